"""The k advisor: which draft length to use, from a measured acceptance rate and cost ratio.

Leviathan et al. 2023 (Thm 3.8, Sec. 3.4): with per-token acceptance alpha and cost ratio c the
expected wall-time speedup of k drafts per round is (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1));
the optimal k ("gamma" in the paper) is its argmax, `specdec.theory.optimal_k`. When even the
best k gives <= 1, speculative decoding cannot pay off for this draft: run the target alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import theory
from .limits import K_MAX



@dataclass
class Advice:
    """The recommended k for one (alpha, c)."""

    acceptance_rate: float  # alpha-hat the advice is based on
    cost_ratio: float  # c the advice is based on
    k: int  # the argmax k in 1..K_MAX
    expected_speedup: float  # cost-aware bound at that k
    expected_tokens_per_round: float  # (1 - alpha^(k+1)) / (1 - alpha) at that k
    worthwhile: bool  # expected_speedup > 1: otherwise the target alone is faster

    @property
    def verdict(self) -> str:
        if self.worthwhile:
            return f"use k={self.k}: expect {self.expected_speedup:.2f}x ({self.expected_tokens_per_round:.2f} tokens/round)"
        return (f"no k pays off (best k={self.k} gives {self.expected_speedup:.2f}x): run the target alone, "
                "or make the draft cheaper (lower c) or closer to the target (higher alpha)")


def advise(acceptance_rate: float, cost_ratio: float, k_max: int = K_MAX) -> Advice:
    """Leviathan's optimal k for a measured alpha-hat and c, with the speedup it promises."""
    k = theory.optimal_k(acceptance_rate, cost_ratio, k_max=k_max)
    speedup = theory.walltime_speedup(acceptance_rate, k, cost_ratio)
    return Advice(acceptance_rate, cost_ratio, k, speedup,
                  theory.expected_tokens_per_step(acceptance_rate, k), speedup > 1.0)


def speedup_curve(acceptance_rate: float, cost_ratio: float, ks: range | list[int]) -> list[float]:
    """The cost-aware bound at each k (the line the bench's speedup-vs-k chart draws)."""
    return [theory.walltime_speedup(acceptance_rate, k, cost_ratio) for k in ks]
