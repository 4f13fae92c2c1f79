"""The acceptance probe: exit 0 for a good draft, 2 for a bad one (with seed 000's advice), 1 for bad input."""
import json

import pytest

from specdec.cli import main
from specdec.core.suites import load_suite
from specdec.lab.probe import probe, sample_prompts
from specdec.testing import tiny_folder, tiny_model, tiny_tokenizer


def ids_folder(path, seed):
    """A tiny HF folder whose vocabulary covers the token ids of the `tiny` suite (< 128)."""
    return str(tiny_folder(path, seed=seed, extra_rows=128 - len(tiny_tokenizer())))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    return ids_folder(root / "target", seed=0), ids_folder(root / "unrelated", seed=7)


def test_probe_passes_a_draft_equal_to_the_target():
    target = tiny_model("llama", seed=0)
    report = probe(target, target, load_suite("tiny"), samples=4, max_new_tokens=12)
    assert report.passed and report.acceptance_rate == 1.0 and report.prompts == 4
    assert report.fallback is None and report.message.startswith("OK:")


def test_probe_fails_an_unrelated_draft_and_measures_the_fallback():
    target = tiny_model("llama", seed=0)
    report = probe(target, tiny_model("llama", seed=7), load_suite("tiny"), samples=4, max_new_tokens=12)
    assert not report.passed and report.acceptance_rate < 0.5
    assert set(report.per_category) <= {"repeat", "random"}
    assert report.fallback["recommendation"] in report.message
    assert "BELOW THRESHOLD" in report.message and "distil" in report.message


def test_probe_rejects_a_threshold_outside_0_1():
    target = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="threshold"):
        probe(target, target, load_suite("tiny"), threshold=50)


def test_sample_is_seeded_and_bounded():
    prompts = load_suite("tiny")
    assert sample_prompts(prompts, 3, seed=1) == sample_prompts(prompts, 3, seed=1)
    assert sample_prompts(prompts, 100, seed=1) == prompts
    with pytest.raises(ValueError, match="samples"):
        sample_prompts(prompts, 0, seed=1)


def test_cli_exit_codes(folders, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target, unrelated = folders
    common = ["probe", "--target", target, "--prompts", "tiny", "--samples", "3", "--max-new-tokens", "10"]
    assert main(common + ["--draft", target]) == 0
    assert "OK: acceptance rate" in capsys.readouterr().out
    assert main(common + ["--draft", unrelated]) == 2
    out = capsys.readouterr().out
    assert "BELOW THRESHOLD" in out and "fall back to" in out.lower()
    assert main(common + ["--draft", unrelated, "--threshold", "0", "--json", "--no-fallback"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True
    assert main(common + ["--draft", target, "--threshold", "1.5"]) == 1
    assert "error: threshold" in capsys.readouterr().err
