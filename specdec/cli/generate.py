"""`python -m specdec generate`: one speculative generation, its round table and stats."""
from __future__ import annotations

import json

from ..engine import speculative_generate
from ..models import add_model_arguments, load_draft, load_model
from ..report import format_stats, format_table, round_rows


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="speculative generation with a per-round table")
    add_model_arguments(p)
    p.add_argument("--draft", required=True, help="draft model (catalogue name, folder, .gguf, hub id) or drafter")
    p.add_argument("--prompt", required=True)
    p.add_argument("--k", type=int, default=4, help="draft tokens per round")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    target = load_model(args.target, dtype=args.dtype)
    draft = load_draft(args.draft, target, dtype=args.dtype)
    result = speculative_generate(
        target, draft, args.prompt, k=args.k, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=1))
        return 0
    print(f"{args.prompt}{result.text}\n")
    print(format_table(round_rows(result, target.tokenizer)))
    print()
    print(format_stats(result.stats))
    return 0
