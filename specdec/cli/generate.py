"""`python -m specdec generate`: one speculative generation, its round table and stats.

`--costs FILE` (a profile another machine saved with `profile --save`, `specdec.costs.profile`) adds the speedup
that machine's costs predict from this run's α̂ per draft position, and the k to use there."""
from __future__ import annotations

import json
from dataclasses import asdict

from specdec.cli.arguments import parse_k
from specdec.core.engine import autoregressive_generate, speculative_generate
from specdec.core.limits import K_MAX
from specdec.core.trace import explain_divergence, measured_speedup
from specdec.costs.calibration import calibrate
from specdec.costs.profile import load_profile, predict
from specdec.lab.report import baseline_lines, format_stats, format_table, is_bug, round_rows
from specdec.models.loading import add_model_arguments, load_draft, load_model

BUG_EXIT = 3  # exit status when greedy output leaves the target's for a reason rounding cannot explain


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="speculative generation with a per-round table")
    add_model_arguments(p)
    p.add_argument("--draft", required=True, help="draft model (catalogue name, folder, .gguf, hub id) or drafter")
    p.add_argument("--prompt", required=True)
    p.add_argument("--k", type=parse_k, default="auto",
                   help=f"draft tokens per round (1..{K_MAX}), or auto (default: chosen each round from the measured costs)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", action="store_true",
                   help="also run the target alone: measured speedup and an output-identity check")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the verification cost v(n), the draft cost c and the int8 kernel of each weight shape "
                        "again (else cached per machine)")
    p.add_argument("--costs", metavar="FILE",
                   help="a cost profile of another machine (`profile --save FILE`): also print the speedup predicted "
                        "there from this run's α̂ per draft position, next to the one measured here")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    profile = load_profile(args.costs) if args.costs else None
    if profile is not None:
        profile.costs(args.draft)  # a draft the profile does not price is refused before any model loads
    target = load_model(args.target, dtype=args.dtype, quant=args.quant)
    if profile is not None:
        profile.check_target(target.name)
    draft = load_draft(args.draft, target, dtype=args.draft_dtype)
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                    seed=args.seed)
    costs = calibrate(target, draft, recalibrate=args.recalibrate)
    result = speculative_generate(target, draft, args.prompt, k=args.k, costs=costs, **sampling)
    baseline = autoregressive_generate(target, args.prompt, **sampling) if args.baseline else None
    greedy = args.temperature == 0
    divergence = explain_divergence(result, baseline, target.dtype) if baseline and greedy else None
    elsewhere = (predict(profile, args.draft, result.stats.per_position_acceptance, result.stats.k)
                 if profile is not None else None)
    if args.json:
        output = {**result.to_dict(), "costs": costs.to_dict()}
        if elsewhere is not None:
            output["elsewhere"] = asdict(elsewhere)
        if baseline is not None:
            output["baseline"] = baseline.to_dict()
            output["divergence"] = divergence and asdict(divergence)
        print(json.dumps(output, ensure_ascii=False, indent=1))
    else:
        print(f"{args.prompt}{result.text}\n")
        print(format_table(round_rows(result, target.tokenizer)))
        print()
        print(format_stats(result.stats))
        if baseline is not None:
            print("\n".join(baseline_lines(result, baseline, greedy, target.dtype, target.tokenizer)))
        if elsewhere is not None:
            print(elsewhere.line(result.stats.predicted_speedup,
                                 measured_speedup(result.stats, baseline.stats) if baseline is not None else None))
    return BUG_EXIT if is_bug(divergence) else 0

