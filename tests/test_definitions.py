"""One set of definitions: the app's cards, the CLI's stats, the bench row and docs/metrics.md agree on one run."""
from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

import pytest

import specdec.core.trace
from specdec.core.metrics import METRICS, metrics_table
from specdec.core.trace import Rates
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


def test_docs_metrics_table_is_the_generated_one():
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    table = text.split("-->\n", 1)[1].split("\n<!-- end of the generated table -->", 1)[0]
    assert table == metrics_table(), "docs/metrics.md differs from specdec.core.metrics.METRICS: paste metrics_table()"
    fields = re.findall(r"^\| [^|]+ \| `(\w+)` \|", table, flags=re.MULTILINE)
    assert sorted(fields) == sorted(definitions()) and len(fields) == len(set(fields))


def test_every_rate_has_one_definition_and_every_definition_a_value():
    defined = [m.field for m in METRICS]
    assert len(defined) == len(set(defined))
    assert set(defined) == {f.name for f in dataclasses.fields(Rates)} | {"measured_speedup"}  # the one not from counts
    assert all(m.name and m.symbol and m.definition for m in METRICS)


def test_the_theory_text_prices_c_per_step_and_does_not_call_k1_optimal():
    from specdec.dashboard.tabs.theory import THEORY_MD

    assert "one target step" in THEORY_MD and "k = 1 already wins" not in THEORY_MD
    assert "one target step" in specdec.core.trace.__doc__
