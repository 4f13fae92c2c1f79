"""Fault injection: run Python code in a child process and SIGKILL it at a chosen point.

A point is "module.attribute" (that function is replaced by a pause), "half:module.attribute"
(the function runs, its output file is cut to half its size, then the pause: a kill mid-write), or
"pause" (the code calls `pause` itself); a patched function pauses at its `call`-th call (the earlier
ones run as usual). The pause touches a sentinel file and sleeps; the parent waits for it, then kills.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 180  # a child importing torch and transformers on 2 busy cores takes seconds, not minutes

PRELUDE = """
import importlib, os, sys, time
from pathlib import Path
def pause(*args, **kwargs):
    Path(os.environ["FAULT_SENTINEL"]).touch()
    time.sleep(600)
calls = [int(os.environ["FAULT_CALL"])]
def at_call(original, cut):
    def patched(*args, **kwargs):
        calls[0] -= 1
        if calls[0] > 0 or cut:
            original(*args, **kwargs)
        if calls[0] == 0:
            if cut:  # args: (what, file name)
                os.truncate(args[1], os.path.getsize(args[1]) // 2)
            pause()
    return patched
point = os.environ["FAULT_POINT"]
if point != "pause":
    module, _, name = point.removeprefix("half:").rpartition(".")
    module = importlib.import_module(module)
    setattr(module, name, at_call(getattr(module, name), point.startswith("half:")))
"""


def start(code: str, point: str = "pause", sentinel: Path | None = None, call: int = 1) -> subprocess.Popen:
    """A child running PRELUDE then `code` (stdout and stderr captured)."""
    env = {**os.environ, "FAULT_POINT": point, "FAULT_CALL": str(call), "PYTHONPATH": str(ROOT),
           "FAULT_SENTINEL": str(sentinel or "/dev/null"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", PRELUDE + code], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def kill_at(code: str, point: str, waiter: str | None = None, call: int = 1) -> subprocess.CompletedProcess | None:
    """Run `code` until it reaches `point` (its `call`-th call), then SIGKILL it. With `waiter` (code), a
    second child is started once the first is paused, given a second to block, and run to completion
    after the kill; its CompletedProcess is returned."""
    with TemporaryDirectory() as folder:
        sentinel = Path(folder) / "paused"
        child = start(code, point, sentinel, call)
        _wait_for(sentinel, child)
        second = start(waiter) if waiter else None
        time.sleep(1.0 if waiter else 0)
        child.send_signal(signal.SIGKILL)
        child.communicate()
        assert child.returncode == -signal.SIGKILL
        if second is None:
            return None
        stdout, stderr = second.communicate(timeout=WAIT_S)
        return subprocess.CompletedProcess(second.args, second.returncode, stdout, stderr)


@contextlib.contextmanager
def paused(code: str, point: str = "pause", call: int = 1) -> Iterator[subprocess.Popen]:
    """Run `code` until it reaches `point`, yield while it is paused there (alive), then SIGKILL it."""
    with TemporaryDirectory() as folder:
        sentinel = Path(folder) / "paused"
        child = start(code, point, sentinel, call)
        try:
            _wait_for(sentinel, child)
            yield child
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate()


def _wait_for(sentinel: Path, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT_S
    while not sentinel.exists():
        if child.poll() is not None:
            raise AssertionError(f"the child ended before its kill point: {child.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            child.kill()
            raise AssertionError("the child never reached its kill point")
        time.sleep(0.05)
