"""Prompt lookup decoding: draft by copying from the context, no model at all.

Saxena 2023, "Prompt Lookup Decoding" (also the n-gram drafter of Spec-Bench, Xia et al. 2024):
when the output copies its input (code editing, summarisation, RAG), the tokens that followed
an earlier occurrence of the context's last few tokens are a free and often right guess.
The drafter gives no probabilities, so verification treats each proposal as a point mass:
greedy output is still the target's, and sampling stays lossless (accept with p_target(x)).
"""
from __future__ import annotations

import torch

from specdec.core.drafter import Proposal, SamplingPolicy
from specdec.core.timing import Timer


def find_continuation(context_ids: list[int], n: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to n tokens that followed the latest earlier occurrence of the longest matching suffix n-gram.

    Suffix lengths max_ngram..min_ngram are tried in turn; the first that occurs earlier in the
    context wins, and its latest occurrence is copied. Returns [] when no suffix occurs earlier.
    """
    context = torch.tensor(context_ids, dtype=torch.long)  # [T]
    for size in range(min(max_ngram, len(context_ids) - 1), min_ngram - 1, -1):
        suffix = context[-size:]  # [size]
        earlier = context[:-1].unfold(0, size, 1)  # [T - size, size]: windows that end before the last token
        starts = (earlier == suffix).all(dim=1).nonzero()  # [matches, 1]
        if len(starts):
            after = int(starts[-1]) + size  # first token after the latest occurrence
            return context_ids[after:after + n]
    return []


class PromptLookupDraft:
    """Proposes the continuation of the latest earlier n-gram match in the context (Saxena 2023).

    max_ngram / min_ngram bound the suffix lengths tried (longest first). The draft length k comes
    per round as `n` in `propose`. No match: nothing is proposed and the round is one target step.
    """

    forwards = 0  # no model, no forwards
    model = None

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not isinstance(min_ngram, int) or not isinstance(max_ngram, int) or not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"prompt lookup needs integers 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram!r}, "
                f"max_ngram={max_ngram!r} (the defaults 3 and 1 suit most prompts)")
        self.max_ngram = max_ngram  # longest suffix n-gram searched for
        self.min_ngram = min_ngram  # shortest suffix n-gram accepted as a match

    @property
    def cost_key(self) -> str:
        return f"PromptLookupDraft|ngram={self.min_ngram}..{self.max_ngram}"

    def reset(self) -> None:
        pass  # it keeps nothing between rounds

    def prefill(self, prompt_ids: list[int]) -> float:
        return 0.0

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        with Timer() as timer:  # on the CPU: no device work to wait for
            tokens = policy.up_to_end(find_continuation(context_ids, n, self.max_ngram, self.min_ngram))
        return Proposal(tokens, None, timer.seconds, 0, source="lookup")
