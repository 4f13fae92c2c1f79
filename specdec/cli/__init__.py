"""`python -m specdec <command>`: every module in this package that defines `register(subparsers)`
is a subcommand (its parser sets `func`, which returns the exit code)."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import torch

from specdec.models import cache, quant


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdec", description="speculative-decoding lab")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        apply_threads(getattr(args, "threads", None))
        if getattr(args, "recalibrate", False):
            quant.forget_kernel_choices()  # the int8 kernel of each weight shape is timed again as models load
        return int(args.func(args) or 0)
    except ValueError as error:  # bad input: a clear message, no traceback
        print(f"error: {cache.redact(str(error))}", file=sys.stderr)
        return 1


def apply_threads(threads: int | None) -> None:
    """--threads: torch's CPU threads for the whole command (None leaves torch's default)."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--threads takes a positive number of threads, got {threads}")
    torch.set_num_threads(threads)
