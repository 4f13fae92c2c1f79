"""Hybrid drafting: copy from the context where the draft model has just missed, ask the model otherwise.

Prompt lookup (Saxena 2023) is free and, on text that repeats its input (summaries, code edits), long
and right; a draft model (Leviathan et al. 2023) costs forwards but guesses anywhere. Each round the
hybrid takes the lookup continuation when one exists, unless the model's last proposal passed whole: a model
on track keeps drafting (a copied continuation there can only save its forwards, and where the earlier
occurrence goes on differently it costs the round). Either way the target verifies with the one rule of
`specdec.core.verify`, so greedy output is the target's and sampling stays lossless (which source proposes
depends on the context only; a lookup proposal is a point mass; a model proposal carries its p_draft).
"""
from __future__ import annotations

import torch

from specdec.core.drafter import Drafter, Proposal, SamplingPolicy
from specdec.drafters.lookup import PromptLookupDraft

HYBRID_MIN_NGRAM = 3  # shorter repeats are too weak a cue to skip the draft model (2-token matches copied continuations
# the target rejected on code and finance, docs/performance.md)


class HybridDrafter:
    """Prompt lookup where the model has just missed, `model_drafter` otherwise and when lookup finds nothing (the
    model's cache catches up later)."""

    def __init__(self, model_drafter: Drafter, lookup: PromptLookupDraft | None = None):
        self.model_drafter = model_drafter  # a ModelDrafter or TextBridgeDrafter
        self.lookup = lookup or PromptLookupDraft(max_ngram=3, min_ngram=HYBRID_MIN_NGRAM)
        self.last_model: tuple[int, list[int]] | None = None  # the model's last proposal: (context length, tokens)

    @property
    def forwards(self) -> int:
        return self.model_drafter.forwards

    @property
    def model(self) -> torch.nn.Module | None:
        return self.model_drafter.model

    @property
    def cost_key(self) -> str:
        """Its kind and its model drafter's key: c prices the model's forwards (lookup runs none)."""
        return f"HybridDrafter|{self.model_drafter.cost_key}"

    def reset(self) -> None:
        self.model_drafter.reset()
        self.lookup.reset()
        self.last_model = None

    def prefill(self, prompt_ids: list[int]) -> float:
        return self.model_drafter.prefill(prompt_ids)

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        copied = self.lookup.propose(context_ids, n, policy)
        if copied.token_ids and not self.model_on_track(context_ids):
            return copied
        proposal = self.model_drafter.propose(context_ids, n, policy)
        proposal.time_s += copied.time_s
        self.last_model = (len(context_ids), proposal.token_ids)
        return proposal

    def model_on_track(self, context_ids: list[int]) -> bool:
        """Whether the model's last proposal passed whole: its tokens follow its context in this one (a rejected
        token is never the target's next, greedy or sampled, so a miss always shows)."""
        if self.last_model is None:
            return False
        start, tokens = self.last_model
        return bool(tokens) and context_ids[start:start + len(tokens)] == tokens
