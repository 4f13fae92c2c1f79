"""Prompt suites, the benchmark on tiny in-code models (core and CLI), resume, the report and the k advisor."""
import json
import time

import pytest

from specdec.cli import main
from specdec.core import theory
from specdec.core.limits import K_MAX
from specdec.core.suites import SUITES_DIR, available_suites, load_suite
from specdec.core.trace import Counts, first_divergence, ratio
from specdec.costs.advisor import advise, speedup_curve
from specdec.costs.profile import load_profile, speedups_by_k
from specdec.lab.bench.run import BenchConfig, contender, row_counts, run_bench
from specdec.lab.bench.store import read_rows
from specdec.lab.bench.summary import advice_rows, format_report, summarise, target_checks
from specdec.testing import perturbed_copy, tiny_folder, tiny_model, tiny_tokenizer

TEXT_SUITES = ("chat", "code", "finance", "medical", "summarisation", "math", "translation")


# --- suites ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TEXT_SUITES)
def test_builtin_text_suites_have_a_few_dozen_prompts_and_both_splits(name):
    prompts = load_suite(name)
    assert len(prompts) >= 24
    assert {p.category for p in prompts} == {name}
    assert {p.split for p in prompts} == {"dev", "heldout"}
    assert all(isinstance(p.prompt, str) and len(p.prompt) >= 10 for p in prompts)


def test_all_suite_covers_every_category_but_tiny_and_ids_are_unique():
    prompts = load_suite("all")
    assert {p.category for p in prompts} == set(TEXT_SUITES)
    assert len({p.id for p in prompts}) == len(prompts)
    assert set(TEXT_SUITES) | {"all", "tiny"} <= set(available_suites())
    assert {p.language for p in load_suite("chat")} == {"en", "zh"}
    assert {p.language for p in load_suite("medical")} == {"zh"}


def test_summarisation_prompts_carry_the_text_to_summarise():
    assert all(len(p.prompt) > 120 for p in load_suite("summarisation"))


def test_tiny_suite_is_token_ids_within_a_tiny_vocabulary():
    prompts = load_suite("tiny")
    assert all(isinstance(p.prompt, tuple) and max(p.prompt) < 128 for p in prompts)


def test_filters_split_categories_limit():
    assert {p.split for p in load_suite("math", split="heldout")} == {"heldout"}
    limited = load_suite("all", categories=["code", "math"], limit=2)
    assert [p.category for p in limited] == ["code", "code", "math", "math"]
    with pytest.raises(ValueError, match="no prompts of categories"):
        load_suite("code", categories=["poetry"])
    with pytest.raises(ValueError, match="unknown split"):
        load_suite("code", split="test")


def test_user_text_file_one_prompt_per_line(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("first prompt\n\n  second prompt  \n", encoding="utf-8")
    prompts = load_suite(str(path))
    assert [p.prompt for p in prompts] == ["first prompt", "second prompt"]
    assert {p.category for p in prompts} == {"user"}


@pytest.mark.parametrize("content, message", [
    ('{"id": "a", "category": "x", "prompt": "p"}\nnot json\n', r"mine.jsonl:2: not valid JSON"),
    ('{"id": "a", "prompt": "p"}\n', "missing field"),
    ('{"id": "a", "category": "x", "prompt": ""}\n', "non-empty string"),
    ('{"id": "a", "category": "x", "prompt": [1, -2]}\n', "non-negative integers"),
    ('{"id": "a", "category": "x", "prompt": "p", "split": "train"}\n', "split must be one of"),
    ('{"id": "a", "category": "x", "prompt": "p"}\n{"id": "a", "category": "x", "prompt": "q"}\n', "appears twice"),
    ("\n", "empty"),
])
def test_bad_jsonl_is_a_clear_value_error(tmp_path, content, message):
    path = tmp_path / "mine.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_suite(str(path))


def test_unknown_suite_names_the_choices():
    with pytest.raises(ValueError, match="tiny"):
        load_suite("no-such-suite")


def test_builtin_files_are_what_load_suite_reads():
    assert {p.stem for p in SUITES_DIR.glob("*.jsonl")} == set(TEXT_SUITES) | {"tiny"}


# --- the bench on tiny models ----------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_target():
    return tiny_model("llama", seed=0)


def run_tiny(target, out, ks=(1, 2), on_cell=None, drafts=("self", "noisy"), **config):
    models = {"self": target, "noisy": perturbed_copy(target, 0.3)}
    contenders = [contender(name, models[name], target) for name in drafts]
    prompts = load_suite("tiny", limit=1)  # one "repeat" and one "random" prompt
    settings = dict(target="tiny", max_new_tokens=8) | config
    return run_bench(target, contenders, prompts, list(ks), BenchConfig(**settings), out, on_cell=on_cell)


@pytest.fixture(scope="module")
def tiny_run(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    return out, run_tiny(tiny_target, out)


def test_bench_writes_rows_csv_and_greedy_identity(tiny_run):
    tmp_path, rows = tiny_run
    assert len(rows) == 2 * 2 * 2  # drafts x k x prompts
    assert (tmp_path / "results.csv").read_text().count("\n") == len(rows) + 1
    assert len(read_rows(tmp_path)) == len(rows)
    for row in rows:
        assert row["ours_equals_target_alone"] is True
        assert row["hf_assisted_equals_target_alone"] is True
        assert row["hf_plain_equals_target_alone"] is True
        assert row["new_tokens"] == row["target_alone_tokens"] == 8
        assert row["ours_tok_s"] > 0 and row["hf_assisted_tok_s"] > 0 and row["target_alone_tok_s"] > 0
    self_rows = [r for r in rows if r["draft"] == "self"]
    assert all(r["acceptance_rate"] == 1.0 for r in self_rows)  # draft = target accepts everything
    assert any(r["acceptance_rate"] < 1.0 for r in rows if r["draft"] == "noisy")


def test_bench_resumes_and_refuses_a_different_configuration(tiny_target, tmp_path):
    run_tiny(tiny_target, tmp_path, ks=(1,), drafts=("self",))
    finished = []
    rows = run_tiny(tiny_target, tmp_path, ks=(1, 2), drafts=("self",), on_cell=finished.append)
    assert {r["k"] for r in finished} == {"2"}  # k=1 cells were already there
    assert len(rows) == 4 and len({(r["draft"], r["k"], r["prompt_id"]) for r in rows}) == 4
    with pytest.raises(ValueError, match="another configuration .*max_new_tokens"):
        run_tiny(tiny_target, tmp_path, drafts=("self",), max_new_tokens=9)


def test_drafter_without_model_has_no_hf_column(tiny_target, tmp_path):
    from specdec.drafters import PromptLookupDraft

    entry = contender("lookup", PromptLookupDraft(), tiny_target)
    assert entry.hf_assistant is None
    rows = run_bench(tiny_target, [entry], load_suite("tiny", limit=1), [2],
                     BenchConfig(target="tiny", max_new_tokens=8), tmp_path)
    assert all(r["hf_assisted_tok_s"] is None and r["hf_assisted_equals_target_alone"] is None for r in rows)
    assert all(r["ours_equals_target_alone"] for r in rows)


def test_summary_pools_counts_and_report_lists_divergences(tiny_run):
    rows = [dict(r) for r in tiny_run[1]]
    summaries = summarise(rows)
    noisy = next(s for s in summaries if s.draft == "noisy" and s.k == "2" and s.category == "all")
    cells = [r for r in rows if r["draft"] == "noisy" and r["k"] == "2"]
    accepted = sum(r["accepted_tokens"] for r in cells)
    assert noisy.acceptance_rate == pytest.approx(accepted / (accepted + sum(r["rejections"] for r in cells)))
    assert noisy.leviathan_bound == pytest.approx(theory.leviathan_bound(noisy.acceptance_rate, 2, noisy.cost_ratio))
    assert noisy.identical == "2/2"
    assert sum(getattr(noisy, f) for f in ("draft_share", "target_share", "prefill_share", "overhead_share")) \
        == pytest.approx(1.0)
    report = format_report(rows)
    for heading in ("## repeat", "## random", "## all", "## k advisor", "## Performance targets", "## Greedy divergences"):
        assert heading in report
    assert "None: every greedy output matched" in report
    rows[0]["ours_equals_target_alone"], rows[0]["first_divergence"] = False, 3
    assert f"ours ≠ target alone: draft {rows[0]['draft']}, k={rows[0]['k']}, prompt {rows[0]['prompt_id']} at token 3" \
        in format_report(rows)
    checks = target_checks(summaries, rows=rows)
    worst = next(c for c in checks if c.draft == "noisy" and c.target.startswith("worst"))
    at_k = [s for s in summaries if s.draft == "noisy" and s.k == worst.k and s.category != "all"]
    slowest = min(at_k, key=lambda s: s.speedup_vs_target_alone)  # which category is timing, not a constant
    assert {c.target for c in checks if c.draft == "noisy"} == {
        "all prompts: speedup vs target alone", f"worst category ({slowest.category}): speedup",
        "ours / HF assisted tokens/s"}
    assert worst.measured == slowest.speedup_vs_target_alone
    assert not [c for c in checks if "predicted" in c.target]  # 8-token cells: below the prediction's minimum
    long_rows = [dict(r, new_tokens=64) for r in rows]
    prediction = next(c for c in target_checks(summarise(long_rows), rows=long_rows)
                      if c.draft == "noisy" and "predicted" in c.target)
    cells = [r for r in long_rows if r["draft"] == "noisy"]
    assert prediction.measured == sum(abs(r["speedup_vs_target_alone"] / r["predicted_speedup"] - 1) <= 0.1
                                      for r in cells) / len(cells)


SAME_RATES = ("acceptance_rate", "draft_acceptance_rate", "mean_accepted_length", "per_position_acceptance",
              "per_position_unconditional", "cost_ratio", "verify_cost", "theoretical_speedup", "leviathan_bound",
              "predicted_speedup")


@pytest.mark.parametrize("calibrated", [True, False])
def test_bench_groups_and_engine_stats_agree_on_the_same_rounds(tiny_target, tmp_path, monkeypatch, calibrated):
    """The bench pools its rows' counts with the engine's code: the rounds of its cells, pooled by the engine,
    give the same rates. Calibrated, v(3) = 2: c per verification forward would be half of c per target step."""
    from specdec.core.costmodel import CostModel, TargetCosts
    from specdec.core.trace import pooled_stats
    from specdec.lab.bench import run as bench_run

    measured = []  # the generations of the measured cells (warm-up calls are shorter)

    def recorded(*args, **kwargs):
        result = engine_generate(*args, **kwargs)
        if kwargs["max_new_tokens"] == 12:
            measured.append(result)
        return result

    engine_generate = bench_run.speculative_generate
    monkeypatch.setattr(bench_run, "speculative_generate", recorded)
    costs = CostModel(TargetCosts(0.01, [1.0 + 0.5 * n for n in range(K_MAX + 1)], "test"), 0.25, "test")
    entry = contender("noisy", perturbed_copy(tiny_target, 0.3), tiny_target, costs if calibrated else None)
    rows = run_bench(tiny_target, [entry], load_suite("tiny", limit=1), [3],
                     BenchConfig(target="tiny", max_new_tokens=12), tmp_path, hf_plain=False)
    pooled = next(s for s in summarise(rows) if s.category == "all")
    engine = pooled_stats(measured, 3, costs if calibrated else None)
    assert len(measured) == len(rows) == 2 and engine.rounds == sum(r["rounds"] for r in rows)
    for name in SAME_RATES:
        assert getattr(pooled, name) == pytest.approx(getattr(engine, name), rel=1e-12), name
    assert engine.verify_cost > 2 if calibrated else engine.verify_cost == 1  # calibrated: mostly v(4) = 2.5


@pytest.mark.parametrize("slope, expect_max_k", [(0.0, True), (0.5, False)])
def test_advice_prices_the_calibrated_verification_cost(tiny_run, slope, expect_max_k):
    """A model-free draft (c = 0) whose verification grows by `slope` steps a token is not advised the largest k."""
    cells = [dict(r) for r in tiny_run[1] if r["draft"] == "self" and r["k"] == "2"]
    curve = [1.0 + slope * n for n in range(K_MAX + 1)]
    for r in cells:  # lookup-like: no draft forwards, 9 of 10 drafts accepted, calibrated v(n) = 1 + slope (n - 1)
        r.update(draft="free", draft_time_s=0.0, round_draft_forwards=0, rounds=10, draft_tokens=20,
                 accepted_tokens=18, rejections=2, verify_curve=curve, calibrated_c=0.0)
    advice = next(a for a in advice_rows(cells) if a.category == "all")
    assert advice.cost_ratio == 0 and advice.verify_cost == pytest.approx(1 + slope * advice.recommended_k)
    assert (advice.recommended_k == K_MAX) == expect_max_k and advice.leviathan_k == K_MAX
    assert advice.predicted_speedup == pytest.approx(theory.predicted_speedup(0.9, advice.recommended_k, 0.0,
                                                                             advice.verify_cost))


def test_calibrations_of_a_test_run_land_in_its_tmp_cache_never_the_users(users_cache, tiny_target,
                                                                          tmp_path_factory):
    """`tests/conftest.py` points the cache at a tmp folder: a calibration writes there, not into `users_cache`."""
    from specdec.costs.calibration import calibrate
    from specdec.models.cache import root

    started = time.time()
    costs = calibrate(tiny_target, None, n_max=2, repeats=1, recalibrate=True)
    assert root().is_relative_to(tmp_path_factory.getbasetemp())
    for key in (costs.target.key, costs.draft_key):
        assert (root() / "costs" / f"{key}.json").is_file()
        users = users_cache / "costs" / f"{key}.json"
        assert not users.exists() or users.stat().st_mtime < started


def test_a_test_runs_model_stores_go_and_ended_sessions_leftovers_too(tmp_path):
    """Converted models written into a test run's tmp cache are removed (2.4 GB a run for the default pair), in
    ended sessions' kept folders too; a running session's (it holds `.lock`) and a store linked to the user's stay."""
    from conftest import MODEL_STORES, clear_ended_sessions

    users = tmp_path / "users-converted"
    (users / "model").mkdir(parents=True)
    for session, running in (("pytest-7", False), ("pytest-8", True)):
        private = tmp_path / session / "specdec-cache0"
        for name in MODEL_STORES:
            (private / name / "model").mkdir(parents=True)
        (private / "costs").mkdir()
        if running:
            (tmp_path / session / ".lock").touch()
    (tmp_path / "pytest-9" / "specdec-cache0").mkdir(parents=True)
    (tmp_path / "pytest-9" / "specdec-cache0" / "converted").symlink_to(users)
    clear_ended_sessions(tmp_path)
    assert not any((tmp_path / "pytest-7" / "specdec-cache0" / name).exists() for name in MODEL_STORES)
    assert (tmp_path / "pytest-7" / "specdec-cache0" / "costs").is_dir()
    assert all((tmp_path / "pytest-8" / "specdec-cache0" / name / "model").is_dir() for name in MODEL_STORES)
    assert (users / "model").is_dir()


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_cells_are_timed_by_the_shared_harness_first_output_median_time(monkeypatch):
    from types import SimpleNamespace

    from specdec.core import timing
    from specdec.lab import measure

    clock = iter([0.0, 5.0, 10.0, 11.0, 20.0, 22.0])  # three runs of 5 s, 1 s and 2 s
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    outputs = iter([[7, 8], [9], [9]])
    timed = measure.time_generation(lambda: next(outputs), repeats=3, device="cpu")
    assert timed.token_ids == [7, 8] and timed.seconds == 2.0 and timed.tokens_per_s == 1.0
    calls = []
    timing.warm_up(lambda: calls.append("a"), lambda: calls.append("b"))
    assert calls == ["a", "b"]


def test_a_cells_methods_are_timed_in_turn_each_keeping_its_first_output_and_median(monkeypatch):
    """The target alone and ours alternate (a, b, b, a, a, b: each repeat starts one method later), so a drift of
    the machine's speed moves both; each keeps its first run's output and its median seconds."""
    from types import SimpleNamespace

    from specdec.core import timing
    from specdec.lab import measure

    now, order = [0.0], []
    durations = {"alone": iter([5.0, 1.0, 2.0]), "ours": iter([4.0, 6.0, 8.0])}
    outputs = {"alone": iter([[1], [2], [3]]), "ours": iter([[4], [5], [6]])}

    def method(name):
        def run():
            order.append(name)
            now[0] += next(durations[name])
            return next(outputs[name])
        return run

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    runs = measure.time_in_turn({"alone": method("alone"), "ours": method("ours")}, repeats=3, device="cpu")
    assert order == ["alone", "ours", "ours", "alone", "alone", "ours"]
    assert (runs["alone"].seconds, runs["ours"].seconds) == (2.0, 6.0)
    assert (runs["alone"].token_ids, runs["ours"].token_ids) == ([1], [4])


# --- the CLI on tiny folders -----------------------------------------------------------------

def ids_folder(path, seed):
    """A tiny HF folder whose vocabulary covers the token ids of the `tiny` suite (< 128)."""
    return str(tiny_folder(path, seed=seed, extra_rows=128 - len(tiny_tokenizer())))


def test_cli_bench_on_tiny_suite_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target = ids_folder(tmp_path / "target", seed=0)
    out = tmp_path / "run"
    argv = ["bench", "--target", target, "--draft", target, "lookup", "--prompts", "tiny", "--limit", "1",
            "--k", "1", "auto", "--max-new-tokens", "6", "--dtype", "float32", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "## all" in printed.out
    assert printed.out.count(", identical") == 8  # one line per finished cell
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2
    assert all(r["ours_equals_target_alone"] for r in rows)
    for name in ("results.csv", "summary.md", "speedup_vs_k.html", "categories.html", "config.json"):
        assert (out / name).exists(), name
    summary = (out / "summary.md").read_text()
    assert "HF assisted tok/s" in summary and 'k="auto" vs the best fixed k' in summary
    auto = [r for r in rows if r["k"] == "auto" and r["draft"] == target]
    assert auto and all(r["hf_assisted_tok_s"] for r in auto)  # HF's own adaptive schedule
    assert main(argv) == 0  # resumed: nothing left to run, same summary
    assert len((out / "results.jsonl").read_text().splitlines()) == len(rows)


def test_cli_bench_with_a_cost_profile_predicts_the_speedup_there_and_the_k_to_use(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target, out, there = ids_folder(tmp_path / "target", seed=0), tmp_path / "run", tmp_path / "there.json"
    assert main(["profile", "--target", target, "--draft", "lookup", "--dtype", "float32", "--save", str(there)]) == 0
    argv = ["bench", "--target", target, "--prompts", "tiny", "--limit", "1", "--k", "1", "2", "--max-new-tokens", "6",
            "--dtype", "float32", "--no-hf-generate", "--costs", str(there), "--out", str(out)]
    assert main([*argv[:3], "--draft", target, *argv[3:]]) == 1  # a draft the profile does not price: refused
    assert not (out / "results.jsonl").exists()
    assert main([*argv[:3], "--draft", "lookup", *argv[3:]]) == 0
    summary = (out / "summary.md").read_text()
    profile = load_profile(there)
    assert f"## On {profile.label}" in summary and "- lookup: use k=" in summary
    counts = sum((row_counts(r) for r in read_rows(out) if r["k"] == "2"), Counts())
    rates = [ratio(accepted, reached) for accepted, reached in zip(counts.accepted_at, counts.reached)]
    expected = speedups_by_k(rates, profile.costs("lookup"))[2]
    assert "| lookup | 2 |" in summary and f"| {expected:.2f}x |" in summary


def test_cli_bench_self_auto_benches_the_calibrated_layer_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target, out = ids_folder(tmp_path / "target", seed=0), tmp_path / "run"
    argv = ["bench", "--target", target, "--draft", "self:auto", "--self-layers", "2", "1", "--prompts", "tiny",
            "--split", "heldout", "--limit", "1", "--k", "2", "--max-new-tokens", "5", "--dtype", "float32",
            "--no-hf-generate", "--out", str(out)]
    assert main(argv) == 0
    calibration = json.loads((out / "calibration.json").read_text())
    assert [r["layers"] for r in calibration["results"]] == [1, 2]
    dev = {p.id: p.category for p in load_suite("tiny", split="dev", limit=1)}
    assert calibration["settings"]["prompts"] == list(dev) and len(set(dev.values())) == len(dev)  # not heldout
    assert calibration["settings"]["k"] == 2
    best = max(calibration["results"], key=lambda r: r["leviathan_bound"])["layers"]
    assert calibration["best_layers"] == best
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["draft"] for r in rows} == {f"self:{best}"} and all(r["ours_equals_target_alone"] for r in rows)
    summary = (out / "summary.md").read_text()
    assert "self:auto calibration" in summary and f"| {best} (chosen) |" in summary
    best_bound = max(r["leviathan_bound"] for r in calibration["results"])
    assert ("cannot beat the target alone" in summary) == (best_bound <= 1.0)
    printed = capsys.readouterr().out
    assert printed.index("  self:1: α̂=") < printed.index("  self:2: α̂=") < printed.index("(chosen)")  # as measured
    assert main(argv) == 0  # rerun: the stored calibration is reused, nothing is measured again
    assert "calibrating" not in capsys.readouterr().out


@pytest.mark.parametrize("bounds, verdict", [((0.6, 0.5), True), ((0.6, 1.3), False)])
def test_calibration_text_says_when_no_layer_count_can_pay_off(bounds, verdict):
    from specdec.cli.bench import calibration_text
    from specdec.lab.measure import Calibration, DraftMeasurement

    results = [(layers, DraftMeasurement(f"self:{layers}", 0.5, 0.3, bound, 1.5, 1.0, 0.8))
               for layers, bound in zip((7, 14), bounds)]
    text = calibration_text(Calibration(results, max(results, key=lambda r: r[1].leviathan_bound)[0]))
    assert ("cannot beat the target alone" in text) == verdict
    assert ("| 14 (chosen) |" in text) == (not verdict) and text.count("(chosen)") == 1


def test_self_auto_outside_the_bench_points_to_it(tmp_path):
    from types import SimpleNamespace

    from specdec.models import load_draft

    with pytest.raises(ValueError, match="self:auto.*bench"):
        load_draft("self:auto", SimpleNamespace(model=None, dtype="float32"))


def test_cli_bench_bad_input_exits_1(tmp_path, capsys):
    assert main(["bench", "--target", "x", "--draft", "y", "--prompts", str(tmp_path / "none.jsonl"),
                 "--out", str(tmp_path / "o")]) == 1
    assert "error: no prompt suite" in capsys.readouterr().err


# --- the k advisor ---------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, c", [(0.8, 0.05), (0.6, 0.2), (0.9, 0.1), (0.5, 0.02)])
def test_advisor_picks_the_argmax_of_the_cost_aware_bound(alpha, c):
    advice = advise(alpha, c)
    curve = speedup_curve(alpha, c, range(1, 17))
    assert advice.k == 1 + curve.index(max(curve))
    assert advice.predicted_speedup == pytest.approx(max(curve))
    assert advice.theoretical_speedup == pytest.approx(theory.expected_tokens_per_step(alpha, advice.k))
    assert advice.worthwhile and f"use k={advice.k}" in advice.verdict


def test_advisor_says_run_the_target_alone_when_nothing_pays_off():
    advice = advise(0.2, 0.5)
    assert not advice.worthwhile and advice.predicted_speedup < 1
    assert "run the target alone" in advice.verdict


def test_advisor_on_leviathan_table_1():
    assert advise(0.8, 0.0, k_max=5).theoretical_speedup == pytest.approx(3.69, abs=0.01)
