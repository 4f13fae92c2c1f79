"""Fault injection: run Python code in a child process and SIGKILL it at a chosen point.

A point is "module.attribute" (that function is replaced by a pause), "half:module.attribute"
(the function runs, its output file is cut to half its size, then the pause: a kill mid-write), or
"pause" (the code calls `pause` itself); a patched function pauses at its `call`-th call (the earlier
ones run as usual). The pause touches a sentinel file and sleeps; the parent waits for it, then kills.

`Forker` kills at a moment instead of a point: one child imports the heavy modules once, then forks a
grandchild per run and SIGKILLs it after a given delay (its own child: no other process is ever signalled), so
many kills do not each pay for importing torch.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from dataclasses import dataclass
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


ZYGOTE = """
import json, os, signal, sys, time, traceback
exec(sys.argv[1])  # the preload: heavy imports, done once
for line in sys.stdin:
    job = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1); os.dup2(log, 2)
        os.environ.update(job["env"])
        status = 0
        try:
            exec(compile(job["code"], "<forked run>", "exec"), {"__name__": "__forked__"})
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            traceback.print_exc(); status = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(status)
    killed, deadline = False, None if job["kill_after"] is None else started + job["kill_after"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG if deadline is not None else 0)
        if done:
            break
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            killed, deadline = True, None
        else:
            time.sleep(0.002)
    print(json.dumps({"seconds": time.monotonic() - started, "killed": killed,
                      "status": os.waitstatus_to_exitcode(status)}), flush=True)
"""


@dataclass
class Run:
    """What became of one forked run."""

    seconds: float  # from the fork to its end (its kill, when killed)
    killed: bool  # SIGKILLed before it ended by itself
    status: int  # its exit status (-SIGKILL when killed)
    log: str  # its stdout and stderr


class Forker:
    """A child that runs `preload` (imports) once, then forks one grandchild per `run`."""

    def __init__(self, preload: str):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE, preload], env=env, cwd=ROOT, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.folder = TemporaryDirectory()

    def run(self, code: str, env: dict[str, str], kill_after: float | None = None) -> Run:
        """Fork a grandchild running `code` with `env` added; SIGKILL it `kill_after` seconds after the fork (None:
        let it end)."""
        log = Path(self.folder.name) / "run.log"
        job = {"code": code, "env": env, "kill_after": kill_after, "log": str(log)}
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the forking child died (exit status {self.process.wait()})")
        return Run(**json.loads(line), log=log.read_text(errors="replace"))

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=WAIT_S)
        self.folder.cleanup()


def journal(entry) -> None:
    """Append `entry` (JSON) to the file $KILL_JOURNAL, on disk before returning: what a forked run had finished
    when it was killed."""
    with open(os.environ["KILL_JOURNAL"], "a") as file:
        file.write(json.dumps(entry) + "\n")
        file.flush()
        os.fsync(file.fileno())


def read_journal(path: Path) -> list:
    """The entries of a journal (a last line cut by the kill is left out)."""
    lines = path.read_text().split("\n") if path.exists() else [""]
    return [json.loads(line) for line in lines[:-1]]
