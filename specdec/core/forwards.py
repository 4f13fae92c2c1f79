"""Timed forwards after a fixed context: the probe every cost measurement shares.

The calibration of v(n) and c (`specdec.costs.calibration`), the format calibration (`specdec.models.formats`),
the lever table (`specdec.lab.levers`) and the breakdown (`specdec.lab.breakdown`) all time one forward over n new
tokens after the same CONTEXT_TOKENS-token context: `primed_cache` fills a CachedLM with it once, and
`forward_seconds` rolls the cache back to it (the one rule of `specdec.core.kv`) before each timed forward, whose
seconds are `CachedLM.forward`'s (`specdec.core.timing.Timer`: the device synchronised at both ends).
"""
from __future__ import annotations

import torch

from specdec.core.inputs import vocab_size
from specdec.core.kv import CachedLM

CONTEXT_TOKENS = 64  # tokens in the cache before each timed forward (a short prompt plus some output)


def timing_context(model: torch.nn.Module, length: int = CONTEXT_TOKENS) -> list[int]:
    """A deterministic context of distinct tokens (given length + 10 rows or more: the stride 7919 is prime);
    timing does not depend on which ids."""
    rows = vocab_size(model)
    return [(7 + 7919 * i) % (rows - 10) + 5 for i in range(length)]


def primed_cache(model: torch.nn.Module, own_forward: bool = True) -> tuple[CachedLM, list[int]]:
    """A CachedLM of `model` holding CONTEXT_TOKENS tokens of context, and that context (own_forward=False:
    transformers' forward even where the model has its own, `specdec.core.kv`)."""
    lm = CachedLM(model, own_forward)
    base = timing_context(model)
    lm.prefill(base + [base[0]])  # the cache holds `base`
    return lm, base


def forward_seconds(lm: CachedLM, base: list[int], n: int) -> float:
    """Seconds of one forward over n new tokens after `base` (the cache is rolled back to `base` first, outside
    the forward's own timer)."""
    cached_next = lm.token_ids[len(base):len(base) + 1]
    first = 2 if cached_next == [1] else 1  # differs from what is cached, so the rollback keeps exactly `base`
    feed = lm.pending(base + [first] + [3] * (n - 1))  # [n] new tokens
    return lm.forward(feed, logits_to_keep=n)[1]
