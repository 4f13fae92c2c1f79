"""`python -m specdec distill`: distil a draft (sharing the target's tokenizer) towards the target.

Writes to --out: data/ (the target's continuations, cached), checkpoint/ (resumable), draft/ (the distilled
draft as a plain HF folder), report.json and loss.html (loss curve and held-out acceptance). Each is
replaced whole (written under a temporary name, then renamed); a folder holding a run is continued only
with --resume and replaced only with --overwrite. Prompts and settings are checked before any model loads.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from specdec.core import files
from specdec.core.inputs import check_vocabularies
from specdec.core.suites import Prompt, available_suites, encode, has_held_out, load_suite, split_note
from specdec.drafters import DraftSpec, Vocabulary
from specdec.models import aligned
from specdec.models.loading import add_model_arguments, load_draft, load_model
from specdec.training.distill import DIVERGENCES, DistillConfig, DistillReport
from specdec.training.service import distill_to_folder

RUN_OUTPUTS = ("checkpoint", "draft", "report.json", "loss.html")  # what a finished or started run leaves in --out


def register(subparsers) -> None:
    p = subparsers.add_parser("distill", help="distil a draft towards the target (KL on target continuations)")
    add_model_arguments(p)
    p.add_argument("--draft", required=True, help="draft with the target's tokenizer (run `align` first if not)")
    add_distill_arguments(p)
    p.add_argument("--on-policy", action="store_true", help="also train on the draft's own continuations")
    p.add_argument("--out", required=True, help="run folder (reused to resume)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from --out/checkpoint (same settings)")
    again.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    p.add_argument("--name", help="name the distilled draft is registered under in the model cache, loadable as "
                                  "aligned:NAME (default: the --out folder's name)")
    p.set_defaults(func=run)


def add_distill_arguments(p) -> None:
    """Data and hyper-parameter options (shared with `experiment align-distill`)."""
    defaults = DistillConfig()
    p.add_argument("--prompts", default="finance",
                   help=f"training prompts: a suite ({', '.join(available_suites())}) or a .jsonl/.txt file")
    p.add_argument("--split", default="dev", help="split of --prompts to train on (dev|heldout|all)")
    p.add_argument("--train-limit", type=int, help="first N training prompts of each category")
    p.add_argument("--eval-prompts", help="held-out prompts (default: --prompts, split heldout)")
    p.add_argument("--eval-limit", type=int, default=4, help="held-out prompts evaluated (first N)")
    p.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps (default %(default)s)")
    p.add_argument("--lr", type=float, default=defaults.lr, help="AdamW learning rate, constant (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size,
                   help="sequences per micro-batch (default %(default)s)")
    p.add_argument("--grad-accum", type=int, default=defaults.grad_accum)
    p.add_argument("--temperature", type=float, default=defaults.temperature, help="soft-label temperature T")
    p.add_argument("--alpha", type=float, default=defaults.alpha, help="weight of the divergence term")
    p.add_argument("--divergence", choices=DIVERGENCES, default=defaults.divergence)
    p.add_argument("--top-k", type=int, default=defaults.top_k, help="soft labels kept per position (0 = all)")
    p.add_argument("--four-bit", action=argparse.BooleanOptionalAction, default=defaults.four_bit,
                   help="train through the 4-bit values of the decoder's weights (straight-through), for a draft run "
                        "in int4 (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="target continuation length per prompt")
    p.add_argument("--eval-every", type=int, default=defaults.eval_every)
    p.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every)
    p.add_argument("--eval-k", type=int, default=defaults.eval_k)
    p.add_argument("--eval-max-new-tokens", type=int, default=defaults.eval_max_new_tokens)


def config_from(args) -> DistillConfig:
    return DistillConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size, grad_accum=args.grad_accum,
                         temperature=args.temperature, alpha=args.alpha, divergence=args.divergence,
                         top_k=args.top_k or None, four_bit=args.four_bit, eval_every=args.eval_every,
                         checkpoint_every=args.checkpoint_every, eval_k=args.eval_k,
                         eval_max_new_tokens=args.eval_max_new_tokens)


def read_prompts(spec: str, split: str | None, limit: int | None = None) -> list[Prompt]:
    return load_suite(spec, split=None if split in (None, "all") else split, limit=limit)


def prompt_ids(spec: str, split: str | None, tokenizer, limit: int | None = None) -> list[list[int]]:
    return [encode(p, tokenizer) for p in read_prompts(spec, split, limit)]


def held_out_prompts(eval_spec: str | None, train_spec: str, limit: int | None) -> list[Prompt]:
    """--eval-prompts: its held-out split, or all of it when the file has none; else --prompts' held-out split."""
    if eval_spec and not has_held_out(eval_spec):
        return read_prompts(eval_spec, None)[:limit]
    return read_prompts(eval_spec or train_spec, "heldout")[:limit]


def say_split(train_spec: str, split: str | None, eval_spec: str | None) -> None:
    """Print how many prompts were held out when the training file has no held-out split of its own."""
    note = split_note(train_spec) if split not in (None, "all") or not eval_spec else None
    if note:
        print(note, flush=True)


def check_run_folder(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to start a new run over an old one unless told to (then clear the old run's outputs)."""
    found = [name for name in RUN_OUTPUTS if (out / name).exists()]
    if not found or resume:
        return
    if not overwrite:
        raise ValueError(f"{out} already holds a run ({', '.join(found)}): pass --resume to continue it, "
                         "--overwrite to replace it, or another --out")
    for name in found:
        files.remove(out / name)


def run(args) -> int:
    train = read_prompts(args.prompts, args.split, args.train_limit)
    held_out = held_out_prompts(args.eval_prompts, args.prompts, args.eval_limit)
    say_split(args.prompts, args.split, args.eval_prompts)
    config = config_from(args)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    spec = DraftSpec.parse(args.draft)
    if spec.kind != "model" or spec.hybrid:
        raise ValueError(f"--draft {args.draft!r}: distillation trains a draft model; name one (a catalogue name, "
                         "folder, hub id or aligned:NAME), not lookup, self:L, +lookup or @vocab=")
    check_run_folder(Path(args.out), args.resume, args.overwrite)
    target = load_model(args.target, dtype=args.dtype, role="train")
    draft = load_draft(args.draft, target, dtype=target.dtype, bridge=Vocabulary.AS_IS, shipped_set=False)
    check_vocabularies(target.model, draft.model)
    report = distill_to_folder(target, draft, [encode(p, target.tokenizer) for p in train],
                               [encode(p, target.tokenizer) for p in held_out], config, Path(args.out),
                               max_new_tokens=args.max_new_tokens, on_policy=args.on_policy, resume=args.resume)
    if not report.evals:  # a non-main process of a multi-process launch: the main one reports
        return 0
    first, last = report.evals[0], report.evals[-1]
    print(f"held-out acceptance {first['acceptance_rate']:.3f} -> {last['acceptance_rate']:.3f}, mean accepted "
          f"length {first['mean_accepted_length']:.2f} -> {last['mean_accepted_length']:.2f}; "
          f"saved to {Path(args.out) / 'draft'}")
    register_draft(args, target, draft, report)
    return 0


def register_draft(args, target, draft, report: DistillReport) -> None:
    """Register --out/draft in the model cache; a draft given as aligned:NAME passes its source on."""
    card = aligned.find(args.draft.strip())
    source = card.source if card else aligned.loaded_id(draft)
    transplanted = card is not None or (draft.path / "alignment.json").is_file()
    domain = args.prompts if args.prompts in available_suites() else Path(args.prompts).stem
    name = aligned.name_for(args.name or Path(args.out).resolve().name)
    aligned.register_distilled(Path(args.out) / "draft", report, name=name, target=aligned.loaded_id(target),
                               source=source, domain=domain, transplanted=transplanted)
    print(f"registered as {aligned.PREFIX}{name}")


