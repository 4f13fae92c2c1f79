"""The benchmark: measured speedup next to what the acceptance rate promises, against the baselines.

- `run`: times every (draft, k, prompt) cell: the target alone, ours, HF assisted and HF plain generation;
- `store`: the run folder (config check, one JSON line per cell, CSV copy), so a run resumes;
- `summary`: pooled metrics per category, the Markdown report, k advice and performance targets;
- `llamacpp`: the optional llama.cpp column (same GGUF files and prompts through llama.cpp's binaries).
"""
from specdec.lab.bench.run import BenchConfig, Contender, cells_to_run, contender, run_bench
from specdec.lab.bench.store import read_rows, write_csv
from specdec.lab.bench.summary import (AdviceRow, Summary, TargetCheck, Targets, advice_rows, format_report, row_costs,
                                       summarise, target_checks)

__all__ = ["AdviceRow", "BenchConfig", "Contender", "Summary", "TargetCheck", "Targets", "advice_rows",
           "cells_to_run", "contender", "format_report", "read_rows", "row_costs", "run_bench", "summarise", "target_checks",
           "write_csv"]
