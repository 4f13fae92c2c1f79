"""Every round is data: `Round`, its `Counts`, the `Rates` computed once from them, `DecodeStats`,
`GenerationResult`, and why a greedy run diverged.

A run's numbers come in two kinds. `Counts` are what it counted (rounds, drafted, accepted per position,
emitted tokens, forwards, seconds, verification steps): they add up over runs (`+`), so the engine, a pooled
set of generations, the bench's groups and the dashboard's partial runs all aggregate the same counters.
`Rates.of` computes every metric from counts, once: the acceptance rates, the mean accepted length, c (one
draft forward / one target step), tokens/s, Eq. 1, Leviathan's bound and the predicted speedup. Their
definitions in words are data, `specdec.core.metrics.METRICS`, from which the app's hovers and
docs/metrics.md are made.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from specdec.core import theory
from specdec.core.costmodel import CostModel


COPY = "copy"  # the draft source of a copy round: prompt lookup in a round k="auto" gave at most one model draft


@dataclass
class Round:
    """One draft-then-verify round."""

    draft_token_ids: list[int]  # tokens the drafter proposed, in order (may be empty)
    draft_probs: list[float]  # p_draft of each proposed token (after temperature/top-p; 1.0 for a point-mass drafter)
    target_probs: list[float]  # p_target of each proposed token at the same position
    matches: list[bool]  # greedy: equals the target's argmax there; sampling: passed min(1, p_target/p_draft)
    num_accepted: int  # accepted prefix length (index of the first False in `matches`)
    target_token_id: int  # the target's correction (first rejection) or bonus token (all accepted)
    emitted_token_ids: list[int]  # what this round appended to the output (accepted + target token, cut at EOS)
    draft_time_s: float  # wall time of the draft forwards of this round
    target_time_s: float  # wall time of the verification forward
    draft_forwards: int  # number of draft model forwards (0 for a model-free drafter)
    k: int = 0  # draft length asked for this round (k="auto" chooses it per round; 0 = a plain target step)
    target_top_ids: list[list[int]] = field(default_factory=list)  # per verification row (the chain's, then a
    # leaf's that passed): the target's top-2 ids
    target_top_logits: list[list[float]] = field(default_factory=list)  # per row: their logits (explains near-ties)
    draft_source: str = ""  # which drafter proposed: "model", "lookup", "model+lookup", "copy" (prompt lookup in a
    # round the k="auto" controller gave at most one model draft), "" when nothing was proposed
    uniforms: list[float] = field(default_factory=list)  # sampling: u per drafted position, kept iff u < min(1, p_target/p_draft)
    wall_time_s: float = 0.0  # wall time of the whole round: its forwards plus choosing, verifying and keeping
    leaf_positions: list[int] = field(default_factory=list)  # greedy: draft positions whose second choice was
    # verified too, as a leaf row each (a one-level draft tree; `SamplingPolicy.leaves`)
    leaf_token_ids: list[int] = field(default_factory=list)  # those second choices, in the same order
    leaf_passed: bool = False  # the target's token at the first miss was that position's leaf: the round emitted the
    # target's token after the leaf too (from the leaf's row)

    @property
    def rows(self) -> int:
        """Rows its verification forward read besides the pending context: the target token's, the drafts', the
        leaves'."""
        return len(self.draft_token_ids) + 1 + len(self.leaf_token_ids)

    @property
    def is_bonus(self) -> bool:
        """True when every proposed token was accepted, so the target token is a bonus token."""
        return self.num_accepted == len(self.draft_token_ids)

    @property
    def rejected(self) -> bool:
        return self.num_accepted < len(self.draft_token_ids)

    @property
    def overhead_s(self) -> float:
        """Its wall time besides its forwards (choosing, verifying, keeping); 0 for a round made by hand (no wall
        time)."""
        if self.wall_time_s <= 0:
            return 0.0
        return max(self.wall_time_s - self.target_time_s - self.draft_time_s, 0.0)


@dataclass
class Counts:
    """What a run counted. Every metric is a rate of these (`Rates.of`); the counts of several runs add up (`+`)."""

    rounds: int = 0  # verification forwards (= target decode forwards)
    draft_tokens: int = 0  # tokens proposed over all rounds
    accepted_tokens: int = 0  # proposed tokens accepted
    rejections: int = 0  # rounds that ended with a rejection
    emitted_tokens: int = 0  # new tokens in the output
    reached: list[int] = field(default_factory=list)  # [i]: rounds that reached draft i+1 (drafts 1..i accepted)
    accepted_at: list[int] = field(default_factory=list)  # [i]: rounds that accepted draft i+1
    round_draft_forwards: int = 0  # draft forwards inside rounds (prefill excluded): what c is per
    draft_time_s: float = 0.0  # draft forwards inside rounds
    target_time_s: float = 0.0  # target verification forwards
    verify_steps: float = 0.0  # sum over rounds of v(rows): the verification forwards in one-token target steps
    leaf_rows: int = 0  # leaves verified (each a draft's second choice, a row of its own)
    leaf_tokens: int = 0  # tokens emitted from a leaf's row (a leaf passed: the round emitted one token more)
    target_forwards: int = 0  # all target forwards, prefill included
    draft_forwards: int = 0  # all draft forwards, prefill included
    prefill_time_s: float = 0.0  # prompt prefill of both models
    draft_prefill_time_s: float = 0.0  # the draft's part of it
    overhead_time_s: float = 0.0  # rounds' wall time besides their forwards: choosing, verifying, keeping
    plain_overhead_time_s: float = 0.0  # the part of it in rounds that drafted nothing (plain target steps)
    plain_rounds: int = 0  # rounds that drafted nothing
    wall_time_s: float = 0.0  # whole call, prefill and bookkeeping included

    @classmethod
    def of(cls, rounds: list[Round], costs: CostModel | None = None, **run) -> "Counts":
        """The counts of `rounds`, verification priced by `costs` (calibrated, else v = 1); `run` gives the
        whole-call fields (prefill_time_s, wall_time_s, target_forwards, draft_forwards)."""
        counts = cls(**run)
        for round_ in rounds:
            counts.observe(round_, costs)
        return counts

    def observe(self, round_: Round, costs: CostModel | None = None) -> None:
        """Count one round; `costs` (calibrated, else v = 1) price its verification forward."""
        drafted = len(round_.draft_token_ids)
        self.rounds += 1
        self.draft_tokens += drafted
        self.accepted_tokens += round_.num_accepted
        self.rejections += round_.rejected
        self.emitted_tokens += len(round_.emitted_token_ids)
        self.round_draft_forwards += round_.draft_forwards
        self.draft_time_s += round_.draft_time_s
        self.target_time_s += round_.target_time_s
        self.verify_steps += costs.v(round_.rows) if costs else 1.0
        self.leaf_rows += len(round_.leaf_token_ids)
        self.leaf_tokens += round_.leaf_passed
        self.overhead_time_s += round_.overhead_s
        if not drafted:
            self.plain_rounds += 1
            self.plain_overhead_time_s += round_.overhead_s
        for counter in (self.reached, self.accepted_at):
            counter.extend([0] * (drafted - len(counter)))
        for i in range(min(drafted, round_.num_accepted + 1)):  # the positions this round reached
            self.reached[i] += 1
            self.accepted_at[i] += i < round_.num_accepted

    def __add__(self, other: "Counts") -> "Counts":
        """Both runs pooled: every counter summed, the per-position ones position by position."""
        return Counts(**{f.name: _plus(getattr(self, f.name), getattr(other, f.name)) for f in fields(Counts)})


def _plus(a, b):
    """a + b; lists element-wise, the shorter one padded with zeros."""
    if isinstance(a, list):
        return [x + y for x, y in zip(a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b)))]
    return a + b


@dataclass
class Rates:
    """Every metric of a run, computed once from its Counts by `Rates.of` (`specdec.core.metrics` defines them)."""

    acceptance_rate: float = 0.0  # alpha-hat = accepted / (accepted + rejections); 0 when nothing was drafted
    draft_acceptance_rate: float = 0.0  # accepted / proposed
    mean_accepted_length: float = 0.0  # tokens per round, bonus/correction included: 1 + (accepted + leaf)/rounds
    per_position_acceptance: list[float] = field(default_factory=list)  # conditional: accepted at i / reached i
    per_position_unconditional: list[float] = field(default_factory=list)  # accepted at i / all rounds
    cost_ratio: float = 0.0  # c = one draft forward / one target step (target step: verification time / v)
    verify_cost: float = 1.0  # mean v(n+1) of the rounds: a verification forward in one-token target steps
    tokens_per_s: float = 0.0  # emitted tokens / wall time
    theoretical_speedup: float = 1.0  # tokens per target forward (1 - alpha^(k+1)) / (1 - alpha), = k+1 at alpha = 1
    leviathan_bound: float = 1.0  # (1 - alpha^(k+1)) / ((1 - alpha)(k*c + 1)): verification = one step
    rounds_speedup: float = 1.0  # emitted / sum of (v(n+1) + draft forwards * c) over the rounds
    predicted_speedup: float = 1.0  # the whole call priced: the rounds as above, prefill and bookkeeping on both sides

    @classmethod
    def of(cls, counts: Counts, k: int, draft_cost: float | None = None) -> "Rates":
        """The metrics of `counts` at draft length k; `draft_cost` (the calibrated c) prices the prediction,
        else the run's own c does."""
        accepted, rounds = counts.accepted_tokens, counts.rounds
        alpha = ratio(accepted, accepted + counts.rejections)
        c = ratio(ratio(counts.draft_time_s, counts.round_draft_forwards),
                  ratio(counts.target_time_s, counts.verify_steps))
        priced_c = c if draft_cost is None else draft_cost
        width = max(k, len(counts.reached))
        reached, accepted_at = (x + [0] * (width - len(x)) for x in (counts.reached, counts.accepted_at))
        return cls(
            acceptance_rate=alpha,
            draft_acceptance_rate=ratio(accepted, counts.draft_tokens),
            mean_accepted_length=1.0 + ratio(accepted + counts.leaf_tokens, rounds),
            per_position_acceptance=[ratio(a, r) for a, r in zip(accepted_at, reached)],
            per_position_unconditional=[ratio(a, rounds) for a in accepted_at],
            cost_ratio=c,
            verify_cost=ratio(counts.verify_steps, rounds) or 1.0,
            tokens_per_s=ratio(counts.emitted_tokens, counts.wall_time_s),
            theoretical_speedup=theory.expected_tokens_per_step(alpha, k),
            leviathan_bound=theory.leviathan_bound(alpha, k, c),
            rounds_speedup=ratio(counts.emitted_tokens, counts.verify_steps + counts.round_draft_forwards * priced_c),
            predicted_speedup=_predicted(counts, priced_c),
        )


def _predicted(counts: Counts, c: float) -> float:
    """The whole call's speedup the costs predict: the target alone's time for the emitted tokens over this run's.

    In seconds, with s = one target step (verification time / verification steps):
    alone = target prefill + emitted · (s + b), b = a plain round's bookkeeping (its mean in this run, 0 where every
    round drafted); ours = target prefill + draft prefill + s · (Σ v(n+1) + draft forwards · c) + the rounds'
    bookkeeping. The forwards of the rounds are priced by the calibrated v and c; the prefills and the bookkeeping
    are this run's own times (the same engine pays them for the target alone). Without wall times (rounds made by
    hand) it is `rounds_speedup`."""
    step = ratio(counts.target_time_s, counts.verify_steps)
    target_prefill = counts.prefill_time_s - counts.draft_prefill_time_s
    plain = ratio(counts.plain_overhead_time_s, counts.plain_rounds)
    alone = target_prefill + counts.emitted_tokens * (step + plain)
    ours = (counts.prefill_time_s + step * (counts.verify_steps + counts.round_draft_forwards * c)
            + counts.overhead_time_s)
    return ratio(alone, ours)


@dataclass
class DecodeStats(Rates, Counts):
    """A generation's Counts and the Rates computed from them once, at construction (`of`, `from_rounds`)."""

    k: int = 0  # draft length per round asked for (0 for the target alone; k="auto": the mean draft length)

    @classmethod
    def of(cls, counts: Counts, k: int, costs: CostModel | None = None) -> "DecodeStats":
        """`counts` with their rates; `costs` (calibrated, as the counts were priced with) give the prediction's c."""
        rates = Rates.of(counts, k, costs.draft_cost if costs else None)
        return cls(**asdict(counts), **asdict(rates), k=k)

    @classmethod
    def from_rounds(cls, rounds: list[Round], k: int, costs: CostModel | None = None, **run) -> "DecodeStats":
        """Aggregate `rounds`; `costs` (calibrated, else v = 1) price them; `run` gives prefill_time_s,
        wall_time_s and the forward counts."""
        return cls.of(Counts.of(rounds, costs, **run), k, costs)

    @property
    def counts(self) -> Counts:
        """The counters alone (what pools with other runs)."""
        return Counts(**{f.name: getattr(self, f.name) for f in fields(Counts)})


@dataclass
class GenerationResult:
    """What a generation returns: new tokens, optional text, the per-round trace and stats."""

    token_ids: list[int]  # new tokens only
    rounds: list[Round]
    stats: DecodeStats
    text: str | None = None  # decoded new tokens, when a tokenizer was given or attached
    stopped_early: bool = False  # True when on_round asked to stop

    def to_dict(self) -> dict:
        """Plain JSON-serialisable form (the CLI's --json and the dashboard API return this)."""
        d = asdict(self)
        for r, rd in zip(self.rounds, d["rounds"]):
            rd["is_bonus"] = r.is_bonus
        return d


ROUNDING_NOISE = {  # relative disagreement of two forwards over the same context that rounding alone explains
    "float32": 2.0 ** -14,  # 24-bit significand; the accumulation order of a batched GEMM differs per row count
    "bfloat16": 2.0 ** -4,  # 8-bit significand: every layer output rounds at ~2^-8, compounded over the layers
}


@dataclass
class Divergence:
    """Where a greedy speculative run left the target-alone output, and whether rounding explains it."""

    position: int  # index of the first differing new token
    alone_token: int  # the target alone's token there (one-token decoding step)
    speculative_token: int  # the speculative run's token there (row of a batched verification forward)
    gap_one_token: float | None  # one-token path: logit(alone_token) - logit(speculative_token); None if not in top 2
    gap_batched: float | None  # batched path: logit(speculative_token) - logit(alone_token); None if not in top 2
    drift: float | None  # largest change of those two logits between the paths
    tolerance: float  # rounding noise of the dtype at these logits' magnitude (ROUNDING_NOISE * |logit|)
    near_tie: bool  # both tokens are the top two on both paths and the drift is within the tolerance

    def describe(self, tokenizer=None) -> str:
        """One line: the position, the two tokens, both gaps and the verdict."""
        name = (lambda t: repr(tokenizer.decode([t]))) if tokenizer is not None else str
        gaps = (f"top-1/top-2 logit gap {_number(self.gap_one_token)} on the one-token path and "
                f"{_number(self.gap_batched)} in the batched verification forward (drift {_number(self.drift)}, "
                f"rounding noise {self.tolerance:.2g})")
        cause = ("a numerical near-tie: the dtype's rounding flipped the argmax" if self.near_tie
                 else "NOT explained by rounding: this is a bug")
        return (f"token {self.position}: target alone {name(self.alone_token)}, speculative "
                f"{name(self.speculative_token)}; {gaps}; {cause}")


def explain_divergence(speculative: GenerationResult, alone: GenerationResult, dtype: str) -> Divergence | None:
    """Why greedy `speculative` and `alone` (same target, prompt, dtype) differ; None when they do not.

    Both runs keep each verification row's top-2 target logits (`Round.target_top_*`), so the
    position where they part is compared on the one-token path (the target alone's step) and on
    the batched path (the speculative run's verification row) without running anything again.
    """
    position = first_divergence(speculative.token_ids, alone.token_ids)
    if position is None or position >= min(len(speculative.token_ids), len(alone.token_ids)):
        return None
    a, b = alone.token_ids[position], speculative.token_ids[position]
    one_token, batched = _row_top(alone.rounds, position), _row_top(speculative.rounds, position)
    gap_one, gap_batched = _gap(one_token, a, b), _gap(batched, b, a)
    drift = None
    if gap_one is not None and gap_batched is not None:
        drift = max(abs(one_token[a] - batched[a]), abs(one_token[b] - batched[b]))
    magnitude = max([abs(x) for x in (*one_token.values(), *batched.values())] or [1.0])
    tolerance = ROUNDING_NOISE.get(dtype, ROUNDING_NOISE["float32"]) * magnitude
    near_tie = drift is not None and drift <= tolerance
    return Divergence(position, a, b, gap_one, gap_batched, drift, tolerance, near_tie)


def _row_top(rounds: list[Round], position: int) -> dict[int, float]:
    """{token id: logit} of the top-2 of the verification row that emitted new token `position`."""
    start = 0
    for r in rounds:
        if position < start + len(r.emitted_token_ids):
            row = position - start
            if row > r.num_accepted:  # a leaf passed: the token after it came from the leaf's row, kept last
                row = len(r.draft_token_ids) + 1
            return dict(zip(r.target_top_ids[row], r.target_top_logits[row])) if r.target_top_ids else {}
        start += len(r.emitted_token_ids)
    return {}


def _gap(top: dict[int, float], winner: int, loser: int) -> float | None:
    return top[winner] - top[loser] if winner in top and loser in top else None


def _number(value: float | None) -> str:
    return "n/a (not in the top 2)" if value is None else f"{value:.4g}"


def pooled_stats(results: list[GenerationResult], k: int, costs: CostModel | None = None) -> DecodeStats:
    """One DecodeStats over several generations: their counts summed; `costs` (the calibrated ones the
    generations ran with) give the prediction's c.

    Its tokens_per_s is pooled emitted tokens / pooled wall time (not a mean of per-run rates).
    """
    return DecodeStats.of(sum((r.stats.counts for r in results), Counts()), k, costs)


def ratio(a: float, b: float) -> float:
    """a / b, or 0.0 when b is 0 (a rate over nothing is reported as 0)."""
    return a / b if b else 0.0


def measured_speedup(stats: DecodeStats, baseline: DecodeStats) -> float:
    """Measured speedup = tokens/s of a speculative run / tokens/s of the target alone (same prompt, length)."""
    return ratio(stats.tokens_per_s, baseline.tokens_per_s)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or the shorter length when one is a prefix); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
