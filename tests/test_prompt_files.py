"""Prompt files as documented: a plain text file (one prompt per line) works for every command; a file without
a held-out split gets one (every 5th prompt, at least one) and the command says how many; a bad file is one
line naming file:line. (`experiment` on a text file: tests/test_align_cli.py, with resume after a kill.)"""
import json

import pytest

from specdec.cli import main
from specdec.core.suites import HOLD_OUT_EVERY, has_held_out, load_suite, split_note
from specdec.testing import tiny_folder

LINES = ["def print the a", "return if else", "for while in range", "the a of to", "and is def",
         "print the range", "if the a", "while in the", "return a of", "to and is", "def the print", "in range"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt-files")
    prompts = root / "mine.txt"
    prompts.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    few = root / "few.txt"
    few.write_text("def the a\nreturn if else\n", encoding="utf-8")
    return {"target": str(tiny_folder(root / "target", seed=0)), "draft": str(tiny_folder(root / "draft", seed=1)),
            "prompts": str(prompts), "few": str(few), "root": root}


# --- load_suite ------------------------------------------------------------------------------------------

def test_a_text_file_gets_a_deterministic_held_out_split(folders):
    prompts = load_suite(folders["prompts"])
    held = [p.prompt for p in prompts if p.split == "heldout"]
    assert held == [LINES[4], LINES[9]] and HOLD_OUT_EVERY == 5
    assert [p.prompt for p in load_suite(folders["prompts"], split="dev")] == [x for x in LINES if x not in held]
    assert load_suite(folders["prompts"]) == prompts  # the same split every time
    assert split_note(folders["prompts"]).endswith("held out every 5th prompt, 2 of 12 (10 left to tune or train on)")
    assert not has_held_out(folders["prompts"])


def test_fewer_than_five_prompts_hold_out_the_last_and_one_prompt_says_why_it_cannot(tmp_path, folders):
    assert [p.prompt for p in load_suite(folders["few"], split="heldout")] == ["return if else"]
    one = tmp_path / "one.txt"
    one.write_text("def the a\n", encoding="utf-8")
    assert len(load_suite(one, split="dev")) == 1
    with pytest.raises(ValueError, match="a file of one prompt cannot hold one out"):
        load_suite(one, split="heldout")


def test_a_jsonl_with_its_own_held_out_split_keeps_it_and_one_without_gets_one(tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text("".join(json.dumps({"id": f"p{i}", "category": "x", "prompt": f"p {i}",
                                       "split": "heldout" if i == 0 else "dev"}) + "\n" for i in range(6)))
    assert [p.id for p in load_suite(own, split="heldout")] == ["p0"] and has_held_out(own)
    assert split_note(own) is None
    none = tmp_path / "none.jsonl"
    none.write_text("".join(json.dumps({"id": f"p{i}", "category": "x", "prompt": f"p {i}"}) + "\n"
                            for i in range(6)))
    assert [p.id for p in load_suite(none, split="heldout")] == ["p4"]
    assert {p.split for p in load_suite("finance")} == {"dev", "heldout"}  # built-in suites keep theirs
    assert not any(p.split_from != "file" for p in load_suite("all"))


@pytest.mark.parametrize("name, content, message", [
    ("bad.txt", b"first\nsecond \xff\xfe here\n", r"bad.txt:2: not UTF-8 text \(byte 0xff at column 8\)"),
    ("bad.jsonl", b'{"id": "a", "category": "x", "prompt": "p"}\n\xe9\n', r"bad.jsonl:2: not UTF-8"),
    ("empty.txt", b"", r"empty.txt: no prompts \(the file is empty\)"),
    ("blank.txt", b"\n  \n", r"blank.txt: no prompts"),
    ("bad.jsonl", b'{"id": "a", "category": "x", "prompt": "p"}\n{"id": \n', r"bad.jsonl:2: not valid JSON"),
    ("deep.jsonl", b'{"id": "a", "category": "x", "prompt": "p"}\n' + b"[" * 100_000 + b"\n",
     r"deep.jsonl:2: not valid JSON \(nested too deeply\)"),
])
def test_a_bad_file_is_one_error_naming_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        load_suite(path)


def test_prompts_are_split_at_newlines_only(tmp_path):
    """U+2028 (line separator) and U+0085 (next line) are characters of a prompt, not line breaks."""
    jsonl = tmp_path / "mine.jsonl"
    record = {"id": "a", "category": "x", "prompt": "first\u2028second\u0085third"}
    jsonl.write_text(json.dumps(record, ensure_ascii=False) + "\r\n", encoding="utf-8")
    assert [p.prompt for p in load_suite(jsonl)] == [record["prompt"]]
    text = tmp_path / "mine.txt"
    text.write_text("one\x85prompt\u2028still\r\ntwo\n", encoding="utf-8")
    assert [p.prompt for p in load_suite(text)] == ["one\x85prompt\u2028still", "two"]


# --- every command with a text file ----------------------------------------------------------------------

def test_probe_reads_a_text_file(folders, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    assert main(["probe", "--target", folders["target"], "--draft", folders["target"], "--prompts",
                 folders["prompts"], "--samples", "3", "--max-new-tokens", "6", "--no-fallback"]) == 0
    assert "OK: acceptance rate" in capsys.readouterr().out


def test_bench_reads_a_text_file_and_its_held_out_split(folders, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "bench"
    assert main(["bench", "--target", folders["target"], "--draft", folders["draft"], "--prompts",
                 folders["prompts"], "--split", "heldout", "--k", "2", "--max-new-tokens", "5", "--dtype", "float32",
                 "--no-hf-generate", "--out", str(out)]) == 0
    assert "held out every 5th prompt, 2 of 12" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["ours_equals_target_alone"] for r in rows)


def test_distill_trains_on_a_text_file_and_evaluates_its_held_out_prompts(folders, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(folders["root"] / "cache"))
    out = folders["root"] / "distill"
    assert main(["distill", "--target", folders["target"], "--draft", folders["draft"], "--prompts",
                 folders["prompts"], "--steps", "2", "--eval-every", "0", "--max-new-tokens", "4",
                 "--eval-max-new-tokens", "4", "--eval-limit", "8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "held out every 5th prompt, 2 of 12 (10 left to tune or train on)" in printed
    assert "held-out acceptance" in printed
    data = [json.loads(line) for f in (out / "data").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert len(data) == 10  # the dev split only
    assert len(json.loads((out / "report.json").read_text())["evals"]) == 2


def test_distill_uses_all_of_an_eval_text_file(folders, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(folders["root"] / "cache"))
    out = folders["root"] / "distill-eval"
    assert main(["distill", "--target", folders["target"], "--draft", folders["draft"], "--prompts",
                 folders["prompts"], "--split", "all", "--eval-prompts", folders["few"], "--steps", "1",
                 "--eval-every", "0", "--max-new-tokens", "4", "--eval-max-new-tokens", "4", "--out", str(out)]) == 0
    assert "held out every" not in capsys.readouterr().out  # trains on all 12, evaluates on all of few.txt
    data = [json.loads(line) for f in (out / "data").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert len(data) == 12


@pytest.mark.parametrize("command", ["distill", "probe", "bench", "experiment"])
def test_a_bad_file_fails_every_command_with_one_line(folders, capsys, tmp_path, command):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\n")
    models = ["--target", folders["target"]]
    argv = {"distill": ["distill", *models, "--draft", folders["draft"], "--out", str(tmp_path / "o")],
            "probe": ["probe", *models, "--draft", folders["draft"]],
            "bench": ["bench", *models, "--draft", folders["draft"], "--out", str(tmp_path / "o")],
            "experiment": ["experiment", "align-distill", *models, "--out", str(tmp_path / "o")]}[command]
    assert main(argv + ["--prompts", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}:2: not UTF-8 text" in err
