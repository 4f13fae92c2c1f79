"""specdec.lab.quality and `python -m specdec quality` on tiny models: the same model agrees everywhere, a perturbed
one matches a hand computation, the reference text is generated once, rows pool by tokens, bad input is one line."""
import copy
import json
import math

import pytest
import torch

from specdec.cli import main
from specdec.core.suites import Prompt
from specdec.lab import quality
from specdec.models.entries import default_name
from specdec.lab.quality import PromptScores, measure_quality, pool, read_prompts, report_of
from specdec.testing import perturbed_copy, tiny_model
from specdec.training import distill

N = 8  # continuation length of the tests
PROMPTS = [Prompt("p-1", "a", (1, 5, 9, 33, 17, 60, 4)), Prompt("p-2", "b", (1, 40, 41, 7, 7))]
EOS = 2  # tiny_config's eos id


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test writes its reference continuations into a fresh cache."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def reference():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def perturbed(reference):
    return perturbed_copy(reference, noise=0.5, seed=3)


def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens without a KV cache (each step reads the whole sequence), stopping after EOS."""
    out = []
    with torch.no_grad():
        while len(out) < n and not (out and out[-1] == EOS):
            out.append(int(model(torch.tensor([ids + out])).logits[0, -1].argmax()))
    return out


def by_hand(reference, candidate, prompt: list[int]) -> tuple[int, int, float, float, int]:
    """(tokens, agreed, reference NLL, candidate NLL, free-running prefix) of one prompt, from full forwards."""
    text = greedy(reference, prompt, N)
    ids = torch.tensor([prompt + text])
    with torch.no_grad():
        rows = slice(len(prompt) - 1, len(prompt) - 1 + len(text))  # the rows predicting the continuation
        ref, cand = reference(ids).logits[0, rows], candidate(ids).logits[0, rows]  # [n, V]
    nll = lambda logits: -float(torch.log_softmax(logits, -1)[range(len(text)), text].double().sum())  # noqa: E731
    own = greedy(candidate, prompt, len(text))
    prefix = next((i for i, (x, y) in enumerate(zip(own, text)) if x != y), len(text))
    return len(text), int((ref.argmax(-1) == cand.argmax(-1)).sum()), nll(ref), nll(cand), prefix


def test_the_same_model_agrees_everywhere_and_its_ratio_is_one(reference):
    report = measure_quality(reference, copy.deepcopy(reference), PROMPTS, max_new_tokens=N)
    assert report.pooled.agreement == 1.0 and report.pooled.ppl_ratio == 1.0
    assert report.pooled.mean_common_prefix == report.pooled.tokens / len(PROMPTS)
    assert [row.category for row in report.rows] == ["a", "b"] and report.pooled.prompts == 2


def test_a_perturbed_model_matches_the_hand_computation(reference, perturbed):
    report = measure_quality(reference, perturbed, PROMPTS, max_new_tokens=N)
    counts = [by_hand(reference, perturbed, list(p.prompt)) for p in PROMPTS]
    tokens, agreed, nll_reference, nll_candidate, prefix = map(sum, zip(*counts))
    pooled = report.pooled
    assert pooled.tokens == tokens and pooled.agreement == agreed / tokens < 1.0
    assert pooled.ppl_reference == pytest.approx(math.exp(nll_reference / tokens), rel=1e-5)
    assert pooled.ppl_candidate == pytest.approx(math.exp(nll_candidate / tokens), rel=1e-5)
    assert pooled.ppl_ratio == pytest.approx(math.exp((nll_candidate - nll_reference) / tokens), rel=1e-5)
    assert pooled.mean_common_prefix == prefix / 2
    assert [(r.tokens, round(r.agreement * r.tokens)) for r in report.rows] == [c[:2] for c in counts]


def test_a_rerun_reads_the_reference_text_from_the_cache(reference, perturbed, monkeypatch):
    calls = []
    generate = distill.generate_examples
    monkeypatch.setattr(distill, "generate_examples", lambda *a, **k: calls.append(1) or generate(*a, **k))
    first = measure_quality(reference, perturbed, PROMPTS, max_new_tokens=N)
    assert len(calls) == len(PROMPTS)
    second = measure_quality(reference, perturbed, PROMPTS, max_new_tokens=N)
    assert len(calls) == len(PROMPTS) and second == first
    measure_quality(reference, perturbed, PROMPTS, max_new_tokens=N - 1)  # another length: generated again
    assert len(calls) == 2 * len(PROMPTS)


def test_pooled_rows_weigh_tokens_not_categories():
    scores = [PromptScores("x", "a", 10, 10, 10 * math.log(2), 10 * math.log(4), 10),
              PromptScores("y", "b", 90, 0, 90 * math.log(2), 90 * math.log(2), 0)]
    report = report_of(scores, "ref", "cand", N)
    assert [r.agreement for r in report.rows] == [1.0, 0.0] and report.pooled.agreement == 0.1  # not 0.5
    assert report.rows[0].ppl_ratio == pytest.approx(2.0) and report.rows[1].ppl_ratio == pytest.approx(1.0)
    assert report.pooled.ppl_ratio == pytest.approx(2 ** 0.1)  # exp(10 ln 2 / 100), not the mean 1.5
    assert report.pooled.mean_common_prefix == 5.0 and pool(scores[:1]).prompts == 1


def test_prompts_are_a_suite_a_list_of_suites_or_all():
    code_and_chat = read_prompts("code,chat")
    assert {p.category for p in code_and_chat} == {"code", "chat"}
    assert all(p.split == "heldout" for p in code_and_chat)
    assert len(read_prompts("all")) > len(code_and_chat) == len(read_prompts("code")) + len(read_prompts("chat"))


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cli_measures_the_int8_target_and_writes_its_report(paths, capsys, tmp_path):
    argv = ["quality", "--target", paths["target"], "--prompts", "code,chat", "--max-new-tokens", "6",
            "--out", str(tmp_path / "out")]
    code, out, _ = run(capsys, *argv, "--min-agreement", "0", "--max-ppl-ratio", "100")
    assert code == 0 and "| category | prompts | tokens | agreement %" in out and "| **pooled** | 12 |" in out
    assert quality.TEXT in out and "int8 against reference" in out and out.count(", met") == 2
    data = json.loads((tmp_path / "out" / "quality.json").read_text())
    assert data["pooled"]["prompts"] == 12 and len(data["prompts"]) == 12 and data["candidate"].endswith("int8")
    assert (tmp_path / "out" / "quality.md").read_text().strip() in out
    code, out, _ = run(capsys, *argv, "--max-ppl-ratio", "0.5")
    assert code == 2 and "not met" in out
    name = data["candidate"].rsplit(" ", 1)[0]
    [kept] = quality.records_for(name)  # the run's pooled row, kept where the app and `profile` read it
    assert (kept.candidate, kept.prompts, kept.tokens) == (data["candidate"], 12, data["pooled"]["tokens"])
    assert kept.agreement == data["pooled"]["agreement"] and kept.ppl_ratio == data["pooled"]["ppl_ratio"]


def record(candidate: str, agreement: float = 0.97, date: str = "2026-01-02T03:04:05+00:00") -> quality.QualityRecord:
    return quality.QualityRecord(candidate, "m float32", 42, 1344, agreement, 1.0058, "Some CPU, 2 threads", date)


def test_records_of_this_machine_come_before_the_shipped_ones_and_a_bad_file_is_skipped(tmp_path):
    here, shipped = tmp_path / "here", tmp_path / "shipped"
    quality.save_record(record("m int8", 0.99), here)
    quality.save_record(record("m int8", 0.5), shipped)
    quality.save_record(record("m int4", 0.95), shipped)
    quality.save_record(record("m-large int8", 0.1), shipped)  # another model whose name starts alike
    (shipped / "m-bf16.json").write_text("{not json")
    found = quality.records_for("m", [here, shipped])
    assert [(r.candidate, r.agreement) for r in found] == [("m int8", 0.99), ("m int4", 0.95)]
    assert found[0].line() == ("m int8 against m float32: top-1 agreement 99.0 %, perplexity +0.58 % over 1344 "
                               "positions of 42 held-out prompts (measured 2026-01-02 on Some CPU, 2 threads)")


def test_a_model_without_records_says_how_to_measure_it(tmp_path):
    [line] = quality.quality_lines("m", folders=[tmp_path])
    assert "not measured yet" in line and "python -m specdec quality --target m --quant int8" in line


def test_the_format_a_target_runs_in_comes_first_or_how_to_measure_it(tmp_path):
    quality.save_record(record("m int8", 0.99), tmp_path)
    quality.save_record(record("m int4", 0.95), tmp_path)
    assert [line.split(" against")[0] for line in quality.quality_lines("m", "int4", [tmp_path])] == ["m int4", "m int8"]
    assert [line.split(" against")[0] for line in quality.quality_lines("m", "int8", [tmp_path])] == ["m int8", "m int4"]
    (tmp_path / next(p.name for p in tmp_path.glob("*.json") if "int4" in p.read_text())).unlink()
    first, second = quality.quality_lines("m", "int4", [tmp_path])
    assert "python -m specdec quality --target m --quant int4" in first and second.startswith("m int8 against")
    assert quality.quality_lines("m", "float32", [tmp_path]) == [second]  # nothing to measure against itself


def test_the_shipped_records_read_back_for_the_default_target():
    found = quality.records_for(default_name("target"), [quality.SHIPPED])
    assert found and all(0 < r.agreement <= 1 and r.ppl_ratio > 0 for r in found)


@pytest.mark.parametrize("extra, message", [
    (["--prompts", "nope"], "no prompt suite 'nope'"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--min-agreement", "90"], "--min-agreement is a share"),
    (["--quant", "none", "--dtype", "float32"], "the candidate is the reference"),
    (["--dtype", "bfloat16"], "--quant int8 quantizes float32 weights"),
])
def test_bad_input_is_one_clear_line_before_any_model_loads(capsys, monkeypatch, extra, message):
    monkeypatch.setattr("specdec.cli.quality.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code, out, err = run(capsys, "quality", "--target", "any", *extra)
    assert code == 1 and err.strip().splitlines() == [f"error: {err.strip()[7:]}"] and message in err and not out


def test_an_unknown_quantization_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main(["quality", "--target", "any", "--quant", "int3"])
    assert "invalid choice: 'int3'" in capsys.readouterr().err.strip().splitlines()[-1]
