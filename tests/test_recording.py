"""Recordings of the app's presets (`specdec.lab.recording`, `python -m specdec record`) and the Live tab's replay of
them: round trip, refusals of one line naming the file, the replay's label and renderings, the command's checks."""
from __future__ import annotations

import json

import pytest

from specdec.cli import main
from specdec.cli import record as record_command
from specdec.core import hardware
from specdec.dashboard import layout
from specdec.dashboard.chips import chips_html
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.panels import round_table, stats_html
from specdec.dashboard.runs import RunControl
from specdec.dashboard.tabs import live
from specdec.lab import presets, recording
from specdec.lab.recording import load_recording, save_recording
from specdec.models import ModelPool, load_model
from tiny_models import Progress

CONFIG = AppConfig()
PRESET = "Chinese chat: 今天天气"  # multi-byte text: its characters span byte-level tokens


@pytest.fixture(scope="module")
def pair(paths):
    target = load_model(paths["target"], dtype="float32")
    return target, load_model(paths["draft"], dtype="float32")


@pytest.fixture(scope="module")
def made(pair):
    target, draft = pair
    return recording.record(target, draft, "tiny-draft", PRESET, 3, 12, None,
                            {target.name: target.dtype, draft.name: draft.dtype})


def replayed(preset: str, folder) -> tuple:
    """(LiveView, waterfall, JSON download, CSV download) the Live tab's replay sends for `preset`."""
    shown = live.replay(preset, folder)
    return live.LiveView(*shown[:len(live.LiveView._fields)]), *shown[len(live.LiveView._fields):]


def test_a_recording_round_trips_with_its_header(made, tmp_path):
    path = save_recording(made, tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert path.name == "chinese-chat.json" and (data["format"], data["version"]) == (recording.FORMAT, 2)
    loaded = load_recording(path)
    assert loaded == made and loaded.source == str(path)
    assert loaded.result.stats == made.result.stats and loaded.baseline.rounds == made.baseline.rounds
    assert loaded.hardware == hardware.describe() and loaded.code_version == hardware.code_version()
    assert loaded.baseline.token_ids == made.result.token_ids  # greedy: the target alone's output, as many tokens


def _header(**change) -> dict:
    return {"format": recording.FORMAT, "version": recording.VERSION} | change


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a recording (not readable JSON"),
    (json.dumps({"format": "specdec cost profile", "version": 1}), "not a specdec recording"),
    (json.dumps([1, 2]), "not a specdec recording"),
    (json.dumps(_header(version=1)), "a recording of format version 1; this version reads version 2"),
    (json.dumps(_header(preset="Python code")), "a damaged recording (missing baseline, code_version"),
])
def test_other_files_are_refused_with_one_line_naming_them(tmp_path, content, message):
    path = tmp_path / "x.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"^.*x\.json: ") as refused:
        load_recording(path)
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d["result"]["stats"].pop("rounds"), "its runs do not read"),
    (lambda d: d["baseline"]["rounds"][0].pop("num_accepted"), "its runs do not read"),
    (lambda d: d["result"]["stats"].update(tokens_per_s="fast"), "the result's stats must be numbers"),
    (lambda d: d.update(texts={"1": 5}), "texts must map token ids to text"),
])
def test_a_damaged_recording_is_refused_with_one_line(made, tmp_path, damage, message):
    data = made.to_dict()
    damage(data)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="damaged.json: a damaged recording") as refused:
        load_recording(path)
    assert message in str(refused.value)


def test_the_replay_shows_the_recording_as_a_run_and_labels_it(made, pair, tmp_path):
    save_recording(made, tmp_path)
    view, waterfall, json_file, csv_file = replayed(PRESET, tmp_path)
    label = view.recorded
    assert label["visible"] and f"Recorded on {hardware.label(hardware.describe())}, {made.date[:10]}" in label["value"]
    assert "press Run to measure on this machine" in label["value"]
    assert view.stats == stats_html(made.result.stats, made.baseline.stats)
    tokenizer = pair[0].tokenizer  # what a live run renders with: the replay has only the recorded texts
    assert view.chips == chips_html(made.result.rounds, tokenizer, made.prompt)
    assert view.table.equals(round_table(made.result, tokenizer))
    assert view.status.startswith(f"done: {len(made.result.token_ids)} tokens") and "measured speedup" in view.status
    assert waterfall is not None and json_file == csv_file == {"__type__": "update", "value": None}


def test_without_a_recording_the_replay_changes_nothing(tmp_path):
    view, *rest = replayed("Python code", tmp_path)
    assert all(part == {"__type__": "update"} for part in (*view, *rest))  # gr.skip() everywhere


def test_a_bad_recording_in_the_app_is_one_line_naming_it(tmp_path):
    recording.path_of("English chat", tmp_path).write_text("{}", encoding="utf-8")
    view, *_ = replayed("English chat", tmp_path)
    assert "english-chat.json: not a specdec recording" in view.status and not view.recorded["visible"]


def test_a_live_run_removes_the_recorded_label(hub, paths):
    views = list(live.live_decode(hub, paths["target"], paths["draft"], "auto", "def print", 3, 8, False, 0.8, 1.0,
                                  0, True, RunControl(), progress=Progress()))
    assert views and all(view.recorded == {"__type__": "update", "value": "", "visible": False} for view in views)


def test_record_refuses_a_bad_preset_before_any_model_loads(monkeypatch, capsys):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(record_command, "load_model", no_loading)
    assert main(["record", "--preset", "Pyhton code"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no prompt preset 'Pyhton code'; the presets: 'Python code'") and "\n" not in err


def test_the_record_command_writes_a_recording_that_loads_back(paths, tmp_path, capsys):
    code = main(["record", "--target", paths["target"], "--draft", paths["draft"], "--preset", "Python code",
                 "--out", str(tmp_path), "--max-new-tokens", "8", "--dtype", "float32", "--draft-dtype", "float32"])
    assert code == 0 and "python-code.json" in capsys.readouterr().out
    loaded = load_recording(tmp_path / "python-code.json")
    assert (loaded.preset, loaded.prompt, loaded.k, loaded.max_new_tokens) == ("Python code",
                                                                                presets.PROMPTS["Python code"], "auto", 8)
    assert loaded.formats == {"tiny-target": "float32", "tiny-draft": "float32"}
    assert 1 <= len(loaded.result.token_ids) <= 8 and loaded.baseline.token_ids == loaded.result.token_ids
    assert loaded.hardware == hardware.describe() and loaded.date.endswith("+00:00")
    view, *_ = replayed("Python code", tmp_path)
    assert view.recorded["visible"] and view.stats == stats_html(loaded.result.stats, loaded.baseline.stats)


def test_each_preset_has_its_own_file_name():
    names = [recording.path_of(name).name for name in presets.PROMPTS]
    assert len(set(names)) == len(names) and all(name.isascii() for name in names)


def test_the_replay_is_wired_on_page_load_and_preset_change_to_what_it_returns(made, tmp_path):
    demo = layout.build_demo(CONFIG, ModelHub(CONFIG, pool=ModelPool()))
    wired = [block for block in demo.fns.values() if getattr(block.fn, "__name__", "") == "replay"]
    assert len(wired) == 2 and all(not block.queue for block in wired)  # no model, no wait in the decode queue
    save_recording(made, tmp_path)
    assert {len(block.outputs) for block in wired} == {len(live.replay(PRESET, tmp_path))}
    outputs = [component.elem_id for component in wired[0].outputs]
    assert {"recorded", "status", "chips-box", "stats-box", "round-table", "alpha-plot", "waterfall-plot"} <= set(outputs)


def test_every_shipped_recording_reads_back_and_the_replay_labels_it():
    shipped = sorted(recording.FOLDER.glob("*.json"))
    assert {path.name for path in shipped} <= {recording.path_of(name).name for name in presets.PROMPTS}
    for name in presets.PROMPTS:
        made = recording.recorded(name)
        if made is None:
            continue
        view = live.replay(name)
        label = next(value for value in view if isinstance(value, dict) and "Recorded on" in str(value.get("value")))
        assert hardware.label(made.hardware) in label["value"] and made.date[:10] in label["value"]
