"""The one atomic writer: a partial sibling, fsynced (files, then folders), renamed, the parent fsynced; an error
leaves the old file; every writer of specdec goes through it."""
import json

import pytest

from specdec.core import files
from specdec.costs.calibration import calibrate
from specdec.lab.bench import store
from specdec.models import cache
from specdec.testing import tiny_model


@pytest.fixture
def synced(monkeypatch):
    """The paths `files.fsync` flushes, in order (the real fsync still runs)."""
    paths = []
    real = files.fsync
    monkeypatch.setattr(files, "fsync", lambda path: (paths.append(path), real(path)))
    return paths


def test_a_file_is_fsynced_renamed_and_its_folder_fsynced(tmp_path, synced):
    path = tmp_path / "out" / "a.json"
    files.write_text(path, "first")
    partial = files.partial_path(path)
    assert path.read_text() == "first" and synced == [partial, path.parent]
    files.write_text(path, "second")
    assert path.read_text() == "second" and sorted(p.name for p in path.parent.iterdir()) == ["a.json"]


def test_a_folder_is_flushed_file_by_file_then_replaces_the_old_one(tmp_path, synced):
    final = tmp_path / "folder"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with files.atomic_path(final) as partial:
        (partial / "inner").mkdir(parents=True)
        (partial / "inner" / "w.bin").write_bytes(b"12")
        (partial / "top.txt").write_text("t")
    assert sorted(p.name for p in final.iterdir()) == ["inner", "top.txt"]
    assert set(synced[:-1]) == {partial / "inner" / "w.bin", partial / "inner", partial / "top.txt", partial}
    assert synced.index(partial / "inner" / "w.bin") < synced.index(partial / "inner") < synced.index(partial)
    assert synced[-1] == tmp_path


def test_an_error_leaves_the_old_file_and_no_partial(tmp_path):
    path = tmp_path / "a.txt"
    files.write_text(path, "kept")
    with pytest.raises(RuntimeError):
        with files.atomic_path(path) as partial:
            partial.write_text("half")
            raise RuntimeError("killed")
    assert path.read_text() == "kept" and files.partials_of(path) == []


def test_the_cache_cleans_partials_the_writer_names(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    final = cache.root() / "costs" / "x.json"
    final.parent.mkdir(parents=True)
    files.partial_path(final).write_text("a killed writer's")
    assert files.partials_of(final) and cache.clean_stale() == 1 and files.partials_of(final) == []


def test_calibration_and_the_bench_store_write_through_it(tmp_path, monkeypatch):
    written = []
    real = files.write_text
    monkeypatch.setattr(files, "write_text", lambda path, text: (written.append(path.name), real(path, text)))
    calibrate(tiny_model("llama", seed=0), None, n_max=2, repeats=1, cache_dir=tmp_path / "costs")
    assert len(written) == 2 and all(name.endswith(".json") for name in written)  # the target's, the draft's
    rows = [{"draft": "d", "k": "1", "prompt_id": "p", "x": 1}]
    store.write_csv(rows, tmp_path / "r.csv")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / store.RESULTS_JSONL).write_text(json.dumps(rows[0]) + "\n{\"torn")
    assert store.read_rows(tmp_path / "run") == rows
    assert written[2:] == ["r.csv", store.RESULTS_JSONL]
    assert (tmp_path / "r.csv").read_text().splitlines() == ["draft,k,prompt_id,x", "d,1,p,1"]
