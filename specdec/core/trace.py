"""Every round is data: `Round`, `DecodeStats`, `GenerationResult`, and why a greedy run diverged.

Metric conventions (the single place they are defined; the CLI, dashboard and bench only
read these fields):

- A *round* is one target verification forward. k is the draft length asked for (the papers' gamma).
  A round verifies n <= k drafted tokens (n < k only
  near max_new_tokens, or when a drafter proposes fewer) and emits the accepted prefix plus
  one target token: the correction at the first rejection, or a bonus token when all n pass.
- acceptance_rate (alpha-hat) = accepted / (accepted + rejections): the per-token acceptance
  probability of the theory (Leviathan et al. 2023), estimated from a run. Tokens drafted
  after the first rejection of a round are neither accepted nor rejections (they were never
  reached; counting them inflates or deflates the rate, cf. vLLM #9565).
- draft_acceptance_rate = accepted / drafted (vLLM's "draft acceptance rate").
- mean_accepted_length = emitted tokens per round = 1 + accepted / rounds. It INCLUDES the
  target's token (vLLM convention). "Accepted draft tokens per round" (0..k, the histogram, and
  gpt-fast's "mean accepted") excludes it.
- per_position_acceptance[i] = rounds that accepted draft i+1 / rounds that reached it (drafts 1..i
  all accepted, draft i+1 proposed): the conditional acceptance at that position. Drafts never reached
  are not failures; the unconditional variant (accepted there / all rounds) is, when every round
  drafts k, the product of the conditional rates up to i.
- cost_ratio c = one draft forward / one target step (Leviathan's c, both reading one token). A
  run times its verification forwards, not one-token steps, so the target step is estimated as
  verification time / the calibrated v(n+1) of each round (`specdec.costs.calibration`; v = 1 without one).
- verify_cost = mean over rounds of v(n+1): what one verification forward costs in one-token
  target steps (1 = Leviathan's assumption; measured by `specdec.costs.calibration.calibrate`).
- theoretical_speedup = (1 - alpha^(k+1)) / (1 - alpha): tokens per target forward (Eq. 1).
- expected_walltime_speedup = (1 - alpha^(k+1)) / ((1 - alpha)(k*c + 1)): Leviathan's bound
  (Thm 3.8), which assumes verification costs one step.
- predicted_speedup = emitted tokens / sum over rounds of (v(n+1) + draft forwards * c): the
  speedup the calibrated costs predict for the rounds this run had (prefill and per-round
  overhead are not in it; they are the gap to the measurement).
- measured_speedup = tokens/s of the speculative run / tokens/s of the target alone on the same
  prompt and length, wall time with prefill (`measured_speedup`; `specdec.costs.waterfall` walks from
  theoretical_speedup to it one cost at a time).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specdec.core import theory
from specdec.core.costmodel import CostModel, assumed_costs


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
    target_top_ids: list[list[int]] = field(default_factory=list)  # per verification row: the target's top-2 ids
    target_top_logits: list[list[float]] = field(default_factory=list)  # per row: their logits (explains near-ties)
    draft_source: str = ""  # which drafter proposed: "model", "lookup" ("" when nothing was proposed)
    uniforms: list[float] = field(default_factory=list)  # sampling: u per drafted position, kept iff u < min(1, p_target/p_draft)
    wall_time_s: float = 0.0  # wall time of the whole round: its forwards plus choosing, verifying and keeping

    @property
    def is_bonus(self) -> bool:
        """True when every proposed token was accepted, so the target token is a bonus token."""
        return self.num_accepted == len(self.draft_token_ids)

    @property
    def rejected(self) -> bool:
        return self.num_accepted < len(self.draft_token_ids)


@dataclass
class DecodeStats:
    """Counters and derived metrics of one generation (definitions in the module docstring)."""

    k: int  # draft length per round asked for (0 for the target alone)
    rounds: int = 0  # verification forwards (= target decode forwards)
    draft_tokens: int = 0  # tokens proposed over all rounds
    accepted_tokens: int = 0  # proposed tokens accepted
    rejections: int = 0  # rounds that ended with a rejection
    emitted_tokens: int = 0  # new tokens in the output
    acceptance_rate: float = 0.0  # alpha-hat = accepted / (accepted + rejections); 0 when nothing was drafted
    draft_acceptance_rate: float = 0.0  # accepted / proposed
    mean_accepted_length: float = 0.0  # emitted tokens per round, bonus/correction included: 1 + accepted/rounds
    per_position_acceptance: list[float] = field(default_factory=list)  # length k
    target_forwards: int = 0  # all target forwards, prefill included
    draft_forwards: int = 0  # all draft forwards, prefill included
    prefill_time_s: float = 0.0  # prompt prefill of both models
    draft_time_s: float = 0.0  # draft forwards inside rounds
    target_time_s: float = 0.0  # target verification forwards
    wall_time_s: float = 0.0  # whole call, prefill and bookkeeping included
    tokens_per_s: float = 0.0  # emitted_tokens / wall_time_s
    cost_ratio: float = 0.0  # c = one draft forward / one target step (estimate in the module docstring)
    verify_cost: float = 1.0  # mean v(n+1) of the rounds: a verification forward in one-token target steps
    theoretical_speedup: float = 1.0  # (1 - alpha^(k+1)) / (1 - alpha), = k+1 at alpha = 1
    expected_walltime_speedup: float = 1.0  # Leviathan's bound (1 - alpha^(k+1)) / ((1 - alpha)(k*c + 1)), v = 1
    predicted_speedup: float = 1.0  # emitted / sum of (v(n+1) + draft forwards * c) over the rounds

    @classmethod
    def from_rounds(cls, rounds: list[Round], k: int, costs: CostModel | None = None, **timing) -> "DecodeStats":
        """Aggregate `rounds`; `costs` (calibrated, else v = 1) prices them; `timing` gives prefill_time_s,
        wall_time_s and the forward counts."""
        s = cls(k=k, **timing)
        s.rounds = len(rounds)
        s.draft_tokens = sum(len(r.draft_token_ids) for r in rounds)
        s.accepted_tokens = sum(r.num_accepted for r in rounds)
        s.rejections = sum(r.rejected for r in rounds)
        s.emitted_tokens = sum(len(r.emitted_token_ids) for r in rounds)
        s.acceptance_rate = ratio(s.accepted_tokens, s.accepted_tokens + s.rejections)
        s.draft_acceptance_rate = ratio(s.accepted_tokens, s.draft_tokens)
        s.mean_accepted_length = 1.0 + ratio(s.accepted_tokens, s.rounds)
        s.per_position_acceptance = _per_position(rounds, k)
        s.draft_time_s = sum(r.draft_time_s for r in rounds)
        s.target_time_s = sum(r.target_time_s for r in rounds)
        s.tokens_per_s = ratio(s.emitted_tokens, s.wall_time_s)
        verify_steps = sum(costs.v(len(r.draft_token_ids) + 1) if costs else 1.0 for r in rounds)
        s.verify_cost = ratio(verify_steps, s.rounds) or 1.0
        target_step_s = ratio(s.target_time_s, verify_steps)
        s.cost_ratio = ratio(ratio(s.draft_time_s, sum(r.draft_forwards for r in rounds)), target_step_s)
        s.theoretical_speedup = theory.expected_tokens_per_step(s.acceptance_rate, k)
        s.expected_walltime_speedup = theory.walltime_speedup(s.acceptance_rate, k, s.cost_ratio)
        priced = costs or assumed_costs(s.cost_ratio)
        s.predicted_speedup = ratio(s.emitted_tokens, sum(priced.round_cost(len(r.draft_token_ids), r.draft_forwards)
                                                          for r in rounds))
        return s


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
            return dict(zip(r.target_top_ids[row], r.target_top_logits[row])) if r.target_top_ids else {}
        start += len(r.emitted_token_ids)
    return {}


def _gap(top: dict[int, float], winner: int, loser: int) -> float | None:
    return top[winner] - top[loser] if winner in top and loser in top else None


def _number(value: float | None) -> str:
    return "n/a (not in the top 2)" if value is None else f"{value:.4g}"


def pooled_stats(results: list[GenerationResult], k: int, costs: CostModel | None = None) -> DecodeStats:
    """One DecodeStats over several generations: every round pooled, times and forward counts summed;
    `costs` (the calibrated ones the generations ran with) price the pooled rounds.

    Its tokens_per_s is pooled emitted tokens / pooled wall time (not a mean of per-run rates).
    """
    timing = {name: sum(getattr(r.stats, name) for r in results)
              for name in ("prefill_time_s", "wall_time_s", "target_forwards", "draft_forwards")}
    return DecodeStats.from_rounds([rd for r in results for rd in r.rounds], k, costs, **timing)


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


def _per_position(rounds: list[Round], k: int) -> list[float]:
    """Conditional acceptance per draft position: accepted there / reached there (module docstring)."""
    width = max([k] + [len(r.draft_token_ids) for r in rounds])
    reached = [0] * width
    accepted = [0] * width
    for r in rounds:
        for i in range(min(len(r.draft_token_ids), r.num_accepted + 1)):
            reached[i] += 1
            accepted[i] += i < r.num_accepted
    return [ratio(a, d) for a, d in zip(accepted, reached)]
