"""Distillation run folders under faults: a child `distill` is SIGKILLed at a chosen checkpoint write, then
`--resume` continues to exactly the weights of an uninterrupted run. Also: a run never overwrites another
silently, a resume refuses other settings, and bad input is refused before any model loads."""
import json

import pytest
from safetensors.torch import load_file

from faults import kill_at
from specdec.cli import main
from tiny_models import write_tiny_models

STEPS = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill-faults")
    paths = write_tiny_models(root / "models", context=128)
    prompts = root / "prompts.jsonl"
    lines = [{"id": f"p{i}", "category": "c", "prompt": f"the tiny prompt number {i}", "template": "raw",
              "split": "heldout" if i >= 4 else "dev"} for i in range(6)]
    prompts.write_text("\n".join(json.dumps(line) for line in lines))
    return root, paths, str(prompts)


def arguments(setup, out, *extra) -> list[str]:
    _, paths, prompts = setup
    return ["distill", "--target", paths["target"], "--draft", paths["draft"], "--prompts", prompts,
            "--steps", str(STEPS), "--checkpoint-every", "1", "--eval-every", "0", "--eval-limit", "1",
            "--eval-max-new-tokens", "4", "--max-new-tokens", "6", "--batch-size", "2", "--top-k", "8",
            "--lr", "1e-2", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def straight(setup):
    out = setup[0] / "straight"
    assert main(arguments(setup, out)) == 0
    return load_file(out / "draft" / "model.safetensors")


@pytest.mark.parametrize("point", ["half:safetensors.torch.save_model",  # mid-way through the weights
                                   "torch.save",  # between the weights and the optimizer state
                                   "specdec.core.files.write_text"])  # checkpoint whole, LATEST not yet moved
def test_a_run_killed_at_a_checkpoint_resumes_to_the_uninterrupted_result(setup, straight, tmp_path, point):
    out = tmp_path / "run"
    kill_at(f"from specdec.cli import main; main({arguments(setup, out)!r})", point, call=3)
    assert not (out / "report.json").exists()
    assert main(arguments(setup, out, "--resume")) == 0
    report = json.loads((out / "report.json").read_text())
    assert [r["step"] for r in report["losses"]] == list(range(1, STEPS + 1))
    resumed = load_file(out / "draft" / "model.safetensors")
    assert resumed.keys() == straight.keys()
    for name, weight in straight.items():
        assert (resumed[name] - weight).abs().max() <= 1e-6, name
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["LATEST", f"step-{STEPS:08d}"]


def test_a_new_run_never_replaces_an_old_one_silently(setup, straight, capsys):
    out = setup[0] / "straight"
    before = (out / "report.json").read_bytes()
    assert main(arguments(setup, out)) == 1
    assert "already holds a run" in capsys.readouterr().err and (out / "report.json").read_bytes() == before
    assert main(arguments(setup, out, "--resume", "--lr", "5e-3")) == 1
    assert "lr was 0.01 there, 0.005 now" in capsys.readouterr().err
    assert main(arguments(setup, out, "--resume", "--steps", str(STEPS - 2))) == 1  # would return a longer run
    assert f"it has trained {STEPS} steps, more than the {STEPS - 2} asked" in capsys.readouterr().err
    assert (out / "report.json").read_bytes() == before


def test_overwrite_replaces_the_old_run(setup, tmp_path):
    out = tmp_path / "run"
    assert main(arguments(setup, out, "--steps", "1")) == 0
    assert main(arguments(setup, out, "--steps", "2", "--overwrite")) == 0
    assert json.loads((out / "report.json").read_text())["steps_done"] == 2


@pytest.mark.parametrize("extra, message", [
    (["--checkpoint-every", "0"], "checkpoint_every must be >= 1"),
    (["--grad-accum", "0"], "grad_accum must be >= 1"),
    (["--alpha", "1.5"], "alpha must be in"),
    (["--temperature", "0"], "temperature must be > 0"),
    (["--temperature", "nan"], "temperature must be > 0"),
    (["--prompts", "no-such-suite"], "no prompt suite"),
    (["--max-new-tokens", "0"], "max-new-tokens must be >= 1"),
])
def test_distill_inputs_are_refused_before_any_model_loads(setup, tmp_path, capsys, extra, message):
    """--target names a missing folder: reaching the model load would report that instead."""
    argv = arguments(setup, tmp_path / "run", *extra)
    argv[argv.index("--target") + 1] = "./no-such-dir"
    assert main(argv) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [(["--threshold", "1.5"], "threshold must be"),
                                            (["--samples", "0"], "samples must be >= 1")])
def test_probe_inputs_are_refused_before_any_model_loads(capsys, extra, message):
    argv = ["probe", "--target", "./no-such-dir", "--draft", "lookup", "--prompts", "tiny", *extra]
    assert main(argv) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["./no-such-dir", "~/no-such-dir", "checkpoints/final", "a/b/c", "runs\\final"])
def test_a_mistyped_local_path_is_a_missing_folder_never_a_hub_id(tmp_path, monkeypatch, capsys, spec):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    assert main(["probe", "--target", spec, "--draft", "lookup", "--prompts", "tiny"]) == 1
    assert "folder not found" in capsys.readouterr().err


def test_a_continuation_line_cut_by_a_kill_is_generated_again(tmp_path):
    from specdec.training.distill import cached_examples
    from specdec.testing import tiny_model

    target = tiny_model("llama", seed=0, vocab_size=48, hidden=32)
    whole = cached_examples(target, [[3, 4], [5, 6]], tmp_path / "a", max_new_tokens=4)
    (done,) = (tmp_path / "a").glob("*.jsonl")
    partial = tmp_path / "b" / done.with_suffix(".partial").name
    partial.parent.mkdir()
    partial.write_text(done.read_text().splitlines()[0] + "\n" + done.read_text()[:7])  # second line half-written
    assert cached_examples(target, [[3, 4], [5, 6]], tmp_path / "b", max_new_tokens=4) == whole


def test_a_suite_that_is_not_utf8_is_named_in_the_error(tmp_path, capsys):
    suite = tmp_path / "latin1.txt"
    suite.write_bytes("café au lait\n".encode("latin-1"))
    assert main(["probe", "--target", "./no-such-dir", "--draft", "lookup", "--prompts", str(suite)]) == 1
    err = capsys.readouterr().err
    assert str(suite) in err and "not UTF-8" in err
