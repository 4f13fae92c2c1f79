"""What a benchmark run shows: rows pooled per (draft, k, category), the Markdown report, k advice,
performance targets and greedy divergences.

Pooling adds the rows' `specdec.core.trace.Counts` (never a mean of per-row rates) and computes the metrics
from them with `specdec.core.trace.Rates.of`, the engine's own code: a group's α̂, c, bounds and prediction
are those the engine reports for the same rounds pooled (`specdec.core.trace.pooled_stats`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from specdec.core.costmodel import CostModel, TargetCosts
from specdec.core.trace import Counts, Rates, ratio
from specdec.costs.advisor import advise
from specdec.lab.bench.run import row_counts


@dataclass(kw_only=True)
class Summary(Rates):
    """Pooled metrics of a group of rows (one draft, one k, one category or all): the Rates of the summed
    Counts (tokens_per_s: summed new tokens / summed median wall time of ours), and the bench's comparisons."""

    draft: str  # contender name
    k: str  # draft length ("auto" for the adaptive k: the rates then use the mean draft length, rounded)
    category: str  # category, or "all"
    prompts: int  # cells pooled
    mean_drafted: float  # tokens drafted per round (= k for a fixed k, except near the length limit)
    measured_vs_predicted: float  # speedup_vs_target_alone / predicted_speedup (1 = the cost model is exact)
    target_alone_tok_s: float
    hf_assisted_tok_s: float | None  # None when the draft has no HF column
    hf_plain_tok_s: float | None
    speedup_vs_target_alone: float  # tokens_per_s / target_alone_tok_s
    speedup_vs_hf_assisted: float | None  # tokens_per_s / hf_assisted_tok_s
    identical: str  # greedy: "n/m" cells where ours == target alone; "-" when sampling
    hf_identical: str  # greedy: "n/m" cells where HF assisted == target alone
    draft_share: float  # share of our wall time in draft forwards
    target_share: float  # ... in target verification forwards
    prefill_share: float  # ... in prompt prefill
    overhead_share: float  # ... in everything else (sampling, verification, bookkeeping, Python)
    verify_vs_step: float  # mean verification forward (k+1 tokens) / mean target-alone forward (1 token);
    #                        Leviathan's bound assumes 1: above 1 the bound is out of reach


def summarise(rows: list[dict]) -> list[Summary]:
    """One Summary per (draft, k, category) plus a per-(draft, k) "all" group."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        for category in (row["category"], "all"):
            groups.setdefault((row["draft"], str(row["k"]), category), []).append(row)
    return [_pool(key, group) for key, group in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))]


def _sort_key(key: tuple) -> tuple:
    draft, k, category = key
    return draft, category == "all", category, (0, int(k)) if k.isdigit() else (1, 0)


def pooled_rates(rows: list[dict], k: str) -> Rates:
    """The Rates of the rows' summed Counts at k (a digit string; otherwise the mean draft length, rounded, as
    the engine reports a k="auto" run), the prediction priced at the rows' calibrated c when they have one."""
    counts = sum((row_counts(r) for r in rows), Counts())
    k_rates = int(k) if k.isdigit() else round(ratio(counts.draft_tokens, counts.rounds))
    return Rates.of(counts, k_rates, rows[0]["calibrated_c"])


def _pool(key: tuple, rows: list[dict]) -> Summary:
    draft, k, category = key
    total = lambda name: sum(r[name] for r in rows)  # noqa: E731
    rates = pooled_rates(rows, k)
    alone_tok_s = ratio(total("target_alone_tokens"), total("target_alone_s"))
    assisted = _pooled_rate(rows, "hf_assisted_s")
    wall = total("engine_wall_s")
    inside = total("prefill_time_s") + total("draft_time_s") + total("target_time_s")
    return Summary(
        **asdict(rates), draft=draft, k=k, category=category, prompts=len(rows),
        mean_drafted=ratio(total("draft_tokens"), total("rounds")),
        measured_vs_predicted=ratio(ratio(rates.tokens_per_s, alone_tok_s), rates.predicted_speedup),
        target_alone_tok_s=alone_tok_s, hf_assisted_tok_s=assisted,
        hf_plain_tok_s=_pooled_rate(rows, "hf_plain_s"),
        speedup_vs_target_alone=ratio(rates.tokens_per_s, alone_tok_s),
        speedup_vs_hf_assisted=ratio(rates.tokens_per_s, assisted) if assisted else None,
        identical=_count_true(rows, "ours_equals_target_alone"),
        hf_identical=_count_true(rows, "hf_assisted_equals_target_alone"),
        draft_share=ratio(total("draft_time_s"), wall), target_share=ratio(total("target_time_s"), wall),
        prefill_share=ratio(total("prefill_time_s"), wall), overhead_share=ratio(wall - inside, wall),
        verify_vs_step=ratio(ratio(total("target_time_s"), total("rounds")), _mean(r["target_step_s"] for r in rows)),
    )


def _pooled_rate(rows: list[dict], seconds_field: str) -> float | None:
    """Tokens/s of an HF column over the rows that have it (same token counts as the target alone)."""
    have = [r for r in rows if r[seconds_field] is not None]
    if not have:
        return None
    tokens_field = "hf_assisted_tok_s" if seconds_field == "hf_assisted_s" else "hf_plain_tok_s"
    tokens = sum(r[tokens_field] * r[seconds_field] for r in have)
    return ratio(tokens, sum(r[seconds_field] for r in have))


def _count_true(rows: list[dict], name: str) -> str:
    values = [r[name] for r in rows if r[name] is not None]
    return f"{sum(values)}/{len(values)}" if values else "-"


def _mean(values) -> float:
    values = list(values)
    return ratio(sum(values), len(values))


# --- the Markdown report ---------------------------------------------------------------------

@dataclass(frozen=True)
class Targets:
    """Performance targets the report checks, per draft, at k="auto" when it was run (else the best fixed k)."""

    pooled_speedup: float = 1.8  # all prompts pooled: measured speedup over the target alone
    code_speedup: float = 2.0  # code prompts: measured speedup over the target alone
    summarisation_speedup: float = 3.5  # summarisation prompts (a draft that copies: lookup or MODEL+lookup)
    category_floor: float = 0.97  # no category below this speedup (speculation must never lose much)
    vs_hf_assisted: float = 1.0  # our tokens/s / HF assisted tokens/s (same pair, prompts and k)
    prediction_tolerance: float = 0.10  # |measured / predicted - 1| on every cell with >= prediction_min_tokens
    prediction_min_tokens: int = 48  # shorter cells are dominated by prefill and are not held to the tolerance


COLUMNS = (  # (header, Summary field, format)
    ("draft", "draft", "{}"), ("k", "k", "{}"), ("n", "prompts", "{}"),
    ("α̂", "acceptance_rate", "{:.3f}"), ("mean acc. len", "mean_accepted_length", "{:.2f}"),
    ("c", "cost_ratio", "{:.3f}"), ("v(k+1)", "verify_cost", "{:.2f}"),
    ("(1-α^(k+1))/(1-α)", "theoretical_speedup", "{:.2f}"),
    ("Leviathan bound (v=1)", "leviathan_bound", "{:.2f}"), ("predicted", "predicted_speedup", "{:.2f}x"),
    ("measured vs target alone", "speedup_vs_target_alone", "{:.2f}x"),
    ("measured / predicted", "measured_vs_predicted", "{:.2f}"),
    ("ours vs HF assisted", "speedup_vs_hf_assisted", "{:.2f}x"),
    ("ours tok/s", "tokens_per_s", "{:.2f}"), ("target alone tok/s", "target_alone_tok_s", "{:.2f}"),
    ("HF assisted tok/s", "hf_assisted_tok_s", "{:.2f}"), ("HF generate tok/s", "hf_plain_tok_s", "{:.2f}"),
    ("ours = target alone", "identical", "{}"), ("HF assisted = target alone", "hf_identical", "{}"),
)
PROFILE_COLUMNS = (
    ("draft", "draft", "{}"), ("k", "k", "{}"), ("draft forwards", "draft_share", "{:.0%}"),
    ("target forwards", "target_share", "{:.0%}"), ("prefill", "prefill_share", "{:.0%}"),
    ("overhead", "overhead_share", "{:.0%}"),
    ("verify forward / target step", "verify_vs_step", "{:.2f}"),
)


def format_report(rows: list[dict], targets: Targets = Targets()) -> str:
    """The run's Markdown summary: per-category tables, time profile, k advice, performance targets, divergences."""
    if not rows:
        return "(no results)"
    summaries = summarise(rows)
    first = rows[0]
    parts = [f"# Benchmark: target {first['target']}",
             f"dtype {first['dtype']}, max_new_tokens {first['max_new_tokens']}, temperature {first['temperature']}, "
             f"repeats {first['repeats']} (median), {len({r['prompt_id'] for r in rows})} prompts. "
             "Speedups are ratios of tokens/s measured in this run; metric definitions in docs/metrics.md."]
    for category in _categories(summaries):
        parts += [f"## {category}", _markdown([s for s in summaries if s.category == category], COLUMNS)]
    overall = [s for s in summaries if s.category == "all"]
    parts += ["## Where our wall time goes (all prompts)",
              "Shares of our engine's wall time. The last column is the cost of one verification forward "
              "(k+1 tokens) relative to one target-alone step (1 token): the bound assumes it is 1.",
              _markdown(overall, PROFILE_COLUMNS)]
    parts += ["## Per-position acceptance (all prompts)", POSITIONS_NOTE, _positions_table(overall)]
    parts += ["## k advisor (the k with the best predicted speedup: measured α̂ and c, calibrated v(k+1))",
              _advice_table(rows, summaries)]
    if any(s.k == "auto" for s in overall):
        parts += ['## k="auto" vs the best fixed k (all prompts)', _auto_table(overall)]
    parts += ["## Performance targets", _targets_table(summaries, targets, rows)]
    parts += ["## Greedy divergences", _divergences(rows)]
    return "\n\n".join(parts) + "\n"


POSITIONS_NOTE = ("Draft position i in both conventions: conditional = rounds that accepted draft i / rounds that "
                  "reached it (this lab, SGLang); unconditional = rounds that accepted draft i / all rounds (vLLM, "
                  "llama.cpp).")


def _positions_table(overall: list[Summary]) -> str:
    """One line per (draft, k) and convention: the acceptance at each draft position."""
    width = max((len(s.per_position_acceptance) for s in overall), default=0)
    lines = ["| draft | k | convention | " + " | ".join(f"i={i}" for i in range(1, width + 1)) + " |",
             "|---|---|---|" + "---|" * width]
    for s in overall:
        for convention, rates in (("conditional", s.per_position_acceptance),
                                  ("unconditional", s.per_position_unconditional)):
            cells = [f"{rate:.3f}" for rate in rates] + ["–"] * (width - len(rates))
            lines.append(f"| {s.draft} | {s.k} | {convention} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _categories(summaries: list[Summary]) -> list[str]:
    return sorted({s.category for s in summaries} - {"all"}) + ["all"]


def _markdown(items: list, columns: tuple) -> str:
    header = "| " + " | ".join(h for h, _, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = ["| " + " | ".join(cell_text(getattr(item, f), fmt) for _, f, fmt in columns) + " |" for item in items]
    return "\n".join([header, rule, *lines])


def cell_text(value, fmt: str) -> str:
    """A table cell: `value` formatted, or a dash where there is none."""
    return "–" if value is None else fmt.format(value)


@dataclass
class AdviceRow:
    """The advisor's view of one (draft, category)."""

    draft: str  # contender
    category: str  # category or "all"
    acceptance_rate: float  # pooled over every fixed k measured
    cost_ratio: float  # pooled over every fixed k measured (one draft forward / one target step)
    recommended_k: int  # argmax of the predicted speedup, verification priced at the calibrated v(k+1)
    verify_cost: float  # v(recommended_k + 1) in target steps
    predicted_speedup: float  # predicted speedup at recommended_k
    leviathan_k: int  # Leviathan's argmax, which assumes verification costs one step
    best_measured_k: str  # the k with the highest measured speedup vs the target alone
    best_measured_speedup: float  # that speedup
    verdict: str  # one line


def advice_rows(rows: list[dict], summaries: list[Summary] | None = None) -> list[AdviceRow]:
    """k advice per (draft, category) from the pooled fixed-k measurements and the pair's calibrated v(n).

    Leviathan's bound prices a verification forward of k+1 tokens at one target step; the advice prices
    it at the calibrated v(k+1) stored in the rows (`specdec.costs.calibration`; v = 1 when a run has none), so a
    model-free draft (c = 0) is not advised the largest k on hardware where verification is not free.
    """
    summaries = summaries if summaries is not None else summarise(rows)
    result = []
    for draft, category in sorted({(s.draft, s.category) for s in summaries}):
        fixed = [r for r in rows if r["draft"] == draft and str(r["k"]).isdigit()
                 and category in (r["category"], "all")]
        if not fixed:
            continue
        pooled = pooled_rates(fixed, "pooled")
        advice = advise(pooled.acceptance_rate, pooled.cost_ratio, costs=row_costs(fixed[0]))
        best = max((s for s in summaries if s.draft == draft and s.category == category),
                   key=lambda s: s.speedup_vs_target_alone)
        result.append(AdviceRow(draft, category, pooled.acceptance_rate, pooled.cost_ratio, advice.k,
                                advice.verify_cost, advice.predicted_speedup, advice.leviathan_k, best.k,
                                best.speedup_vs_target_alone, advice.verdict))
    return result


def row_costs(row: dict) -> CostModel | None:
    """The calibrated costs a row was measured with (None for a run without a calibration)."""
    if not row.get("verify_curve"):
        return None
    return CostModel(TargetCosts(row["target_step_s"], row["verify_curve"], ""), row["calibrated_c"], "")


ADVICE_COLUMNS = (
    ("draft", "draft", "{}"), ("category", "category", "{}"), ("α̂", "acceptance_rate", "{:.3f}"),
    ("c", "cost_ratio", "{:.3f}"), ("advised k", "recommended_k", "{}"), ("v(k+1)", "verify_cost", "{:.2f}"),
    ("predicted speedup", "predicted_speedup", "{:.2f}x"), ("Leviathan's k (v=1)", "leviathan_k", "{}"),
    ("best measured k", "best_measured_k", "{}"),
    ("its measured speedup", "best_measured_speedup", "{:.2f}x"), ("advice", "verdict", "{}"),
)


def _advice_table(rows: list[dict], summaries: list[Summary]) -> str:
    return _markdown(advice_rows(rows, summaries), ADVICE_COLUMNS)


def _auto_table(overall: list[Summary]) -> str:
    lines = ["| draft | auto: measured speedup | mean k drafted | best fixed k | its measured speedup | auto / best fixed |",
             "|---|---|---|---|---|---|"]
    for draft in sorted({s.draft for s in overall}):
        auto = next((s for s in overall if s.draft == draft and s.k == "auto"), None)
        fixed = [s for s in overall if s.draft == draft and s.k.isdigit()]
        if auto is None or not fixed:
            continue
        best = max(fixed, key=lambda s: s.speedup_vs_target_alone)
        lines.append(f"| {draft} | {auto.speedup_vs_target_alone:.2f}x | {auto.mean_drafted:.2f} | {best.k} | "
                     f"{best.speedup_vs_target_alone:.2f}x | "
                     f"{ratio(auto.speedup_vs_target_alone, best.speedup_vs_target_alone):.2f} |")
    return "\n".join(lines)


@dataclass
class TargetCheck:
    """One performance target, measured."""

    draft: str  # contender
    target: str  # what is asked
    k: str  # the k it was measured at (the best measured k over all prompts)
    measured: float | None  # the measured ratio
    required: float  # the threshold
    met: str  # "yes" / "no" / "n/a"


def target_checks(summaries: list[Summary], targets: Targets = Targets(), rows: list[dict] = ()) -> list[TargetCheck]:
    """Each target of `targets`, per draft, at k="auto" when it was run, else at the best fixed k over all prompts."""
    checks = []
    for draft in sorted({s.draft for s in summaries}):
        mine = [s for s in summaries if s.draft == draft]
        overall = [s for s in mine if s.category == "all"]
        chosen = next((s for s in overall if s.k == "auto"), max(overall, key=lambda s: s.speedup_vs_target_alone))
        at_k = {s.category: s for s in mine if s.k == chosen.k}
        checks.append(_check(draft, "all prompts: speedup vs target alone", chosen.k,
                             chosen.speedup_vs_target_alone, targets.pooled_speedup))
        for category, required in (("code", targets.code_speedup), ("summarisation", targets.summarisation_speedup)):
            if category in at_k:
                checks.append(_check(draft, f"{category}: speedup vs target alone", chosen.k,
                                     at_k[category].speedup_vs_target_alone, required))
        worst = min((s for s in at_k.values() if s.category != "all"), key=lambda s: s.speedup_vs_target_alone)
        checks.append(_check(draft, f"worst category ({worst.category}): speedup", chosen.k,
                             worst.speedup_vs_target_alone, targets.category_floor))
        checks.append(_check(draft, "ours / HF assisted tokens/s", chosen.k, chosen.speedup_vs_hf_assisted,
                             targets.vs_hf_assisted))
        cells = [r for r in rows if r["draft"] == draft and r["new_tokens"] >= targets.prediction_min_tokens]
        if cells:
            within = sum(abs(ratio(r["speedup_vs_target_alone"], r["predicted_speedup"]) - 1)
                         <= targets.prediction_tolerance for r in cells)
            checks.append(_check(draft, f"cells with measured within ±{targets.prediction_tolerance:.0%} of predicted",
                                 "all", within / len(cells), 1.0))
    return checks


def _check(draft: str, what: str, k: str, measured: float | None, required: float) -> TargetCheck:
    met = "n/a" if measured is None else ("yes" if measured >= required else "no")
    return TargetCheck(draft, what, k, measured, required, met)


TARGET_COLUMNS = (
    ("draft", "draft", "{}"), ("target", "target", "{}"), ("at k", "k", "{}"),
    ("measured", "measured", "{:.2f}"), ("required", "required", "≥ {:.2f}"), ("met", "met", "{}"),
)


def _targets_table(summaries: list[Summary], targets: Targets, rows: list[dict]) -> str:
    return _markdown(target_checks(summaries, targets, rows), TARGET_COLUMNS)


def _divergences(rows: list[dict]) -> str:
    """Every greedy cell whose output differs from the target alone, by method."""
    lines = []
    for r in rows:
        for method in ("ours", "hf_assisted", "hf_plain"):
            if r.get(f"{method}_equals_target_alone") is False:
                where = f" at {_divergence_text(r)}" if method == "ours" else ""
                lines.append(f"- {method} ≠ target alone: draft {r['draft']}, k={r['k']}, prompt {r['prompt_id']}{where}")
    if not lines and rows[0]["temperature"] > 0:
        return "Sampling run (temperature > 0): outputs are not expected to match token by token."
    return "\n".join(lines) if lines else "None: every greedy output matched the target alone token for token."


def _divergence_text(row: dict) -> str:
    """Where and why ours left the target alone (the engine's explanation when the row has one)."""
    divergence = row.get("divergence") or {}
    return divergence.get("describe", f"token {row['first_divergence']}")
