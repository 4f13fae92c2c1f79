"""The run folder of a benchmark: `config.json`, one JSON line per finished cell, and a CSV copy.

A rerun with the same configuration resumes (cells already in `results.jsonl` are skipped); a rerun
with another configuration is refused, so one folder never mixes two settings.
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"
CONFIG_JSON = "config.json"


def row_key(row: dict) -> tuple[str, str, str]:
    """What identifies a cell: (draft, k, prompt id)."""
    return row["draft"], str(row["k"]), row["prompt_id"]


def read_rows(out_dir: str | Path) -> list[dict]:
    """Rows of `results.jsonl` in a run folder ([] when there is none)."""
    path = Path(out_dir) / RESULTS_JSONL
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_row(out_dir: Path, row: dict) -> None:
    """Add one finished cell to `results.jsonl`."""
    with open(Path(out_dir) / RESULTS_JSONL, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")


def check_run_folder(out: Path, config) -> None:
    """Create the folder, or refuse to mix results of a different configuration (a dataclass) into it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / CONFIG_JSON
    wanted = asdict(config)
    if not path.exists():
        path.write_text(json.dumps(wanted, indent=1), encoding="utf-8")
        return
    stored = json.loads(path.read_text(encoding="utf-8"))
    if stored != wanted:
        changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise ValueError(f"{out} holds results of another configuration (differs in {', '.join(changed)}): "
                         "use a new --out folder, or the same settings to resume")


def write_csv(rows: list[dict], path: Path) -> None:
    """All rows as a CSV table (nothing is written for no rows)."""
    if not rows:
        return
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
