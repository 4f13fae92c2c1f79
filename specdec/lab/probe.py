"""The acceptance probe: is this draft still worth running with this target?

A rule for production: after every target update (new version, LoRA merge), sample
live prompts and measure the draft's acceptance rate; below the 50% warning line the draft and
the target have drifted apart, so roll back to self-speculation (or the target alone) and start
distilling the draft again. `probe` measures alpha-hat on a sample of prompts and, below the
threshold, asks `specdec.lab.measure.recommend_fallback` which draft-free fallback measures best.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from specdec.core.engine import speculative_generate
from specdec.core.inputs import unwrap
from specdec.core.suites import Prompt, encode
from specdec.core.trace import pooled_stats
from specdec.lab.measure import recommend_fallback


@dataclass
class ProbeReport:
    """What the probe measured and what it recommends."""

    acceptance_rate: float  # pooled alpha-hat = accepted / (accepted + rejections) over the sampled prompts
    threshold: float  # the warning line it was compared with
    passed: bool  # acceptance_rate >= threshold
    prompts: int  # prompts sampled
    k: int  # draft length used
    accepted_tokens: int  # pooled counters behind acceptance_rate
    rejections: int
    per_category: dict[str, float] = field(default_factory=dict)  # pooled alpha-hat per prompt category
    fallback: dict | None = None  # `recommend_fallback`'s measurements when below the threshold
    message: str = ""  # the human-readable verdict


def probe(target, draft, prompts: list[Prompt], *, threshold: float = 0.5, samples: int | None = None,
          k: int = 4, max_new_tokens: int = 32, seed: int = 0, tokenizer=None,
          fallback: bool = True) -> ProbeReport:
    """Measure alpha-hat of `draft` on `samples` prompts (all when None), greedy, and judge it.

    fallback=True measures self-speculation vs prompt lookup when alpha-hat is below the threshold,
    so the message names a concrete replacement draft.
    """
    check_threshold(threshold)
    target_model, tokenizer = unwrap(target, tokenizer)
    chosen = sample_prompts(prompts, samples, seed)
    ids = [encode(p, tokenizer) for p in chosen]
    results = {p.category: [] for p in chosen}  # category -> its GenerationResults
    for prompt, prompt_ids in zip(chosen, ids):
        results[prompt.category].append(
            speculative_generate(target_model, draft, prompt_ids, k=k, max_new_tokens=max_new_tokens))
    pooled = pooled_stats([r for category in results.values() for r in category], k)
    report = ProbeReport(pooled.acceptance_rate, threshold, pooled.acceptance_rate >= threshold, len(chosen), k,
                         pooled.accepted_tokens, pooled.rejections,
                         {c: pooled_stats(rs, k).acceptance_rate for c, rs in sorted(results.items())})
    if not report.passed and fallback:
        report.fallback = recommend_fallback(target_model, ids, k=k, max_new_tokens=max_new_tokens)
    report.message = verdict(report)
    return report


def check_threshold(threshold: float) -> None:
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be an acceptance rate in [0, 1], got {threshold}")


def sample_prompts(prompts: list[Prompt], samples: int | None, seed: int) -> list[Prompt]:
    """A seeded random sample of `samples` prompts (all of them, in order, when None or too many)."""
    if samples is not None and samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if samples is None or samples >= len(prompts):
        return list(prompts)
    return random.Random(seed).sample(prompts, samples)


def verdict(report: ProbeReport) -> str:
    """The probe's message: pass, or below the line with the recommendation."""
    measured = (f"acceptance rate α̂ = {report.acceptance_rate:.3f} over {report.prompts} prompts "
                f"(k={report.k}, {report.accepted_tokens} accepted, {report.rejections} rejections)")
    if report.passed:
        return f"OK: {measured} >= threshold {report.threshold:.2f}"
    lines = [f"BELOW THRESHOLD: {measured} < {report.threshold:.2f}.",
             "The draft no longer predicts this target well (below the warning line the draft and "
             "target have drifted apart, and speculation costs more than it saves).",
             "Recommendation: stop using this draft; fall back to self-speculation or prompt lookup "
             "(or the target alone), and retrain/distil the draft towards the current target on its own "
             "outputs (`python -m specdec distill`), then probe again."]
    if report.fallback is not None:
        lines.append(f"Measured fallback: {report.fallback['recommendation']}")
    return "\n".join(lines)
