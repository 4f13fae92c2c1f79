"""A draft with a pruned vocabulary: the draft's LM head restricted to a set of target token ids.

Most of a small draft's step on CPU can be its LM head (SmolLM2-135M: 576 x 151936 against ~100M other
weights). Restricting the head to the tokens a domain actually uses, plus the most frequent ones, makes each
draft step cheaper at a small acceptance cost (FR-Spec, Zhao et al. 2025). Only drafting changes: p_draft
is the draft's softmax renormalised over the set (logits outside it are -inf, so such a token is never
proposed); the target verifies with the one rule of `specdec.core.verify`, so greedy output is the target's and
sampling stays lossless.

The set is a JSON file `{"token_ids": [...], ...}` (`save_vocabulary`); the drafter spec
`MODEL@vocab=FILE` names it (`specdec.drafters.spec`).
"""
from __future__ import annotations

import copy
import hashlib
import json
import weakref
from pathlib import Path
from typing import Iterable

import torch

from specdec.core.drafter import ModelDrafter, SamplingPolicy
from specdec.core.inputs import parse_json

class PrunedVocabularyDrafter(ModelDrafter):
    """A causal LM drafting over `token_ids` only; the head's rows for the set are sliced once."""

    def __init__(self, model: torch.nn.Module, token_ids: Iterable[int]):
        head = model.get_output_embeddings()
        rows = head.weight.shape[0]
        ids = sorted(set(int(t) for t in token_ids))
        if not ids or ids[0] < 0 or ids[-1] >= rows:
            raise ValueError(f"a pruned vocabulary needs ids in 0..{rows - 1}, got {len(ids)} ids"
                             + (f" from {ids[0]} to {ids[-1]}" if ids else ""))
        self.token_ids = torch.tensor(ids, dtype=torch.long)  # [S] the set, sorted
        super().__init__(_pruned_model(model, self.token_ids))

    def candidates(self, logits: torch.Tensor, policy: SamplingPolicy) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Greedy: the set's [S] logits and their ids as they are (nothing spread over the target's vocabulary per
        token); sampling: [V_target] logits, -inf at every id outside the set, so a draw takes the same index
        space as an unpruned draft's."""
        if policy.greedy and int(self.token_ids[-1]) < policy.vocab_size:
            return logits, self.token_ids
        full = logits.new_full((policy.vocab_size,), float("-inf"))
        keep = self.token_ids < policy.vocab_size
        full[self.token_ids[keep]] = logits[keep]
        return full, None


_PRUNED = weakref.WeakKeyDictionary()  # model -> {digest of a set: the model with that set's head rows}


def _pruned_model(model: torch.nn.Module, token_ids: torch.Tensor) -> torch.nn.Module:
    """`_with_head_rows(model, token_ids)`, sliced once per model and set: an app's every request drafts with a
    new drafter over the same model (kept while the model is)."""
    clones = _PRUNED.setdefault(model, {})
    digest = hashlib.sha256(token_ids.numpy().tobytes()).hexdigest()
    if digest not in clones:
        clones[digest] = _with_head_rows(model, token_ids)
    return clones[digest]


def _with_head_rows(model: torch.nn.Module, token_ids: torch.Tensor) -> torch.nn.Module:
    """A shallow copy of `model` whose LM head holds only `token_ids`' rows (the original is untouched): a float
    head's rows copied, a quantized one's in its own form (`kept_rows`: the int8 rows and scales as they are)."""
    head = model.get_output_embeddings()
    if hasattr(head, "kept_rows"):
        sliced = head.kept_rows(token_ids)
    elif head.weight.is_floating_point():
        sliced = torch.nn.Linear(head.weight.shape[1], len(token_ids), bias=head.bias is not None,
                                 device=head.weight.device, dtype=head.weight.dtype)
        with torch.no_grad():
            sliced.weight.copy_(head.weight[token_ids])  # [S, H]
            if head.bias is not None:
                sliced.bias.copy_(head.bias[token_ids])
    else:
        raise ValueError(f"a pruned vocabulary cannot slice a {type(head).__name__} LM head: load the draft as "
                         "float32, bfloat16 or an int8 format (--draft-dtype)")
    clone = copy.copy(model)
    clone._modules = dict(model._modules)  # own module table, shared submodules (weights are not copied)
    clone.set_output_embeddings(sliced)
    return clone.eval()


# --- the token set -----------------------------------------------------------------------------------------


def load_vocabulary(path: str | Path) -> list[int]:
    """The token ids of a set written by `save_vocabulary` (or a bare JSON list of ids)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no draft vocabulary file {path}: write one with the align-distill recipe "
                         "(its prune stage) or specdec.training.prune.save_vocabulary")
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a JSON draft vocabulary ({error})") from None
    ids = data.get("token_ids") if isinstance(data, dict) else data
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
        raise ValueError(f"{path}: expected {{\"token_ids\": [ids...]}} with at least one integer id")
    return ids
