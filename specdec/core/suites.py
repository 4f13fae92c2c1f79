"""Prompt suites: the prompts a benchmark or an acceptance probe runs on.

A suite is a JSONL file, one prompt per line:
`{"id": "code-01", "category": "code", "language": "python", "split": "dev", "prompt": "..."}`
with an optional `"template": "raw"` for prompts that are fed as they are (code prefixes to
complete) instead of wrapped in the tokenizer's chat template. `prompt` is a string, or a list
of token ids (the `tiny` suite, for in-code tiny models without a tokenizer).

Built-in suites live in `assets/prompts/` (one file per category; `all` = every category but
`tiny`). `load_suite` also reads a user's JSONL, or a plain text file with one prompt per line.
A file without a held-out split (every text file, a JSONL without "heldout" lines) gets one: every
HOLD_OUT_EVERY-th prompt, at least one, is held out (`split_note` says how many). A bad file is one
ValueError naming file:line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from specdec.core import files
from specdec.core.inputs import parse_json

SUITES_DIR = files.ASSETS / "prompts"
SPLITS = ("dev", "heldout")
TEMPLATES = ("chat", "raw")
REQUIRED_FIELDS = ("id", "category", "prompt")
ALL = "all"  # every built-in category suite except the CI one
CI_SUITE = "tiny"
HOLD_OUT_EVERY = 5  # a file without a held-out split: prompts 5, 10, 15, ... (at least one) are held out


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt."""

    id: str  # unique within a suite, e.g. "code-07"
    category: str  # what the summary groups by: chat, code, finance, medical, ...
    prompt: str | tuple[int, ...]  # text, or token ids for tokenizer-free tiny models
    language: str = "en"  # "en", "zh", "python", or "ids" for token-id prompts
    split: str = "dev"  # "dev" (tune on) or "heldout" (report on)
    template: str = "chat"  # "chat": wrap in the chat template when the tokenizer has one; "raw": as is
    split_from: str = "file"  # "file": the file gave the split; "every 5th": held out by `_hold_out`


def available_suites() -> list[str]:
    """Names `load_suite` accepts without a path."""
    return sorted([p.stem for p in SUITES_DIR.glob("*.jsonl")] + [ALL])


def load_suite(name_or_path: str | Path, *, split: str | None = None, categories: list[str] | None = None,
               limit: int | None = None) -> list[Prompt]:
    """Prompts of a built-in suite name, a JSONL file, or a text file (one prompt per line).

    split keeps one split; categories keeps those categories; limit keeps the first `limit`
    prompts of each category (a quick run that still covers every category).
    """
    prompts = _read(name_or_path)
    if split is not None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
        prompts = [p for p in prompts if p.split == split]
    if categories:
        unknown = sorted(set(categories) - {p.category for p in prompts})
        if unknown:
            raise ValueError(f"no prompts of categories {unknown} in {name_or_path}; it has "
                             f"{sorted({p.category for p in prompts})}")
        prompts = [p for p in prompts if p.category in categories]
    if limit is not None:
        prompts = _first_per_category(prompts, limit)
    if not prompts:
        hint = " (a file of one prompt cannot hold one out: add prompts)" if split == "heldout" else ""
        raise ValueError(f"no prompts left in {name_or_path} after filtering (split={split}, limit={limit}){hint}")
    return prompts


def _read(name_or_path: str | Path) -> list[Prompt]:
    if str(name_or_path) == ALL:
        return [p for path in sorted(SUITES_DIR.glob("*.jsonl")) if path.stem != CI_SUITE for p in _read(path)]
    path = Path(name_or_path)
    if not path.exists() and (SUITES_DIR / f"{name_or_path}.jsonl").exists():
        path = SUITES_DIR / f"{name_or_path}.jsonl"
    if not path.is_file():
        raise ValueError(f"no prompt suite {name_or_path!r}: give a file (.jsonl, or text with one prompt per "
                         f"line) or one of {', '.join(available_suites())}")
    lines = _text_lines(path)
    prompts = _parse_jsonl(lines, path) if path.suffix == ".jsonl" else _parse_text(lines, path)
    _check_unique_ids(prompts, path)
    return _hold_out(prompts)


def split_note(name_or_path: str | Path) -> str | None:
    """One line saying how many prompts were held out when the file has no held-out split of its own."""
    prompts = _read(name_or_path)
    held = sum(p.split == "heldout" for p in prompts if p.split_from != "file")
    if not held:
        return None
    return (f"{name_or_path} has no held-out split: held out every {HOLD_OUT_EVERY}th prompt, {held} of "
            f"{len(prompts)} ({len(prompts) - held} left to tune or train on)")


def has_held_out(name_or_path: str | Path) -> bool:
    """True when the suite or file gives a held-out split itself (not one made by `_hold_out`)."""
    return any(p.split == "heldout" and p.split_from == "file" for p in _read(name_or_path))


def _hold_out(prompts: list[Prompt]) -> list[Prompt]:
    """No prompt held out by the file: every HOLD_OUT_EVERY-th one is (the last one when there are fewer),
    so a command that trains or tunes on "dev" and reports on "heldout" works on any file of 2+ prompts."""
    if len(prompts) < 2 or any(p.split == "heldout" for p in prompts):
        return prompts
    picked = {i for i in range(len(prompts)) if i % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1} or {len(prompts) - 1}
    return [replace(p, split="heldout", split_from=f"every {HOLD_OUT_EVERY}th") if i in picked else p
            for i, p in enumerate(prompts)]


def _text_lines(path: Path) -> list[str]:
    """The file's lines as UTF-8 text, split at "\n" only (a prompt may hold U+2028, U+0085 and the like);
    ValueError naming file:line at the first line that is not UTF-8."""
    data = path.read_bytes()
    try:
        return [line.removesuffix("\r") for line in data.decode("utf-8").split("\n")]
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte 0x{data[error.start]:02x} at column {column}); "
                         "save the file as UTF-8") from None


def _parse_text(lines: list[str], path: Path) -> list[Prompt]:
    """A plain text file: each non-blank line is one prompt of category "user"."""
    prompts = [Prompt(id=f"{path.stem}-{n}", category="user", prompt=line.strip(), language="?")
               for n, line in enumerate(lines, start=1) if line.strip()]
    if not prompts:
        raise ValueError(f"{path}: no prompts (the file is empty)")
    return prompts


def _parse_jsonl(lines: list[str], path: Path) -> list[Prompt]:
    prompts = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{n}: not valid JSON ({error.msg}); each line must be one JSON object") from None
        prompts.append(_prompt_from_record(record, f"{path}:{n}"))
    if not prompts:
        raise ValueError(f"{path}: no prompts (the file is empty)")
    return prompts


def _prompt_from_record(record, where: str) -> Prompt:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object with fields {', '.join(REQUIRED_FIELDS)}")
    missing = [f for f in REQUIRED_FIELDS if f not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)} (required: {', '.join(REQUIRED_FIELDS)})")
    prompt = record["prompt"]
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and t >= 0 for t in prompt):
            raise ValueError(f"{where}: a token-id prompt must be a non-empty list of non-negative integers")
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: prompt must be a non-empty string or a list of token ids")
    split = record.get("split", "dev")
    template = record.get("template", "chat")
    if split not in SPLITS:
        raise ValueError(f"{where}: split must be one of {', '.join(SPLITS)}, got {split!r}")
    if template not in TEMPLATES:
        raise ValueError(f"{where}: template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    return Prompt(id=str(record["id"]), category=str(record["category"]), prompt=prompt,
                  language=str(record.get("language", "ids" if isinstance(prompt, tuple) else "?")),
                  split=split, template=template)


def _check_unique_ids(prompts: list[Prompt], path: Path) -> None:
    seen: set[str] = set()
    for p in prompts:
        if p.id in seen:
            raise ValueError(f"{path}: prompt id {p.id!r} appears twice; ids must be unique")
        seen.add(p.id)


def _first_per_category(prompts: list[Prompt], limit: int) -> list[Prompt]:
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    counts: dict[str, int] = {}
    kept = []
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
        if counts[p.category] <= limit:
            kept.append(p)
    return kept


def encode(prompt: Prompt, tokenizer) -> list[int]:
    """Token ids of a prompt: ids as given; text through the chat template (unless raw) and tokenizer."""
    if isinstance(prompt.prompt, tuple):
        return list(prompt.prompt)
    if tokenizer is None:
        raise ValueError(f"prompt {prompt.id} is text but the model has no tokenizer: use a token-id suite "
                         f"(--prompts {CI_SUITE}) or a model with a tokenizer")
    if prompt.template == "chat" and getattr(tokenizer, "chat_template", None):
        return _ids(tokenizer.apply_chat_template([{"role": "user", "content": prompt.prompt}],
                                                  add_generation_prompt=True, tokenize=True))
    return tokenizer(prompt.prompt)["input_ids"]


def _ids(encoded) -> list[int]:
    """apply_chat_template returns a list, or a BatchEncoding in newer transformers."""
    return list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded)
