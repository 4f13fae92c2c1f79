"""The one way specdec writes a file or a folder that others read: whole or not at all, and never lost to cleanup.

`atomic_path(final)` yields a sibling `NAME.partial-<pid>-<thread>` to write (a file, or a folder of files);
when the block ends without an error the partial is flushed to disk (every file in it fsynced, then its
folders), renamed over `final`, and the parent folder is fsynced so the rename itself survives a power cut. An
error removes the partial and leaves `final` as it was; a writer killed before the rename leaves only a
partial, which no reader opens.

While the partial may exist its writer holds an flock on a token, `NAME.writer-<pid>-<thread>` (made before the
partial, removed after; the kernel releases the lock when the process dies), so cleanup can tell a live write
from a dead one (`writer_gone`; `specdec.models.cache.clean_stale` removes the cache's dead partials, and each
write removes those of its own destination first, `reap`, so a run folder outside the cache is cleaned by its
next write). A folder being replaced is first moved aside as `<partial>.previous` and deleted once the new one
is in place; a kill in between leaves it, and `discard` puts it back. A folder deleted (`remove`) is renamed to
a partial first, so a kill midway never leaves it under its own name with files missing.

`write_json` / `read_json`: a versioned JSON document (a "format" and a "version" field, then its own): written
the same way, read back or refused with one line naming the file.
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
from typing import Iterable, Iterator

ASSETS = Path(__file__).resolve().parents[2] / "assets"  # the data that ships with the code (catalogue, prompts, ...)
PARTIAL = ".partial-"  # NAME.partial-<pid>-<thread>: a write of NAME in progress (or left by a killed writer)
WRITER = ".writer-"  # NAME.writer-<pid>-<thread>: the token the writer of NAME.partial-<pid>-<thread> holds locked
PREVIOUS = ".previous"  # <partial>.previous: the folder being replaced, moved aside until the new one is in place


def partial_path(final: Path) -> Path:
    """This thread's temporary sibling of `final`."""
    return final.with_name(f"{final.name}{PARTIAL}{os.getpid()}-{threading.get_ident()}")


def partials_of(final: Path) -> list[Path]:
    """Every temporary sibling of `final` (a partial or a folder moved aside), this process's or another's."""
    return list(final.parent.glob(f"{final.name}{PARTIAL}*"))


def destination(partial: Path) -> Path:
    """The final path a partial (or a folder it moved aside) is written for."""
    return partial.with_name(partial.name.partition(PARTIAL)[0])


def in_progress(path: Path) -> bool:
    """Whether `path` is a write in progress (a partial, a folder moved aside, a writer token), not a result."""
    return PARTIAL in path.name or WRITER in path.name


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final` to write (file or folder); on success flush it and rename it to `final`.

    A caller racing other writers of `final` holds a lock around this (`specdec.models.cache.locked`). On an
    exception the temporary path is removed and `final` is untouched; on success a previous `final` is replaced
    (a folder is moved aside first and deleted once the new one is in place, so a kill in between loses neither).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(final)
    aside = partial.with_name(partial.name + PREVIOUS)
    with _writing(partial):
        try:
            yield partial
            flush_tree(partial)
            if final.is_dir():  # a folder cannot be renamed over (a file is, atomically)
                os.replace(final, aside)
            os.replace(partial, final)
            fsync(final.parent)
            remove(aside)
        except BaseException:
            remove(partial)
            raise


def json_key(value) -> str:
    """20 hex digits of the sha256 of `value` as JSON with sorted keys: a cache file's name after what it holds."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:20]


def write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) atomically: readers see the old file or the new one, never a part."""
    with atomic_path(Path(path)) as partial:
        partial.write_text(text, encoding="utf-8")


def write_json(path: Path, data: dict) -> None:
    """Replace `path` with `data` as indented UTF-8 JSON, atomically (`write_text`)."""
    write_text(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def read_json(path: Path, kind: str, format_name: str, version: int, names: Iterable[str], remedy: str) -> dict:
    """The JSON object in `path` whose "format" is `format_name` at `version` with every field of `names`;
    otherwise a ValueError of one line naming the file: missing, not JSON, not a `kind`, another version or
    damaged (fields missing). `remedy` says how to make one this version reads."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such {kind} ({remedy})") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"{path}: not a {kind} (not readable JSON: {type(error).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != format_name:
        raise ValueError(f"{path}: not a specdec {kind} ({remedy})")
    if data.get("version") != version:
        raise ValueError(f"{path}: a {kind} of format version {data.get('version')!r}; this version reads "
                         f"version {version}: {remedy}")
    missing = sorted(set(names) - set(data))
    if missing:
        raise ValueError(f"{path}: a damaged {kind} (missing {', '.join(missing)})")
    return data


@contextlib.contextmanager
def _writing(partial: Path) -> Iterator[None]:
    """Hold `partial`'s writer token locked while the partial may exist (taken before, dropped after)."""
    token = token_of(partial)
    while True:  # the lock must be on the file the name points to now (cleanup unlinks a dead writer's token)
        handle = open(token, "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _names(token, handle):
            break
        handle.close()
    try:
        for stale in (partial, partial.with_name(partial.name + PREVIOUS)):  # left by a dead writer of this name
            discard(stale)
        reap(destination(partial))
        yield
    finally:
        token.unlink(missing_ok=True)
        handle.close()


def reap(final: Path) -> None:
    """Remove what dead writers of `final` left next to it (partials, folders moved aside, tokens); a live
    writer's stay. A folder outside the cache has no `clean_stale`: its next write cleans it."""
    for left in partials_of(final) + list(final.parent.glob(f"{final.name}{WRITER}*")):
        with contextlib.ExitStack() as held:
            if writer_gone(token_of(left), held) and PARTIAL in left.name:
                discard(left)


def token_of(partial: Path) -> Path:
    """The writer token of a partial (or of the folder it moved aside)."""
    return partial.with_name(partial.name.removesuffix(PREVIOUS).replace(PARTIAL, WRITER, 1))


def writer_gone(token: Path, held: contextlib.ExitStack) -> bool:
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


def discard(path: Path) -> bool:
    """Remove a dead writer's partial `path`; a folder it moved aside goes back when nothing replaced it. True
    when there was one (the caller knows its writer is dead)."""
    if not path.exists():
        return False
    final = destination(path)
    if path.name.endswith(PREVIOUS) and not final.exists():
        os.replace(path, final)
    else:
        remove(path)
    return True


def flush_tree(path: Path) -> None:
    """Fsync a file, or every file of a folder tree and then its folders (deepest first)."""
    if path.is_dir():
        for folder, _, names in os.walk(path, topdown=False):
            for name in names:
                fsync(Path(folder) / name)
            fsync(Path(folder))
    else:
        fsync(path)


def fsync(path: Path) -> None:
    """Flush `path` (a file, or a folder's entries) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def remove(path: Path) -> None:
    """Delete a file or a folder tree, if there (a folder is renamed to a partial first: see the module)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        if not in_progress(path):
            doomed = partial_path(path)
            if doomed.exists():  # a killed removal of this name by this pid and thread left it
                shutil.rmtree(doomed, ignore_errors=True)
            os.replace(path, doomed)
            path = doomed
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
