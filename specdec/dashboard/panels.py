"""Stats cards and the round table: the engine's numbers, labels and definitions, rendered."""
from __future__ import annotations

import html

import pandas as pd

from specdec.core.metrics import definitions
from specdec.core.trace import DecodeStats, GenerationResult, measured_speedup
from specdec.lab.report import STAT_LINES, round_rows

TABLE_COLUMNS = ("round", "k", "drafted by", "matches", "accepted", "target token", "kind", "produced")  # the round table
BASELINE_HELP = "the target alone (specdec.autoregressive_generate): new tokens ÷ wall time of the whole call"

CSS = """
.stat-cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 8px; }
.stat-card { border: 1px solid #e3e3e3; border-radius: 8px; padding: 6px 10px; cursor: help; }
.stat-card .value { font-size: 1.35rem; font-weight: 700; }
.stat-card .label { font-size: 0.75rem; color: #555; }
.stat-card.measured { border-color: #2b7bba; }
"""


def round_table(result: GenerationResult, tokenizer) -> pd.DataFrame:
    """specdec.lab.report.round_rows as a DataFrame (the round table; the chips show the running text)."""
    rows = round_rows(result, tokenizer)
    return pd.DataFrame(rows, columns=list(rows[0]) if rows else list(TABLE_COLUMNS))[list(TABLE_COLUMNS)]


def stats_html(stats: DecodeStats, baseline: DecodeStats | None = None) -> str:
    """One card per STAT_LINES entry (its label and, on hover, its definition from METRICS), plus the baseline cards."""
    defined = definitions()
    cards = [_card(fmt.format(getattr(stats, name)), label, f"{label}. {defined.get(name, '')}".strip())
             for name, label, fmt in STAT_LINES]
    if baseline is not None:
        cards.append(_card(f"{baseline.tokens_per_s:.2f}", "tokens/s, target alone", BASELINE_HELP, measured=True))
        cards.append(_card(f"{measured_speedup(stats, baseline):.2f}×", "measured speedup",
                           f"measured speedup. {defined['measured_speedup']}", measured=True))
    return f'<div class="stat-cards" id="stats">{"".join(cards)}</div>'


def _card(value: str, label: str, tooltip: str, measured: bool = False) -> str:
    css = "stat-card measured" if measured else "stat-card"
    return (f'<div class="{css}" title="{html.escape(tooltip)}"><div class="value">{html.escape(value)}</div>'
            f'<div class="label">{html.escape(label)}</div></div>')
