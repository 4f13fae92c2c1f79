import shutil
from pathlib import Path

import pytest
import torch

from specdec.models import cache

# Tiny test models gain nothing from intra-op threads, and one thread keeps timings steady on 2 cores.
# Tests that load real models raise this themselves.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Tiny target / draft / unaligned-draft folders (tests/tiny_models.py), once per test module."""
    from tiny_models import write_tiny_models

    return write_tiny_models(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def hub():
    """The dashboard's model hub over a fresh pool, as a host with a 64-token cap configures it."""
    from specdec.dashboard.config import AppConfig
    from specdec.dashboard.hub import ModelHub
    from specdec.models import ModelPool

    return ModelHub(AppConfig(max_new_tokens_cap=64), pool=ModelPool())


MODEL_STORES = ("converted", "gguf", "locks")  # entries of the user's cache the tests may read from


@pytest.fixture(scope="session", autouse=True)
def users_cache(tmp_path_factory):
    """The user's cache root (yielded), kept out of the test run's writes: the session runs on a tmp
    `$SPECDEC_CACHE` (subprocesses inherit it) where only the model stores of the user's cache (`MODEL_STORES`:
    converted models, GGUFs, their locks) are linked in, so real-model tests still find what is already
    converted, while what tests write (calibrations, aligned drafts, reference texts) lands in the tmp root.
    Model stores the session writes itself (an int8 copy of the default pair: 2.4 GB) go when it ends, and those
    that ended sessions left in pytest's kept tmp folders go when one starts: three kept copies fill a small disk."""
    base = tmp_path_factory.getbasetemp()
    if base.name.startswith("pytest-") and base.parent.name.startswith("pytest-of-"):
        clear_ended_sessions(base.parent)
    real, private = cache.root(), tmp_path_factory.mktemp("specdec-cache")
    for name in MODEL_STORES:
        if (real / name).is_dir():
            (private / name).symlink_to(real / name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE", str(private))
        yield real
    clear_model_stores(private)


def clear_model_stores(private: Path) -> None:
    """Remove the model stores written into a tmp cache root (a linked store is the user's: left alone)."""
    for name in MODEL_STORES:
        if (private / name).is_dir() and not (private / name).is_symlink():
            shutil.rmtree(private / name, ignore_errors=True)


def clear_ended_sessions(sessions: Path) -> None:
    """Clear the tmp caches' model stores of every ended session under pytest's `pytest-of-USER` folder (a running
    session holds a `.lock` in its folder until it exits)."""
    for session in sessions.glob("pytest-*"):
        if session.is_dir() and not session.is_symlink() and not (session / ".lock").exists():
            for private in session.glob("specdec-cache*"):
                clear_model_stores(private)
