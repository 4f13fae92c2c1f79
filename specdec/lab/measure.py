"""Drafts measured against the target alone: one harness, and the self-speculation calibration built on it.

`time_in_turn` times generations the way every measurement does (`DraftTrials` here, the bench's cells in
`specdec.lab.bench.run`): after untimed first calls (`specdec.core.timing.warm_up`), `repeats` runs of each method,
the methods in turn (a bench cell's target alone, ours and HF assisted), each run a `specdec.core.timing.timed`
region (the device synchronised around it), the first output and the median kept; `time_generation` is one method.
`DraftTrials` runs drafts on fixed prompts, greedy, against a target-alone baseline measured once
after a warm-up. `calibrate_layers` picks the L of self-speculation (`specdec.drafters.selfspec`) by
Leviathan's bound (Leviathan et al. 2023) measured on a few prompts; `recommend_fallback` compares
the best L with prompt lookup for the acceptance probe.
"""
from __future__ import annotations

import functools
import statistics
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, NamedTuple

import torch

from specdec.core.drafter import Drafter
from specdec.core.engine import autoregressive_generate, speculative_generate
from specdec.core.inputs import unwrap
from specdec.core.timing import interleaved, timed, warm_up
from specdec.core.trace import measured_speedup, pooled_stats, ratio
from specdec.drafters.lookup import PromptLookupDraft
from specdec.drafters.selfspec import SelfSpeculativeDraft, decoder_layers


WARMUP_TOKENS = 4  # new tokens of a warm-up call (first-call allocation and kernel selection)


@dataclass
class Timed:
    """A generation timed `repeats` times: the first run's output and the median wall time."""

    output: object  # what the first run returned: a GenerationResult, or the new token ids (HF `generate`)
    seconds: float  # median wall time over the repeats

    @property
    def token_ids(self) -> list[int]:
        return self.output if isinstance(self.output, list) else self.output.token_ids

    @property
    def tokens_per_s(self) -> float:
        return ratio(len(self.token_ids), self.seconds)


def time_generation(generate: Callable[[], object], repeats: int, device: torch.device | str | None) -> Timed:
    """Run `generate` `repeats` times (at least once) on a model on `device`: its first output, the median seconds
    (`time_in_turn` of one method)."""
    return time_in_turn({"generate": generate}, repeats, device)["generate"]


def time_in_turn(generates: Mapping[str, Callable[[], object]], repeats: int,
                 device: torch.device | str | None) -> dict[str, Timed]:
    """Each of `generates` run `repeats` times (at least once), the methods in turn (a, b, a, b, ...:
    `specdec.core.timing.interleaved`), on a model on `device`: each one's first output and median seconds. A drift
    of the machine's speed then moves every method alike, so their ratio holds where their absolute times do not."""
    outputs: dict[str, object] = {}

    def run(name: str) -> float:
        output, seconds = timed(generates[name], device)
        outputs.setdefault(name, output)
        return seconds

    samples = interleaved({name: functools.partial(run, name) for name in generates}, max(repeats, 1))
    return {name: Timed(outputs[name], statistics.median(seconds)) for name, seconds in samples.items()}


@dataclass
class DraftMeasurement:
    """One draft measured on a few prompts, greedy, against the target alone in the same run."""

    draft: str  # `--draft` name: "self:L" or "lookup"
    acceptance_rate: float  # alpha-hat pooled over all rounds of all prompts (specdec.core.metrics)
    cost_ratio: float  # c = one draft forward / one target step, pooled (0 for a model-free draft)
    leviathan_bound: float  # theory.leviathan_bound(alpha-hat, k, c), Leviathan et al. 2023
    mean_accepted_length: float  # tokens emitted per target forward, the target's own token included
    drafted_rounds: float  # fraction of rounds in which the draft proposed anything
    measured_speedup: float  # measured tokens/s of speculative decoding / tokens/s of the target alone


@dataclass
class Calibration:
    """`calibrate_layers` result: one measurement per candidate L and the L with the best bound."""

    results: list[tuple[int, DraftMeasurement]]  # (L, measurement) for each candidate L, ascending L
    best_layers: int  # the L maximising Leviathan's bound

    @property
    def best(self) -> DraftMeasurement:
        return dict(self.results)[self.best_layers]

    def to_dict(self) -> dict:
        return {"best_layers": self.best_layers,
                "results": [{"layers": layers, **asdict(m)} for layers, m in self.results]}

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        results = [(r["layers"], DraftMeasurement(**{k: v for k, v in r.items() if k != "layers"}))
                   for r in data["results"]]
        return cls(results, data["best_layers"])


def default_candidates(total_layers: int) -> list[int]:
    """L at 1/4, 3/8, 1/2, 5/8 and 3/4 of the depth (for 28 layers: 7, 10, 14, 18, 21); [1] for tiny models."""
    picks = {max(1, round(total_layers * eighths / 8)) for eighths in (2, 3, 4, 5, 6)}
    return sorted(layers for layers in picks if layers < total_layers) or [1]


OnLayer = Callable[[int, "DraftMeasurement"], None]  # called with (L, its measurement) as each L finishes


def calibrate_layers(target_model, prompts_ids, k: int = 4, candidates: list[int] | None = None,
                     max_new_tokens: int = 32, on_layer: OnLayer | None = None) -> Calibration:
    """Measure alpha, c, the bound and the real speedup of self-speculation for each candidate L.

    Greedy decoding of `max_new_tokens` on each prompt; the best L maximises
    theory.leviathan_bound(alpha-hat, k, c) pooled over the prompts.
    """
    return calibrate_on(DraftTrials(target_model, prompts_ids, k, max_new_tokens), candidates, on_layer)


def calibrate_on(run: DraftTrials, candidates: list[int] | None, on_layer: OnLayer | None = None) -> Calibration:
    """`calibrate_layers` on prompts (and a baseline) already set up in `run`."""
    model = run.model
    candidates = default_candidates(len(decoder_layers(model))) if candidates is None else sorted(set(candidates))
    if not candidates:
        raise ValueError("calibrate_layers needs at least one candidate number of layers")
    results = []
    for layers in candidates:
        results.append((layers, run.measure(f"self:{layers}", lambda: SelfSpeculativeDraft(model, layers))))
        if on_layer is not None:
            on_layer(*results[-1])
    best_layers = max(results, key=lambda item: item[1].leviathan_bound)[0]
    return Calibration(results, best_layers)


def recommend_fallback(target_model, prompts_ids, k: int = 4, candidates: list[int] | None = None,
                       max_new_tokens: int = 32) -> dict:
    """Which draft-free fallback to use for this target on these prompts: self-speculation or prompt lookup.

    Calibrates L (`calibrate_layers`), measures prompt lookup on the same prompts, and picks the one
    with the higher measured speedup over the target alone. Returns a JSON-able dict with both
    measurements, the calibration table, `best_draft` (a `--draft` name, or None when neither
    beats the target alone) and a one-line `recommendation`.
    """
    run = DraftTrials(target_model, prompts_ids, k, max_new_tokens)
    calibration = calibrate_on(run, candidates)
    lookup = run.measure("lookup", PromptLookupDraft)
    self_spec = calibration.best
    winner, other = sorted([self_spec, lookup], key=lambda m: m.measured_speedup, reverse=True)
    return {
        "k": k,
        "prompts": len(prompts_ids),
        "self_speculation": {"layers": calibration.best_layers, **asdict(self_spec)},
        "prompt_lookup": asdict(lookup),
        "calibration": calibration.to_dict()["results"],
        "best_draft": winner.draft if winner.measured_speedup > 1.0 else None,
        "recommendation": _recommendation(winner, other, len(prompts_ids)),
    }


def _recommendation(winner: DraftMeasurement, other: DraftMeasurement, prompts: int) -> str:
    if winner.measured_speedup <= 1.0:
        return (f"Neither draft-free fallback beats the target alone on these {prompts} prompts "
                f"({_describe(winner)}: {winner.measured_speedup:.2f}x, {_describe(other)}: "
                f"{other.measured_speedup:.2f}x): turn speculation off, or retrain the draft.")
    return (f"Fall back to {_describe(winner)} (--draft {winner.draft}): measured {winner.measured_speedup:.2f}x "
            f"over the target alone (α̂={winner.acceptance_rate:.2f}, c={winner.cost_ratio:.2f}, Leviathan bound "
            f"{winner.leviathan_bound:.2f}x) on {prompts} prompts; {_describe(other)} measured "
            f"{other.measured_speedup:.2f}x.")


def _describe(measurement: DraftMeasurement) -> str:
    if measurement.draft == "lookup":
        return "prompt lookup"
    return f"self-speculation with the first {measurement.draft.split(':')[1]} layers"


class Trial(NamedTuple):
    """One draft on every prompt of a DraftTrials, each prompt's target alone timed just before it."""

    results: list  # the draft's GenerationResult on each prompt
    alone: list  # the target alone's GenerationResult on each prompt, timed right before the draft's

    @property
    def measured_speedup(self) -> float:
        """Pooled tokens/s of the draft's runs over those of the target alone's beside them."""
        return measured_speedup(pooled_stats(self.results, 0), pooled_stats(self.alone, 0))


class DraftTrials:
    """The one harness that measures drafts against the target alone: fixed prompts, greedy, a warm-up, then the
    target-alone baseline once (its outputs, which every draft's must equal); each draft runs every prompt just
    after the target alone runs it again (`run`: a machine whose speed drifts over a long measurement moves both
    sides of each ratio, as the bench's cells do), and is pooled (`measure`, `identical`)."""

    def __init__(self, target_model, prompts_ids, k: int, max_new_tokens: int):
        if not prompts_ids:
            raise ValueError("give at least one prompt to measure drafts on")
        model, tokenizer = unwrap(target_model, None)
        self.model, self.tokenizer, self.prompts = model, tokenizer, list(prompts_ids)
        self.k, self.max_new_tokens = k, max_new_tokens
        warm_up(lambda: autoregressive_generate(model, self.prompts[0], max_new_tokens=WARMUP_TOKENS,
                                                tokenizer=tokenizer))
        self.alone = [self._alone(p) for p in self.prompts]  # the target alone on each prompt
        self.baseline = pooled_stats(self.alone, 0)  # pooled over the prompts

    def _alone(self, prompt_ids: list[int]):
        return autoregressive_generate(self.model, prompt_ids, max_new_tokens=self.max_new_tokens,
                                       tokenizer=self.tokenizer)

    def run(self, draft, costs=None) -> Trial:
        """`draft` (a model or Drafter, reused across prompts) on every prompt, each right after the target alone."""
        results, alone = [], []
        for prompt in self.prompts:
            alone.append(self._alone(prompt))
            results.append(speculative_generate(self.model, draft, prompt, k=self.k,
                                                max_new_tokens=self.max_new_tokens, tokenizer=self.tokenizer,
                                                costs=costs))
        return Trial(results, alone)

    def identical(self, results: list) -> int:
        """How many of `results` equal the target alone's greedy output on the same prompt."""
        return sum(r.token_ids == a.token_ids for r, a in zip(results, self.alone))

    def measure(self, name: str, make_drafter: Callable[[], Drafter]) -> DraftMeasurement:
        """Greedy-generate every prompt with a fresh drafter; pool all rounds into one DecodeStats."""
        trial = self.run(make_drafter())
        stats = pooled_stats(trial.results, self.k)
        rounds = [r for result in trial.results for r in result.rounds]
        return DraftMeasurement(
            draft=name,
            acceptance_rate=stats.acceptance_rate,
            cost_ratio=stats.cost_ratio,
            leviathan_bound=stats.leviathan_bound,
            mean_accepted_length=stats.mean_accepted_length,
            drafted_rounds=ratio(sum(bool(r.draft_token_ids) for r in rounds), len(rounds)),
            measured_speedup=trial.measured_speedup,
        )
