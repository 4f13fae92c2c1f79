"""`python -m specdec generate`: one speculative generation, its round table and stats."""
from __future__ import annotations

import json

from ..engine import autoregressive_generate, speculative_generate
from ..models import add_model_arguments, load_draft, load_model
from ..report import baseline_lines, format_stats, format_table, round_rows


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="speculative generation with a per-round table")
    add_model_arguments(p)
    p.add_argument("--draft", required=True, help="draft model (catalogue name, folder, .gguf, hub id) or drafter")
    p.add_argument("--prompt", required=True)
    p.add_argument("--k", type=_k_value, default=4, help="draft tokens per round (1..32) or 'auto'")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", action="store_true",
                   help="also run the target alone: measured speedup and an output-identity check")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    target = load_model(args.target, dtype=args.dtype)
    draft = load_draft(args.draft, target, dtype=args.dtype)
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                    seed=args.seed)
    result = speculative_generate(target, draft, args.prompt, k=args.k, **sampling)
    baseline = autoregressive_generate(target, args.prompt, **sampling) if args.baseline else None
    if args.json:
        output = result.to_dict()
        if baseline is not None:
            output["baseline"] = baseline.to_dict()
        print(json.dumps(output, ensure_ascii=False, indent=1))
        return 0
    print(f"{args.prompt}{result.text}\n")
    print(format_table(round_rows(result, target.tokenizer)))
    print()
    print(format_stats(result.stats))
    if baseline is not None:
        print("\n".join(baseline_lines(result, baseline, greedy=args.temperature == 0)))
    return 0


def _k_value(text: str):
    return text if text == "auto" else int(text)
