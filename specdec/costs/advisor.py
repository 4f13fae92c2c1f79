"""The k advisor: which draft length to use, from a measured acceptance rate and the pair's costs.

Leviathan et al. 2023 (Thm 3.8, Sec. 3.4): with per-token acceptance alpha and cost ratio c the
expected wall-time speedup of k drafts per round is (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)),
which prices the verification of k+1 tokens at one target step. The advisor prices it at the
measured v(k+1) (`specdec.costs.calibration`): the advised k maximises (1 - alpha^(k+1)) / ((1 - alpha)(v(k+1) + k c)).
Leviathan's own argmax is reported next to it. When even the best k gives <= 1, speculative
decoding cannot pay off for this draft on this machine: run the target alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core import theory
from specdec.core.costmodel import CostModel, assumed_costs
from specdec.core.limits import K_MAX


@dataclass
class Advice:
    """The recommended k for one (alpha, costs)."""

    acceptance_rate: float  # alpha-hat the advice is based on
    cost_ratio: float  # c the advice is based on
    k: int  # the argmax in 1..K_MAX of the predicted speedup (verification priced at v(k+1))
    verify_cost: float  # v(k+1) at that k, in target steps (1 when no calibration was given)
    predicted_speedup: float  # predicted speedup at that k
    theoretical_speedup: float  # tokens per target forward (1 - alpha^(k+1)) / (1 - alpha) at that k
    leviathan_k: int  # Leviathan's argmax (verification = 1 step), for comparison
    worthwhile: bool  # predicted_speedup > 1: otherwise the target alone is faster

    @property
    def verdict(self) -> str:
        if self.worthwhile:
            return (f"use k={self.k}: expect {self.predicted_speedup:.2f}x ({self.theoretical_speedup:.2f} "
                    f"tokens/round, verification {self.verify_cost:.2f} steps)")
        return (f"no k pays off (best k={self.k} gives {self.predicted_speedup:.2f}x): run the target alone, "
                "or make the draft cheaper (lower c), closer to the target (higher alpha), or verification cheaper")


def advise(acceptance_rate: float, cost_ratio: float, k_max: int = K_MAX, costs: CostModel | None = None) -> Advice:
    """The k that maximises the predicted speedup for a measured alpha-hat, c and (optional) calibrated v(n)."""
    priced = CostModel(costs.target, cost_ratio, costs.draft_key) if costs else assumed_costs(cost_ratio)
    k = max(range(1, k_max + 1), key=lambda k: (priced.predicted_speedup(acceptance_rate, k), -k))
    speedup = priced.predicted_speedup(acceptance_rate, k)
    return Advice(acceptance_rate, cost_ratio, k, priced.v(k + 1), speedup,
                  theory.expected_tokens_per_step(acceptance_rate, k),
                  theory.optimal_k(acceptance_rate, cost_ratio, k_max), speedup > 1.0)


def speedup_curve(acceptance_rate: float, cost_ratio: float, ks: range | list[int],
                  costs: CostModel | None = None) -> list[float]:
    """The predicted speedup at each k (Leviathan's bound without `costs`): the line the bench's chart draws."""
    priced = CostModel(costs.target, cost_ratio, costs.draft_key) if costs else assumed_costs(cost_ratio)
    return [priced.predicted_speedup(acceptance_rate, k) for k in ks]
