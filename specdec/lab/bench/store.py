"""The run folder of a benchmark: `config.json`, one JSON line per finished cell, and a CSV copy.

A rerun with the same configuration resumes (cells already in `results.jsonl` are skipped); a rerun
with another configuration is refused, so one folder never mixes two settings.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict
from pathlib import Path

from specdec.core import files

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"
CONFIG_JSON = "config.json"


def row_key(row: dict) -> tuple[str, str, str]:
    """What identifies a cell: (draft, k, prompt id)."""
    return row["draft"], str(row["k"]), row["prompt_id"]


def read_rows(out_dir: str | Path) -> list[dict]:
    """Rows of `results.jsonl` in a run folder ([] when there is none).

    A last line cut short by a killed run (no newline, or not JSON) is dropped from the file, so the next
    append starts on a line of its own; a bad line anywhere else is an error naming file:line.
    """
    path = Path(out_dir) / RESULTS_JSONL
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")  # a complete file ends with "\n": last item b""
    rows = []
    for number, line in enumerate(lines[:-1], start=1):
        try:
            rows.append(json.loads(line.decode("utf-8")))
        except ValueError:  # not UTF-8, or not JSON
            raise ValueError(f"{path}:{number}: not a JSON row ({line[:60]!r}); move the file away to start over")
    if lines[-1]:  # a torn last line (cut anywhere, even inside a character): keep every complete row
        files.write_text(path, b"".join(line + b"\n" for line in lines[:-1]).decode("utf-8"))
    return rows


def append_row(out_dir: Path, row: dict) -> None:
    """Add one finished cell to `results.jsonl` (one write of one whole line, flushed to disk)."""
    with open(Path(out_dir) / RESULTS_JSONL, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def check_run_folder(out: Path, config) -> None:
    """Create the folder, or refuse to mix results of a different configuration (a dataclass) into it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / CONFIG_JSON
    wanted = asdict(config)
    if not path.exists():
        files.write_text(path, json.dumps(wanted, indent=1))
        return
    files.reap(path)  # a run killed just after writing it left its writer's token: the next write would reap it
    stored = json.loads(path.read_text(encoding="utf-8"))
    if stored != wanted:
        changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise ValueError(f"{out} holds results of another configuration (differs in {', '.join(changed)}): "
                         "use a new --out folder, or the same settings to resume")


def write_csv(rows: list[dict], path: Path) -> None:
    """All rows as a CSV table, replaced atomically (nothing is written for no rows)."""
    if not rows:
        return
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    files.write_text(path, table.getvalue())
