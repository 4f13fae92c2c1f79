"""An optional llama.cpp column: the same GGUF files and prompts through llama.cpp's own binaries.

When `llama-bench` and `llama-speculative-simple` are found (in $SPECDEC_LLAMA_CPP, else on PATH) and
the target is a catalogue model with a packaged GGUF file, the bench also times

- llama.cpp's target alone: `llama-bench -p 0 -n N` (generation tokens/s, no prompt);
- llama.cpp's speculative decoding, for each draft whose model is a catalogue model with a GGUF file (a
  `MODEL+lookup` draft's model alone: llama.cpp drafts without the lookup): `llama-speculative-simple
  --spec-type draft-simple` with the same draft, k (`--spec-draft-n-max`), prompt text and length, greedy
  (decoded tokens / decode seconds), beside our tokens/s on the same prompt. A run that
  dies by a signal runs once more with its weights as stored (`--no-repack`: on a CPU with AMX tiles one build's
  repacked product over several rows crashes), and its row says so.

Nothing in specdec needs llama.cpp; without the binaries this column is simply absent.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from specdec.lab.bench.summary import cell_text
from specdec.models import cache, entries, loading

ENV = "SPECDEC_LLAMA_CPP"  # a folder holding the binaries (else they are looked up on PATH)
BENCH, SPECULATIVE = "llama-bench", "llama-speculative-simple"
TIMEOUT_S = 900  # one llama.cpp call at most
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
COUNTER = re.compile(r"(n_drafted|n_accept)\s*=\s*(\d+)")
NO_REPACK = "--no-repack"  # its weights as stored, not repacked for the CPU: the retry after a crash


class Crashed(ValueError):
    """A llama.cpp binary ended by a signal."""


@dataclass
class LlamaCppRun:
    """llama.cpp's speculative decoding on one prompt, next to its target alone."""

    draft: str  # the draft's catalogue name
    k: int  # draft tokens per round (--spec-draft-n-max)
    prompt_id: str  # the bench prompt
    target_alone_tok_s: float  # llama-bench generation tokens/s of the target
    speculative_tok_s: float  # decoded tokens / decode seconds of llama-speculative-simple
    accept_rate: float  # n_accept / n_drafted as llama.cpp counts them
    repacked: bool = True  # False: the run with weights repacked for the CPU crashed; this one read them as stored
    ours_tok_s: float | None = None  # our speculative tokens/s, same prompt and draft: k = auto where run, else k

    @property
    def speedup(self) -> float:
        """llama.cpp's own speculative speedup over its own target alone."""
        return self.speculative_tok_s / self.target_alone_tok_s if self.target_alone_tok_s else 0.0

    @property
    def ours_vs_its_target(self) -> float | None:
        """Our speculative tokens/s over llama.cpp's target alone (None where ours was not run)."""
        return self.ours_tok_s / self.target_alone_tok_s if self.ours_tok_s and self.target_alone_tok_s else None


def find_binaries() -> dict[str, Path] | None:
    """Both binaries, from $SPECDEC_LLAMA_CPP or PATH; None when either is missing."""
    folder = os.environ.get(ENV)
    found = {name: (Path(folder) / name if folder else Path(shutil.which(name) or "")) for name in (BENCH, SPECULATIVE)}
    return found if all(path.is_file() and os.access(path, os.X_OK) for path in found.values()) else None


def gguf_of(name: str, held: contextlib.ExitStack) -> Path | None:
    """The GGUF file of a catalogue model, assembled from its installed package when not in the cache and kept
    until `held` closes (`loading.assembled`); None when it has none on this machine."""
    entry = entries.find(name)
    if entry is None or entry.package is None:
        return None
    if not (entry.package.installed() or cache.gguf_path(entry.package.gguf).is_file()):
        return None
    return held.enter_context(loading.assembled(entry))


def target_alone_tok_s(binaries: dict[str, Path], target: Path, new_tokens: int, threads: int) -> float:
    """llama-bench's generation tokens/s for `new_tokens` tokens (median of its repetitions)."""
    out = _run([binaries[BENCH], "-m", target, "-p", "0", "-n", new_tokens, "-t", threads, "-r", "3", "-o", "json"])
    return float(json.loads(out[out.index("["):])[0]["avg_ts"])


def speculative(binaries: dict[str, Path], target: Path, draft: Path, prompt: str, new_tokens: int, k: int,
                threads: int) -> tuple[float, float, bool]:
    """(decoded tokens/s, acceptance, repacked) of llama-speculative-simple, greedy, k drafts per round; after a
    crash once more with its weights as stored (repacked False)."""
    argv = [binaries[SPECULATIVE], "-m", target, "-md", draft, "--spec-type", "draft-simple", "-p", prompt,
            "-n", new_tokens, "-t", threads, "--spec-draft-n-max", k, "--temp", "0"]
    try:
        out, repacked = _run(argv), True
    except Crashed:
        out, repacked = _run(argv + [NO_REPACK]), False
    decoded = DECODED.search(out)
    if decoded is None:
        raise ValueError(f"{SPECULATIVE} printed no 'decoded N tokens in S seconds' line: {out[-300:]}")
    counters = {name: int(value) for name, value in COUNTER.findall(out)}
    accept = counters.get("n_accept", 0) / counters["n_drafted"] if counters.get("n_drafted") else 0.0
    return int(decoded.group(1)) / float(decoded.group(2)), accept, repacked


def _run(argv: list) -> str:
    completed = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=TIMEOUT_S)
    if completed.returncode != 0:
        error = Crashed if completed.returncode < 0 else ValueError
        raise error(f"{Path(str(argv[0])).name} failed ({completed.returncode}): {completed.stderr[-300:]}")
    return completed.stdout + completed.stderr


def markdown(runs: list[LlamaCppRun]) -> str:
    """The report's llama.cpp section: one row per (draft, k, prompt), ours beside it."""
    lines = ["| draft | k | prompt | llama.cpp target alone tok/s | llama.cpp speculative tok/s | its speedup | "
             "its acceptance | its weights | ours tok/s (k = auto where run) | ours / its target alone |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.draft} | {r.k} | {r.prompt_id} | {r.target_alone_tok_s:.2f} | {r.speculative_tok_s:.2f} | "
              f"{r.speedup:.2f}x | {r.accept_rate:.0%} | "
              f"{'repacked' if r.repacked else 'as stored (the repacked run crashed)'} | "
              f"{cell_text(r.ours_tok_s, '{:.2f}')} | {cell_text(r.ours_vs_its_target, '{:.2f}x')} |" for r in runs]
    return "\n".join(lines)
