"""Can this draft's token ids be verified by this target? `check_pair` says, and what to do if not.

Speculative decoding compares token ids: it needs the draft and the target to share a tokenizer
(Leviathan et al. 2023 assume one vocabulary). Same-family checkpoints often pad the embedding
matrix differently (Qwen2.5: 151,936 rows for a 151,665-entry tokenizer), which is harmless.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core.inputs import PADDING_TOLERANCE, vocab_size

KINDS = ("identical", "padded", "different")


@dataclass
class PairReport:
    """How a target's and a draft's tokenizers relate."""

    kind: str  # "identical" | "padded" (same tokenizer, other LM-head row count) | "different"
    compatible: bool  # the engine can verify the draft's ids directly (else: align or text bridge)
    target_tokens: int  # entries in the target's tokenizer
    draft_tokens: int  # entries in the draft's tokenizer
    target_rows: int  # LM-head rows of the target (width of its logits)
    draft_rows: int  # LM-head rows of the draft
    shared_tokens: int  # token strings that have the same id in both tokenizers
    message: str  # one human sentence: what this means and what to do


def check_pair(target, draft) -> PairReport:
    """Compare the tokenizers and LM heads of two LoadedModels."""
    target_vocab, draft_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    shared = sum(1 for token, index in draft_vocab.items() if target_vocab.get(token) == index)
    same = target_vocab == draft_vocab and _specials(target.tokenizer) == _specials(draft.tokenizer)
    rows_t, rows_d = vocab_size(target.model), vocab_size(draft.model)
    kind = ("identical" if rows_t == rows_d else "padded") if same else "different"
    compatible = same and abs(rows_t - rows_d) <= PADDING_TOLERANCE * max(rows_t, rows_d)
    return PairReport(kind, compatible, len(target_vocab), len(draft_vocab), rows_t, rows_d, shared,
                      _message(kind, compatible, len(target_vocab), len(draft_vocab), rows_t, rows_d, shared))


def _specials(tokenizer) -> tuple:
    return tuple(sorted(str(t) for t in tokenizer.all_special_tokens))


def _message(kind, compatible, tokens_t, tokens_d, rows_t, rows_d, shared) -> str:
    if kind == "identical":
        return f"identical tokenizers ({tokens_t} entries) and logit widths ({rows_t}): ready for speculative decoding"
    if kind == "padded" and compatible:
        return (f"same tokenizer ({tokens_t} entries); the LM heads are padded differently ({rows_t} vs {rows_d} rows): "
                "fine, the extra ids are never proposed")
    if kind == "padded":
        return (f"same tokenizer, but the LM heads differ too much ({rows_t} vs {rows_d} rows) for the engine's "
                "padding check: resize the draft's embeddings to the target's row count")
    return (f"different tokenizers ({tokens_t} vs {tokens_d} entries, {shared} with the same id): the same id means "
            "different text. Hard-clone the draft onto the target's tokenizer (`python -m specdec align`) or let it "
            "draft through the text bridge (specdec.drafters.TextBridgeDrafter; load_draft(..., bridge='auto') does "
            "this for you)")
