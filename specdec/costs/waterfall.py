"""From Leviathan's bound to the measured speedup, one cost at a time (the cost waterfall).

Each step is a speedup over the target alone; going down the list adds one cost the step before
ignored (definitions in `specdec.core.metrics`):

1. tokens per target forward, Eq. 1 of Leviathan et al. 2023 at the run's alpha-hat and k: drafting and
   verification are free;
2. / (1 + k*c): each round also pays k draft steps (Leviathan's bound, Thm 3.8);
3. * (1 + k*c) / (v(k+1) + k*c): the verification forward costs v(k+1) one-token steps, not one;
4. the rounds as they ran: emitted tokens / sum of (v(n+1) + draft forwards * c) (`predicted_speedup`),
   i.e. the real accepted lengths and draft lengths instead of Eq. 1's geometric law;
5. + prefill: both runs also read the prompt once (times measured in this run and its baseline);
6. measured: tokens/s / tokens/s of the target alone; the step from 5 is the remaining per-round overhead
   (sampling, cache bookkeeping, Python) that no cost above prices.

`theory_steps` gives steps 1-3 for chosen alpha, k, c and v (the theory tab).
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core import theory
from specdec.core.trace import GenerationResult, measured_speedup, ratio


@dataclass(frozen=True)
class Step:
    """One bar of the waterfall."""

    label: str  # what this step adds, in words
    value: float  # speedup over the target alone after this step
    formula: str  # how `value` is computed from the step before (hover text)


def theory_steps(alpha: float, k: int, c: float, v: float) -> list[Step]:
    """Eq. 1 -> Leviathan's bound -> priced verification, for alpha, k, c and v = v(k+1)."""
    tokens = theory.expected_tokens_per_step(alpha, k)
    return [
        Step("Eq. 1: tokens per target forward", tokens, f"(1 − α^(k+1))/(1 − α) at α = {alpha:.3f}, k = {k}"),
        Step("÷ (1 + k·c) drafting = Leviathan's bound", theory.leviathan_bound(alpha, k, c),
             f"÷ (1 + {k}·{c:.3f})"),
        Step("verification at v(k+1) steps", theory.predicted_speedup(alpha, k, c, v),
             f"verification costs v(k+1) = {v:.2f} target steps, not 1"),
    ]


def cost_waterfall(result: GenerationResult, baseline: GenerationResult | None = None) -> list[Step]:
    """The steps from Eq. 1 to the measurement for `result` (its stats carry alpha-hat, k, c, v and the
    prediction); the prefill and measured steps need `baseline`, the target alone on the same prompt."""
    s = result.stats
    steps = theory_steps(s.acceptance_rate, s.k, s.cost_ratio, s.verify_cost)
    steps.append(Step("the rounds as they ran = predicted", s.predicted_speedup,
                      "emitted tokens / Σ over rounds of (v(n+1) + draft forwards·c): real accepted lengths"))
    if baseline is None or not result.token_ids:
        return steps
    b = baseline.stats
    step_s = ratio(b.target_time_s, b.rounds)  # one target step, measured by the target alone
    alone = len(result.token_ids) * step_s  # the target alone's decode of as many tokens, in seconds
    ours = ratio(alone, s.predicted_speedup)  # the speculative decode the costs predict, in seconds
    with_prefill = ratio(alone + b.prefill_time_s, ours + s.prefill_time_s)
    steps.append(Step("+ prefill", with_prefill,
                      f"prefill {s.prefill_time_s * 1e3:.0f} ms here, {b.prefill_time_s * 1e3:.0f} ms for the "
                      "target alone"))
    steps.append(Step("− overhead = measured", measured_speedup(s, b),
                      "tokens/s ÷ tokens/s of the target alone; the step is sampling, cache bookkeeping, Python"))
    return steps
