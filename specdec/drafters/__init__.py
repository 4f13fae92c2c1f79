"""Drafters: anything that proposes tokens for the target to verify, and the one factory that builds them.

`from_spec(spec, target, load=...)` owns every kind of draft a user can name:

| spec | drafter |
|---|---|
| a model (catalogue name, folder, .gguf, hub id) | the model itself (the engine drafts with `ModelDrafter`); another tokenizer goes through `TextBridgeDrafter` |
| `aligned:NAME` | a draft of another family moved onto the target's tokenizer, registered in the cache (`specdec.models.aligned`) |
| `lookup` | `PromptLookupDraft` (Saxena 2023) |
| `self:L` | `SelfSpeculativeDraft`: the target's first L layers (Zhang et al. 2023) |
| `MODEL+lookup` | `HybridDrafter`: prompt lookup when it finds a continuation, the model otherwise |
| `MODEL@vocab=FILE` | `PrunedVocabularyDrafter`: the model drafting over the token ids in FILE only (FR-Spec, Zhao et al. 2025) |

`vocabulary` says how a model draft meets the target's ids: "auto" (text bridge only when the tokenizers
differ), "as is" (ids as they are; the engine refuses a different vocabulary), "bridge" (always through
text) or "naive" (ids fed across vocabularies, `NaiveCrossVocabDrafter`, to show the collapse).
"""
from __future__ import annotations

from typing import Callable

from specdec.core.drafter import Drafter, ModelDrafter, NoDraft, Proposal, SamplingPolicy, as_drafter, to_target_vocab
from specdec.core.inputs import check_vocabularies, unwrap
from specdec.drafters.bridge import NaiveCrossVocabDrafter, TextBridgeDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.lookup import PromptLookupDraft
from specdec.drafters.pair import check_pair
from specdec.drafters.pruned import PrunedVocabularyDrafter, VOCAB_SEPARATOR, load_vocabulary
from specdec.drafters.selfspec import SelfSpeculativeDraft

VOCABULARY_MODES = ("auto", "as is", "bridge", "naive")
LOOKUP = "lookup"
HYBRID_SUFFIX = "+lookup"

__all__ = [
    "Drafter", "ModelDrafter", "NoDraft", "Proposal", "SamplingPolicy", "to_target_vocab", "PromptLookupDraft",
    "SelfSpeculativeDraft", "PrunedVocabularyDrafter", "TextBridgeDrafter", "NaiveCrossVocabDrafter", "HybridDrafter", "from_spec",
    "as_drafter", "self_layers", "VOCABULARY_MODES",
]


def from_spec(spec: str, target, *, load: Callable[[str], object], vocabulary: str = "auto"):
    """The draft named by `spec` for `target` (a LoadedModel); `load(name)` loads a model draft.

    Returns a Drafter, or a LoadedModel for a model draft used as is (the engine wraps it).
    """
    if vocabulary not in VOCABULARY_MODES:
        raise ValueError(f"vocabulary mode must be one of {', '.join(VOCABULARY_MODES)}, got {vocabulary!r}")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("a draft spec must be a non-empty string: a model, 'lookup', 'self:L', 'MODEL+lookup' "
                         "or 'MODEL@vocab=FILE'")
    spec = spec.strip()
    if spec == LOOKUP:
        return PromptLookupDraft()
    if spec.startswith("self:"):
        return SelfSpeculativeDraft(target.model, layers=self_layers(spec))
    if spec.endswith(HYBRID_SUFFIX):
        inner = from_spec(spec.removesuffix(HYBRID_SUFFIX), target, load=load, vocabulary=vocabulary)
        return HybridDrafter(as_drafter(inner, target.model))
    if VOCAB_SEPARATOR in spec:
        return _pruned_draft(spec, target, load)
    return _model_draft(load(spec), target, vocabulary)


def _pruned_draft(spec: str, target, load) -> PrunedVocabularyDrafter:
    """`MODEL@vocab=FILE`: the model (sharing the target's ids) drafting over FILE's token ids only."""
    model_spec, _, vocabulary_file = spec.rpartition(VOCAB_SEPARATOR)
    if not model_spec or not vocabulary_file:
        raise ValueError(f"{spec!r}: a pruned draft is MODEL@vocab=FILE, e.g. runs/finance/distill/draft"
                         f"@vocab=runs/finance/prune/vocabulary.json")
    token_ids = load_vocabulary(vocabulary_file)  # the cheap check first, then the model
    draft_model, _ = unwrap(load(model_spec), None)
    check_vocabularies(target.model, draft_model)
    return PrunedVocabularyDrafter(draft_model, token_ids)


def _model_draft(draft, target, vocabulary: str):
    if vocabulary == "naive":
        return NaiveCrossVocabDrafter(draft)
    if vocabulary == "bridge" or (vocabulary == "auto" and check_pair(target, draft).kind == "different"):
        return TextBridgeDrafter(draft, target.tokenizer)
    return draft


def self_layers(spec: str) -> int:
    """L of a "self:L" spec; ValueError with an example otherwise."""
    value = spec.removeprefix("self:")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{spec!r}: self-speculation needs a positive number of target layers, e.g. self:8 "
                         "(self:auto, which calibrates L, is a `python -m specdec bench` draft)")
    return int(value)
