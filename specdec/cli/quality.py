"""`python -m specdec quality`: how far the quantized target is from the float one (agreement, perplexity).

Exit 0, or 2 when a target given (--min-agreement, --max-ppl-ratio) is not met; 1 is bad input.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from specdec.core.files import write_text
from specdec.core.suites import SPLITS
from specdec.lab.quality import (Check, PromptScores, QualityReport, QualityRow, check_targets, measure_quality,
                                 read_prompts, record_of, save_record)
from specdec.models.loading import add_model_arguments, load_model, resolve_dtype

NOT_MET = 2  # exit code when a given target is not met
COLUMNS = ("category", "prompts", "tokens", "agreement %", "ppl reference", "ppl candidate", "ratio",
           "mean tokens before divergence")


def register(subparsers) -> None:
    p = subparsers.add_parser("quality", help="measure a quantized target against its float model "
                                              "(top-1 agreement, perplexity ratio)",
                              description="The candidate (--quant int8 by default, or --quant none --dtype D) against "
                                          "the reference (--reference-dtype) on the reference's greedy continuations "
                                          "of the prompts.")
    add_model_arguments(p)
    p.set_defaults(quant="int8")
    p.add_argument("--reference-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="dtype of the reference model the candidate (--quant/--dtype) is measured against")
    p.add_argument("--prompts", default="all", help="suite name, comma-separated suites (code,chat) or a file")
    p.add_argument("--split", choices=SPLITS, default="heldout", help="prompts of this split")
    p.add_argument("--max-new-tokens", type=int, default=64, help="length of each reference continuation")
    p.add_argument("--min-agreement", type=float, help="target: pooled top-1 agreement at least this (0..1)")
    p.add_argument("--max-ppl-ratio", type=float, help="target: pooled perplexity ratio at most this")
    p.add_argument("--out", help="folder to write quality.json and quality.md into")
    p.set_defaults(func=run)


def check_arguments(args) -> None:
    """Refuse bad input before any model loads."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.min_agreement is not None and not 0 <= args.min_agreement <= 1:
        raise ValueError(f"--min-agreement is a share of positions in [0, 1], got {args.min_agreement}")
    if args.max_ppl_ratio is not None and args.max_ppl_ratio <= 0:
        raise ValueError(f"--max-ppl-ratio must be > 0, got {args.max_ppl_ratio}")
    if args.quant == "int8" and args.dtype not in ("auto", "float32"):
        raise ValueError(f"--quant int8 quantizes float32 weights: drop --dtype {args.dtype}")
    if args.quant == "none" and resolve_dtype(args.dtype) == args.reference_dtype:
        raise ValueError(f"the candidate is the reference ({args.reference_dtype}): give --quant int8, "
                         "or a --dtype other than --reference-dtype")


def run(args) -> int:
    prompts = read_prompts(args.prompts, args.split)  # inputs first, then the models
    check_arguments(args)
    reference = load_model(args.target, dtype=args.reference_dtype)
    candidate = load_model(args.target, dtype=args.dtype, quant=args.quant,
                           device="cpu" if args.quant == "int8" else "auto")
    report = measure_quality(reference, candidate, prompts, max_new_tokens=args.max_new_tokens,
                             on_prompt=lambda index, scores: say_prompt(index, len(prompts), scores))
    checks = check_targets(report.pooled, args.min_agreement, args.max_ppl_ratio)
    text = markdown(report, checks)
    print(text)
    save_record(record_of(report))  # what the app and `profile` show beside this target's format
    if args.out:
        write(Path(args.out), report, checks, text)
    return NOT_MET if any(not c.met for c in checks) else 0


def say_prompt(index: int, total: int, scores: PromptScores) -> None:
    print(f"[{index + 1}/{total}] {scores.prompt_id} ({scores.category}): {scores.agreed}/{scores.tokens} "
          f"positions agree, {scores.common_prefix} tokens before divergence", flush=True)


def markdown(report: QualityReport, checks: list[Check]) -> str:
    """The report as markdown: what was compared on what text, the table, the targets."""
    lines = [f"Candidate {report.candidate} against reference {report.reference}, on {report.text} "
             f"(up to {report.max_new_tokens} tokens each).",
             f"Bias: {report.bias}.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
             *[table_row(row) for row in report.rows], table_row(report.pooled, bold=True)]
    lines += [""] + [f"{c.label}: {c.value:.4f}, {'met' if c.met else 'not met'}" for c in checks]
    return "\n".join(lines).rstrip()


def table_row(row: QualityRow, bold: bool = False) -> str:
    category = f"**{row.category}**" if bold else row.category
    cells = (category, row.prompts, row.tokens, f"{100 * row.agreement:.1f}", f"{row.ppl_reference:.3f}",
             f"{row.ppl_candidate:.3f}", f"{row.ppl_ratio:.4f}", f"{row.mean_common_prefix:.1f}")
    return "| " + " | ".join(map(str, cells)) + " |"


def write(out: Path, report: QualityReport, checks: list[Check], text: str) -> None:
    """quality.json (the report, per-prompt counts included, and the checks) and quality.md, each atomically."""
    data = {**asdict(report), "checks": [asdict(c) for c in checks]}
    write_text(out / "quality.json", json.dumps(data, ensure_ascii=False, indent=1))
    write_text(out / "quality.md", text + "\n")
    print(f"written: {out / 'quality.md'}, {out / 'quality.json'}")
