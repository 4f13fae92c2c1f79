"""Arguments several subcommands share: one reading of --k (the range 1..K_MAX is the engine's check)."""
from __future__ import annotations

import argparse

from specdec.core.limits import K_MAX

AUTO = "auto"  # --k auto: the engine chooses k each round from the measured costs


def parse_k(text: str) -> int | str:
    """A --k value: "auto" or an integer draft length."""
    if text == AUTO:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"k takes an integer in 1..{K_MAX} or 'auto', got {text!r}") from None


def parse_fixed_k(text: str) -> int:
    """A --k value where k must be fixed: an integer draft length."""
    k = parse_k(text)
    if k == AUTO:
        raise argparse.ArgumentTypeError(f"k must be a fixed integer in 1..{K_MAX} here, not 'auto'")
    return k
