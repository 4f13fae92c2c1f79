"""How many tokens to draft next round: a fixed k, or k="auto" (a cost-aware controller).

k="auto" rule (documented once, here). Before every round the controller picks the k in
0..K_AUTO_MAX that maximises predicted tokens per second,

    E_k / time_k,   E_k = 1 + sum_{j<=k} prod_{i<=j} a_i            (`theory.tokens_per_round_by_k`)
                    time_k = step·v(k+1) + k·(draft + extra) + base  (seconds, `RoundPrices`)

where a_i is the running conditional acceptance at draft position i: accepted there / reached there,
counts decayed by DECAY each round that drafted (recent rounds count most) and shrunk (PRIOR_ROUNDS pseudo-rounds)
towards a_(i-1), the first towards the pooled rate, so a position seldom reached borrows the rate of the
one before it. Every price is what this run paid, decayed like the counts: step = a target forward over
one token at the run's context (verification time / v(n)), draft = one draft forward over one token (a probe's
first forward, which also caught the draft up on the m tokens it missed, counts as v(m + 1) of them), extra = what
a drafted token costs besides its forward (choosing it, its distribution), base = what a round costs besides its
forwards (verification rule, logits; until a plain step has priced it alone, the two are split by a least-squares
line through the drafting rounds' overheads against their drafted tokens, `OverheadFit`, once those vary); v(n) is
the calibrated curve's shape (`specdec.costs.calibration`; v = 1 without one). Before a price is measured the
calibration's is used (step_s, c·step_s), else Leviathan's (v = 1, c = 0).
k = 0 (a plain target step: step + base for one token, the target alone's price) is chosen unless some k is
predicted to beat it by MARGIN. At k = 0 the controller drafts one token to look again (a probe) once the plain
steps since it last drafted have cost 1/EXPLORE times the probe's predicted price: the draft's catch-up over every
token it missed, one forward of m tokens priced draft·v(m) (v's shape stands in for the draft's own), plus what a
round with one draft costs over a plain one. So looking again never costs more than EXPLORE of the time spent at
k = 0, and a draft left behind for long is looked at less often, as its catch-up grows; yet never more than
LOOK_AFTER_MAX plain steps pass without a look (a catch-up that grows faster than the budget would otherwise end
the looking for good). A draft that has just drafted is caught up, and a look costs it no catch-up, so it is
dropped on firmer evidence than it is taken back on: no verdict against drafting is taken before EVIDENCE rounds
(decayed) have judged the first draft position (an unlucky first round or two then cost a few one-draft rounds,
not plain steps and looks that each pay a catch-up), and a caught-up draft keeps drafting one token a round while a
one-draft round breaks even at a_1 + OPTIMISM standard deviations of its estimate (`may_pay`): near break-even,
a few unlucky rounds would otherwise leave a paying draft behind for the rest of the run. Until a round has been
observed, k = K_AUTO_START.

A round given at most one model draft may verify a copy instead: where the drafter copies for free (a hybrid's
prompt lookup, `copy`), the engine asks `copy_k` how many of the copied tokens to verify, priced like a draft round
without draft forwards, from the copy rounds' own per-position rates (kept apart from the model's; Laplace's 1/2
before any), against the round chosen; such a copy round counts for the model as time without drafting.

Under greedy decoding the draft's confidence bends k both ways. A model draft prices every token it drafts: it
drafts one more only while that is predicted to raise the round's tokens per second, E_j / time_j against
(E_j + P_j·q_j) / time_(j+1), where q_i is the probability the draft gave its i-th token, P_j = q_1···q_j the chance
the first j pass, E_j = 1 + P_1 + ... + P_j and time_j the round's price above (`SamplingPolicy.pays`; the last
token's confidence stands for the next one's). So an unsure token ends a round sooner where drafting is dear (a
costly draft, a steep v), later where it is cheap: the price, not a threshold, decides. And it goes on past k, up to
K_AUTO_MAX, while each token it drafts gets more than GO_ON_ABOVE and the next still pays (a run of sure tokens, a
copy or boilerplate, passes at rates the position counts, made of every round, understate; EAGLE-2's dynamic draft
trees and SpecDec++'s stopping rule rest on the same signal, a draft's confidence tracking its acceptance). Tokens
drafted past k are counted at their positions like any others. A fixed k always drafts k.

Where a round also verifies leaves (greedy, a row-invariant target: the draft's second choices priced to pay,
`SamplingPolicy.leaves`, verified with the rows of `row_times`), a round of k >= 1 drafts is credited the leaves this
run's drafting rounds passed and priced the leaf rows they verified, each a decayed mean per drafting round: a
round's worth is then what it yields with its leaves, and their rows are paid for in its price.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdec.core import theory
from specdec.core.costmodel import CostModel
from specdec.core.limits import K_AUTO_MAX, K_AUTO_START
from specdec.core.trace import COPY, Round

DECAY = 0.9  # weight of the past per round: about the last 10 rounds decide
PRIOR_ROUNDS = 1.0  # pseudo-rounds at the pooled acceptance rate added to every position
EXPLORE = 0.02  # probes at k = 0 may cost at most this share of the time spent in plain steps
LOOK_AFTER_MAX = 128  # ... yet at most this many plain steps pass between two looks
EVIDENCE = 3.0  # rounds that judged the first draft position (decayed) before a verdict against drafting
OPTIMISM = 0.5  # standard deviations above a_1's estimate at which a caught-up draft stays in play (k = 1)
MARGIN = 0.05  # drafting must be predicted this much faster than a plain step to be chosen (noise, misprediction)
SPREAD_MIN = 0.05  # variance of the drafted tokens per round below which the overheads are not split by a line
GO_ON_ABOVE = 0.8  # greedy, k="auto": past the k chosen, drafting goes on (to K_AUTO_MAX) while tokens get more
# (chosen on the suites' dev split, docs/performance.md "The confidence thresholds again"), and while it pays


def mean_draft_length(rounds: list[Round]) -> int:
    """The k of the stats of a k="auto" run: the mean draft length per round, rounded."""
    return round(sum(len(r.draft_token_ids) for r in rounds) / max(len(rounds), 1))


class FixedK:
    go_on_above = math.inf  # a fixed k drafts k tokens, never more however sure (and never fewer: no prices)

    def __init__(self, k: int):
        self.k = self.k_max = k

    def next_k(self) -> int:
        return self.k

    def reported_k(self, rounds: list[Round]) -> int:
        return self.k

    def copy_k(self, available: int, k: int = 0) -> int:
        return 0  # a fixed k never adds copy rounds

    def round_times(self, most: int) -> tuple[float, ...]:
        return ()  # no prices: every round drafts k

    def row_times(self, most: int) -> tuple[float, ...]:
        return ()  # no prices: no leaves

    def observe(self, round_: Round) -> None:
        pass


@dataclass
class RoundPrices:
    """Seconds this run paid per unit of work, as decayed means (each None until measured)."""

    step: float | None = None  # a target forward over one token: verification time / v(n)
    draft: float | None = None  # one draft forward
    extra: float | None = None  # per drafted token, besides its forward
    base: float | None = None  # per round, besides its forwards
    weights: dict = field(default_factory=dict)  # decayed sample count of each price

    def add(self, name: str, value: float) -> None:
        weight = self.weights.get(name, 0.0) * DECAY
        old = getattr(self, name)
        setattr(self, name, value if old is None else (old * weight + value) / (weight + 1.0))
        self.weights[name] = weight + 1.0


@dataclass
class OverheadFit:
    """A drafting round's overhead o against its drafted tokens d, o = base + extra·d, by least squares over the
    rounds (decayed as the prices are): what a round pays besides its forwards, split into its part per round and its
    part per drafted token before a plain step has priced the first alone (a drafting round alone cannot tell them
    apart, and pricing plain steps without theirs favours them by about a step's 5 %)."""

    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # decayed sums of 1, d, d², o, d·o

    def add(self, drafted: int, overhead: float) -> None:
        terms = (1.0, drafted, drafted * drafted, overhead, drafted * overhead)
        self.sums = [total * DECAY + term for total, term in zip(self.sums, terms)]

    def fitted(self) -> tuple[float, float] | None:
        """(base, extra) in seconds, each at least 0; None while d has varied less than SPREAD_MIN."""
        weight, d, dd, o, do = self.sums
        spread = dd * weight - d * d  # weight² · the variance of d
        if weight <= 0 or spread <= SPREAD_MIN * weight * weight:
            return None
        extra = max((do * weight - d * o) / spread, 0.0)
        return max((o - extra * d) / weight, 0.0), extra


class AdaptiveK:
    """k="auto": the k (0 allowed) with the most predicted tokens per second, from acceptance and costs so far."""

    def __init__(self, costs: CostModel | None = None, k_max: int = K_AUTO_MAX):
        self.costs = costs  # calibrated v(n) and c: v's shape, and the prices until this run has measured its own
        self.k_max = k_max
        self.go_on_above = GO_ON_ABOVE  # a round's drafting goes on past the k chosen (to k_max) while this sure
        self.reached = [0.0] * k_max  # decayed count of rounds that reached draft position i
        self.accepted = [0.0] * k_max  # decayed count of rounds that accepted it
        self.copy_reached = [0.0] * k_max  # the same for copy rounds' position i (a source of its own)
        self.copy_accepted = [0.0] * k_max
        self.leaves = [0.0, 0.0, 0.0]  # decayed over the rounds a model drafted in: rounds, leaf rows, leaves passed
        self.plain_s = 0.0  # seconds of plain steps (k = 0) since the draft last drafted
        self.missed = 0  # tokens emitted since the draft last drafted: its catch-up at the next probe
        self.prices = RoundPrices()
        self.overheads = OverheadFit()  # base and extra until a plain step has measured base
        self.observed = 0

    def next_k(self) -> int:
        if self.observed == 0:
            return min(K_AUTO_START, self.k_max)
        speeds = self.speeds()
        best = max(range(len(speeds)), key=lambda k: (speeds[k], -k))
        if speeds[best] < speeds[0] * (1.0 + MARGIN):
            best = 0
        if best > 0:
            return best
        if self.reached[0] < EVIDENCE or (self.missed == 0 and self.may_pay()):
            return 1  # the draft stays in play, one token a round
        return 1 if self.missed >= LOOK_AFTER_MAX or self.plain_s * EXPLORE >= self.probe_price() else 0

    def may_pay(self) -> bool:
        """Whether one draft a round would break even at the first position's optimistic rate, a_1 + OPTIMISM
        standard deviations of its estimate (binomial, over the decayed rounds that judged it plus the prior's)."""
        rate = self.position_rates()[0]
        upper = min(rate + OPTIMISM * (rate * (1.0 - rate) / (self.reached[0] + PRIOR_ROUNDS + 1.0)) ** 0.5, 1.0)
        plain, one_draft = self.speeds([upper])
        return one_draft >= plain

    def speeds(self, rates: list[float] | None = None) -> list[float]:
        """Predicted tokens per second of a round of k model drafts, k = 0..len(rates), at `rates` per draft
        position (default: the measured `position_rates`)."""
        expected = theory.tokens_per_round_by_k(self.position_rates() if rates is None else rates)
        rounds, rows, passed = self.leaves
        rows, passed = (rows / rounds, passed / rounds) if rounds else (0.0, 0.0)  # per drafting round
        drafting = [(e + passed) / self.round_time(k, rows) for k, e in enumerate(expected[1:], start=1)]
        return [expected[0] / self.round_time(0), *drafting]

    def probe_price(self) -> float:
        """Predicted seconds a probe (k = 1) costs over a plain step: the draft's catch-up over the `missed` tokens
        in its one forward (draft·v(missed + 1) instead of draft), and a round of one draft over a plain one."""
        catch_up = self._price("draft") * (self._v(self.missed + 1) - 1.0)
        return catch_up + self.round_time(1) - self.round_time(0)

    def position_rates(self) -> list[float]:
        """a_i per draft position: decayed accepted / reached, shrunk towards the previous position's a_(i-1).

        The first position is shrunk towards the pooled rate (Laplace: 1/2 before any data). A position the
        controller has not drafted lately thus inherits the rate of the one before it, so after rounds that
        accepted everything a longer k is predicted to pay, and tried."""
        return _shrunk_rates(self.accepted, self.reached)

    def copy_k(self, available: int, k: int = 0) -> int:
        """How many of `available` copied tokens (prompt lookup, no model forward) a round the controller gave k
        model drafts verifies instead: the j in 0..available with the most predicted tokens per second, a copy of j
        priced step·v(j+1) + base, from the copy rounds' own rates (0 unless j beats by MARGIN the round chosen:
        k = 0 a plain step, else k drafts at the model's rates). A copy is free to draft but not to verify: a failed
        one costs v(j+1) - 1 steps."""
        if available == 0 or self.observed == 0:
            return 0
        rates = _shrunk_rates(self.copy_accepted, self.copy_reached)[:available]
        speeds = [e / (self._price("step") * self._v(j + 1) + self._price("base"))
                  for j, e in enumerate(theory.tokens_per_round_by_k(rates))]
        best = max(range(len(speeds)), key=lambda j: (speeds[j], -j))
        return best if best and speeds[best] >= self.speeds()[k] * (1.0 + MARGIN) else 0

    def reported_k(self, rounds: list[Round]) -> int:
        return mean_draft_length(rounds)

    def observe(self, round_: Round) -> None:
        self.observed += 1
        if round_.draft_source == COPY:
            self._observe_copy(round_)
            return
        drafted = len(round_.draft_token_ids)
        caught_up = self.missed if drafted else 0  # tokens the round's first draft forward read besides its own
        if drafted:  # a plain step says nothing of the draft: what was learnt is not forgotten meanwhile
            self.reached, self.accepted = _counted(self.reached, self.accepted, round_)
            self.leaves = [total * DECAY + this for total, this in
                           zip(self.leaves, (1.0, len(round_.leaf_token_ids), round_.leaf_passed))]
            self.plain_s, self.missed = 0.0, 0
        else:
            self.plain_s += round_.wall_time_s or round_.target_time_s
            self.missed += 1  # a plain step emits one token
        self._observe_step(round_)
        self._observe_prices(round_, caught_up)

    def _observe_copy(self, round_: Round) -> None:
        """A copy round: its positions counted apart (the copy's own rates), the target step priced; for the model
        it is time without drafting, as plain steps are (its catch-up grows by the tokens emitted)."""
        self.copy_reached, self.copy_accepted = _counted(self.copy_reached, self.copy_accepted, round_)
        self.plain_s += round_.wall_time_s or round_.target_time_s
        self.missed += len(round_.emitted_token_ids)
        self._observe_step(round_)

    def _observe_step(self, round_: Round) -> None:
        if round_.target_time_s > 0:
            self.prices.add("step", round_.target_time_s / self._v(round_.rows))

    def _observe_prices(self, round_: Round, caught_up: int) -> None:
        """The draft's price, and what a round and a drafted token cost besides their forwards."""
        drafted = len(round_.draft_token_ids)
        if round_.draft_forwards:  # the first forward caught up on the tokens missed: priced draft·v(caught_up + 1)
            forwards = round_.draft_forwards - 1 + self._v(caught_up + 1)
            self.prices.add("draft", round_.draft_time_s / forwards)
        if round_.wall_time_s <= 0:
            return  # a round without its wall time (made by hand): forwards only
        rest = round_.overhead_s
        if drafted == 0:
            self.prices.add("base", rest)
        else:
            self.prices.add("extra", max(rest - (self.prices.base or 0.0), 0.0) / drafted)
            self.overheads.add(drafted, rest)

    def round_time(self, k: int, leaves: float = 0.0) -> float:
        """Predicted seconds of a round with k drafts (and `leaves` leaf rows, each priced as one more row):
        step·v(k+1) + k·(draft + extra) + base."""
        step = self._price("step")
        rows = self._v(k + 1) + leaves * (self._v(k + 2) - self._v(k + 1))
        return step * rows + k * (self._price("draft") + self._price("extra")) + self._price("base")

    def round_times(self, most: int) -> tuple[float, ...]:
        """`round_time` of k = 0..most: what a greedy draft prices one more token with (`SamplingPolicy.pays`)."""
        return tuple(self.round_time(k) for k in range(most + 1))

    def row_times(self, most: int) -> tuple[float, ...]:
        """Predicted seconds of a verification of n rows, step·v(n), n = 0..most: what a greedy round prices a leaf
        with (`SamplingPolicy.leaves`)."""
        step = self._price("step")
        return tuple(step * self._v(n) for n in range(most + 1))

    def _price(self, name: str) -> float:
        if name in ("base", "extra") and self.prices.base is None and (fit := self.overheads.fitted()) is not None:
            base, extra = fit  # no plain step yet: the drafting rounds' split
            return extra if name == "extra" else base
        measured = getattr(self.prices, name)
        if measured is not None:
            return measured
        step = self.prices.step or (self.costs.target.step_s if self.costs and self.costs.target.step_s > 0 else 1.0)
        if name == "step":
            return step
        if name == "draft":
            return self.costs.draft_cost * step if self.costs else 0.0
        return 0.0

    def _v(self, n: int) -> float:
        return self.costs.v(n) if self.costs else 1.0


def _counted(reached: list[float], accepted: list[float], round_: Round) -> tuple[list[float], list[float]]:
    """Decayed per-position counts (reached, accepted) after `round_`: the past weighed by DECAY, then each draft
    position the round reached counted, and accepted where it passed."""
    reached, accepted = [x * DECAY for x in reached], [x * DECAY for x in accepted]
    for i in range(min(len(round_.draft_token_ids), round_.num_accepted + 1, len(reached))):
        reached[i] += 1.0
        accepted[i] += i < round_.num_accepted
    return reached, accepted


def _shrunk_rates(accepted: list[float], reached: list[float]) -> list[float]:
    """`AdaptiveK.position_rates` of decayed counts: each position's accepted / reached shrunk by PRIOR_ROUNDS
    towards the one before it, the first towards the pooled rate (Laplace: 1/2 before any data)."""
    prior = (sum(accepted) + 1.0) / (sum(reached) + 2.0)
    rates = []
    for accepted_i, reached_i in zip(accepted, reached):
        prior = (accepted_i + PRIOR_ROUNDS * prior) / (reached_i + PRIOR_ROUNDS)
        rates.append(prior)
    return rates
