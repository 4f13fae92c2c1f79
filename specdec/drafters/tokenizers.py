"""Can a draft with another tokenizer speak the target's? A compatibility report between two tokenizers.

Speculative decoding verifies token ids, so draft and target must share one tokenizer (Leviathan et al.
2023 assume it silently). `tokenizer_report` says how far two tokenizers are from that: shared tokens,
special tokens, embedding rows, and how differently they cut domain text (`DEFAULT_TEXTS`).

Token strings of different tokenizer families differ for the same text (byte-level BPE writes " the" as
"Ġthe", SentencePiece as "▁the"), so tokens are matched by raw string first and by their normalised form,
the decoded text of the single token, where the raw strings differ.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from specdec.core.inputs import vocab_size

DEFAULT_TEXTS = (  # finance, code and medical text that generic tokenizers split differently
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
