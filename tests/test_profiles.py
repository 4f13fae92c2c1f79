"""Cost profiles that travel: saved and read back whole, bad or foreign files refused in one line, predictions
from a profile, the random-weights architecture that lets a machine without model files be profiled, and the
bundled profiles the app's compare and theory tabs predict with, and the table of every format's path."""
import json
import logging

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from specdec import DecodeStats, GenerationResult, Round
from specdec.cli import main
from specdec.core import hardware, theory
from specdec.costs import profile as profiles
from specdec.costs.calibration import N_MAX
from specdec.costs.profile import (VERSION, bundled_profiles, load_profile, predict, predict_for, save_profile,
                                   speedups_by_k)
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.layout import build_demo
from specdec.dashboard.profiles import THIS_MACHINE, choices
from specdec.dashboard.tabs import compare, theory as theory_tab
from specdec.lab import paths
from specdec.lab.breakdown import weight_bytes_per_step
from specdec.models import ModelPool
from specdec.models import entries, formats, random_weights
from specdec.testing import tiny_config, tiny_folder
from tiny_models import Progress

PROFILE = {"format": "specdec cost profile", "version": VERSION, "target": "t", "dtype": "bfloat16",
           "device": "cuda", "weights": "random", "hardware": {"gpu": "Some GPU", "threads": 8}, "date": "2025-01-01",
           "code_version": "abc", "step_s": 0.01, "verify": [1.0, 1.2, 1.5], "drafts": {"d": 0.1, "lookup": 0.0}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tiny_folder(root / "target", seed=0), tiny_folder(root / "draft", seed=1)


def write(path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_profile_save_writes_what_load_reads_back(folders, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target, draft = folders
    saved = tmp_path / "here.json"
    assert main(["profile", "--target", str(target), "--draft", str(draft), "lookup", "--save", str(saved)]) == 0
    assert f"to {saved}" in capsys.readouterr().out
    profile = load_profile(saved)
    assert profile.target == "target" and profile.device == "cpu" and profile.weights == "loaded"
    assert set(profile.drafts) == {str(draft), "lookup"} and profile.verify[0] == 1.0 and len(profile.verify) == N_MAX
    assert profile.hardware["cpu"] and profile.hardware["threads"] == torch.get_num_threads()
    assert profile.code_version and profile.date and profile.dtype in formats.FORMATS
    again = tmp_path / "again.json"
    save_profile(profile, again)
    assert json.loads(again.read_text()) == json.loads(saved.read_text())
    assert load_profile(again) == profile


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a cost profile"),
    ({"some": "other json"}, "not a specdec cost profile"),
    ([1, 2], "not a specdec cost profile"),
    ({**PROFILE, "version": 99}, "format version 99"),
    ({**PROFILE, "verify": [0.5, 1.0]}, "damaged cost profile (verify"),
    ({**PROFILE, "drafts": {"d": -1}}, "damaged cost profile (drafts"),
    ({k: v for k, v in PROFILE.items() if k != "step_s"}, "missing step_s"),
    ({**PROFILE, "date": 20250101}, "damaged cost profile (target, dtype, device and date must be text"),
    (None, "no such cost profile"),
])
def test_a_bad_profile_is_refused_in_one_line_naming_it_before_any_model_loads(tmp_path, capsys, content, message):
    path = str(tmp_path / "costs.json") if content is None else write(tmp_path / "costs.json", content)
    code = main(["generate", "--target", str(tmp_path / "no-model-here"), "--draft", "d", "--prompt", "x",
                 "--costs", path])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and path in err and message in err, err


def test_a_profile_of_another_target_or_without_the_draft_is_refused(folders, tmp_path, capsys):
    target, draft = folders
    foreign = write(tmp_path / "other.json", PROFILE)
    argv = ["generate", "--target", str(target), "--draft", "d", "--prompt", "def the", "--costs", foreign]
    assert main(argv) == 1
    assert "a cost profile of target 't', not 'target'" in capsys.readouterr().err
    assert main([*argv[:4], str(draft), *argv[5:]]) == 1
    assert f"no cost c for draft {str(draft)!r} (it has: d, lookup)" in capsys.readouterr().err


def test_a_prediction_prices_the_acceptance_per_position_at_the_profiled_costs(tmp_path):
    profile = load_profile(write(tmp_path / "p.json", PROFILE))
    rates = [0.8, 0.5]
    tokens = theory.tokens_per_round_by_k(rates)  # [1, 1.8, 2.2]
    assert speedups_by_k(rates, profile.costs("d")) == pytest.approx([1.0, 1.8 / 1.3, 2.2 / 1.7])
    there = predict(profile, "d", rates, 2)
    assert there.speedup == pytest.approx(tokens[2] / (1.5 + 2 * 0.1)) and there.k == 2
    assert there.best_k == 1 and there.best_speedup == pytest.approx(1.8 / 1.3)
    flat = load_profile(write(tmp_path / "flat.json", {**PROFILE, "verify": [1.0, 1.0, 1.0]}))
    assert predict(flat, "lookup", rates, 2).best_k == 2  # free drafts, free verification: the longer draft pays
    assert "Some GPU (bfloat16, cuda)" in there.line(1.1, 1.05) and "measured 1.05x" in there.line(1.1, 1.05)


def test_generate_shows_the_speedup_predicted_there_next_to_the_one_measured_here(folders, tmp_path, capsys):
    target, draft = folders
    path = write(tmp_path / "p.json", {**PROFILE, "target": "target", "drafts": {str(draft): 0.25}})
    argv = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "def the", "--k", "3",
            "--max-new-tokens", "12", "--costs", path]
    assert main([*argv, "--baseline"]) == 0
    out = capsys.readouterr().out
    assert "on Some GPU (bfloat16, cuda): predicted" in out and "measured" in out.splitlines()[-1]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rates = data["stats"]["per_position_acceptance"]
    expected = predict(load_profile(path), str(draft), rates, 3)
    assert data["elsewhere"]["speedup"] == pytest.approx(expected.speedup)
    assert data["elsewhere"]["best_k"] == expected.best_k


@pytest.fixture
def tiny_architectures(tmp_path, monkeypatch):
    """assets/configs/ stand-ins: the default pair's names with tiny shapes (same vocabulary)."""
    folder = tmp_path / "configs"
    folder.mkdir()
    for role, layers in (("target", 2), ("draft", 1)):
        tiny_config("qwen2", vocab_size=96, layers=layers).to_json_file(folder / f"{entries.default_name(role)}.json")
    monkeypatch.setattr(entries, "CONFIGS", folder)
    return folder


def test_random_weights_profile_a_machine_without_the_model_files(tiny_architectures, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    target, draft = entries.default_name("target"), entries.default_name("draft")
    saved = tmp_path / "random.json"
    assert main(["profile", "--target", target, "--draft", draft, "self:1", "--random-weights", "--dtype",
                 "float32", "--draft-dtype", "float32", "--save", str(saved)]) == 0
    assert "with random weights" in capsys.readouterr().out
    profile = load_profile(saved)
    assert (profile.target, profile.weights, set(profile.drafts)) == (target, "random", {draft, "self:1"})
    assert sorted(p.name for p in cache.iterdir()) == ["costs"]  # no model was written to the model cache
    built = random_weights.load_random(target, dtype="float32")
    assert built.source == "random weights" and built.tokenizer is None
    assert built.model.config.num_hidden_layers == 2 and built.model.config.vocab_size == 96


def test_random_weights_refuse_a_model_without_a_shipped_architecture(tiny_architectures, capsys):
    assert main(["profile", "--target", "gemma-3-270m", "--random-weights"]) == 1
    err = capsys.readouterr().err
    assert "random weights need a catalogue model whose architecture ships with specdec" in err
    assert entries.default_name("target") in err


@pytest.mark.parametrize("name", random_weights.shipped())
def test_each_shipped_architecture_is_a_catalogue_model_of_its_size(name):
    entry = entries.find(name)
    assert entry is not None and entry.name == name
    config = AutoConfig.from_pretrained(entries.CONFIGS / f"{name}.json")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tied = config.tie_word_embeddings
    parameters = sum(p.numel() for p in model.parameters()) - (0 if tied else model.lm_head.weight.numel())
    stated = float(entry.parameters[:-1]) * {"M": 1e6, "B": 1e9}[entry.parameters[-1]]
    assert 0.75 < parameters / stated < 1.1  # the catalogue's size counts the embedding once


def test_a_stored_hardware_description_is_named_in_one_line():
    here = hardware.describe("cpu")
    assert hardware.label(here) == f"{here['cpu']}, {here['threads']} threads"
    assert hardware.label({**here, "gpu": "Some GPU"}) == "Some GPU"
    assert hardware.code_version()  # a commit here, "unknown" outside a checkout


def test_bundled_profiles_list_the_good_files_and_refuse_a_bad_one_in_one_line_naming_it(tmp_path, caplog):
    write(tmp_path / "gpu.json", PROFILE)
    bad = write(tmp_path / "broken.json", "{not json")
    write(tmp_path / "notes.txt", "not a profile, not listed")
    with caplog.at_level(logging.WARNING):
        listed = bundled_profiles(tmp_path)
    assert list(listed) == ["gpu.json"] and listed["gpu.json"].label == "Some GPU (bfloat16, cuda)"
    assert [r.getMessage() for r in caplog.records] == [f"{bad}: not a cost profile (not readable JSON: "
                                                        "JSONDecodeError)"]
    assert choices(listed) == [(THIS_MACHINE, THIS_MACHINE), ("Some GPU (bfloat16, cuda), profiled 2025-01-01; "
                                                              "target t", "gpu.json")]


def test_without_a_bundled_folder_the_app_offers_only_this_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(profiles, "HARDWARE", tmp_path / "absent")
    assert bundled_profiles() == {}
    config = AppConfig()
    demo = build_demo(config, ModelHub(config, pool=ModelPool()))
    lists = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) in ("compare-hardware", "theory-hardware")]
    assert len(lists) == 2 and all(b.choices == [(THIS_MACHINE, THIS_MACHINE)] for b in lists)
    assert all(b.value == THIS_MACHINE for b in lists)


def synthetic_result() -> GenerationResult:
    """Two k=3 rounds: one rejected at position 2, one all accepted (α̂ per position 1, 0.5, 1)."""
    common = dict(draft_time_s=0.01, target_time_s=0.1, draft_forwards=3)
    rounds = [Round([5, 6, 7], [0.9, 0.8, 0.7], [0.95, 0.1, 0.3], [True, False, True], 1, 9, [5, 9], **common),
              Round([5, 6, 7], [0.9, 0.8, 0.7], [0.9, 0.9, 0.9], [True, True, True], 3, 4, [5, 6, 7, 4], **common)]
    return GenerationResult([5, 9, 5, 6, 7, 4], rounds, DecodeStats.from_rounds(rounds, 3))


def test_the_compare_tab_shows_predict_for_the_acceptance_measured_here_and_names_the_hardware(tmp_path):
    profile = load_profile(write(tmp_path / "p.json", PROFILE))
    result = synthetic_result()
    rates = result.stats.per_position_acceptance
    expected = predict(profile, "d", rates, result.stats.k)
    assert predict_for(profile, "t", "d", rates, result.stats.k) == expected
    there = {"1: d": predict_for(profile, "t", "d", rates, 3), "2: other": predict_for(profile, "t", "other", rates, 3)}
    table = compare.comparison_table({"1: d": result, "2: other": result}, result, profile, there)
    row = table.iloc[-1]
    assert "Some GPU (bfloat16, cuda), profiled 2025-01-01" in row["metric"]
    assert row["1: d"].startswith(f"{expected.speedup:.2f} (k=3; k={expected.best_k} there")
    assert row["2: other"] == "no c for this draft there"
    assert table.iloc[-2]["metric"].startswith("measured speedup")  # the prediction there next to the measurement
    bars = compare.comparison_chart({"1: d": result, "2: other": result}, result, profile, there).data
    assert bars[0].y[-1] == pytest.approx(expected.speedup) and bars[1].y[-1] is None
    assert len(compare.comparison_table({"1: d": result}, result)) == len(table) - 1  # this machine: no such row


def test_a_profile_of_another_target_says_so_in_its_cell(tmp_path):
    foreign = load_profile(write(tmp_path / "p.json", PROFILE))
    assert predict_for(foreign, "tiny-target", "d", [0.8, 0.5], 2) == "not for this target (a profile of t)"


@pytest.fixture
def bundled(tmp_path, paths, hub):
    """Two profiles as the app lists them: one of the tiny target with a c for its draft, one of another target."""
    name = hub.target(paths["target"]).name
    write(tmp_path / "mine.json", {**PROFILE, "target": name, "drafts": {paths["draft"]: 0.25}})
    write(tmp_path / "foreign.json", PROFILE)
    return bundled_profiles(tmp_path)


def test_compare_predicts_each_pair_on_the_chosen_hardware(bundled, paths, hub):
    inputs = [paths["target"], "def the", 3, 10]
    drafts = [paths["draft"], "as is", "lookup", "as is"]
    *_, table, chart, status = list(compare.compare(hub, bundled, *inputs, "mine.json", *drafts,
                                                    progress=Progress()))[-1]
    row = table.iloc[-1]
    assert status.startswith("done") and bundled["mine.json"].title in row["metric"]
    assert float(row["1: tiny-draft (as is)"].split()[0]) > 0
    assert row["2: lookup (as is)"] == "no c for this draft there"
    assert "predicted there" in chart.data[0].x and bundled["mine.json"].title in chart.layout.title.text
    *_, table, _chart, _status = list(compare.compare(hub, bundled, *inputs, "foreign.json", *drafts))[-1]
    assert set(table.iloc[-1].drop("metric")) == {"not for this target (a profile of t)"}


def test_the_theory_tab_prices_its_curves_and_sweep_with_the_chosen_profile(bundled, paths, hub):
    mine = bundled["mine.json"]
    c, slope, status = theory_tab.hardware_costs(bundled, "mine.json", paths["draft"])
    assert (c, slope) == (0.25, round(mine.costs(paths["draft"]).verify_slope(), 3)) and mine.title in status
    assert "no c for draft lookup" in theory_tab.hardware_costs(bundled, "mine.json", "lookup")[2]
    pair = [paths["target"], paths["draft"], "auto", "def the", 8]
    figure, alpha, c, slope, table, sweep, status = list(theory_tab.k_sweep(hub, bundled, *pair, 2, "mine.json",
                                                                             progress=Progress()))[-1]
    assert (c, slope) == (0.25, round(mine.costs(paths["draft"]).verify_slope(), 3)) and mine.title in status
    assert all(value > 0 for value in table[f"predicted on {mine.label}"])
    *_, table, _sweep, status = list(theory_tab.k_sweep(hub, bundled, *pair, 2, "foreign.json"))[-1]
    assert set(table[f"predicted on {mine.label}"]) == {"not for this target (a profile of t)"}  # same hardware
    assert "not for this target" in status
    with pytest.raises(Exception, match="pick this machine or one of the bundled profiles"):
        list(theory_tab.k_sweep(hub, bundled, *pair, 2, "../elsewhere.json"))


def test_every_shipped_profile_reads_back_for_the_default_target():
    shipped = sorted(p.name for p in profiles.HARDWARE.glob("*.json"))
    bundled = bundled_profiles()
    assert sorted(bundled) == shipped  # none refused
    for found in bundled.values():
        found.check_target(entries.default_name("target"))
        assert found.costs(entries.default_name("draft")).draft_cost > 0


def test_the_paths_table_has_a_row_per_format_with_its_bytes_floor_step_curve_and_costs(tiny_architectures, tmp_path,
                                                                                        monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target, draft = entries.default_name("target"), entries.default_name("draft")
    bandwidth, rows = paths.measure_paths(target, [draft, "lookup"])
    assert [row.format for row in rows] == list(formats.candidates("cpu", "draft")) and bandwidth > 0
    for row in rows:
        model = random_weights.load_random(target, dtype=row.format).model
        assert row.bytes == weight_bytes_per_step(model) > 0
        assert row.floor_s(bandwidth) == pytest.approx(row.bytes / bandwidth)
        assert len(row.verify) == N_MAX and row.verify[0] == 1.0 and row.step_s > 0
        draft_model = random_weights.load_random(draft, dtype=row.format).model
        assert row.drafts[draft].bytes == weight_bytes_per_step(draft_model)
        assert row.drafts["lookup"].bytes is None and row.drafts[draft].cost > 0
    by_format = {row.format: row.bytes for row in rows}
    assert by_format["int8"] < by_format["bfloat16"] < by_format["float32"]  # the bytes follow the format
    assert main(["profile", "--target", target, "--draft", draft, "--paths"]) == 0
    out = capsys.readouterr().out
    assert "GB/s" in out and all(f"\n{f:12s} |" in out for f in by_format)
    assert main(["profile", "--target", target, "--paths", "--save", str(tmp_path / "p.json")]) == 1
    assert "not with --levers, --breakdown or --paths" in capsys.readouterr().err
