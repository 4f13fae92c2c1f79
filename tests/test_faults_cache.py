"""Fault injection on the conversion cache: a child process is SIGKILLed at a chosen point of a write.

The next run must start clean: nothing half-written is trusted, stale partials are removed, and the
result equals the original model. Kill points: tests/faults.py.
"""
import hashlib

import pytest
import torch

from specdec.core import files
from specdec.models import cache, load_model
from specdec.testing import tiny_model
from faults import kill_at, paused
from test_models_gguf import IDS, write_tiny_gguf

CONVERT = "from specdec.models import load_model; load_model({path!r}, dtype='float32')"
ASSEMBLE = ("from pathlib import Path; from specdec.models import cache; cache.CHUNK_BYTES = 64; "
            "cache.assemble([Path({chunk!r})], {sha!r}, Path({out!r}), progress=pause)")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    model = tiny_model("llama", 0, vocab_size=300)
    path = tmp_path_factory.mktemp("weights") / "tiny.gguf"
    write_tiny_gguf(path, model)
    return path, model


def partials():
    return sorted(p.name for p in cache.root().glob("**/*.partial-*"))


@pytest.mark.parametrize("point", ["half:transformers.modeling_utils.safe_save_file",
                                   "specdec.models.cache.mark_ready"])
def test_killed_conversion_is_never_trusted_and_the_next_run_converts_cleanly(tiny_gguf, point):
    path, original = tiny_gguf
    kill_at(CONVERT.format(path=str(path)), point)
    assert partials(), "the kill should leave a partial folder behind"
    loaded = load_model(str(path), dtype="float32")
    assert loaded.source == "gguf" and partials() == []
    torch.testing.assert_close(loaded.model(IDS).logits, original(IDS).logits, rtol=0, atol=1e-5)


def test_truncated_weights_in_a_finished_folder_are_converted_again(tiny_gguf):
    path, original = tiny_gguf
    folder = load_model(str(path), dtype="float32").path
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    again = load_model(str(path), dtype="float32")
    assert again.source == "gguf" and again.path == folder
    torch.testing.assert_close(again.model(IDS).logits, original(IDS).logits, rtol=0, atol=1e-5)


def test_a_same_size_header_corruption_is_converted_again(tiny_gguf):
    path, original = tiny_gguf
    folder = load_model(str(path), dtype="float32").path
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:16] = b"{{{{{{{{"  # the JSON header's start: safetensors can no longer parse it
    weights.write_bytes(bytes(data))
    again = load_model(str(path), dtype="float32")
    assert again.source == "gguf" and again.path == folder
    torch.testing.assert_close(again.model(IDS).logits, original(IDS).logits, rtol=0, atol=1e-5)
    assert load_model(str(path), dtype="float32").source == "cache"


def test_a_waiting_process_converts_once_the_lock_holder_is_killed(tiny_gguf):
    """A holds the lock (paused before its marker) and is killed; B, waiting on the lock, converts."""
    path, original = tiny_gguf
    code = CONVERT.format(path=str(path))
    waiter = kill_at(code, "specdec.models.cache.mark_ready", waiter=code)
    assert waiter.returncode == 0, waiter.stderr
    loaded = load_model(str(path), dtype="float32")
    assert loaded.source == "cache" and partials() == []
    torch.testing.assert_close(loaded.model(IDS).logits, original(IDS).logits, rtol=0, atol=1e-5)


def test_killed_assembly_leaves_no_file_and_the_next_assembly_is_whole(tmp_path):
    chunk = tmp_path / "part.bin"
    chunk.write_bytes(bytes(range(256)) * 64)
    sha = hashlib.sha256(chunk.read_bytes()).hexdigest()
    out = tmp_path / "gguf" / "model.gguf"
    kill_at(ASSEMBLE.format(chunk=str(chunk), sha=sha, out=str(out)), "pause")
    assert not out.exists() and list(out.parent.glob("*.partial-*"))
    assert cache.clean_stale() == 0  # partials outside the cache are the lock holder's to remove
    assert cache.assemble([chunk], sha, out).read_bytes() == chunk.read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]


def test_stale_partials_of_dead_processes_are_removed_at_start(tiny_gguf):
    path, _ = tiny_gguf
    kill_at(CONVERT.format(path=str(path)), "specdec.models.cache.mark_ready")
    assert len(partials()) == 1
    assert cache.clean_stale() == 1 and partials() == []


def test_a_partial_whose_writer_holds_the_lock_is_kept():
    final = cache.converted_dir("live", "float32")
    with cache.locked(final):
        partial = final.with_name(f"{final.name}.partial-1-1")
        partial.mkdir(parents=True)
        assert cache.clean_stale() == 0 and partial.is_dir()
    assert cache.clean_stale() == 1 and not partial.exists()


LIVE_WRITER = ("from pathlib import Path; from specdec.core import files\n"
               "with files.atomic_path(Path({final!r})) as partial:\n"
               "    partial.mkdir(); (partial / 'draft.safetensors').write_bytes(b'half')\n"
               "    pause()")


def test_a_live_writer_s_partial_survives_cleanup_even_without_the_destination_lock():
    """A distillation writes its checkpoints without `locked`: a model load's clean_stale must not delete them."""
    final = cache.root() / "aligned-runs" / "job" / "checkpoint" / "step-00000010"
    with paused(LIVE_WRITER.format(final=str(final))):
        assert cache.clean_stale() == 0 and len(partials()) == 1
        assert cache.clean_stale(final.parent) == 0 and len(partials()) == 1
    assert cache.clean_stale() == 1 and partials() == [] and list(final.parent.iterdir()) == []


REPLACE = ("import os; from pathlib import Path; from specdec.core import files\n"
           "replace, calls = os.replace, []\n"
           "def paused_second(*args):\n"
           "    calls.append(args)\n"
           "    if len(calls) == 2: pause()  # the old folder is moved aside, the new one not yet in place\n"
           "    replace(*args)\n"
           "os.replace = paused_second\n"
           "with files.atomic_path(Path({final!r})) as partial:\n"
           "    partial.mkdir(); (partial / 'version').write_text('2')")


def test_a_kill_while_a_folder_is_replaced_keeps_the_old_one():
    final = cache.root() / "aligned" / "draft"
    with files.atomic_path(final) as partial:
        partial.mkdir()
        (partial / "version").write_text("1")
    kill_at(REPLACE.format(final=str(final)), "pause")
    assert not final.exists()  # between the two renames
    cache.clean_stale()
    assert (final / "version").read_text() == "1" and partials() == []
    with files.atomic_path(final) as partial:  # and the next write replaces it as usual
        partial.mkdir()
        (partial / "version").write_text("3")
    assert (final / "version").read_text() == "3" and sorted(p.name for p in final.parent.iterdir()) == ["draft"]


WRITE_AND_PAUSE = ("from pathlib import Path; from specdec.core import files\n"
                   "with files.atomic_path(Path({final!r})) as partial:\n"
                   "    partial.write_text('half'); {then}")


def test_a_write_outside_the_cache_removes_what_killed_writers_of_it_left_and_keeps_a_live_one(tmp_path):
    """A run folder has no clean_stale: the next write of a file there removes its dead writers' partials."""
    final = tmp_path / "run" / "report.json"
    kill_at(WRITE_AND_PAUSE.format(final=str(final), then="pause()"), "pause")
    assert len(files.partials_of(final)) == 1 and list(final.parent.glob("report.json.writer-*"))
    with paused(WRITE_AND_PAUSE.format(final=str(final), then="pause()")):
        files.write_text(final, "whole")
        assert final.read_text() == "whole" and len(files.partials_of(final)) == 1  # the live writer's
    files.write_text(final, "again")
    assert sorted(p.name for p in final.parent.iterdir()) == ["report.json"]


REMOVE = ("import shutil; from pathlib import Path; from specdec.core import files\n"
          "rmtree = shutil.rmtree\n"
          "def first_file_then_pause(path, ignore_errors=False):\n"
          "    sorted(Path(path).iterdir())[0].unlink(); pause()\n"
          "shutil.rmtree = first_file_then_pause\n"
          "files.remove(Path({folder!r}))")


def test_a_folder_removal_killed_midway_never_leaves_it_with_files_missing():
    """An older checkpoint, or a run replaced with --overwrite: never left under its name, half deleted."""
    folder = cache.root() / "aligned-runs" / "job" / "checkpoint" / "step-00000001"
    folder.mkdir(parents=True)
    for name in ("draft.safetensors", "optimizer.pt", "trainer_state.json"):
        (folder / name).write_text(name)
    kill_at(REMOVE.format(folder=str(folder)), "pause")
    assert not folder.exists() and len(partials()) == 1
    assert cache.clean_stale() == 1 and partials() == [] and list(folder.parent.iterdir()) == []
