"""Hybrid drafting: copy from the context where the draft model has just missed, where it starts the copy itself,
and while a copy is on track.

Prompt lookup (Saxena 2023) is free and, on text that repeats its input (summaries, code edits), long
and right; a draft model (Leviathan et al. 2023) costs forwards but guesses anywhere. Each round, where lookup
finds a continuation (the context's last HYBRID_MIN_NGRAM tokens occurred before):
- the model's last proposal did not pass whole (it has just missed), or the last round's copy did (the copy is
  on track): the copy is proposed as it is;
- else the model, on track, drafts AGREE_BEFORE_COPY tokens first, and the copy's rest follows them only
  if they are the copy's own first tokens (else the model drafts on), so a copy never interrupts a model on track
  where the earlier occurrence goes on differently, yet saves its forwards where it does not; once such a copy has
  passed whole, the next ones go on without the model's tokens first until one misses.
The target verifies with the one rule of `specdec.core.verify`, so greedy output is the target's and sampling stays
lossless: which source proposes depends on the context and on which earlier proposals passed, never on this round's
draws; a copied token is a point mass given the tokens before it, a modelled one carries its p_draft.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from specdec.core.drafter import Drafter, Proposal, SamplingPolicy
from specdec.core.trace import COPY
from specdec.drafters.lookup import PromptLookupDraft

HYBRID_MIN_NGRAM = 3  # shorter repeats are too weak a cue to skip the draft model (2-token matches copied continuations
# the target rejected on code and finance, docs/performance.md)
AGREE_BEFORE_COPY = 2  # tokens a model on track drafts itself before a copy that starts with them takes over


class HybridDrafter:
    """Prompt lookup where the model has just missed, starts the copy itself or a copy is on track; `model_drafter`
    otherwise (the model's cache catches up later)."""

    def __init__(self, model_drafter: Drafter, lookup: PromptLookupDraft | None = None):
        self.model_drafter = model_drafter  # a ModelDrafter or TextBridgeDrafter
        self.lookup = lookup or PromptLookupDraft(max_ngram=3, min_ngram=HYBRID_MIN_NGRAM)
        self.last_model: tuple[int, list[int]] | None = None  # the model's last proposal: (context length, tokens)
        self.last_copy: tuple[int, list[int]] | None = None  # the last copied tokens proposed: (their position, tokens)

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
        self.last_model = self.last_copy = None

    def prefill(self, prompt_ids: list[int]) -> float:
        return self.model_drafter.prefill(prompt_ids)

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        copied = self.lookup.propose(context_ids, n, policy)
        if copied.token_ids and (self.copy_goes_on(context_ids) or not self.passed(self.last_model, context_ids)):
            return self._copied(context_ids, copied)
        if len(copied.token_ids) <= AGREE_BEFORE_COPY:  # nothing to copy, or nothing the model would not draft
            return self._modelled(context_ids, n, policy, copied.time_s)
        head = self._modelled(context_ids, AGREE_BEFORE_COPY, policy.capped(0), copied.time_s)
        if head.token_ids == copied.token_ids[:AGREE_BEFORE_COPY]:
            tail = Proposal(copied.token_ids[AGREE_BEFORE_COPY:], None)
            self.last_copy = (len(context_ids) + AGREE_BEFORE_COPY, tail.token_ids)
            return _joined(head, tail, policy, "model+lookup")
        confidences = head.token_probs()
        if len(head.token_ids) < AGREE_BEFORE_COPY or not policy.goes_on(head.token_ids, n, confidences):
            return head  # the model stopped there, as it would have drafting alone
        rest = self._modelled(context_ids + head.token_ids, n - AGREE_BEFORE_COPY,
                              policy.after(confidences).capped(policy.most - AGREE_BEFORE_COPY), 0.0)
        self.last_model = (len(context_ids), head.token_ids + rest.token_ids)
        return _joined(head, rest, policy, "model")

    def copy(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        """Prompt lookup's proposal alone (up to n tokens, no model forward), for a round the k="auto" controller
        gave at most one model draft (`specdec.core.schedule`: a copy round); its source is "copy"."""
        return replace(self._copied(context_ids, self.lookup.propose(context_ids, n, policy)), source=COPY)

    def _copied(self, context_ids: list[int], copied: Proposal) -> Proposal:
        """Prompt lookup's proposal as it is, remembered as the last copy."""
        self.last_copy = (len(context_ids), copied.token_ids)
        return copied

    def _modelled(self, context_ids: list[int], n: int, policy: SamplingPolicy, lookup_s: float) -> Proposal:
        """The model's proposal (its time with the lookup's), remembered as its last."""
        proposal = self.model_drafter.propose(context_ids, n, policy)
        proposal.time_s += lookup_s
        self.last_model = (len(context_ids), proposal.token_ids)
        return proposal

    def copy_goes_on(self, context_ids: list[int]) -> bool:
        """Whether the last round proposed a copy that passed whole: its tokens, then the target's token after them,
        end this context (plain steps or a model round since end the copy's run)."""
        if not self.passed(self.last_copy, context_ids):
            return False
        start, tokens = self.last_copy
        return len(context_ids) == start + len(tokens) + 1

    @staticmethod
    def passed(proposed: tuple[int, list[int]] | None, context_ids: list[int]) -> bool:
        """Whether the `proposed` tokens (the model's last, or the last copy: their position, tokens) passed whole:
        they follow in this context (a rejected token is never the target's next, greedy or sampled, so a miss
        always shows)."""
        if proposed is None:
            return False
        start, tokens = proposed
        return bool(tokens) and context_ids[start:start + len(tokens)] == tokens


def _joined(head: Proposal, tail: Proposal, policy: SamplingPolicy, source: str) -> Proposal:
    """One proposal of `head`'s tokens then `tail`'s, each with the distribution it was drawn from."""
    rows = torch.cat([head.draft_distributions(policy.vocab_size), tail.draft_distributions(policy.vocab_size)])
    return Proposal(head.token_ids + tail.token_ids, rows, head.time_s + tail.time_s, head.forwards + tail.forwards,
                    source=source)

