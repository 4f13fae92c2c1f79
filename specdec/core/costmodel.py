"""What a round costs, as data: the verification curve v(n) and the draft cost c, in one-token target steps.

Measured by `specdec.costs.calibration.calibrate`; read by the engine (to price rounds), the k controller and the
advisor.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specdec.core import theory


@dataclass
class TargetCosts:
    """How a target forward's time grows with the tokens it reads."""

    step_s: float  # median seconds of a one-token forward after CONTEXT_TOKENS tokens
    verify: list[float]  # verify[n-1] = v(n) = median n-token forward / step_s, n = 1..len (verify[0] = 1)
    key: str  # what was measured: model identity, dtype, threads, machine
    rows_first: list[int] = field(default_factory=list)  # sizes whose float32 Linears run faster as W @ x.T


@dataclass
class CostModel:
    """Measured costs of one (target, draft) pair: v(n) and c, in one-token target steps."""

    target: TargetCosts  # the verification curve
    draft_cost: float  # c = one draft forward / one target step (a model-free drafter's proposal time instead)
    draft_key: str  # what the draft cost was measured for
    measured_now: bool = False  # True when this object came from a fresh measurement, not the cache

    def v(self, n: int) -> float:
        """v(n); beyond the calibrated sizes, extended linearly from the last two points (never downwards:
        a noisy last point must not price long verifications below zero)."""
        curve = self.target.verify
        if n <= len(curve):
            return curve[max(n, 1) - 1]
        slope = max(curve[-1] - curve[-2], 0.0) if len(curve) > 1 else 0.0
        return curve[-1] + slope * (n - len(curve))

    def verify_slope(self) -> float:
        """Least-squares slope of v(n) - 1 against n - 1: the line v(n) = 1 + slope·(n - 1) closest to the curve."""
        pairs = [(n, v - 1.0) for n, v in enumerate(self.target.verify)]  # n = tokens beyond the first
        return sum(n * dv for n, dv in pairs) / max(sum(n * n for n, _ in pairs), 1)

    def round_cost(self, drafted: int, draft_forwards: int) -> float:
        """Target steps a round costs: one verification of drafted+1 tokens plus the draft's forwards."""
        return self.v(drafted + 1) + draft_forwards * self.draft_cost

    def predicted_speedup(self, alpha: float, k: int) -> float:
        """E[tokens per round] / (v(k+1) + k*c): the speedup the measured costs predict at acceptance alpha."""
        return theory.predicted_speedup(alpha, k, self.draft_cost, self.v(k + 1))

    def to_dict(self) -> dict:
        return asdict(self)


def assumed_costs(draft_cost: float) -> CostModel:
    """Leviathan's assumption as a CostModel: verification costs one step whatever n (v = 1)."""
    return CostModel(TargetCosts(0.0, [1.0, 1.0], "assumed"), draft_cost, "assumed")
