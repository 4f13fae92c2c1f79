"""`python -m specdec probe`: is the draft still good enough for this target? Exit 0 yes, 2 no.

Meant as a scheduled job after a target update: exit code 2 (below --threshold) prints a
recommendation and the measured draft-free fallback; exit code 1 is bad input.
"""
from __future__ import annotations

import json
from dataclasses import asdict

from specdec.cli.arguments import parse_fixed_k
from specdec.core.limits import K_MAX
from specdec.core.suites import load_suite
from specdec.lab.probe import check_threshold, probe, sample_prompts
from specdec.models.loading import add_model_arguments, load_draft, load_model

BELOW_THRESHOLD = 2  # exit code when the acceptance rate is under the threshold


def register(subparsers) -> None:
    p = subparsers.add_parser("probe", help="measure a draft's acceptance rate; exit 2 below a threshold")
    add_model_arguments(p)
    p.add_argument("--draft", required=True, help="draft model spec, 'lookup' or 'self:L'")
    p.add_argument("--prompts", default="all", help="suite name, .jsonl file, or text file (one prompt per line)")
    p.add_argument("--threshold", type=float, default=0.5, help="minimum acceptance rate α̂ (default 0.5: below it the draft has drifted from the target)")
    p.add_argument("--samples", type=int, default=16, help="prompts sampled from --prompts")
    p.add_argument("--k", type=parse_fixed_k, default=4, help=f"draft tokens per round (1..{K_MAX})")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt sample")
    p.add_argument("--no-fallback", action="store_true",
                   help="below the threshold, do not measure self-speculation vs prompt lookup")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    prompts = sample_prompts(load_suite(args.prompts), args.samples, args.seed)  # inputs first, then the models
    check_threshold(args.threshold)
    target = load_model(args.target, dtype=args.dtype)
    draft = load_draft(args.draft, target, dtype=args.draft_dtype)
    report = probe(target, draft, prompts, threshold=args.threshold, k=args.k,
                   max_new_tokens=args.max_new_tokens, seed=args.seed, fallback=not args.no_fallback)
    if args.json:
        print(json.dumps(asdict(report), ensure_ascii=False, indent=1))
    else:
        print(report.message)
        for category, alpha in report.per_category.items():
            print(f"  {category}: α̂ = {alpha:.3f}")
    return 0 if report.passed else BELOW_THRESHOLD
