"""`python -m specdec models`: the model catalogue and what is ready here; `--prepare` gets models ready."""
from __future__ import annotations

import json
import time

from specdec.models import formats
from specdec.models.cache import root as cache_root, stored
from specdec.models.entries import catalogue
from specdec.models.loading import prepare, remade_stores

COLUMNS = ("name", "roles", "tokenizer", "parameters", "licence", "status")


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="list catalogue models and whether each is ready offline")
    p.add_argument("--prepare", nargs="+", metavar="NAME",
                   help="assemble and convert or quantize these models (catalogue names, folders, .gguf files) "
                        "ahead of time")
    p.add_argument("--dtype", nargs="+", choices=formats.FORMATS, default=["float32", "bfloat16"],
                   help="weight formats to prepare (default: float32 and bfloat16; int8 and int4 store the "
                        "quantized model, made straight from a GGUF)")
    p.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    for name in args.prepare or []:
        for dtype in args.dtype:
            start = time.perf_counter()
            folder, source = prepare(name, dtype=dtype, device="cpu" if dtype in formats.CPU_ONLY else "auto")
            print(f"{name} [{dtype}]: ready from {source} in {time.perf_counter() - start:.1f} s ({folder})")
    entries = catalogue()
    if args.json:
        print(json.dumps([_row(e) | {"sources": e.sources, "detail": e.detail, "stored": stored(e.name),
                                     "remade": remade_stores(e)} for e in entries], indent=1))
        return 0
    print(_table([_row(e) for e in entries]))
    print(f"\ncache: {cache_root()}")
    for entry in entries:
        remade = "".join(f"; its next {form} load makes {form} again ({why})"
                         for form, why in remade_stores(entry).items())
        print(f"- {entry.name}: {entry.detail}{remade}")
    return 0


def _row(entry) -> dict:
    role = "/".join(entry.roles) + (f" (default {entry.default_for})" if entry.default_for else "")
    return {"name": entry.name, "roles": role, "tokenizer": entry.tokenizer, "parameters": entry.parameters,
            "licence": entry.licence, "status": entry.status}


def _table(rows: list[dict]) -> str:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join(lines)
