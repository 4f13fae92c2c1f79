"""Every round is data: `Round`, `DecodeStats`, `GenerationResult`.

Metric conventions (the single place they are defined; the CLI, dashboard and bench only
read these fields):

- A *round* is one target verification forward. It verifies n <= k drafted tokens (n < k only
  near max_new_tokens, or when a drafter proposes fewer) and emits the accepted prefix plus
  one target token: the correction at the first rejection, or a bonus token when all n pass.
- acceptance_rate (alpha-hat) = accepted / (accepted + rejections): the per-token acceptance
  probability of the theory (Leviathan et al. 2023), estimated from a run. Tokens drafted
  after the first rejection of a round are neither accepted nor rejections (they were never
  reached; counting them inflates or deflates the rate, cf. vLLM #9565).
- draft_acceptance_rate = accepted / drafted (vLLM's "draft acceptance rate").
- mean_accepted_length = emitted tokens per round = 1 + accepted / rounds. It INCLUDES the
  target's token (vLLM convention; gpt-fast's "mean accepted" excludes it).
- per_position_acceptance[i] = rounds that accepted position i / rounds that drafted position i.
- cost_ratio c = mean draft forward time / mean target verification forward time.
- measured speedup = tokens/s of the speculative run / tokens/s of the target alone on the same
  prompt and length (`measured_speedup`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from . import theory


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
    cost_ratio: float = 0.0  # c = mean draft forward time / mean target forward time
    theoretical_speedup: float = 1.0  # (1 - alpha^(k+1)) / (1 - alpha), = k+1 at alpha = 1
    expected_walltime_speedup: float = 1.0  # (1 - alpha^(k+1)) / ((1 - alpha)(k*c + 1))

    @classmethod
    def from_rounds(cls, rounds: list[Round], k: int, **timing) -> "DecodeStats":
        """Aggregate `rounds`; `timing` gives prefill_time_s, wall_time_s and the forward counts."""
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
        mean_draft = ratio(s.draft_time_s, sum(r.draft_forwards for r in rounds))
        s.cost_ratio = ratio(mean_draft, ratio(s.target_time_s, s.rounds))
        s.theoretical_speedup = theory.expected_tokens_per_step(s.acceptance_rate, k)
        s.expected_walltime_speedup = theory.walltime_speedup(s.acceptance_rate, k, s.cost_ratio)
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


def pooled_stats(results: list[GenerationResult], k: int) -> DecodeStats:
    """One DecodeStats over several generations: every round pooled, times and forward counts summed.

    Its tokens_per_s is pooled emitted tokens / pooled wall time (not a mean of per-run rates).
    """
    timing = {name: sum(getattr(r.stats, name) for r in results)
              for name in ("prefill_time_s", "wall_time_s", "target_forwards", "draft_forwards")}
    return DecodeStats.from_rounds([rd for r in results for rd in r.rounds], k, **timing)


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
    drafted = [0] * k
    accepted = [0] * k
    for r in rounds:
        for i in range(min(len(r.draft_token_ids), k)):
            drafted[i] += 1
            accepted[i] += i < r.num_accepted
    return [ratio(a, d) for a, d in zip(accepted, drafted)]
