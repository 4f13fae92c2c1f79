"""Background distillations on a public host: a bounded number at once, cancellable, a name checked before the
work starts, a running one's folder safe from preparing the same name again (work stand-ins, no training), and
the list kept across a restart of the app (a job killed with the app resumes from its checkpoint: tiny models)."""
import contextlib
import threading
import time

import gradio as gr
import pytest

from specdec.dashboard import jobs
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.tabs import compare
from faults import kill_at
from specdec.models import ModelPool, aligned, cache, load_model
from specdec.training import service
from tiny_models import Progress


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch, tmp_path):
    monkeypatch.setattr(jobs, "_jobs", {})
    monkeypatch.setattr(jobs, "_loaded", False)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


def until_ended(job: jobs.Job, timeout_s: float = 30) -> jobs.Job:
    deadline = time.monotonic() + timeout_s
    while job.state == jobs.RUNNING and time.monotonic() < deadline:
        time.sleep(0.02)
    return job


def stepping(release: threading.Event):
    """Work that reports a step every 10 ms until `release` is set (or it is cancelled)."""
    def work(progress):
        step = 0
        while not release.is_set():
            step += 1
            progress(step, 1000, {})
            time.sleep(0.01)
        return "aligned:done"
    return work


def test_at_most_the_host_s_limit_of_jobs_run_at_once_and_the_list_is_bounded():
    release = threading.Event()
    first = jobs.start("a", 1000, stepping(release), limit=1)
    with pytest.raises(ValueError, match="the most this host runs at once"):
        jobs.start("b", 1000, stepping(release), limit=1)
    release.set()
    assert until_ended(first).state == jobs.FINISHED
    for n in range(jobs.HISTORY + 5):
        until_ended(jobs.start(f"j{n}", 1, lambda progress: "aligned:x", limit=1))
    assert len(jobs.jobs()) == jobs.HISTORY and jobs.get("j0") is None  # the oldest went first


def test_a_cancelled_job_stops_after_its_current_step():
    job = jobs.start("a", 1000, stepping(threading.Event()), limit=1)
    while job.done < 2:
        time.sleep(0.01)
    jobs.cancel("a")
    assert until_ended(job).state == jobs.CANCELLED and job.done < 1000
    assert "cancelled at step" in job.line() and "resumes" in job.line()
    with pytest.raises(ValueError, match="a is not being distilled"):
        jobs.cancel("a")
    assert jobs.start("b", 1, lambda progress: "aligned:x", limit=1)  # the slot is free again


def test_a_name_too_long_for_its_distilled_copy_is_refused_before_any_work(paths):
    hub = ModelHub(AppConfig(max_new_tokens_cap=16), pool=ModelPool())
    long = "n" * (aligned.NAME_CHARS - len(service.DISTILLED_SUFFIX) + 1)  # 71 characters: valid alone
    with pytest.raises(gr.Error, match="at most 70 characters"):
        compare.prepare_aligned(hub, paths["target"], paths["unaligned"], "code", long, progress=Progress())
    aligned.register(paths["unaligned"], aligned.Card(name=long, target=paths["target"], source=paths["unaligned"],
                                                      method="transplant", domain="code"))  # made elsewhere
    with pytest.raises(gr.Error, match="at most 70 characters"):
        compare.start_distill(hub, f"aligned:{long}", 2, progress=Progress())
    assert jobs.jobs() == []


@contextlib.contextmanager
def distilling(run):
    """Hold the lock service.distil holds on the run folder `run` while it trains (in this process or another)."""
    holding, release = threading.Event(), threading.Event()

    def hold():
        with cache.locked(run):
            holding.set()
            release.wait(30)
    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(30)
        yield
    finally:
        release.set()
        thread.join()


def test_preparing_a_name_again_while_it_is_distilled_is_refused_and_keeps_its_folder():
    run = service.runs_root() / "busy"
    (run / "checkpoint").mkdir(parents=True)
    with distilling(run):
        with pytest.raises(ValueError, match="busy is being distilled"):
            service.transplant(None, None, name="busy")
        with pytest.raises(ValueError, match="busy is already being distilled"):
            service.distil(None, "busy", steps=1)
        assert (run / "checkpoint").is_dir()


def restarted() -> list[jobs.Job]:
    """The job list as an app started anew on the same cache reads it."""
    jobs._jobs, jobs._loaded = {}, False
    return jobs.jobs()


def test_ended_jobs_are_listed_again_after_a_restart_with_their_state_and_progress(monkeypatch):
    def failing(progress):
        progress(1, 3, {})
        raise ValueError("the target ran out of memory")
    until_ended(jobs.start("done", 2, lambda progress: (progress(2, 2, {}), "aligned:done-distilled")[1], limit=1))
    until_ended(jobs.start("broken", 3, failing, limit=1))
    stopped = jobs.start("stopped", 1000, stepping(threading.Event()), limit=1)
    while stopped.done < 2:
        time.sleep(0.01)
    jobs.cancel("stopped")
    until_ended(stopped)
    before = [job.line() for job in jobs.jobs()]
    assert [(job.name, job.state, job.done) for job in restarted()] == [
        ("done", jobs.FINISHED, 2), ("broken", jobs.FAILED, 1), ("stopped", jobs.CANCELLED, stopped.done)]
    assert [job.line() for job in jobs.jobs()] == before
    assert "ran out of memory" in before[1]


def test_a_job_another_live_process_runs_is_not_shown_interrupted():
    """Its run folder's lock is held (service.distil holds it while it trains): it is that process's job."""
    jobs._keep(jobs.Job("elsewhere", 10, done=3))
    jobs._keep(jobs.Job("dead", 10, done=3))
    with distilling(service.runs_root() / "elsewhere"):
        (dead,) = restarted()
    assert (dead.name, dead.state, dead.done) == ("dead", jobs.INTERRUPTED, 3)
    assert "interrupted at step 3 of 10" in dead.line() and "starts over: no checkpoint was saved" in dead.line()


DISTILLING = """
import time
from specdec.dashboard import jobs
from specdec.models import load_model
from specdec.training import service
target = load_model({target!r}, dtype="float32")
job = jobs.start("job", 4, lambda progress: service.distil(target, "job", steps=4, progress=progress, max_new_tokens=8,
                                                           train_limit=1, eval_limit=1).spec, limit=1)
while job.state == jobs.RUNNING:
    time.sleep(0.05)
"""


def test_a_job_running_when_the_app_died_is_shown_interrupted_and_resumes_from_its_checkpoint(paths):
    """The app is SIGKILLed while distilling (about to save its third checkpoint): started anew on the same
    cache it lists the job as interrupted at step 2, and distilling it again resumes at step 3."""
    target, source = (load_model(paths[role], dtype="float32") for role in ("target", "unaligned"))
    service.transplant(target, source, name="job", domain="code")
    kill_at(DISTILLING.format(target=paths["target"]), "specdec.training.distill._save_checkpoint", call=3)
    (job,) = restarted()
    assert (job.state, job.done, job.steps, job.saved) == (jobs.INTERRUPTED, 2, 4, 2)
    assert "interrupted at step 2 of 4 when the app stopped" in job.line()
    assert "resumes from its checkpoint at step 2" in job.line()
    steps = []

    def work(progress):
        def heard(step, total, record):
            steps.append(step)
            progress(step, total, record)
        return service.distil(target, "job", steps=4, progress=heard, max_new_tokens=8, train_limit=1,
                              eval_limit=1).spec
    again = until_ended(jobs.start("job", 4, work, limit=1), timeout_s=300)
    assert (again.state, again.result, steps) == (jobs.FINISHED, "aligned:job-distilled", [3, 4])
    assert aligned.find("aligned:job-distilled").steps == 4
    (kept,) = restarted()
    assert (kept.state, kept.done, kept.result) == (jobs.FINISHED, 4, "aligned:job-distilled")
