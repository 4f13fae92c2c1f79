"""Bench run folders under faults: a bench SIGKILLed between two cells, or cut mid-line, resumes without losing
or repeating a cell; a refused folder gets no calibration written; a retrained draft never reuses old rows."""
import json

import pytest

from faults import kill_at
from specdec.cli import main
from specdec.lab.bench import store
from specdec.testing import tiny_folder, tiny_tokenizer

CELLS = 2 * 4  # two drafts x four prompts of the tiny suite (two per category), one k


def ids_folder(path, seed):
    """A tiny HF folder whose vocabulary covers the token ids of the `tiny` suite (< 128)."""
    return str(tiny_folder(path, seed=seed, extra_rows=128 - len(tiny_tokenizer())))


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return ids_folder(tmp_path / "target", 0), ids_folder(tmp_path / "draft", 1), tmp_path / "run"


def argv(target, draft, out, *extra):
    return ["bench", "--target", target, "--draft", draft, "lookup", "--prompts", "tiny", "--limit", "2", "--k", "2",
            "--max-new-tokens", "5", "--dtype", "float32", "--no-hf-generate", "--out", str(out), *extra]


def rows(out):
    lines = (out / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def keys(found):
    return sorted((r["draft"], r["k"], r["prompt_id"]) for r in found)


def test_a_bench_killed_between_cells_resumes_without_losing_or_repeating_one(setup, monkeypatch):
    target, draft, out = setup
    kill_at(f"from specdec.cli import main; main({argv(target, draft, out)!r})", "specdec.lab.bench.run.append_row",
            call=2)
    assert len(rows(out)) == 1  # the first cell was on disk when the kill came
    first = rows(out)[0]
    assert main(argv(target, draft, out)) == 0
    finished = rows(out)
    assert len(finished) == CELLS and len(set(keys(finished))) == CELLS and finished[0] == first


def test_a_line_cut_by_a_kill_is_dropped_and_measured_again(setup):
    target, draft, out = setup
    assert main(argv(target, draft, out)) == 0
    whole = (out / "results.jsonl").read_text()
    (out / "results.jsonl").write_text(whole[:len(whole) - 40])  # the last line loses its end
    assert main(argv(target, draft, out)) == 0
    assert len(rows(out)) == CELLS and keys(rows(out)) == sorted(keys(json.loads(x) for x in whole.splitlines()))


def test_a_line_cut_inside_a_character_is_dropped(tmp_path):
    """A kill can cut a line between the bytes of one UTF-8 character: the complete rows are kept."""
    complete = json.dumps({"draft": "d", "k": 2, "prompt_id": "今天-1"}, ensure_ascii=False) + "\n"
    torn = json.dumps({"draft": "d", "k": 2, "prompt_id": "今天-2"}, ensure_ascii=False).encode()
    (tmp_path / store.RESULTS_JSONL).write_bytes(complete.encode() + torn[:torn.index("天".encode()) + 1])
    assert store.read_rows(tmp_path) == [json.loads(complete)]
    assert (tmp_path / store.RESULTS_JSONL).read_text(encoding="utf-8") == complete


def test_a_bad_line_inside_the_file_is_named(setup, capsys):
    target, draft, out = setup
    assert main(argv(target, draft, out)) == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    lines[1] = lines[1][:30]
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    assert main(argv(target, draft, out)) == 1
    assert "results.jsonl:2: not a JSON row" in capsys.readouterr().err


def test_a_refused_folder_gets_no_calibration(setup, capsys):
    target, draft, out = setup
    assert main(argv(target, draft, out)) == 0
    other = ["bench", "--target", target, "--draft", "self:auto", "--self-layers", "1", "--prompts", "tiny",
             "--limit", "2", "--k", "2", "--max-new-tokens", "7", "--dtype", "float32", "--out", str(out)]
    assert main(other) == 1 and "another configuration" in capsys.readouterr().err
    assert not (out / "calibration.json").exists()


def test_another_suite_in_the_same_folder_is_refused(setup, capsys):
    target, draft, out = setup
    assert main(argv(target, draft, out)) == 0
    assert main(argv(target, draft, out)[:-2] + ["--limit", "1", "--out", str(out)]) == 1
    assert "prompts" in capsys.readouterr().err


def test_a_retrained_draft_under_the_same_name_never_reuses_old_rows(setup, tmp_path, capsys):
    target, draft, out = setup
    assert main(argv(target, draft, out)) == 0
    ids_folder(tmp_path / "draft", 2)  # the same folder, new weights
    assert main(argv(target, draft, out)) == 1
    assert "other weights" in capsys.readouterr().err


def test_charts_cut_short_by_a_kill_are_written_whole_by_the_next_run(setup):
    """plotly writes a chart and its plotly.min.js in place, and the bundle never again once there."""
    from plotly.offline import get_plotlyjs

    target, draft, out = setup
    assert main(argv(target, draft, out)) == 0
    bundle, chart = out / "plotly.min.js", out / "speedup_vs_k.html"
    for path in (bundle, chart):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert main(argv(target, draft, out)) == 0  # every cell is there: it only reports again
    assert bundle.read_text() == get_plotlyjs() and chart.read_text().rstrip().endswith("</html>")


def test_a_resumed_run_folder_loses_the_token_a_killed_writer_left_beside_its_config(tmp_path):
    """A run killed after config.json was renamed into place but before its writer's token went: the resumed run
    does not write the config again, yet leaves the folder with results only."""
    from dataclasses import make_dataclass
    config = make_dataclass("Config", [("k", int)])(2)
    store.check_run_folder(tmp_path, config)
    token = tmp_path / f"{store.CONFIG_JSON}.writer-999999-1"  # no live process holds it
    token.touch()
    store.check_run_folder(tmp_path, config)
    assert sorted(p.name for p in tmp_path.iterdir()) == [store.CONFIG_JSON]
