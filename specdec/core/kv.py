"""A causal LM together with the KV cache of the tokens it has read.

The one KV-rollback rule of specdec
-----------------------------------
A model's cache always holds the keys/values of a prefix of the sequence it has been fed,
and `CachedLM.token_ids` is that prefix. Before each forward the caller gives the current
context; the cache is cropped to the longest common prefix of `token_ids` and the context,
and only the tokens after it are fed. So after a verification that accepted n of k drafts,
the positions of the k - n rejected drafts are simply dropped (cropped) at the next sync,
and a draft that proposed all k tokens catches up on the last one (plus the target's bonus
token) in one forward. Nothing is ever recomputed from the start: each model is fed
O(prompt + new tokens + k * rounds) tokens over a generation (tested in tests/test_engine.py,
test_each_model_is_fed_a_linear_number_of_tokens).

Which cache class holds the keys/values is a flag on the model, `CACHE_CLASS_FLAG` (default transformers'
`DynamicCache`; `specdec.lab.levers.preallocate_cache` sets a preallocated one); every class obeys this same rule.
A model may also carry its own forward, `DECODER_FLAG` (an int8 model's, `specdec.models.int8_forward`): a
function of the model giving a plan with `new_cache()` and `forward(ids, cache, logits_to_keep)` (or None where
it does not apply), run instead of the model's forward over the plan's cache, unless a lever is in place (a cache
class set, or the model's forward replaced).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from specdec.core.timing import Timer

CACHE_CLASS_FLAG = "specdec_cache_class"  # model attribute: the DynamicCache (sub)class CachedLM keeps
DECODER_FLAG = "specdec_decoder"  # model attribute: model -> its own forward's plan, or None (the model's forward)
LEAF_ROWS_FLAG = "specdec_leaf_rows"  # model attribute: True where its attention gives each row of a tree mask its own
# keys' one-token step, bit for bit (a row-invariant model's), so a forward may verify leaves (`CachedLM.forward`)
MIN_CAPACITY = 256  # positions preallocated key/value storage holds at first (`written`); it doubles when full


def written(storage: torch.Tensor | None, start: int, new: torch.Tensor) -> torch.Tensor:
    """Preallocated key/value storage [B, H_kv, capacity, D] (None: none yet) holding `new` [B, H_kv, n, D] at
    start..start + n: written in place, or, where it is too short, into new storage of twice the capacity
    (MIN_CAPACITY at first, at least start + n) that holds its first `start` positions, so copies are amortised
    O(1) per token. The preallocated caches (the lever's, an int8 model's own forward's) all grow by this rule."""
    end = start + new.shape[-2]
    storage = reserved(storage, start, end, new)
    storage[..., start:end, :] = new
    return storage


def reserved(storage: torch.Tensor | None, start: int, end: int, like: torch.Tensor) -> torch.Tensor:
    """`storage` if it holds `end` positions, else new storage of the growth rule above (shaped and typed as `like`
    [B, H_kv, n, D], its first `start` positions copied)."""
    if storage is None or end > storage.shape[-2]:
        old = 0 if storage is None else storage.shape[-2]
        grown = like.new_empty((*like.shape[:-2], max(end, MIN_CAPACITY, 2 * old), like.shape[-1]))
        if start:
            grown[..., :start, :] = storage[..., :start, :]
        storage = grown
    return storage


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class CachedLM:
    """Wraps a transformers causal LM: feeds only new tokens, counts tokens and time."""

    def __init__(self, model: torch.nn.Module, own_forward: bool = True):
        self.model = model
        self.device = next(model.parameters()).device
        self.plan = _plan(model) if own_forward else None  # the model's own forward (DECODER_FLAG), or transformers'
        self.takes_leaves = bool(getattr(model, LEAF_ROWS_FLAG, False)) and not _lever_in_place(model)
        self.reset()

    def reset(self) -> None:
        """Forget every token read: an empty cache and the counters at zero."""
        self.token_ids: list[int] = []  # the prefix whose keys/values are in `cache`
        self.cache = self._new_cache()
        self.tokens_fed = 0  # total tokens passed through the model (the linear-cost witness)
        self.forwards = 0

    def pending(self, context: list[int]) -> list[int]:
        """Apply the rollback rule for `context` and return the tokens not yet in the cache."""
        keep = common_prefix_length(self.token_ids, context)
        keep = min(keep, len(context) - 1)  # always feed at least one token: its logits are needed
        if keep < len(self.token_ids):
            self._crop(keep)
        return context[keep:]

    def prefill(self, context: list[int]) -> float:
        """Read all of `context` but its last token (whose logits the first round needs). Returns seconds."""
        feed = self.pending(context)[:-1]
        return self.forward(feed)[1] if feed else 0.0

    def _new_cache(self):
        if self.plan is not None:
            return self.plan.new_cache()
        cache = getattr(self.model, CACHE_CLASS_FLAG, DynamicCache)(config=self.model.config)
        cache.activate_past_recording()  # sliding-window layers keep what a rollback needs
        return cache

    def _crop(self, length: int) -> None:
        if self.cache.is_croppable:
            self.cache.crop(length - len(self.token_ids))  # transformers 5.x: a negative count removes tokens
            self.token_ids = self.token_ids[:length]
        else:  # a layer that cannot roll back: start again (correct, only slower)
            self.cache = self._new_cache()
            self.token_ids = []

    @torch.inference_mode()
    def forward(self, new_ids: list[int], logits_to_keep: int = 1,
                leaves: list[tuple[int, int]] = ()) -> tuple[torch.Tensor, float]:
        """Feed `new_ids` after the cached prefix. Returns (logits [logits_to_keep + len(leaves), V] fp32 on the CPU,
        seconds).

        leaves: (token, parent) pairs read in the same forward after `new_ids` (`takes_leaves` models only): each a
        leaf of a one-level tree, at the position after new_ids[parent], attending to the cache, new_ids[:parent + 1]
        and itself, its logits after new_ids' kept rows, each bitwise a one-token step after that prefix. The cache
        then holds `new_ids` alone (a leaf that passes is read again next round, by the rollback rule).
        The logits come to the CPU, where verification and sampling run with the engine's one CPU generator (on
        a GPU too: one code path); the seconds are the forward's run time and that copy (`specdec.core.timing.Timer`:
        the device synchronised at both ends)."""
        if not new_ids:
            raise ValueError("forward needs at least one new token")
        if leaves and not self.takes_leaves:
            raise ValueError("this model's attention cannot verify leaves")
        ids = torch.tensor([new_ids + [token for token, _ in leaves]], dtype=torch.long, device=self.device)  # [1, S]
        with Timer(self.device) as timer:
            logits = self._logits(ids, logits_to_keep + len(leaves), [parent for _, parent in leaves])
            logits = logits[0].float().cpu()  # [logits_to_keep + len(leaves), V]
        if leaves:
            self.cache.crop(-len(leaves))
        self.token_ids.extend(new_ids)
        self.tokens_fed += len(ids[0])
        self.forwards += 1
        return logits, timer.seconds

    def _logits(self, ids: torch.Tensor, logits_to_keep: int, parents: list[int]) -> torch.Tensor:
        """[1, logits_to_keep, V] for ids [1, S] after the cache, which then holds them too; the last len(parents)
        ids are leaves (`forward`), placed and masked as a tree."""
        tree = tree_layout(len(self.token_ids), ids.shape[1] - len(parents), parents, ids.device) if parents else {}
        if self.plan is not None:
            return self.plan.forward(ids, self.cache, logits_to_keep, **tree)
        tree = {"position_ids": tree["positions"], "attention_mask": tree["mask"]} if tree else {}
        return self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=logits_to_keep,
                          **tree).logits


def tree_layout(past: int, chain: int, parents: list[int], device=None) -> dict[str, torch.Tensor]:
    """Where a forward's rows sit and what each sees, for `chain` new tokens after `past` cached ones then one leaf
    per entry of `parents` (the chain index it follows): {"positions": [1, S] (a leaf at its parent's position + 1),
    "mask": bool [1, 1, S, past + S] (a chain token sees the cache and the chain up to itself; a leaf, the cache, the
    chain up to its parent, and itself)}, S = chain + len(parents)."""
    size = chain + len(parents)
    positions = torch.tensor([[*range(past, past + chain), *(past + parent + 1 for parent in parents)]], device=device)
    mask = torch.ones(size, past + size, dtype=torch.bool, device=device).tril(past)  # [S, past + S] causal
    for leaf, parent in enumerate(parents):
        mask[chain + leaf, past + parent + 1:past + chain + leaf] = False  # not the chain past its parent, no other leaf
    return {"positions": positions, "mask": mask[None, None]}


def _plan(model: torch.nn.Module):
    """The plan of the model's own forward (DECODER_FLAG), or None: none set, or a lever in place (a cache class
    set, or the forward replaced on the model, as a compiled one)."""
    make = getattr(model, DECODER_FLAG, None)
    return None if make is None or _lever_in_place(model) else make(model)


def _lever_in_place(model: torch.nn.Module) -> bool:
    """Whether a lever replaced what the model's own forward and its leaves rely on: a cache class set, or the
    forward replaced on the model (a compiled one)."""
    return getattr(model, CACHE_CLASS_FLAG, None) is not None or "forward" in vars(model)
