"""Hybrid drafting: copy from the context when it offers a continuation, ask the draft model otherwise.

Prompt lookup (Saxena 2023) is free and, on text that repeats its input (summaries, code edits), long
and right; a draft model (Leviathan et al. 2023) costs forwards but guesses anywhere. Each round the
hybrid takes the lookup continuation when one exists and the model's proposal otherwise. Either way
the target verifies with the one rule of `specdec.core.verify`, so greedy output is the target's and
sampling stays lossless (a lookup proposal is a point mass; a model proposal carries its p_draft).
"""
from __future__ import annotations

import torch

from specdec.core.drafter import Drafter, Proposal, SamplingPolicy
from specdec.drafters.lookup import PromptLookupDraft

HYBRID_MIN_NGRAM = 2  # a single repeated token is too weak a cue to skip the draft model


class HybridDrafter:
    """Prompt lookup first, `model_drafter` when lookup finds nothing (the model's cache catches up later)."""

    def __init__(self, model_drafter: Drafter, lookup: PromptLookupDraft | None = None):
        self.model_drafter = model_drafter  # a ModelDrafter or TextBridgeDrafter
        self.lookup = lookup or PromptLookupDraft(max_ngram=3, min_ngram=HYBRID_MIN_NGRAM)

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

    def prefill(self, prompt_ids: list[int]) -> float:
        return self.model_drafter.prefill(prompt_ids)

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        copied = self.lookup.propose(context_ids, n, policy)
        if copied.token_ids:
            return copied
        proposal = self.model_drafter.propose(context_ids, n, policy)
        proposal.time_s += copied.time_s
        return proposal
