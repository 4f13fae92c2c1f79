"""`python -m specdec generate` on tiny HF folders: table, stats, JSON, baseline check, clear errors; command names."""
import json
import pkgutil
import re

import pytest

from specdec import cli
from specdec.cli import main
from specdec.testing import tiny_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tiny_folder(root / "target", seed=0), tiny_folder(root / "draft", seed=0)


FLOAT32 = ("--dtype", "float32", "--draft-dtype", "float32")  # the tiny pair is one model twice: every draft passes
MODEL_COMMANDS = ("generate", "profile", "bench", "probe")


def run(capsys, *argv) -> tuple[int, str, str]:
    argv = list(argv) + (list(FLOAT32) if argv and argv[0] in MODEL_COMMANDS and "--dtype" not in argv else [])
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_generate_prints_round_table_stats_and_baseline(folders, capsys):
    target, draft = folders
    code, out, _ = run(capsys, "generate", "--target", str(target), "--draft", str(draft), "--prompt",
                       "def print the", "--k", "3", "--max-new-tokens", "12", "--baseline")
    assert code == 0
    assert "round | k | drafted by | matches" in out and "[T,T,T]" in out  # draft = target: all accepted
    assert "acceptance rate α̂" in out and "Leviathan bound" in out and "predicted speedup" in out
    assert "output identical to the target alone" in out and "measured speedup" in out


def test_generate_defaults_to_the_cost_aware_k(folders, capsys):
    target, draft = folders
    code, out, _ = run(capsys, "generate", "--target", str(target), "--draft", str(draft), "--prompt",
                       "def print the", "--max-new-tokens", "12", "--json")
    data = json.loads(out)
    assert code == 0 and data["costs"]["target"]["verify"][0] == 1.0
    assert all(0 <= r["k"] <= 8 for r in data["rounds"]) and data["token_ids"]


def test_profile_prints_the_verification_curve_and_predictions(folders, capsys):
    target, draft = folders
    code, out, _ = run(capsys, "profile", "--target", str(target), "--draft", str(draft), "--kernels")
    assert code == 0 and "v(n)" in out and "c = " in out and "α = 0.8" in out
    assert "bfloat16 F.linear" in out


def test_generate_json_is_the_whole_result(folders, capsys):
    target, draft = folders
    code, out, _ = run(capsys, "generate", "--target", str(target), "--draft", str(draft), "--prompt",
                       "def print the", "--k", "auto", "--max-new-tokens", "9", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["token_ids"]) == 9
    assert sum(len(r["emitted_token_ids"]) for r in data["rounds"]) == 9
    assert data["stats"]["acceptance_rate"] == 1.0


@pytest.mark.parametrize("extra, message", [
    (["--k", "0"], "k must be"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--prompt", ""], "empty prompt"),
    (["--threads", "0"], "--threads takes a positive number"),
])
def test_bad_input_is_one_clear_line(folders, capsys, extra, message):
    target, draft = folders
    argv = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "def the", *extra]
    code, _, err = run(capsys, *argv)
    assert code == 1 and last_line(err).startswith("error: ") and message in last_line(err) and "Traceback" not in err


def test_unknown_model_is_a_clear_error(folders, capsys, tmp_path):
    _, draft = folders
    code, _, err = run(capsys, "generate", "--target", str(tmp_path / "nowhere"), "--draft", str(draft),
                       "--prompt", "def")
    assert code == 1 and last_line(err).startswith("error: ")


def test_every_command_is_a_whole_word_named_after_its_module(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = re.search(r"\{([a-z,]+)\}", capsys.readouterr().out).group(1).split(",")
    assert set(listed) <= {module.name for module in pkgutil.iter_modules(cli.__path__)}
    assert all(name.isalpha() for name in listed) and "tokenizers" in listed


def test_profile_prints_the_measured_format_choice_and_why(folders, capsys):
    target, draft = folders
    code, out, _ = run(capsys, "profile", "--target", str(target), "--draft", str(draft), "--dtype", "auto",
                       "--draft-dtype", "auto")
    assert code == 0 and "target format:" in out and "draft format:" in out
    assert "quality against its float model not measured yet" in out
    assert "row-invariant" in out and "v(5)" in out and "never changes the output" in out


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_threads_sets_torch_threads_for_the_command(folders, capsys, monkeypatch, command):
    seen = []
    monkeypatch.setattr(cli.torch, "set_num_threads", seen.append)
    parser = cli.build_parser()
    target, draft = folders
    extra = {"generate": ["--draft", str(draft), "--prompt", "def"], "bench": ["--draft", str(draft), "--out", "x"],
             "profile": [], "probe": ["--draft", str(draft)]}[command]
    args = parser.parse_args([command, "--target", str(target), *extra, "--threads", "1"])
    assert args.threads == 1
    cli.apply_threads(args.threads)
    assert seen == [1]


def test_vocabulary_writes_the_set_of_the_targets_continuations(folders, capsys, tmp_path):
    target, _ = folders
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "vocabulary.json"
    prompts.write_text("".join(json.dumps({"id": f"p-{n}", "category": "code", "language": "en", "split": split,
                                           "template": "raw", "prompt": text}) + "\n"
                               for n, (split, text) in enumerate([("dev", "def print the"), ("dev", "for a in range"),
                                                                  ("heldout", "while is")])))
    code, printed, _ = run(capsys, "vocabulary", "--target", str(target), "--dtype", "float32", "--prompts",
                           str(prompts), "--max-new-tokens", "4", "--core", "3", "--out", str(out))
    about = json.loads(out.read_text())
    assert code == 0 and f"wrote {out}: {len(about['token_ids'])} of " in printed
    assert {0, 1, 2} <= set(about["token_ids"]) and about["texts"] == 2 and about["tokens"] > 2 * 4
    assert about["command"] == (f"python -m specdec vocabulary --target {target} --prompts {prompts} --split dev "
                                "--max-new-tokens 4 --core 3")
    code, _, err = run(capsys, "vocabulary", "--target", str(target), "--max-new-tokens", "0", "--out", str(out))
    assert code == 1 and last_line(err) == "error: --max-new-tokens must be at least 1 and --core at least 0"
