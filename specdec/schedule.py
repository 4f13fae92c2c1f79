"""How many tokens to draft next round: a fixed k, or k="auto".

k="auto" rule (documented once, here): after every round, k = theory.optimal_k(alpha~, c, K_AUTO_MAX) where
alpha~ = (accepted + 1) / (accepted + rejections + 2) is the running acceptance rate with a uniform prior
(Laplace smoothing: one early all-accepted round does not jump to k_max) and c is the running cost ratio
(mean draft forward / mean target forward). Until a round has been timed, k = K_AUTO_START.
"""
from __future__ import annotations

from . import theory
from .trace import Round

K_AUTO_START = 4  # first-round k before anything is measured
K_AUTO_MAX = 10  # largest k the rule may choose (the dashboard's range)


class FixedK:
    def __init__(self, k: int):
        self.k = self.k_max = k

    def next_k(self) -> int:
        return self.k

    def reported_k(self, rounds: list[Round]) -> int:
        return self.k

    def observe(self, round_: Round) -> None:
        pass


class AdaptiveK:
    """k="auto": the Leviathan-optimal k for the acceptance and cost measured so far in this generation."""

    def __init__(self, k_max: int = K_AUTO_MAX):
        self.k_max = k_max
        self.accepted = self.rejections = self.draft_forwards = self.rounds = 0
        self.draft_time = self.target_time = 0.0

    def next_k(self) -> int:
        if self.draft_forwards == 0:
            return K_AUTO_START
        alpha = (self.accepted + 1) / (self.accepted + self.rejections + 2)
        c = (self.draft_time / self.draft_forwards) / (self.target_time / self.rounds)
        return theory.optimal_k(alpha, c, self.k_max)

    def reported_k(self, rounds: list[Round]) -> int:
        """The k of the stats: the mean draft length per round, rounded."""
        return round(sum(len(r.draft_token_ids) for r in rounds) / max(len(rounds), 1))

    def observe(self, round_: Round) -> None:
        self.accepted += round_.num_accepted
        self.rejections += round_.rejected
        self.draft_forwards += round_.draft_forwards
        self.rounds += 1
        self.draft_time += round_.draft_time_s
        self.target_time += round_.target_time_s
