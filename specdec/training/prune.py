"""The token set of a pruned-vocabulary draft: built from domain text, saved as JSON (read by
`specdec.drafters.pruned.load_vocabulary`).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable

from specdec.core import files


MOST_FREQUENT = 2048  # general-text tokens kept besides the domain's own


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
