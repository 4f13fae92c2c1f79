"""The metric definitions as data: one `Metric` per field of `specdec.core.trace.Rates`, plus the measured speedup.

`METRICS` is the one place a metric is defined in words: the app's hovers read it (`definitions`), and
`metrics_table` writes the table of docs/metrics.md from it (a test keeps the file equal to it). The numbers
themselves are computed once, from a run's counts, by `specdec.core.trace.Rates.of`.

Units: a *round* is one target verification forward; k is the draft length asked for (the papers' γ). A
round verifies n <= k drafted tokens (n < k only near max_new_tokens, or when a drafter proposes fewer) and
emits the accepted prefix plus one target token: the correction at the first rejection, or a bonus token
when all n pass.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric: what it is called, where it is stored, its symbol and its definition."""

    name: str  # what the app, the CLI and the docs call it
    field: str  # its attribute on DecodeStats and the bench's Summary (specdec.core.trace.Rates)
    symbol: str  # the literature's symbol, or a short formula
    definition: str  # how it is computed from the counts, and which convention it follows


METRICS = (
    Metric("acceptance rate", "acceptance_rate", "α̂",
           "accepted / (accepted + rejections): the per-token acceptance probability α of the theory (Leviathan et "
           "al. 2023), estimated from a run. Drafts after a round's first rejection were never reached: they are "
           "neither accepted nor rejections (counting them biases the rate)."),
    Metric("draft acceptance", "draft_acceptance_rate", "accepted / proposed",
           "accepted / proposed, every drafted token counted, reached or not (vLLM's draft acceptance rate)."),
    Metric("mean accepted length", "mean_accepted_length", "τ",
           "tokens emitted per target forward, the target's own token included: 1 + accepted / rounds (vLLM's "
           "convention), plus the rounds whose leaf (a draft's second choice verified beside its tokens) passed. "
           "Accepted draft tokens per round (0..k, the histogram) exclude both."),
    Metric("per-position acceptance, conditional", "per_position_acceptance", "α̂ᵢ",
           "for draft position i: rounds that accepted draft i / rounds that reached it (drafts 1..i-1 accepted "
           "and draft i proposed), the convention of this lab and SGLang. A position never reached is not a "
           "failure."),
    Metric("per-position acceptance, unconditional", "per_position_unconditional", "Pᵢ",
           "for draft position i: rounds that accepted draft i / all rounds, the convention of vLLM and llama.cpp. "
           "When every round drafts k it is the product of the conditional rates up to i."),
    Metric("cost ratio", "cost_ratio", "c",
           "one draft forward / one target step, both reading one token (Leviathan's c). A run times verification "
           "forwards, not one-token steps, so the target step is its verification time / the sum over rounds of "
           "the calibrated v(n+1) (v = 1 without a calibration)."),
    Metric("verification cost", "verify_cost", "v(k+1)",
           "mean over rounds of v(n+1) (n + 1 + leaves rows where leaves were verified): one verification forward in "
           "one-token target steps (1 = Leviathan's "
           "assumption; measured by specdec.costs.calibration)."),
    Metric("tokens per second", "tokens_per_s", "tokens/s",
           "emitted tokens / wall time of the whole call, prefill included (pooled: summed tokens / summed time, "
           "never a mean of per-run rates)."),
    Metric("tokens per target forward", "theoretical_speedup", "(1 − α^(k+1)) / (1 − α)",
           "the expected tokens per target forward at the run's α̂ and k (Leviathan et al. 2023, Eq. 1; = k+1 at "
           "α = 1): the speedup if drafting and verification were free."),
    Metric("Leviathan bound", "leviathan_bound", "(1 − α^(k+1)) / ((1 − α)(k·c + 1))",
           "the expected wall-time speedup of Leviathan et al. 2023 (Thm 3.8) at the run's α̂, k and c, which "
           "prices a verification forward at one target step."),
    Metric("rounds speedup", "rounds_speedup", "emitted / Σ (v(n+1) + forwards·c)",
           "emitted tokens / the sum over rounds of (v(n+1) + draft forwards · c), c the calibrated one (else the "
           "run's): the speedup the costs predict for the rounds as they ran, prefill and bookkeeping left out."),
    Metric("predicted speedup", "predicted_speedup", "alone ÷ ours, priced",
           "the whole call priced, in seconds: the target alone's prefill and one step plus a plain round's "
           "bookkeeping per emitted token, over this run's prefill (both models), its rounds priced by the "
           "calibrated v(n+1) and c, and its rounds' bookkeeping. The prefills and bookkeeping are the run's own "
           "times, the forwards of the rounds the costs' prediction; the step is the run's verification time / "
           "Σ v(n+1)."),
    Metric("measured speedup", "measured_speedup", "tokens/s ÷ tokens/s alone",
           "tokens/s of the speculative run / tokens/s of the target alone on the same prompt and length, wall time "
           "with prefill (specdec.costs.waterfall walks from tokens per target forward to it one cost at a time)."),
)


def definitions() -> dict[str, str]:
    """{field: definition} of every metric (the app's hover texts)."""
    return {m.field: m.definition for m in METRICS}


def metrics_table() -> str:
    """The Markdown table of METRICS (docs/metrics.md holds exactly this)."""
    rows = [f"| {m.name} | `{m.field}` | {m.symbol} | {m.definition} |" for m in METRICS]
    return "\n".join(["| metric | field | symbol | definition |", "|---|---|---|---|", *rows])
