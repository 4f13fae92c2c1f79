"""`python -m specdec tokenizers`: can these two models share one speculative decoder? (tokenizer report)"""
from __future__ import annotations

import json
from pathlib import Path

from specdec.drafters.tokenizers import DEFAULT_TEXTS, format_report, tokenizer_report
from specdec.models.loading import add_model_arguments, load_model


def register(subparsers) -> None:
    p = subparsers.add_parser("tokenizers", help="compare the tokenizers of a target and a draft")
    add_model_arguments(p)
    p.add_argument("--draft", required=True, help="draft model (catalogue name, folder, .gguf, hub id)")
    p.add_argument("--texts", help="text file to measure token boundaries on (default: built-in finance/code/"
                                   "Chinese medical examples); paragraphs are separated by blank lines")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def read_texts(path: str | None) -> list[str]:
    if path is None:
        return list(DEFAULT_TEXTS)
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--texts: no file {path}")
    texts = [t.strip() for t in file.read_text(encoding="utf-8").split("\n\n") if t.strip()]
    if not texts:
        raise ValueError(f"--texts: {path} is empty")
    return texts


def run(args) -> int:
    texts = read_texts(args.texts)
    target = load_model(args.target, dtype=args.dtype, role="train")
    draft = load_model(args.draft, dtype=args.dtype, role="train")
    report = tokenizer_report(target.tokenizer, draft.tokenizer, texts, target_model=target.model,
                              draft_model=draft.model)
    print(json.dumps(report.to_dict(), ensure_ascii=False, indent=1) if args.json else format_report(report))
    return 0
