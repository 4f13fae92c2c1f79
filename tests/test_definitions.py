"""One set of definitions: the app's cards, the CLI's stats, the bench row and README agree on one run."""
from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

import specdec.core.trace
from specdec.dashboard.tabs import live
from specdec.dashboard.panels import definitions
from specdec.dashboard.runs import RunControl
from specdec.lab.bench.run import metric_fields
from specdec.lab.report import STAT_LINES, format_stats
from tiny_models import Progress

ROOT = Path(__file__).resolve().parent.parent
COMPARED = ("acceptance_rate", "mean_accepted_length", "cost_ratio", "verify_cost", "predicted_speedup")


@pytest.fixture(scope="module")
def run(paths, hub):
    """One tiny live run through the app: its final view and the engine's result behind it."""
    control = RunControl()
    views = list(live.live_decode(hub, paths["target"], paths["draft"], "auto", "def price(option, curve):", 3,
                                      24, False, 0.8, 1.0, 0, False, control, progress=Progress()))
    return views[-1], live._LAST[control].result


def cards(stats_html: str) -> dict[str, str]:
    """{label: shown value} of the stats cards."""
    found = re.findall(r'<div class="value">(.*?)</div><div class="label">(.*?)</div>', stats_html)
    return {html.unescape(label): html.unescape(value) for value, label in found}


def test_cards_cli_and_bench_show_the_same_numbers(run):
    view, result = run
    shown = cards(view.stats)
    printed = dict(line.split(": ", 1) for line in format_stats(result.stats).splitlines())
    row = metric_fields(result.stats)
    for name, label, fmt in STAT_LINES:
        if name in COMPARED:
            assert shown[label] == printed[label] == fmt.format(row[name]), name


def test_every_card_explains_itself_with_the_trace_definition(run):
    view, _ = run
    defined = definitions()
    for name, _, _ in STAT_LINES:
        if name in defined:
            assert html.escape(defined[name][:40]) in view.stats


def test_readme_metrics_table_has_one_row_per_trace_metric():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    fields = re.findall(r"^\| [^|]+ \| `(\w+)` \|", section, flags=re.MULTILINE)
    metrics = [key for key in definitions() if key != "A"]  # "A *round* is ..." defines the unit, not a metric
    assert sorted(fields) == sorted(metrics)
    assert len(fields) == len(set(fields))


def test_the_theory_text_prices_c_per_step_and_does_not_call_k1_optimal():
    from specdec.dashboard.tabs.theory import THEORY_MD

    assert "one target step" in THEORY_MD and "k = 1 already wins" not in THEORY_MD
    assert "one target step" in specdec.core.trace.__doc__
