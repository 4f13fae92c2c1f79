"""Make a draft with another tokenizer speak the target's: a vocabulary transplant.

The cure for a draft whose tokenizer differs from the target's: hard-clone the target tokenizer into the
draft and transplant the embedding matrices, then distil (`specdec.training.distill`). Copying the first
min(V_draft, V_target) rows *by index* maps unrelated tokens onto each other whenever the two vocabularies
are ordered differently; here the default copies rows *by token string* and builds a token the draft lacks
from the mean of the draft's embeddings of its pieces (as in vocabulary-transfer work, e.g. Gee et al. 2022
"Fast Vocabulary Transfer"). The index variant is kept as `method="index"` for comparison.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.core.inputs import vocab_size
from specdec.drafters.tokenizers import SPECIAL_ROLES, decode_text, shared_token_map, token_texts
from specdec.models.speed import apply_speed_levers


@dataclass
class TransplantSummary:
    """How the rows of the new embedding matrices were made."""

    method: str  # "string" (by token string, pieces for new tokens) or "index" (by row number, the naive way)
    rows: int  # rows of the new input embedding and LM head
    copied: int  # rows copied from one draft row (same token; for "index": same row number)
    from_pieces: int  # rows set to the mean of the draft rows of the token's pieces
    initialised: int  # rows with nothing to copy: the draft's mean row ("string") or Gaussian noise ("index")
    tied: bool  # input embedding and LM head share one matrix (as before the transplant)


def transplant_vocabulary(draft_model, draft_tok, target_tok, *, method: str = "string",
                          rows: int | None = None, seed: int = 0) -> TransplantSummary:
    """Give `draft_model` (in place) input-embedding and LM-head matrices for `target_tok`'s ids.

    rows: size of the new matrices, default len(target_tok); pass the target model's head rows so the vocab
    sizes match exactly (vLLM and llama.cpp refuse any difference). The config's vocab size and special
    token ids (bos/eos/pad) become the target tokenizer's. Save with `save_aligned`.
    """
    if method not in ("string", "index"):
        raise ValueError(f"method must be 'string' or 'index', got {method!r}")
    rows = rows or len(target_tok)
    if rows < len(target_tok):
        raise ValueError(f"rows={rows} is smaller than the target tokenizer ({len(target_tok)} tokens)")
    embedding, head = draft_model.get_input_embeddings(), draft_model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    if method == "string":
        sources, kinds = piece_sources(draft_tok, target_tok, rows)
        remap = partial(rows_from_sources, sources=sources)
    else:
        generator = torch.Generator().manual_seed(seed)
        std = getattr(draft_model.config, "initializer_range", 0.02)
        copied = min(rows, embedding.weight.shape[0])
        kinds = ["copied"] * copied + ["initialised"] * (rows - copied)
        remap = partial(rows_by_index, rows=rows, std=std, generator=generator)
    with torch.no_grad():
        new_embedding = torch.nn.Embedding(rows, embedding.weight.shape[1], dtype=embedding.weight.dtype)
        new_embedding.weight.copy_(remap(embedding.weight))
        draft_model.set_input_embeddings(new_embedding)
        if head is not None:
            draft_model.set_output_embeddings(_new_head(head, rows, remap, new_embedding if tied else None))
    _update_config(draft_model, target_tok, rows, tied)
    return TransplantSummary(method, rows, kinds.count("copied"), kinds.count("from_pieces"),
                             kinds.count("initialised"), tied)


def piece_sources(draft_tok, target_tok, rows: int) -> tuple[list[list[int]], list[str]]:
    """For each target row: the draft ids whose rows to average, and how they were found.

    Same token in both -> [its draft id] ("copied"); a special token of the same role (eos, bos, pad) ->
    the draft's one ("copied"); otherwise the draft's tokenization of the token's text ("from_pieces");
    byte pieces and padding rows -> [] ("initialised", the draft's mean row).
    """
    shared = shared_token_map(target_tok, draft_tok)
    for role in SPECIAL_ROLES:
        target_id, draft_id = getattr(target_tok, f"{role}_token_id", None), getattr(draft_tok, f"{role}_token_id", None)
        if target_id is not None and draft_id is not None:
            shared.setdefault(target_id, draft_id)
    texts = token_texts(target_tok)
    missing = [i for i in range(len(target_tok)) if i not in shared and texts[i]]
    pieces = draft_tok([texts[i] for i in missing], add_special_tokens=False)["input_ids"] if missing else []
    from_pieces = dict(zip(missing, pieces))
    sources = [[shared[row]] if row in shared else from_pieces.get(row, []) for row in range(rows)]
    kinds = ["copied" if row in shared else "from_pieces" if sources[row] else "initialised" for row in range(rows)]
    return sources, kinds


def rows_from_sources(old: torch.Tensor, sources: list[list[int]]) -> torch.Tensor:
    """old [V_draft, H] (or [V_draft]) -> [len(sources), H]: row i = mean of old[sources[i]] (mean row if empty)."""
    matrix = old.detach().reshape(old.shape[0], -1).float()  # [V_draft, H]
    ids = torch.tensor([i for s in sources for i in s], dtype=torch.long)
    offsets = torch.tensor([0] + [len(s) for s in sources[:-1]], dtype=torch.long).cumsum(0)
    new = F.embedding_bag(ids, matrix, offsets, mode="mean")  # [rows, H], zeros for empty bags
    empty = torch.tensor([not s for s in sources])
    new[empty] = matrix.mean(0)
    return new.reshape(len(sources), *old.shape[1:]).to(old.dtype)


def rows_by_index(old: torch.Tensor, rows: int, std: float, generator: torch.Generator) -> torch.Tensor:
    """The naive variant: the first min(V_draft, rows) rows copied by row number, N(0, std²) noise for the rest."""
    new = torch.randn((rows, *old.shape[1:]), generator=generator) * std
    copied = min(rows, old.shape[0])
    new[:copied] = old.detach()[:copied].float()
    return new.to(old.dtype)


def _new_head(head: torch.nn.Module, rows: int, remap, tied_embedding) -> torch.nn.Linear:
    new_head = torch.nn.Linear(head.weight.shape[1], rows, bias=head.bias is not None, dtype=head.weight.dtype)
    if tied_embedding is not None:
        new_head.weight = tied_embedding.weight  # still one matrix
    else:
        new_head.weight.copy_(remap(head.weight))
    if head.bias is not None:
        new_head.bias.copy_(remap(head.bias))
    return new_head


def _update_config(model, target_tok, rows: int, tied: bool) -> None:
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    for config in configs:
        config.vocab_size = rows
        config.tie_word_embeddings = tied
        for role in ("bos", "eos", "pad"):
            setattr(config, f"{role}_token_id", getattr(target_tok, f"{role}_token_id", None))
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        for role in ("bos", "eos", "pad"):
            setattr(generation, f"{role}_token_id", getattr(target_tok, f"{role}_token_id", None))


@torch.no_grad()
def bits_per_character(model, tokenizer, texts) -> float:
    """Cross-entropy of `model` on `texts` in bits per character (comparable across tokenizers): how well a
    transplanted draft still models text before any training. The first token of each text is not scored."""
    nats = characters = 0.0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < 2:
            continue
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()  # [T-1, V]
        nats += float(F.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum"))
        characters += len(text) - len(decode_text(tokenizer, ids[:1]))
    if not characters:
        raise ValueError("no text long enough to score: give texts of at least two tokens")
    return nats / math.log(2) / characters


def save_aligned(model, target_tok, out_dir, summary: TransplantSummary | None = None) -> Path:
    """Write the aligned draft as a plain HF folder: safetensors weights, config, the target tokenizer.

    Raises ValueError when the saved tokenizer does not load back as the target's (transformers picks the
    tokenizer class from the draft's model type when the tokenizer does not name its own class)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    target_tok.save_pretrained(out)
    _check_reload(target_tok, out)
    if summary is not None:
        (out / "alignment.json").write_text(json.dumps(asdict(summary), indent=1))
    return out


def _check_reload(target_tok, folder: Path) -> None:
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(folder)
    if reloaded.get_vocab() != target_tok.get_vocab():
        raise ValueError(
            f"the tokenizer saved in {folder} loads back as {type(reloaded).__name__} with {len(reloaded)} tokens "
            f"instead of the target's {len(target_tok)}: set tokenizer_class in the target's tokenizer_config.json")


def transplanted(other, target, method: str):
    """A copy of `other` (a LoadedModel) with the target's tokenizer and logit width."""
    clone = copy.copy(other)
    clone.model = copy.deepcopy(other.model)
    transplant_vocabulary(clone.model, other.tokenizer, target.tokenizer, method=method,
                          rows=vocab_size(target.model))
    apply_speed_levers(clone.model)  # the same load-time speed levers as every other model here
    clone.tokenizer, clone.name = target.tokenizer, f"{other.name} ({method} transplant)"
    return clone
