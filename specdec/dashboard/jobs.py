"""Background distillations started from the app: one process-wide registry, one job per aligned draft.

A job runs in a daemon thread and counts its optimizer steps as `specdec.training.distill` reports them; every
browser session reads the same registry, so a reloaded page (or another visitor) sees a running job and
its progress. The work itself (data, training, checkpoints, registration) is `specdec.training.service.distil`.
At most the host's limit of jobs run at once; `cancel` stops one after its current optimizer step (its
checkpoints stay: distilling it again resumes); the list holds at most HISTORY jobs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

RUNNING, FINISHED, FAILED, CANCELLED = "running", "finished", "failed", "cancelled"
HISTORY = 20  # jobs the list holds at most (running ones always; of those that ended, the newest)


class Cancelled(Exception):
    """Raised by a cancelled job's progress callback: the work stops after that step."""


@dataclass
class Job:
    """One distillation of one aligned draft."""

    name: str  # the aligned draft being distilled
    steps: int  # optimizer steps asked for
    done: int = 0  # optimizer steps completed (a resumed run starts past 0)
    state: str = RUNNING  # RUNNING, FINISHED, FAILED or CANCELLED
    result: str = ""  # when finished: the spec of the registered distilled draft; when failed: why
    cancelled: bool = False  # set by `cancel`: the work stops after its current step

    def advance(self, step: int, steps: int, _record: dict | None = None) -> None:
        """`specdec.training.distill`'s progress callback (raises Cancelled once the job was cancelled)."""
        self.done, self.steps = step, steps
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
        if self.state == FINISHED:
            return f"- **{self.name}**: distilled ({self.steps} steps), in the draft lists as `{self.result}`"
        return f"- **{self.name}**: distillation failed: {self.result}"


_jobs: dict[str, Job] = {}
_lock = threading.Lock()


def start(name: str, steps: int, work: Callable[[Callable[..., None]], str], limit: int) -> Job:
    """Run `work(progress)` (returns the registered spec) in a background thread as the job of `name`.

    A ValueError when `name` already has a running job, or `limit` jobs are running."""
    with _lock:
        if name in _jobs and _jobs[name].state == RUNNING:
            raise ValueError(f"{name} is already being distilled (step {_jobs[name].done} of {_jobs[name].steps})")
        running = sum(job.state == RUNNING for job in _jobs.values())
        if running >= limit:
            raise ValueError(f"{running} distillation(s) are running, the most this host runs at once "
                             "(SPECDEC_MAX_DISTILL_JOBS): wait for one to finish, or cancel it")
        _jobs.pop(name, None)  # a job started again goes to the end of the list
        job = _jobs[name] = Job(name, steps)
        ended = [other.name for other in _jobs.values() if other.state != RUNNING]
        for old in ended[:max(0, len(_jobs) - HISTORY)]:  # the oldest that ended go first
            del _jobs[old]
    threading.Thread(target=_run, args=(job, work), daemon=True, name=f"specdec-distill-{name}").start()
    return job


def cancel(name: str) -> Job:
    """Ask the running job of `name` to stop after its current step; a ValueError when none runs."""
    with _lock:
        job = _jobs.get(name)
        if job is None or job.state != RUNNING:
            raise ValueError(f"{name} is not being distilled")
        job.cancelled = True
        return job


def _run(job: Job, work) -> None:
    try:
        job.result, job.state = work(job.advance), FINISHED
    except Cancelled:
        job.state = CANCELLED
    except Exception as error:  # noqa: BLE001 - shown on the page; the app keeps serving
        job.result, job.state = str(error) or type(error).__name__, FAILED


def jobs() -> list[Job]:
    """Every job since the app started, in starting order."""
    with _lock:
        return list(_jobs.values())


def get(name: str) -> Job | None:
    with _lock:
        return _jobs.get(name)
