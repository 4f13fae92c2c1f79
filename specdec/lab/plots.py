"""One plotly figure builder for every chart of the dashboard, and the data each chart shows."""
from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go

from specdec.core import theory
from specdec.core.trace import DecodeStats, Round
from specdec.lab.report import POSITION_CONVENTIONS

COLOURS = ("#2b7bba", "#e07b39", "#3c9a5f", "#9b59b6", "#c0392b", "#7f8c8d", "#b7950b")


@dataclass
class Series:
    """One trace of a chart."""

    name: str  # legend entry
    x: list  # x values (numbers or category labels)
    y: list[float]  # y values
    kind: str = "line"  # "line", "bar", "markers" or "waterfall" (first bar absolute, then changes)
    text: list[str] = field(default_factory=list)  # optional label drawn on each point / bar
    hover: list[str] = field(default_factory=list)  # optional hover text per point / bar


def figure(title: str, x_title: str, y_title: str, series: list[Series], y_range: tuple | None = None) -> go.Figure:
    """A compact figure with one trace per `Series` (lines, grouped bars or markers)."""
    fig = go.Figure()
    for colour_index, s in enumerate(series):
        colour = COLOURS[colour_index % len(COLOURS)]
        text = s.text or None
        hover = dict(hovertext=s.hover, hoverinfo="text+name") if s.hover else {}
        if s.kind == "bar":
            fig.add_trace(go.Bar(name=s.name, x=s.x, y=s.y, marker_color=colour, text=text, textposition="auto",
                                 **hover))
        elif s.kind == "waterfall":
            # first and last bars stand on zero; those between show each step's change from the bar before
            changes = [s.y[0]] + [b - a for a, b in zip(s.y, s.y[1:-1])] + s.y[-1:] * (len(s.y) > 1)
            measure = ["absolute"] + ["relative"] * (len(s.y) - 2) + ["absolute"] * (len(s.y) > 1)
            fig.add_trace(go.Waterfall(name=s.name, x=s.x, y=changes, measure=measure, text=text,
                                       textposition="outside", connector=dict(line=dict(color="#b0b0b0")),
                                       decreasing=dict(marker=dict(color="#e07b39")),
                                       increasing=dict(marker=dict(color="#3c9a5f")),
                                       totals=dict(marker=dict(color=COLOURS[0])), **hover))
        else:
            mode = "lines+markers" if s.kind == "line" else "markers+text"
            fig.add_trace(go.Scatter(name=s.name, x=s.x, y=s.y, mode=mode, text=text, textposition="top center",
                                     marker=dict(color=colour, size=8 if s.kind == "line" else 12),
                                     line=dict(color=colour)))
    fig.update_layout(title=dict(text=title, font=dict(size=14)), xaxis_title=x_title, yaxis_title=y_title,
                      barmode="group", height=300, margin=dict(l=50, r=20, t=45, b=45),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1.0, xanchor="right"),
                      template="plotly_white", showlegend=len(series) > 1)
    if y_range is not None:
        fig.update_yaxes(range=list(y_range))
    return fig


def running_acceptance(rounds: list[Round], k: int) -> go.Figure:
    """α̂ over the rounds seen so far (the engine's own aggregation of each prefix of rounds)."""
    alphas = [DecodeStats.from_rounds(rounds[:n], k).acceptance_rate for n in range(1, len(rounds) + 1)]
    series = [Series("α̂", list(range(1, len(rounds) + 1)), alphas)]
    return figure("running acceptance rate α̂", "round", "α̂", series, y_range=(0, 1.05))


def accepted_length_histogram(rounds: list[Round], k: int) -> go.Figure:
    """How many rounds accepted 0, 1, ..., k draft tokens."""
    counts = [sum(r.num_accepted == n for r in rounds) for n in range(k + 1)]
    return figure("accepted draft tokens per round", "accepted tokens", "rounds",
                  [Series("rounds", list(range(k + 1)), counts, kind="bar")])


def per_position_acceptance(stats: DecodeStats) -> go.Figure:
    """Acceptance at each draft position in both conventions: accepted / reached (first), accepted / rounds."""
    positions = list(range(1, len(stats.per_position_acceptance) + 1))
    series = [Series(convention, positions, getattr(stats, name), kind="bar") for name, convention in POSITION_CONVENTIONS]
    return figure("per-position acceptance", "draft position", "accepted share", series, y_range=(0, 1.05))


def speedup_curves(alpha: float, c: float, k_max: int, measured: list[tuple[int, float]], slope: float = 0.0,
                   measured_v: list[float] | None = None) -> go.Figure:
    """Theory over k for α, c and v(n) = 1 + slope·(n-1); measured speedups and measured v(k+1) as points.

    Three curves: tokens per target forward (Eq. 1), Leviathan's bound (verification = 1 step) and the
    prediction that prices verification at v(k+1) steps; the optimal k is the prediction's argmax.
    """
    ks = list(range(1, k_max + 1))
    v = [1.0 + slope * k for k in ks]  # v(k+1)
    predicted = [theory.predicted_speedup(alpha, k, c, v_k) for k, v_k in zip(ks, v)]
    best = max(ks, key=lambda k: (predicted[k - 1], -k))
    series = [
        Series("(1−α^(k+1))/(1−α)  tokens per target forward", ks,
               [theory.expected_tokens_per_step(alpha, k) for k in ks]),
        Series("Leviathan bound (1−α^(k+1))/((1−α)(kc+1)), verification = 1 step", ks,
               [theory.leviathan_bound(alpha, k, c) for k in ks]),
        Series("predicted (1−α^(k+1))/((1−α)(v(k+1)+kc))", ks, predicted),
        Series(f"optimal k = {best}", [best], [predicted[best - 1]], kind="markers", text=[f"k*={best}"]),
        Series("v(k+1) = 1 + slope·k, in target steps", ks, v),
    ]
    if measured_v:
        series.append(Series("v(k+1) measured", ks[:len(measured_v) - 1], measured_v[1:k_max + 1], kind="markers"))
    if measured:
        series.append(Series("measured speedup", [k for k, _ in measured], [s for _, s in measured], kind="markers"))
    return figure(f"theory vs measurement (α = {alpha:.2f}, c = {c:.2f}, v slope = {slope:.2f})",
                  "k (draft tokens per round)", "speedup over the target alone / target steps", series)
