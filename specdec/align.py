"""Make a draft with another tokenizer speak the target's: a compatibility report and a vocabulary transplant.

Speculative decoding verifies token ids, so draft and target must share one tokenizer (Leviathan et al.
2023 assume it silently). Seed 000's cure for a draft that does not: hard-clone the target tokenizer into
the draft and transplant the embedding matrices, then distil (`specdec.distill`). Its
`align_draft_model_vocabulary` copies the first min(V_draft, V_target) rows *by index*, which maps unrelated
tokens onto each other whenever the two vocabularies are ordered differently; here the default copies rows
*by token string* and builds a token the draft lacks from the mean of the draft's embeddings of its pieces
(as in vocabulary-transfer work, e.g. Gee et al. 2022 "Fast Vocabulary Transfer"). The index variant is
kept as `method="index"` for comparison.

Token strings of different tokenizer families differ for the same text (byte-level BPE writes " the" as
"Ġthe", SentencePiece as "▁the"), so tokens are matched by raw string first and by their normalised form,
the decoded text of the single token, where the raw strings differ.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from .inputs import vocab_size

DEFAULT_TEXTS = (  # domain text where generic tokenizers split differently (seed 000's examples)
    "import QuantLib as ql\nvol = ql.BlackVolTermStructureHandle(ql.BlackConstantVol(today, calendar, 0.2, dc))",
    "def CalcBlackScholesVega(S, K, T, r, sigma):\n    d1 = (np.log(S / K) + (r + 0.5 * sigma**2) * T) / "
    "(sigma * np.sqrt(T))\n    return S * norm.pdf(d1) * np.sqrt(T)",
    "df['EBITDA_Margin'] = df['EBITDA'] / df['Revenue']\nexposure = CounterpartyCreditRisk(netting_set, "
    "collateral_agreement).expected_positive_exposure()",
    "患者确诊为急性心肌梗死，伴有高血压和2型糖尿病，建议行经皮冠状动脉介入治疗并长期服用阿司匹林。",
    "The portfolio's Value-at-Risk at 99% confidence rose to $4.2M after the CDS spread widened by 35bps.",
)
SPECIAL_ROLES = ("bos", "eos", "pad", "unk")  # tokenizer attributes <role>_token / <role>_token_id
EXAMPLES_KEPT = 10  # worst boundary examples kept in a report


@dataclass
class BoundaryExample:
    """A word the two tokenizers cut differently."""

    text: str  # the word as it appears in the text
    target_pieces: list[str]  # its pieces under the target tokenizer
    draft_pieces: list[str]  # its pieces under the draft tokenizer
    unmatched: int  # target pieces that are not also one draft piece (same span)


@dataclass
class TokenizerReport:
    """Can these two tokenizers be used as target and draft of one speculative decoder?"""

    identical: bool  # same token -> id map and special ids: ids can go straight across
    target_vocab_size: int  # len(target tokenizer), added tokens included
    draft_vocab_size: int  # len(draft tokenizer)
    shared_tokens: int  # target tokens the draft also has (raw string, else decoded text)
    shared_same_id: int  # shared tokens that also have the same id in both
    overlap: float  # shared_tokens / target_vocab_size
    target_specials: dict[str, list]  # role or special token -> [token, id] in the target
    draft_specials: dict[str, list]  # the same for the draft
    specials_missing_in_draft: list[str]  # target special tokens the draft vocabulary lacks
    target_embedding_rows: int | None  # LM-head rows of the target model (None: no model given)
    draft_embedding_rows: int | None  # LM-head rows of the draft model
    boundary_mismatch_rate: float  # share of target tokens (over `texts`) that are not also one draft token
    target_tokens_checked: int  # target tokens in `texts` (the rate's denominator)
    worst_examples: list[BoundaryExample] = field(default_factory=list)  # most-differently-cut words first

    @property
    def target_padding_rows(self) -> int | None:
        """Embedding rows of the target beyond its tokenizer (Qwen pads 151665 tokens to 151936 rows)."""
        return None if self.target_embedding_rows is None else self.target_embedding_rows - self.target_vocab_size

    def to_dict(self) -> dict:
        return asdict(self) | {"target_padding_rows": self.target_padding_rows}


def tokenizer_report(target_tok, draft_tok, texts=DEFAULT_TEXTS, *, target_model=None,
                     draft_model=None) -> TokenizerReport:
    """Compare two tokenizers (and, when given, the embedding rows of their models) on `texts`."""
    shared = shared_token_map(target_tok, draft_tok)
    same_id = sum(1 for t, d in shared.items() if t == d)
    target_specials, draft_specials = special_tokens(target_tok), special_tokens(draft_tok)
    draft_vocab = draft_tok.get_vocab()
    missing = sorted({tok for tok, _ in target_specials.values() if tok not in draft_vocab})
    checked, unmatched, examples = 0, 0, []
    for text in texts:
        target_spans, draft_spans = _spans(target_tok, text), _spans(draft_tok, text)
        checked += len(target_spans)
        unmatched += len(set(target_spans) - set(draft_spans))
        examples += [w for w in compare_words(text, target_spans, draft_spans) if w.target_pieces != w.draft_pieces]
    return TokenizerReport(
        identical=target_tok.get_vocab() == draft_vocab and _special_ids(target_specials) == _special_ids(draft_specials),
        target_vocab_size=len(target_tok), draft_vocab_size=len(draft_tok),
        shared_tokens=len(shared), shared_same_id=same_id, overlap=len(shared) / max(len(target_tok), 1),
        target_specials=target_specials, draft_specials=draft_specials, specials_missing_in_draft=missing,
        target_embedding_rows=vocab_size(target_model) if target_model is not None else None,
        draft_embedding_rows=vocab_size(draft_model) if draft_model is not None else None,
        boundary_mismatch_rate=unmatched / max(checked, 1), target_tokens_checked=checked,
        worst_examples=_worst(examples))


def format_report(report: TokenizerReport) -> str:
    """The report as plain text lines (for the CLI)."""
    lines = [
        f"identical tokenizers: {'yes' if report.identical else 'no'}",
        f"vocabulary: target {report.target_vocab_size} tokens, draft {report.draft_vocab_size}",
        f"shared tokens (by string): {report.shared_tokens} = {report.overlap:.1%} of the target's, "
        f"{report.shared_same_id} with the same id",
        f"embedding rows: target {report.target_embedding_rows}, draft {report.draft_embedding_rows}"
        + (f" (target pads {report.target_padding_rows} rows)" if report.target_padding_rows else ""),
        f"target special tokens: {report.target_specials}",
        f"draft special tokens: {report.draft_specials}",
        f"target specials the draft lacks: {report.specials_missing_in_draft or 'none'}",
        f"boundary mismatch: {report.boundary_mismatch_rate:.1%} of {report.target_tokens_checked} target tokens "
        "are not also one draft token",
    ]
    lines += [f"  {e.text!r}: target {e.target_pieces} vs draft {e.draft_pieces}" for e in report.worst_examples]
    return "\n".join(lines)


def special_tokens(tokenizer) -> dict[str, list]:
    """Role (bos/eos/pad/unk) or added special token -> [token, id]."""
    found = {}
    for role in SPECIAL_ROLES:
        token = getattr(tokenizer, f"{role}_token", None)
        if token is not None:
            found[role] = [str(token), tokenizer.convert_tokens_to_ids(str(token))]
    for token_id, added in sorted(getattr(tokenizer, "added_tokens_decoder", {}).items()):
        if added.special and added.content not in {tok for tok, _ in found.values()}:
            found[added.content] = [added.content, token_id]
    return found


def _special_ids(specials: dict[str, list]) -> dict[str, int]:
    return {name: token_id for name, (_, token_id) in specials.items()}


def token_texts(tokenizer) -> list[str | None]:
    """Decoded text of every token id on its own; None where a token is not whole UTF-8 text (a byte piece).

    Each token is decoded after a probe token, so decoders that drop the leading space of the first token
    (SentencePiece) still give " the" for "▁the", as byte-level BPE does for "Ġthe".
    """
    probe = tokenizer.encode("a", add_special_tokens=False)
    probe_text = decode_text(tokenizer, probe)
    texts = tokenizer.batch_decode([probe + [i] for i in range(len(tokenizer))], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    return [t[len(probe_text):] if t.startswith(probe_text) and "\ufffd" not in t else None for t in texts]


def shared_token_map(target_tok, draft_tok) -> dict[int, int]:
    """Target id -> draft id of the same token: same raw string, else same decoded text."""
    draft_vocab = draft_tok.get_vocab()
    draft_by_text = {}
    for draft_id, text in enumerate(token_texts(draft_tok)):
        if text:
            draft_by_text.setdefault(text, draft_id)  # the lowest id wins among duplicates
    target_texts = token_texts(target_tok)
    shared = {}
    for token, target_id in target_tok.get_vocab().items():
        if token in draft_vocab:
            shared[target_id] = draft_vocab[token]
        elif target_id < len(target_texts) and target_texts[target_id] in draft_by_text:
            shared[target_id] = draft_by_text[target_texts[target_id]]
    return shared


def compare_words(text: str, target_spans: list[tuple[int, int]],
                  draft_spans: list[tuple[int, int]]) -> list[BoundaryExample]:
    """One entry per word of `text` (a \\w+ run or another character) with the tokens overlapping it."""
    draft_set = set(draft_spans)
    words = []
    for match in re.finditer(r"\w+|\S", text):
        start, end = match.span()
        in_target = [s for s in target_spans if s[0] < end and s[1] > start]  # [(start, end)] overlapping
        in_draft = [s for s in draft_spans if s[0] < end and s[1] > start]
        words.append(BoundaryExample(
            text=match.group(), target_pieces=[text[a:b] for a, b in in_target],
            draft_pieces=[text[a:b] for a, b in in_draft], unmatched=sum(s not in draft_set for s in in_target)))
    return words


def _spans(tokenizer, text: str) -> list[tuple[int, int]]:
    """Character spans of the tokens of `text`, trimmed of surrounding whitespace, deduplicated, in order."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans = []
    for start, end in offsets:
        piece = text[start:end]
        start, end = start + len(piece) - len(piece.lstrip()), end - len(piece) + len(piece.rstrip())
        if end > start and (start, end) not in spans[-1:]:
            spans.append((start, end))  # byte pieces of one character share its span: keep it once
    return spans


def _worst(examples: list[BoundaryExample]) -> list[BoundaryExample]:
    unique = {e.text: e for e in examples}.values()
    ranked = sorted(unique, key=lambda e: (-e.unmatched, -abs(len(e.draft_pieces) - len(e.target_pieces))))
    return ranked[:EXAMPLES_KEPT]


def decode_text(tokenizer, ids: list[int]) -> str:
    """Text of `ids` with special tokens kept and spaces untouched (what re-tokenises back)."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# --- the transplant ---------------------------------------------------------------------------------------

@dataclass
class TransplantSummary:
    """How the rows of the new embedding matrices were made."""

    method: str  # "string" (by token string, pieces for new tokens) or "index" (seed 000: by row number)
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
    """Seed 000's variant: the first min(V_draft, rows) rows copied by row number, N(0, std²) noise for the rest."""
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
