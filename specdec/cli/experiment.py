"""`python -m specdec experiment align-distill`: the aligned-draft recipe, per domain, on this machine.

A domain-shift experiment at small scale: does a draft with another tokenizer collapse on domain text, and do
alignment, distillation and a pruned draft vocabulary bring it back? Stages (tokenizer report, transplant,
target data, distillation, pruned vocabulary, measurement) are cached in --out/DOMAIN/ and skipped once done
with the same settings, so a killed run continues where it stopped; a rerun with other settings does again the
stages they change and the ones after them (`specdec.lab.recipe`). The table compares, on held-out prompts:
  (a) the same-family draft; (b) a draft of another family, ids fed naively; (c) through the text bridge;
  (d) transplanted onto the target's tokenizer by token string; (e) (d) distilled; (f) (e) with a pruned
  vocabulary (`MODEL@vocab=FILE`). Every row is measured under one k policy (`--k`, default auto) against the target
as generate runs it (`--dtype`, default auto); the data and the soft labels come from its float32 form.
Measurement is heavy: run it when nothing else is timing on the machine.
Held-out α̂ is measured once, by the measure stage; `--eval-every N` also checks it every N steps of distillation.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path

from specdec.cli.arguments import parse_k
from specdec.cli.distill import (add_distill_arguments, config_from, held_out_prompts, prompt_ids,
                                 read_prompts, say_split)
from specdec.core.limits import K_MAX
from specdec.core.suites import encode, load_suite
from specdec.drafters.tokenizers import DEFAULT_TEXTS
from specdec.lab.recipe import RECIPE_DISTILL, RecipeSettings, markdown, run_recipe
from specdec.models.entries import default_name
from specdec.models.loading import add_model_arguments, load_model, prepare
from specdec.training.align import bits_per_character, transplant_vocabulary


def register(subparsers) -> None:
    p = subparsers.add_parser("experiment", help="reproducible experiments (align-distill: a draft "
                                                    "with another tokenizer, naive vs aligned vs distilled)")
    experiments = p.add_subparsers(dest="experiment", required=True)
    e = experiments.add_parser("align-distill", help="aligned vs unaligned vs distilled drafts on held-out prompts")
    add_model_arguments(e, target_default=default_name("target"))
    e.add_argument("--same-draft", default=default_name("draft"), help="draft of the target's family (row a)")
    e.add_argument("--other-draft", default="smollm2-135m-instruct", help="draft of another family (rows b-e)")
    defaults = RecipeSettings(train=[], held_out=[], texts=[])
    e.add_argument("--k", type=parse_k, default=defaults.k,
                   help=f"draft tokens per round when measuring: auto (default: the controller, as in generate and "
                        f"bench, so every row meets the same k policy) or 1..{K_MAX}")
    e.add_argument("--measure-max-new-tokens", type=int, default=defaults.measure_max_new_tokens,
                   help="tokens generated per held-out prompt when measuring")
    e.add_argument("--most-frequent", type=int, default=defaults.most_frequent,
                   help="general-text tokens kept in the pruned vocabulary besides the domain's own")
    e.add_argument("--generation-batch", type=int, default=defaults.generation_batch,
                   help="training prompts the target continues per batched forward (left padding; 1 = one at a time)")
    e.add_argument("--samples", type=int, default=defaults.samples,
                   help="sampled target continuations per training prompt besides the greedy one (more contexts)")
    e.add_argument("--sample-temperature", type=float, default=defaults.sample_temperature,
                   help="temperature of those samples")
    add_distill_arguments(e)
    e.set_defaults(prompts="finance", steps=RECIPE_DISTILL.steps, lr=RECIPE_DISTILL.lr,
                   batch_size=RECIPE_DISTILL.batch_size, temperature=RECIPE_DISTILL.temperature,
                   eval_every=RECIPE_DISTILL.eval_every, eval_limit=6, max_new_tokens=defaults.max_new_tokens)
    e.add_argument("--out", default="runs/align-distill",
                   help="run folder, one subfolder per domain (a rerun skips the stages done with the same settings)")
    e.set_defaults(func=run)
    t = experiments.add_parser("transplant-check", help="bits per character of a draft before/after transplant "
                                                        "(string vs index); loads the draft and the target tokenizer only")
    t.add_argument("--target", default=default_name("target"), help="whose tokenizer to transplant onto")
    t.add_argument("--draft", default="smollm2-135m-instruct")
    t.add_argument("--prompts", default="finance", help="suite or file whose text prompts are scored")
    t.set_defaults(func=run_transplant_check)


def run(args) -> int:
    """Each domain of --prompts (comma-separated suites or files) through every stage of the recipe."""
    domains = [d.strip() for d in args.prompts.split(",") if d.strip()]
    for domain in domains:  # inputs first, then the models
        read_prompts(domain, args.split, args.train_limit)
        held_out_prompts(args.eval_prompts, domain, args.eval_limit)
    target = load_model(args.target, role="train")  # data and soft labels: the target's float logits
    other = load_model(args.other_draft, dtype=target.dtype)
    # the target the drafts are measured against, as generate runs it (--dtype), loaded once if a measure stage runs
    measured = functools.cache(lambda: load_model(args.target, dtype=args.dtype, quant=args.quant))
    for domain in domains:
        name = Path(domain).stem
        say_split(domain, args.split, args.eval_prompts)
        settings = RecipeSettings(
            train=prompt_ids(domain, args.split, target.tokenizer, args.train_limit),
            held_out=[encode(p, target.tokenizer)
                      for p in held_out_prompts(args.eval_prompts, domain, args.eval_limit)],
            texts=[p.prompt for p in read_prompts(domain, args.split, args.train_limit)
                   if isinstance(p.prompt, str)] or list(DEFAULT_TEXTS),
            distill=config_from(args), max_new_tokens=args.max_new_tokens,
            measure_max_new_tokens=args.measure_max_new_tokens, k=args.k, most_frequent=args.most_frequent,
            generation_batch=args.generation_batch, samples=args.samples, sample_temperature=args.sample_temperature,
            draft_dtype=args.draft_dtype, target_dtype=args.dtype)
        rows = run_recipe(target, other, args.same_draft, settings, Path(args.out) / name, domain=name,
                          measured_target=measured)
        print(f"\n{name}:\n{markdown(rows)}", flush=True)
    return 0


def run_transplant_check(args) -> int:
    """How much language modelling survives each transplant, before any distillation (no target model)."""
    from transformers import AutoTokenizer


    texts = [p.prompt for p in load_suite(args.prompts) if isinstance(p.prompt, str)] + list(DEFAULT_TEXTS)
    target_tokenizer = AutoTokenizer.from_pretrained(prepare(args.target)[0])
    draft = load_model(args.draft, role="train")
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

