"""Verification rules: pure functions over probability tensors.

Notation: `p_target` and `p_draft` are probability vectors (or stacks of them) over the
*target's* vocabulary, after temperature and top-p have been applied identically to both.

- Greedy (top-1) verification, the temperature-0 case: a drafted token is kept while it equals the
  target's argmax at that position; the target's argmax replaces the first mismatch.
- Lossless speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2):
  accept drafted token x with probability min(1, p_target(x) / p_draft(x)); on the first
  rejection sample from norm(max(0, p_target - p_draft)); when all k are accepted, sample a
  bonus token from p_target at position k+1. The emitted tokens are distributed exactly as
  samples from the target alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one round of drafted tokens."""

    matches: list[bool]  # per drafted position: greedy = equals target argmax; sampling = passed the test
    num_accepted: int  # length of the accepted prefix (first False in `matches`, or all)
    target_token_id: int  # correction (at the first rejection) or bonus token (all accepted)
    uniforms: tuple[float, ...] = ()  # sampling: the uniform drawn per drafted position (empty when greedy)


def logits_to_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Softmax with temperature (0 means 1 here: greedy still reports probabilities) and top-p.

    logits: [..., V] -> probs [..., V] (float32). Top-p keeps the smallest set of tokens whose
    mass reaches top_p (the most likely token is always kept) and renormalises.
    """
    scaled = logits.float() if temperature in (0.0, 1.0) else logits.float() / temperature  # x / 1 is x: no copy
    probs = torch.softmax(scaled, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly more likely tokens
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)


def verify_greedy(draft_token_ids: list[int], target_logits: torch.Tensor) -> Verdict:
    """Top-1 verification. target_logits: [n+1, V], row i predicts the token after draft i-1."""
    target_choice = target_logits.max(dim=-1).indices.tolist()  # [n+1]: argmax's first-index rule, 3x sooner here
    matches = [d == t for d, t in zip(draft_token_ids, target_choice)]
    num_accepted = _accepted_prefix(matches)
    return Verdict(matches, num_accepted, target_choice[num_accepted])


def acceptance_probability(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """min(1, p_target / p_draft) elementwise; a token the draft gave no mass is always accepted."""
    ratio = p_target / p_draft.clamp_min(torch.finfo(p_draft.dtype).tiny)
    return torch.where(p_draft > 0, ratio.clamp(max=1.0), torch.ones_like(ratio))


def residual_distribution(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p_target - p_draft)) over the last dim; falls back to p_target if it is empty."""
    residual = (p_target - p_draft).clamp_min(0.0)
    total = residual.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(1e-30), p_target)


def verify_sampling(
    draft_token_ids: list[int],
    p_draft: torch.Tensor,
    p_target: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Lossless rejection sampling.

    p_draft: [n, V] draft distributions that produced each drafted token (a point mass for a
    drafter without probabilities); p_target: [n+1, V] target distributions at the same
    positions plus one. One uniform is drawn per drafted position up front, so `matches`
    reports the test's outcome at every position, not only up to the first rejection.
    """
    n = len(draft_token_ids)
    ids = torch.tensor(draft_token_ids, dtype=torch.long)
    rows = torch.arange(n)
    accept_prob = acceptance_probability(p_target[rows, ids], p_draft[rows, ids])  # [n]
    uniforms = torch.rand(n, generator=generator)
    matches = (uniforms < accept_prob).tolist()
    num_accepted = _accepted_prefix(matches)
    if num_accepted < n:
        law = residual_distribution(p_target[num_accepted], p_draft[num_accepted])
    else:
        law = p_target[n]
    return Verdict(matches, num_accepted, sample(law, generator), tuple(uniforms.tolist()))


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a probability vector [V]."""
    return int(torch.multinomial(probs, 1, generator=generator))


def _accepted_prefix(matches: list[bool]) -> int:
    return next((i for i, ok in enumerate(matches) if not ok), len(matches))
