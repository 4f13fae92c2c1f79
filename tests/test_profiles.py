"""Cost profiles that travel: saved and read back whole, bad or foreign files refused in one line, predictions
from a profile, and the random-weights architecture that lets a machine without model files be profiled."""
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from specdec.cli import main
from specdec.core import hardware, theory
from specdec.costs.profile import VERSION, load_profile, predict, save_profile, speedups_by_k
from specdec.models import entries, formats, random_weights
from specdec.testing import tiny_config, tiny_folder

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
    assert set(profile.drafts) == {str(draft), "lookup"} and profile.verify[0] == 1.0 and len(profile.verify) == 9
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
    monkeypatch.setattr(random_weights, "CONFIGS", folder)
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
    config = AutoConfig.from_pretrained(random_weights.CONFIGS / f"{name}.json")
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
