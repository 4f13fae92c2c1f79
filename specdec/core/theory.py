"""Speedup theory of speculative decoding, and the cost model that makes it predict a measurement.

Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding":
with per-token acceptance rate alpha, k drafted tokens per round (their gamma) and cost ratio
c = (one draft step) / (one target step), both steps reading one token,

- expected tokens emitted per target forward: (1 - alpha^(k+1)) / (1 - alpha)         (Eq. 1)
- expected wall-time improvement, Leviathan's bound: (1 - alpha^(k+1)) / ((1 - alpha)(k*c + 1)) (Thm 3.8)

Theorem 3.8 assumes that verifying k+1 tokens in one forward costs one target step. On real
hardware it costs v(k+1) steps, v(n) = time of a target forward over n new tokens / time of a
one-token step (measured by `specdec.costs.calibration`), so the predicted speedup is

- predicted speedup: (1 - alpha^(k+1)) / ((1 - alpha)(v(k+1) + k*c))

which is Thm 3.8 when v = 1. All tend to k+1 (resp. (k+1)/(v(k+1) + k*c)) as alpha -> 1.
"""
from __future__ import annotations

from specdec.core.limits import K_MAX


def _check(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens emitted per target forward, (1 - alpha^(k+1)) / (1 - alpha); = k+1 at alpha=1."""
    _check(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """Expected speedup over the target alone when a round costs v (verification) + k*c (drafting) steps."""
    if c < 0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    if v <= 0:
        raise ValueError(f"verification cost v must be > 0 target steps, got {v}")
    return expected_tokens_per_step(alpha, k) / (v + k * c)


def leviathan_bound(alpha: float, k: int, c: float) -> float:
    """Leviathan's bound (Thm 3.8), (1 - alpha^(k+1)) / ((1 - alpha)(k*c + 1)): verification assumed to cost one step."""
    return predicted_speedup(alpha, k, c, 1.0)


def optimal_k(alpha: float, c: float, k_max: int = K_MAX) -> int:
    """The k in 1..k_max that maximises `leviathan_bound` (numeric argmax; ties go to the smaller k)."""
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    return max(range(1, k_max + 1), key=lambda k: (leviathan_bound(alpha, k, c), -k))


def tokens_per_round_by_k(position_rates: list[float]) -> list[float]:
    """E[tokens per round] for k = 0..len(position_rates), from conditional acceptance per draft position.

    position_rates[i] = P(draft i+1 accepted | drafts 1..i accepted); with all equal to alpha this is
    Eq. 1 for every k. Entry k = 1 + sum over j <= k of the chance that the first j drafts pass.
    """
    expected, reach = [1.0], 1.0
    for rate in position_rates:
        reach *= rate
        expected.append(expected[-1] + reach)
    return expected
