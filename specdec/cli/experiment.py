"""`python -m specdec experiment align-distill`: a domain-shift experiment, at small scale, on this machine:
does a draft with another tokenizer collapse, and do alignment and distillation bring it back?

Drafts for one target, measured on held-out domain prompts that training never sees:
  (a) the same-family draft (shares the target's tokenizer);
  (b) a draft of another family, its ids fed naively across vocabularies;
  (c) the same draft through the text bridge;
  (d) the same draft transplanted onto the target's tokenizer (by token string; d' by index, the naive way);
  (e) (d) distilled on the target's own continuations of domain prompts.
Table: draft | tokenizer | α̂ | mean accepted length | ms per token | speedup vs the target alone, all measured
in one run (part "measure"); part "distill" trains (e) and is resumable. Each part is heavy: run it
when nothing else is timing on the machine.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..align import DEFAULT_TEXTS, bits_per_character, transplant_vocabulary
from ..drafters import NaiveCrossVocabDrafter, TextBridgeDrafter
from ..engine import autoregressive_generate, speculative_generate
from ..inputs import vocab_size
from ..limits import K_MAX
from ..models import add_model_arguments, apply_speed_levers, default_name, load_draft, load_model
from ..suites import load_suite
from ..trace import pooled_stats, ratio
from .arguments import parse_fixed_k
from .distill import add_distill_arguments, apply_threads, config_from, distill_to_folder, prompt_ids

PARTS = ("distill", "measure", "all")


def register(subparsers) -> None:
    p = subparsers.add_parser("experiment", help="reproducible experiments (align-distill: a draft "
                                                    "with another tokenizer, naive vs aligned vs distilled)")
    experiments = p.add_subparsers(dest="experiment", required=True)
    e = experiments.add_parser("align-distill", help="aligned vs unaligned vs distilled drafts on held-out prompts")
    add_model_arguments(e, target_default=default_name("target"))
    e.add_argument("--same-draft", default=default_name("draft"), help="draft of the target's family (row a)")
    e.add_argument("--other-draft", default="smollm2-135m-instruct", help="draft of another family (rows b-e)")
    e.add_argument("--part", choices=PARTS, default="all", help="distill (train e), measure (the table), or all")
    e.add_argument("--k", type=parse_fixed_k, default=5, help=f"draft tokens per round (1..{K_MAX})")
    e.add_argument("--measure-max-new-tokens", type=int, default=48, help="tokens generated per held-out prompt")
    add_distill_arguments(e)
    e.add_argument("--out", default="runs/align-distill", help="run folder (reused to resume)")
    e.set_defaults(func=run)
    t = experiments.add_parser("transplant-check", help="bits per character of a draft before/after transplant "
                                                        "(string vs index); loads the draft and the target tokenizer only")
    t.add_argument("--target", default=default_name("target"), help="whose tokenizer to transplant onto")
    t.add_argument("--draft", default="smollm2-135m-instruct")
    t.add_argument("--prompts", default="finance", help="suite or file whose text prompts are scored")
    t.set_defaults(func=run_transplant_check)


@dataclass
class Row:
    """One line of the table: a draft measured on every held-out prompt."""

    draft: str  # what drafts, e.g. "(c) smollm2-135m-instruct via text bridge"
    tokenizer: str  # whose tokenizer the draft uses
    acceptance_rate: float  # α̂ pooled over prompts (accepted / (accepted + rejections))
    mean_accepted_length: float  # tokens per target forward, pooled (incl. the target's token)
    ms_per_token: float  # total wall time / total emitted tokens
    speedup: float  # target alone ms per token / this row's
    identical_outputs: str  # "n/N" prompts whose greedy output equals the target alone's


def run(args) -> int:
    apply_threads(args)
    out = Path(args.out)
    target = load_model(args.target, dtype=args.dtype)
    train = prompt_ids(args.prompts, args.split, target.tokenizer, args.train_limit)
    held_out = prompt_ids(args.eval_prompts or args.prompts, "heldout", target.tokenizer)[:args.eval_limit]
    other = load_model(args.other_draft, dtype=target.dtype)
    if args.part in ("distill", "all"):
        aligned = transplanted(other, target, "string")
        distill_to_folder(target, aligned, train, held_out, config_from(args), out / "distill",
                          max_new_tokens=args.max_new_tokens, resume=True)
    if args.part in ("measure", "all"):
        measure(args, target, other, held_out, out)
    return 0


def run_transplant_check(args) -> int:
    """How much language modelling survives each transplant, before any distillation (no target model)."""
    from transformers import AutoTokenizer

    from ..models.loading import prepare

    texts = [p.prompt for p in load_suite(args.prompts) if isinstance(p.prompt, str)] + list(DEFAULT_TEXTS)
    target_tokenizer = AutoTokenizer.from_pretrained(prepare(args.target)[0])
    draft = load_model(args.draft)
    print(f"{len(texts)} texts, {sum(map(len, texts))} characters; bits per character (lower is better):")
    print(f"  {draft.name} with its own tokenizer: {bits_per_character(draft.model, draft.tokenizer, texts):.3f}")
    for method in ("string", "index"):
        model = copy.deepcopy(draft.model)
        summary = transplant_vocabulary(model, draft.tokenizer, target_tokenizer, method=method,
                                        rows=len(target_tokenizer))
        print(f"  transplanted by {method} onto the target tokenizer: "
              f"{bits_per_character(model, target_tokenizer, texts):.3f}  ({summary.copied} rows copied, "
              f"{summary.from_pieces} from pieces, {summary.initialised} initialised)")
    return 0


def transplanted(other, target, method: str):
    """A copy of `other` (a LoadedModel) with the target's tokenizer and logit width."""
    clone = copy.copy(other)
    clone.model = copy.deepcopy(other.model)
    transplant_vocabulary(clone.model, other.tokenizer, target.tokenizer, method=method,
                          rows=vocab_size(target.model))
    apply_speed_levers(clone.model)  # the same load-time speed levers as every other model here
    clone.tokenizer, clone.name = target.tokenizer, f"{other.name} ({method} transplant)"
    return clone


def measure(args, target, other, held_out: list[list[int]], out: Path) -> list[Row]:
    """Every row of the table, measured here in one run; writes table.md and results.json."""
    autoregressive_generate(target, held_out[0], max_new_tokens=2)  # warm-up: first calls are slower
    alone = [autoregressive_generate(target, ids, max_new_tokens=args.measure_max_new_tokens) for ids in held_out]
    alone_ms = _ms_per_token(alone)
    distilled_folder = out / "distill" / "draft"
    contenders = [
        (f"(a) {args.same_draft}", "target's", lambda: load_draft(args.same_draft, target, bridge=False)),
        (f"(b) {other.name}, ids fed naively", f"{other.name}'s", lambda: NaiveCrossVocabDrafter(other)),
        (f"(c) {other.name} via text bridge", f"{other.name}'s", lambda: TextBridgeDrafter(other, target.tokenizer)),
        (f"(d) {other.name} transplanted by string", "target's (hard-cloned)",
         lambda: transplanted(other, target, "string")),
        (f"(d') {other.name} transplanted by index", "target's (hard-cloned)",
         lambda: transplanted(other, target, "index")),
    ]
    if distilled_folder.is_dir():
        contenders.append((f"(e) (d) distilled", "target's (hard-cloned)",
                           lambda: load_model(str(distilled_folder), dtype=target.dtype)))
    rows = [Row("target alone", "target's", float("nan"), 1.0, alone_ms, 1.0, f"{len(alone)}/{len(alone)}")]
    out.mkdir(parents=True, exist_ok=True)
    print(_markdown(rows), end="", flush=True)  # each row is printed as soon as it is measured
    for label, tokenizer, make in contenders:
        draft = make()
        results = [speculative_generate(target, draft, ids, k=args.k, max_new_tokens=args.measure_max_new_tokens)
                   for ids in held_out]
        rows.append(_row(label, tokenizer, results, alone, alone_ms))
        print(_markdown(rows[-1:]).splitlines()[-1], flush=True)
    (out / "results.json").write_text(json.dumps(
        {"target": target.name, "dtype": target.dtype, "k": args.k, "prompts": len(held_out),
         "max_new_tokens": args.measure_max_new_tokens, "rows": [asdict(r) for r in rows]}, indent=1))
    (out / "table.md").write_text(_markdown(rows))
    return rows


def _row(label: str, tokenizer: str, results, alone, alone_ms: float) -> Row:
    stats = pooled_stats(results, results[0].stats.k)
    ms = _ms_per_token(results)
    same = sum(r.token_ids == a.token_ids for r, a in zip(results, alone))
    return Row(label, tokenizer, stats.acceptance_rate, stats.mean_accepted_length, ms, ratio(alone_ms, ms),
               f"{same}/{len(results)}")


def _ms_per_token(results) -> float:
    """Pooled wall time per emitted token, in milliseconds."""
    return ratio(1000, pooled_stats(results, 0).tokens_per_s)


def _markdown(rows: list[Row]) -> str:
    lines = ["| draft | tokenizer | α̂ | mean accepted length | ms per token | speedup vs target alone | "
             "greedy output = target's |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.draft} | {r.tokenizer} | {'—' if math.isnan(r.acceptance_rate) else f'{r.acceptance_rate:.3f}'} | {r.mean_accepted_length:.2f} | "
              f"{r.ms_per_token:.0f} | {r.speedup:.2f}x | {r.identical_outputs} |" for r in rows]
    return "\n".join(lines) + "\n"
