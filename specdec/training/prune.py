"""The token set of a pruned-vocabulary draft: built from domain text (`build_vocabulary`) or for general use
(`frequent_vocabulary`), saved as JSON (read by `specdec.drafters.pruned.load_vocabulary`).
"""
from __future__ import annotations

import json
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Iterable

from specdec.core import files


MOST_FREQUENT = 2048  # general-text tokens kept besides the domain's own
CORE = 32768  # a general set's first ids, kept whatever the texts: a byte-level BPE numbers its tokens in merge
# order, the most frequent pairs of its training text first


def build_vocabulary(domain: Iterable[Iterable[int]], general: Iterable[Iterable[int]] = (), *,
                     most_frequent: int = MOST_FREQUENT, always: Iterable[int] = ()) -> list[int]:
    """Every token of the domain sequences, the `most_frequent` tokens of the general ones, and `always`
    (special tokens such as EOS): the sorted set of ids a pruned draft may propose."""
    kept = {int(t) for sequence in domain for t in sequence} | {int(t) for t in always}
    counts = Counter(int(t) for sequence in general for t in sequence)
    kept |= {t for t, _ in counts.most_common(most_frequent)}
    return sorted(kept)


def save_vocabulary(path: Path, token_ids: list[int], **about) -> Path:
    """Write the set as JSON (`about`: where it came from, e.g. domain, sources, sizes)."""
    files.write_text(Path(path), json.dumps({"token_ids": sorted(token_ids), **about}))
    return Path(path)


def frequent_vocabulary(tokenizer, sequences: Iterable[Iterable[int]], *, core: int = CORE) -> list[int]:
    """A draft vocabulary for general use (FR-Spec's frequency-ranked set, from the tokenizer's own merge order
    where no large corpus is at hand): every token of `sequences` (texts as ids: prompts and the target's
    continuations of them), the tokenizer's first `core` ids, every token written only in the scripts those texts
    use beyond ASCII (`scripts_of`: a set made from texts with Chinese keeps every Chinese token) and the special
    tokens."""
    sequences = [[int(t) for t in sequence] for sequence in sequences]
    scripts = scripts_of(tokenizer.decode(sequence) for sequence in sequences)
    written = {token for token in range(len(tokenizer)) if _in_scripts(tokenizer.decode([token]), scripts)}
    return build_vocabulary(sequences, always=[*range(min(core, len(tokenizer))), *written,
                                               *tokenizer.all_special_ids])


def scripts_of(texts: Iterable[str]) -> set[str]:
    """The scripts `texts` use beyond ASCII: the first word of each such character's Unicode name ("CJK",
    "FULLWIDTH", "CYRILLIC", "LATIN" for an accented letter, ...)."""
    return {_script(character) for text in texts for character in text if ord(character) > 127} - {""}


def _script(character: str) -> str:
    """The first word of `character`'s Unicode name; "" for U+FFFD, which stands for a piece of a character."""
    return "" if character == "\ufffd" else unicodedata.name(character, "").split(" ")[0]


def _in_scripts(text: str, scripts: set[str]) -> bool:
    """Whether `text` (one token, decoded) has a character beyond ASCII and all of those are in `scripts` (a piece
    of a character, decoded as U+FFFD, is not)."""
    beyond = [character for character in text if ord(character) > 127]
    return bool(beyond) and all(_script(character) in scripts for character in beyond)
