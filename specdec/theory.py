"""Speedup theory of speculative decoding.

Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding":
with per-token acceptance rate alpha, k drafted tokens per round and cost ratio
c = (draft step time) / (target step time),

- expected tokens emitted per target forward: (1 - alpha^(k+1)) / (1 - alpha)         (Eq. 1)
- expected wall-time improvement:           (1 - alpha^(k+1)) / ((1 - alpha)(k*c + 1)) (Thm 3.8)

Both tend to k+1 (resp. (k+1)/(k*c+1)) as alpha -> 1.
"""
from __future__ import annotations


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


def walltime_speedup(alpha: float, k: int, c: float) -> float:
    """Expected wall-time speedup over the target alone, (1 - alpha^(k+1)) / ((1 - alpha)(k*c + 1))."""
    if c < 0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_step(alpha, k) / (k * c + 1.0)


def optimal_k(alpha: float, c: float, k_max: int = 16) -> int:
    """The k in 1..k_max that maximises `walltime_speedup` (numeric argmax; ties go to the smaller k)."""
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    return max(range(1, k_max + 1), key=lambda k: (walltime_speedup(alpha, k, c), -k))
