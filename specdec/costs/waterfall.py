"""From Leviathan's bound to the measured speedup, one cost at a time (the cost waterfall).

Each step is a speedup over the target alone; going down the list adds one cost the step before
ignored (definitions in `specdec.core.metrics`):

1. tokens per target forward, Eq. 1 of Leviathan et al. 2023 at the run's alpha-hat and k: drafting and
   verification are free;
2. / (1 + k*c): each round also pays k draft steps (Leviathan's bound, Thm 3.8);
3. * (1 + k*c) / (v(k+1) + k*c): the verification forward costs v(k+1) one-token steps, not one;
4. the rounds as they ran: emitted tokens / sum of (v(n+1) + draft forwards * c) (`rounds_speedup`),
   i.e. the real accepted lengths and draft lengths instead of Eq. 1's geometric law;
5. + prefill and bookkeeping = predicted: both runs also read the prompt (this run's draft too) and keep each
   round's books (`predicted_speedup`: this run's own times, a plain round's bookkeeping per token for the target
   alone);
6. measured: tokens/s / tokens/s of the target alone; the step from 5 is what the costs mispriced (v and c against
   this run's forwards, the plain round's bookkeeping).

`theory_steps` gives steps 1-3 for chosen alpha, k, c and v (the theory tab).
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core import theory
from specdec.core.trace import GenerationResult, measured_speedup


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
    prediction); the measured step needs `baseline`, the target alone on the same prompt."""
    s = result.stats
    steps = theory_steps(s.acceptance_rate, s.k, s.cost_ratio, s.verify_cost)
    steps.append(Step("the rounds as they ran", s.rounds_speedup,
                      "emitted tokens / Σ over rounds of (v(n+1) + draft forwards·c): real accepted lengths"))
    steps.append(Step("+ prefill and bookkeeping = predicted", s.predicted_speedup,
                      f"prefill {s.prefill_time_s * 1e3:.0f} ms (the draft's {s.draft_prefill_time_s * 1e3:.0f}), "
                      f"bookkeeping {s.overhead_time_s * 1e3:.0f} ms over {s.rounds} rounds"))
    if baseline is None or not result.token_ids:
        return steps
    steps.append(Step("measured", measured_speedup(s, baseline.stats),
                      "tokens/s ÷ tokens/s of the target alone; the step is what the costs mispriced"))
    return steps
