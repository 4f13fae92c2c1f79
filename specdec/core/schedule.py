"""How many tokens to draft next round: a fixed k, or k="auto" (a cost-aware controller).

k="auto" rule (documented once, here). Before every round the controller picks the k in
0..K_AUTO_MAX that maximises predicted tokens per unit of time,

    E_k / cost_k,   E_k = 1 + sum_{j<=k} prod_{i<=j} a_i   (`theory.tokens_per_round_by_k`)
                    cost_k = v(k+1) + k*c                   (`specdec.costs.calibration`; v = 1 without a calibration)

where a_i is the running conditional acceptance at draft position i: accepted there / reached there,
counts decayed by DECAY each round (recent rounds count most) and shrunk (PRIOR_ROUNDS pseudo-rounds)
towards a_(i-1), the first towards the pooled rate, so a position seldom reached borrows the rate of the
one before it. c is the
calibrated draft cost, or the run's own measurement. k = 0 (a plain target step, cost v(1) = 1, one
token) wins whenever no k is predicted to beat the target alone; after PROBE_AFTER rounds at k = 0 the
controller drafts one token to look again. Until a round has been observed, k = K_AUTO_START.
"""
from __future__ import annotations

from specdec.core import theory
from specdec.core.costmodel import CostModel
from specdec.core.limits import K_AUTO_MAX, K_AUTO_START
from specdec.core.trace import Round, ratio

DECAY = 0.9  # weight of the past per round: about the last 10 rounds decide
PRIOR_ROUNDS = 1.0  # pseudo-rounds at the pooled acceptance rate added to every position
PROBE_AFTER = 8  # rounds of k = 0 before one probe with k = 1


def mean_draft_length(rounds: list[Round]) -> int:
    """The k of the stats of a k="auto" run: the mean draft length per round, rounded."""
    return round(sum(len(r.draft_token_ids) for r in rounds) / max(len(rounds), 1))


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
    """k="auto": the k (0 allowed) with the most predicted tokens per second, from acceptance and costs so far."""

    def __init__(self, costs: CostModel | None = None, k_max: int = K_AUTO_MAX):
        self.costs = costs  # calibrated v(n) and c; None = v(n) = 1 and c measured in this run
        self.k_max = k_max
        self.reached = [0.0] * k_max  # decayed count of rounds that reached draft position i
        self.accepted = [0.0] * k_max  # decayed count of rounds that accepted it
        self.rounds_at_zero = 0  # consecutive rounds the controller chose k = 0
        self.draft_time = self.target_time = 0.0  # for c when there is no calibration
        self.draft_forwards = self.observed = 0

    def next_k(self) -> int:
        if self.observed == 0:
            return min(K_AUTO_START, self.k_max)
        gains = [e / self._cost(k) for k, e in enumerate(theory.tokens_per_round_by_k(self.position_rates()))]
        best = max(range(len(gains)), key=lambda k: (gains[k], -k))
        self.rounds_at_zero = self.rounds_at_zero + 1 if best == 0 else 0
        if self.rounds_at_zero > PROBE_AFTER:
            self.rounds_at_zero = 0
            return 1
        return best

    def position_rates(self) -> list[float]:
        """a_i per draft position: decayed accepted / reached, shrunk towards the previous position's a_(i-1).

        The first position is shrunk towards the pooled rate (Laplace: 1/2 before any data). A position the
        controller has not drafted lately thus inherits the rate of the one before it, so after rounds that
        accepted everything a longer k is predicted to pay, and tried."""
        prior = (sum(self.accepted) + 1.0) / (sum(self.reached) + 2.0)
        rates = []
        for accepted, reached in zip(self.accepted, self.reached):
            prior = (accepted + PRIOR_ROUNDS * prior) / (reached + PRIOR_ROUNDS)
            rates.append(prior)
        return rates

    def reported_k(self, rounds: list[Round]) -> int:
        return mean_draft_length(rounds)

    def observe(self, round_: Round) -> None:
        self.observed += 1
        self.reached = [x * DECAY for x in self.reached]
        self.accepted = [x * DECAY for x in self.accepted]
        for i in range(min(len(round_.draft_token_ids), round_.num_accepted + 1, self.k_max)):
            self.reached[i] += 1.0
            self.accepted[i] += i < round_.num_accepted
        self.draft_time += round_.draft_time_s
        self.draft_forwards += round_.draft_forwards
        self.target_time += round_.target_time_s / self._v(len(round_.draft_token_ids) + 1)

    def _cost(self, k: int) -> float:
        """Target steps a round with k drafts costs: v(k+1) + k*c."""
        return self._v(k + 1) + k * self._c()

    def _v(self, n: int) -> float:
        return self.costs.v(n) if self.costs else 1.0

    def _c(self) -> float:
        if self.costs is not None:
            return self.costs.draft_cost
        return ratio(ratio(self.draft_time, self.draft_forwards), ratio(self.target_time, self.observed))
