"""Background distillations started from the app: one process-wide registry, one job per aligned draft.

A job runs in a daemon thread and counts its optimizer steps as `specdec.training.distill` reports them; every
browser session reads the same registry, so a reloaded page (or another visitor) sees a running job and
its progress. The work itself (data, training, checkpoints, registration) is `specdec.training.service.distil`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

RUNNING, FINISHED, FAILED = "running", "finished", "failed"


@dataclass
class Job:
    """One distillation of one aligned draft."""

    name: str  # the aligned draft being distilled
    steps: int  # optimizer steps asked for
    done: int = 0  # optimizer steps completed (a resumed run starts past 0)
    state: str = RUNNING  # RUNNING, FINISHED or FAILED
    result: str = ""  # when finished: the spec of the registered distilled draft; when failed: why

    def advance(self, step: int, steps: int, _record: dict | None = None) -> None:
        """`specdec.training.distill`'s progress callback."""
        self.done, self.steps = step, steps

    def line(self) -> str:
        """One Markdown line for the page."""
        if self.state == RUNNING:
            return f"- **{self.name}**: distilling, step {self.done} of {self.steps}"
        if self.state == FINISHED:
            return f"- **{self.name}**: distilled ({self.steps} steps), in the draft lists as `{self.result}`"
        return f"- **{self.name}**: distillation failed: {self.result}"


_jobs: dict[str, Job] = {}
_lock = threading.Lock()


def start(name: str, steps: int, work: Callable[[Callable[..., None]], str]) -> Job:
    """Run `work(progress)` (returns the registered spec) in a background thread as the job of `name`.

    A ValueError when `name` already has a running job."""
    with _lock:
        if name in _jobs and _jobs[name].state == RUNNING:
            raise ValueError(f"{name} is already being distilled (step {_jobs[name].done} of {_jobs[name].steps})")
        job = _jobs[name] = Job(name, steps)
    threading.Thread(target=_run, args=(job, work), daemon=True, name=f"specdec-distill-{name}").start()
    return job


def _run(job: Job, work) -> None:
    try:
        job.result, job.state = work(job.advance), FINISHED
    except Exception as error:  # noqa: BLE001 - shown on the page; the app keeps serving
        job.result, job.state = str(error) or type(error).__name__, FAILED


def jobs() -> list[Job]:
    """Every job since the app started, in starting order."""
    with _lock:
        return list(_jobs.values())


def get(name: str) -> Job | None:
    with _lock:
        return _jobs.get(name)
