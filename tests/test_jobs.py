"""Background distillations on a public host: a bounded number at once, cancellable, a name checked before the
work starts, and a running one's folder safe from preparing the same name again (work stand-ins, no training)."""
import threading
import time

import gradio as gr
import pytest

from specdec.dashboard import jobs
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.tabs import compare
from specdec.models import ModelPool, aligned, cache
from specdec.training import service
from tiny_models import Progress


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch, tmp_path):
    monkeypatch.setattr(jobs, "_jobs", {})
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


def test_preparing_a_name_again_while_it_is_distilled_is_refused_and_keeps_its_folder():
    run = service.runs_root() / "busy"
    (run / "checkpoint").mkdir(parents=True)
    holding, release = threading.Event(), threading.Event()

    def distilling():  # what service.distil holds while it trains (in this process or another)
        with cache.locked(run):
            holding.set()
            release.wait(30)
    thread = threading.Thread(target=distilling)
    thread.start()
    try:
        assert holding.wait(30)
        with pytest.raises(ValueError, match="busy is being distilled"):
            service.transplant(None, None, name="busy")
        with pytest.raises(ValueError, match="busy is already being distilled"):
            service.distil(None, "busy", steps=1)
        assert (run / "checkpoint").is_dir()
    finally:
        release.set()
        thread.join()
