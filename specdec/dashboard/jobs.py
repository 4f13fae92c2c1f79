"""Background distillations started from the app: one process-wide registry, one job per aligned draft.

A job runs in a daemon thread and counts its optimizer steps as `specdec.training.distill` reports them; every
browser session reads the same registry, so a reloaded page (or another visitor) sees a running job and
its progress. The work itself (data, training, checkpoints, registration) is `specdec.training.service.distil`.
At most the host's limit of jobs run at once; `cancel` stops one after its current optimizer step (its
checkpoints stay: distilling it again resumes); the list holds at most HISTORY jobs.

Each job's state is kept in the model cache, `jobs/<name>.json` (replaced whole at every change and step), so the
list survives a restart of the app: read back on first use, a job that was running when the app stopped is
INTERRUPTED, never shown running, with where distilling it again resumes (its last checkpoint). A job another
live process is running (it holds the run folder's lock) is that process's and is not read.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

from specdec.core import files
from specdec.models import cache
from specdec.training.distill import checkpoint_report
from specdec.training.service import runs_root

RUNNING, FINISHED, FAILED, CANCELLED, INTERRUPTED = "running", "finished", "failed", "cancelled", "interrupted"
HISTORY = 20  # jobs the list holds at most (running ones always; of those that ended, the newest)


class Cancelled(Exception):
    """Raised by a cancelled job's progress callback: the work stops after that step."""


@dataclass
class Job:
    """One distillation of one aligned draft."""

    name: str  # the aligned draft being distilled
    steps: int  # optimizer steps asked for
    done: int = 0  # optimizer steps completed (a resumed run starts past 0)
    state: str = RUNNING  # RUNNING, FINISHED, FAILED, CANCELLED, or INTERRUPTED (the app stopped while it ran)
    result: str = ""  # when finished: the spec of the registered distilled draft; when failed: why
    started: float = field(default_factory=time.time)  # when it started (time.time()): the list's order
    saved: int = 0  # when interrupted: the steps of its last checkpoint, where distilling it again resumes
    cancelled: bool = False  # set by `cancel`: the work stops after its current step (not kept: a restart ends it)

    def advance(self, step: int, steps: int, _record: dict | None = None) -> None:
        """`specdec.training.distill`'s progress callback (raises Cancelled once the job was cancelled)."""
        self.done, self.steps = step, steps
        with _lock:
            _keep(self)
        if self.cancelled:
            raise Cancelled

    def line(self) -> str:
        """One Markdown line for the page."""
        if self.state == RUNNING:
            doing = "cancelling after its current step" if self.cancelled else "distilling"
            return f"- **{self.name}**: {doing}, step {self.done} of {self.steps}"
        if self.state == CANCELLED:
            return (f"- **{self.name}**: cancelled at step {self.done} of {self.steps} (distilling it again resumes "
                    "from its last checkpoint)")
        if self.state == INTERRUPTED:
            again = (f"resumes from its checkpoint at step {self.saved}" if self.saved
                     else "starts over: no checkpoint was saved")
            return (f"- **{self.name}**: interrupted at step {self.done} of {self.steps} when the app stopped "
                    f"(distilling it again {again})")
        if self.state == FINISHED:
            return f"- **{self.name}**: distilled ({self.steps} steps), in the draft lists as `{self.result}`"
        return f"- **{self.name}**: distillation failed: {self.result}"


_jobs: dict[str, Job] = {}
_loaded = False  # whether the jobs kept in the cache were read into `_jobs` (on first use)
_lock = threading.Lock()


def start(name: str, steps: int, work: Callable[[Callable[..., None]], str], limit: int) -> Job:
    """Run `work(progress)` (returns the registered spec) in a background thread as the job of `name`.

    A ValueError when `name` already has a running job, or `limit` jobs are running."""
    with _lock:
        registry = _registry()
        if name in registry and registry[name].state == RUNNING:
            raise ValueError(f"{name} is already being distilled (step {registry[name].done} of "
                             f"{registry[name].steps})")
        running = sum(job.state == RUNNING for job in registry.values())
        if running >= limit:
            raise ValueError(f"{running} distillation(s) are running, the most this host runs at once "
                             "(SPECDEC_MAX_DISTILL_JOBS): wait for one to finish, or cancel it")
        registry.pop(name, None)  # a job started again goes to the end of the list
        job = registry[name] = Job(name, steps)
        _keep(job)
        ended = [other.name for other in registry.values() if other.state != RUNNING]
        for old in ended[:max(0, len(registry) - HISTORY)]:  # the oldest that ended go first
            del registry[old]
            files.remove(_kept_path(old))
    threading.Thread(target=_run, args=(job, work), daemon=True, name=f"specdec-distill-{name}").start()
    return job


def cancel(name: str) -> Job:
    """Ask the running job of `name` to stop after its current step; a ValueError when none runs."""
    with _lock:
        job = _registry().get(name)
        if job is None or job.state != RUNNING:
            raise ValueError(f"{name} is not being distilled")
        job.cancelled = True
        return job


def _run(job: Job, work) -> None:
    try:
        result, state = work(job.advance), FINISHED
    except Cancelled:
        result, state = job.result, CANCELLED
    except Exception as error:  # noqa: BLE001 - shown on the page; the app keeps serving
        result, state = str(error) or type(error).__name__, FAILED
    with _lock:
        job.result, job.state = result, state
        _keep(job)


def jobs() -> list[Job]:
    """Every job in the list (those of earlier runs of the app included), in starting order."""
    with _lock:
        return list(_registry().values())


def get(name: str) -> Job | None:
    with _lock:
        return _registry().get(name)


def _registry() -> dict[str, Job]:
    """The jobs by name, read from the cache on first use (the caller holds `_lock`)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for job in sorted(filter(None, map(_read, _kept_path("*").parent.glob("*.json"))), key=lambda j: j.started):
            _jobs.setdefault(job.name, job)
    return _jobs


def _kept_path(name: str) -> Path:
    """Where the state of the job of `name` is kept."""
    return cache.root() / "jobs" / f"{name}.json"


def _keep(job: Job) -> None:
    """Write `job`'s state to the cache, replacing the previous one whole (the caller holds `_lock`)."""
    kept = {name: value for name, value in asdict(job).items() if name != "cancelled"}
    files.write_text(_kept_path(job.name), json.dumps(kept))


def _read(path: Path) -> Job | None:
    """The job kept in `path`: one that was running is INTERRUPTED, with its last checkpoint, unless another
    live process runs it (then None, as for an unreadable file)."""
    try:
        kept = json.loads(path.read_text())
        job = Job(**{f.name: kept[f.name] for f in fields(Job) if f.name in kept})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if job.state != RUNNING:
        return job
    run = runs_root() / job.name
    try:
        with cache.locked(run, busy="distilled by another process"):  # taken: no live process runs it
            job.state, job.saved = INTERRUPTED, _checkpointed(run)
    except ValueError:
        return None
    _keep(job)
    return job


def _checkpointed(run: Path) -> int:
    """The steps of the last checkpoint in the run folder `run` (0: none, or none readable)."""
    try:
        report = checkpoint_report(run / "checkpoint")
    except (OSError, ValueError, TypeError):
        return 0
    return report.steps_done if report is not None else 0
