"""Drafters: anything that proposes tokens for the target to verify, and the one factory that builds them.

`from_spec(spec, target, load=...)` owns every kind of draft a user can name:

| spec | drafter |
|---|---|
| a model (catalogue name, folder, .gguf, hub id) | the model itself (the engine drafts with `ModelDrafter`); another tokenizer goes through `TextBridgeDrafter` |
| `aligned:NAME` | a draft of another family moved onto the target's tokenizer, registered in the cache (`specdec.models.aligned`) |
| `lookup` | `PromptLookupDraft` (Saxena 2023) |
| `self:L` | `SelfSpeculativeDraft`: the target's first L layers (Zhang et al. 2023) |
| `MODEL+lookup` | `HybridDrafter`: prompt lookup where the model has just missed, starts the copy itself or a copy is on track; the model otherwise |
| `MODEL@vocab=FILE` | `PrunedVocabularyDrafter`: the model drafting over the token ids in FILE only (FR-Spec, Zhao et al. 2025) |

`DraftSpec.parse` (`specdec.drafters.spec`) reads the spec once, for this factory and the app's allow-list.
`vocabulary` (a `Vocabulary`) says how a model draft meets the target's ids: "auto" (text bridge only when the
tokenizers differ), "as is" (ids as they are; the engine refuses a different vocabulary), "text bridge" (always
through text) or "naive ids" (ids fed across vocabularies, `NaiveCrossVocabDrafter`, to show the collapse).
"""
from __future__ import annotations

from typing import Callable

from specdec.core.drafter import Drafter, ModelDrafter, NoDraft, Proposal, SamplingPolicy, as_drafter, to_target_vocab
from specdec.core.inputs import check_vocabularies, unwrap
from specdec.drafters.bridge import NaiveCrossVocabDrafter, TextBridgeDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.lookup import PromptLookupDraft
from specdec.drafters.pair import check_pair
from specdec.drafters.pruned import PrunedVocabularyDrafter, load_vocabulary
from specdec.drafters.selfspec import SelfSpeculativeDraft
from specdec.drafters.spec import HYBRID_SUFFIX, DraftSpec, Vocabulary

__all__ = [
    "Drafter", "ModelDrafter", "NoDraft", "Proposal", "SamplingPolicy", "to_target_vocab", "PromptLookupDraft",
    "SelfSpeculativeDraft", "PrunedVocabularyDrafter", "TextBridgeDrafter", "NaiveCrossVocabDrafter", "HybridDrafter",
    "from_spec", "as_drafter", "DraftSpec", "Vocabulary", "HYBRID_SUFFIX",
]


def from_spec(spec: str | DraftSpec, target, *, load: Callable[[str], object],
              vocabulary: Vocabulary | str = Vocabulary.AUTO):
    """The draft named by `spec` (a string or a parsed DraftSpec) for `target` (a LoadedModel); `load(name)` loads
    a model draft.

    Returns a Drafter, or a LoadedModel for a model draft used as is (the engine wraps it).
    """
    vocabulary = Vocabulary.of(vocabulary)
    spec = spec if isinstance(spec, DraftSpec) else DraftSpec.parse(spec)
    draft = _base_draft(spec, target, load, vocabulary)
    return HybridDrafter(as_drafter(draft, target.model)) if spec.hybrid else draft


def _base_draft(spec: DraftSpec, target, load, vocabulary: Vocabulary):
    """The draft `spec` names, before any "+lookup"."""
    if spec.kind == "lookup":
        return PromptLookupDraft()
    if spec.kind == "self":
        return SelfSpeculativeDraft(target.model, layers=spec.layers)
    if spec.kind == "pruned":
        return _pruned_draft(spec, target, load)
    return _model_draft(load(spec.model), target, vocabulary)


def _pruned_draft(spec: DraftSpec, target, load) -> PrunedVocabularyDrafter:
    """`MODEL@vocab=FILE`: the model (sharing the target's ids) drafting over FILE's token ids only."""
    token_ids = load_vocabulary(spec.vocabulary_file)  # the cheap check first, then the model
    draft_model, _ = unwrap(load(spec.model), None)
    check_vocabularies(target.model, draft_model)
    return PrunedVocabularyDrafter(draft_model, token_ids)


def _model_draft(draft, target, vocabulary: Vocabulary):
    if vocabulary is Vocabulary.NAIVE:
        return NaiveCrossVocabDrafter(draft)
    different = vocabulary is Vocabulary.AUTO and check_pair(target, draft).kind == "different"
    if vocabulary is Vocabulary.BRIDGE or different:
        return TextBridgeDrafter(draft, target.tokenizer)
    return draft
