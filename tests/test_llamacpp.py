"""The optional llama.cpp column, against stand-in binaries that print what llama.cpp prints."""
import contextlib
import json
import os
from types import SimpleNamespace

import pytest

from specdec.cli import bench as bench_cli
from specdec.core.suites import Prompt
from specdec.lab.bench import llamacpp
from specdec.models import cache
from specdec.models.loading import prepare
from specdec.testing import tiny_model
from test_models_gguf import install_package, write_tiny_gguf

BENCH_OUT = '[{"model_type": "qwen2 1.5B Q4_K - Medium", "n_gen": 16, "avg_ts": 29.7, "stddev_ts": 0.3}]'
SPEC_OUT = """def quicksort(arr):
encoded    5 tokens in    0.100 seconds, speed:   50.000 t/s
decoded   20 tokens in    1.000 seconds, speed:   20.000 t/s
n_draft   = 4
n_predict = 20
n_drafted = 16
n_accept  = 12
accept    = 75.000%
"""


@pytest.fixture
def binaries(tmp_path, monkeypatch):
    """Stand-ins for llama-bench and llama-speculative-simple that log their arguments."""
    log = tmp_path / "calls.jsonl"
    for name, output in ((llamacpp.BENCH, BENCH_OUT), (llamacpp.SPECULATIVE, SPEC_OUT)):
        script = tmp_path / name
        script.write_text(f"#!/usr/bin/env python3\nimport json, sys\nopen({str(log)!r}, 'a').write("
                          f"json.dumps(sys.argv[1:]) + '\\n')\nprint({output!r})\n")
        script.chmod(0o755)
    monkeypatch.setenv(llamacpp.ENV, str(tmp_path))
    return llamacpp.find_binaries(), log


def test_binaries_are_found_only_when_both_are_there(binaries, tmp_path, monkeypatch):
    found, _ = binaries
    assert set(found) == {llamacpp.BENCH, llamacpp.SPECULATIVE}
    os.remove(tmp_path / llamacpp.SPECULATIVE)
    assert llamacpp.find_binaries() is None
    monkeypatch.setenv(llamacpp.ENV, str(tmp_path / "nowhere"))
    assert llamacpp.find_binaries() is None


def test_outputs_are_parsed_and_arguments_passed(binaries, tmp_path):
    found, log = binaries
    assert llamacpp.target_alone_tok_s(found, tmp_path / "t.gguf", 16, 2) == 29.7
    tok_s, accept, repacked = llamacpp.speculative(found, tmp_path / "t.gguf", tmp_path / "d.gguf", "def f():",
                                                   16, 4, 2)
    assert tok_s == 20.0 and accept == 0.75 and repacked
    bench_args, spec_args = [json.loads(line) for line in log.read_text().splitlines()]
    assert bench_args[bench_args.index("-n") + 1] == "16" and "-p" in bench_args
    assert spec_args[spec_args.index("--spec-draft-n-max") + 1] == "4" and "--temp" in spec_args
    assert llamacpp.NO_REPACK not in spec_args
    run = llamacpp.LlamaCppRun("d", 4, "code-01", 29.7, 20.0, 0.75)
    assert run.speedup == pytest.approx(20 / 29.7) and \
        "| d | 4 | code-01 | 29.70 | 20.00 | 0.67x | 75% | repacked | – | – |" in llamacpp.markdown([run])
    ours = llamacpp.LlamaCppRun("d", 4, "code-01", 29.7, 20.0, 0.75, ours_tok_s=44.55)
    assert ours.ours_vs_its_target == pytest.approx(1.5) and "| 44.55 | 1.50x |" in llamacpp.markdown([ours])


def test_a_speculative_run_that_crashes_runs_again_with_its_weights_as_stored(binaries, tmp_path):
    """Seen on a CPU with AMX tiles: its repacked product over several rows ends in a segmentation fault."""
    found, _ = binaries
    (tmp_path / "spec.out").write_text(SPEC_OUT)
    (tmp_path / llamacpp.SPECULATIVE).write_text(
        f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'spec.log'}\n"
        f"case \"$*\" in *{llamacpp.NO_REPACK}*) cat {tmp_path / 'spec.out'} ;; *) kill -SEGV $$ ;; esac\n")
    tok_s, accept, repacked = llamacpp.speculative(found, tmp_path / "t.gguf", tmp_path / "d.gguf", "def f():",
                                                   16, 4, 2)
    assert (tok_s, accept, repacked) == (20.0, 0.75, False)
    first, second = (tmp_path / "spec.log").read_text().splitlines()
    assert llamacpp.NO_REPACK not in first and second.endswith(llamacpp.NO_REPACK)
    run = llamacpp.LlamaCppRun("d", 4, "code-01", 29.7, 20.0, 0.75, repacked)
    assert "| 75% | as stored (the repacked run crashed) |" in llamacpp.markdown([run])


def test_the_bench_section_runs_each_draft_k_and_prompt(binaries, tmp_path, monkeypatch):
    """A `MODEL+lookup` draft runs in llama.cpp as its model alone; a lookup draft has no GGUF; ours (k = auto
    where it ran) stands beside each llama.cpp run."""
    asked = []
    monkeypatch.setattr(llamacpp, "gguf_of", lambda name, held: asked.append(name) or tmp_path / f"{name}.gguf")
    tokenizer = SimpleNamespace(decode=lambda ids: "text", apply_chat_template=None)
    monkeypatch.setattr(bench_cli, "encode", lambda prompt, tok: [1, 2])
    args = SimpleNamespace(target="t", draft=["d+lookup", "lookup"], k=[2, "auto"], max_new_tokens=16)
    prompts = [Prompt("code-01", "code", "def f():"), Prompt("code-02", "code", "def g():")]
    rows = [{"draft": "d+lookup", "k": k, "prompt_id": p.id, "ours_tok_s": tok_s}
            for p, by_k in zip(prompts, ({2: 30.0, "auto": 44.55}, {2: 31.0})) for k, tok_s in by_k.items()]
    section = bench_cli.llama_cpp_section(args, SimpleNamespace(tokenizer=tokenizer), prompts, tmp_path, rows)
    assert asked == ["t", "d"]
    runs = json.loads((tmp_path / "llama_cpp.json").read_text())
    assert [(r["draft"], r["k"], r["prompt_id"], r["ours_tok_s"]) for r in runs] == [
        ("d+lookup", 2, "code-01", 44.55), ("d+lookup", 4, "code-01", 44.55),
        ("d+lookup", 2, "code-02", 31.0), ("d+lookup", 4, "code-02", None)]
    assert "## llama.cpp on the same GGUF files" in section and "| 44.55 | 1.50x |" in section


def test_the_section_reports_its_target_alone_without_a_model_draft(binaries, tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp, "gguf_of", lambda name, held: tmp_path / f"{name}.gguf")
    args = SimpleNamespace(target="t", draft=["lookup"], k=["auto"], max_new_tokens=16)
    monkeypatch.setattr(bench_cli, "encode", lambda prompt, tok: [1, 2])
    target = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids: "text"))
    section = bench_cli.llama_cpp_section(args, target, [Prompt("code-01", "code", "def f():")], tmp_path, [])
    assert "Its target alone: 29.70 tokens/s." in section and "| draft |" not in section


def test_a_failing_llama_cpp_run_is_a_line_of_the_section_not_the_end_of_the_report(binaries, tmp_path, monkeypatch):
    """A crash of its speculative binary (seen: a segmentation fault on one build) leaves the rest of the section."""
    monkeypatch.setattr(llamacpp, "gguf_of", lambda name, held: tmp_path / f"{name}.gguf")
    monkeypatch.setattr(bench_cli, "encode", lambda prompt, tok: [1, 2])
    (tmp_path / llamacpp.SPECULATIVE).write_text("#!/bin/sh\necho 'load: a warning' >&2\nkill -SEGV $$\n")
    args = SimpleNamespace(target="t", draft=["d"], k=[2], max_new_tokens=16)
    target = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids: "text"))
    section = bench_cli.llama_cpp_section(args, target, [Prompt("code-01", "code", "def f():")], tmp_path, [])
    assert "Its target alone: 29.70 tokens/s." in section
    failed = section.split("Its speculative runs that failed:\n")[1].strip()
    assert failed.startswith("- d k=2 code-01: ") and "failed (-11)" in failed and "\n" not in failed


def test_no_binaries_no_section(tmp_path, monkeypatch):
    monkeypatch.setenv(llamacpp.ENV, str(tmp_path))
    args = SimpleNamespace(target="t", draft=["d"], k=[2], max_new_tokens=16)
    assert bench_cli.llama_cpp_section(args, None, [], tmp_path, []) == ""
    assert llamacpp.gguf_of("not-a-catalogue-model", contextlib.ExitStack()) is None


def test_a_packaged_gguf_is_assembled_for_llama_cpp_and_removed_after_when_a_store_has_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    gguf_file = tmp_path / "weights" / "tiny.gguf"
    gguf_file.parent.mkdir()
    write_tiny_gguf(gguf_file, tiny_model("llama", 0, vocab_size=300))
    name = install_package(gguf_file, tmp_path, monkeypatch)
    prepare(name, dtype="int8")
    assembled = cache.gguf_path("tiny-packaged.gguf")
    assert not assembled.exists()
    with contextlib.ExitStack() as held:
        assert llamacpp.gguf_of(name, held) == assembled and assembled.read_bytes() == gguf_file.read_bytes()
        assert not cache.remove_unread(assembled)  # kept while llama.cpp may read it
    assert not assembled.exists()
