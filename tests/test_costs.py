"""The cost model: v(n) and c measured and cached, predictions by formula, the dtype choice, divergences."""
import copy

import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.core import hardware, theory
from specdec.core.costmodel import CostModel, TargetCosts, assumed_costs
from specdec.core.trace import GenerationResult, ROUNDING_NOISE, Round, explain_divergence
from specdec.costs import calibration
from specdec.costs.calibration import cached_costs, calibrate
from specdec.models import formats, quant
from specdec.models.loading import LoadedModel
from specdec.models.quant4 import quantize_int4
from specdec.testing import perturbed_copy, tiny_model

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=0)
    return target, perturbed_copy(target, noise=0.2, seed=1)


def test_predicted_speedup_is_the_formula():
    costs = CostModel(TargetCosts(0.2, [1.0, 1.1, 1.3, 1.6, 2.0], "test"), 0.25, "test")
    for alpha in (0.0, 0.5, 0.9, 1.0):
        for k in range(1, 5):
            expected = theory.expected_tokens_per_step(alpha, k) / (costs.v(k + 1) + k * 0.25)
            assert costs.predicted_speedup(alpha, k) == pytest.approx(expected)
    assert costs.v(7) == pytest.approx(2.0 + 2 * 0.4)  # extended linearly past the calibrated sizes
    assert theory.leviathan_bound(0.8, 5, 0.0) == pytest.approx(3.6893, abs=1e-4)  # Leviathan's Table 1
    assert assumed_costs(0.3).predicted_speedup(0.7, 3) == pytest.approx(theory.leviathan_bound(0.7, 3, 0.3))


def test_calibration_is_measured_once_then_cached_and_recalibrated_on_request(pair, tmp_path):
    target, draft = pair
    first = calibrate(target, draft, n_max=4, repeats=1, cache_dir=tmp_path)
    assert first.measured_now and len(first.target.verify) == 4 and first.target.verify[0] == 1.0
    assert first.target.step_s > 0 and first.draft_cost > 0
    again = calibrate(target, draft, n_max=4, repeats=1, cache_dir=tmp_path)
    assert not again.measured_now and again.to_dict() | {"measured_now": True} == first.to_dict()
    assert calibrate(target, draft, n_max=4, repeats=1, cache_dir=tmp_path, recalibrate=True).measured_now
    lookup = calibrate(target, None, n_max=4, repeats=1, cache_dir=tmp_path)
    assert lookup.draft_key != first.draft_key  # another draft: its own cost entry


def test_a_cached_curve_is_checked_once_per_process_and_measured_again_where_the_machine_moved(pair, tmp_path,
                                                                                              monkeypatch):
    """Read from another process's cache, a curve is timed again before it prices anything (a one-token step and
    its largest size, in turn); where either is more than DRIFT off, the curve and c are measured again; within
    CHECK_EVERY_S this process takes what it measured or checked as it is."""
    target, draft = pair
    first = calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    step, v_last = first.target.step_s, first.target.verify[-1]
    speed = {"step": step, "v": v_last, "c": first.draft_cost}  # what the machine does "now"
    monkeypatch.setattr(calibration, "forward_seconds",
                        lambda lm, base, n: speed["step"] * (speed["v"] if n == 3 else 1.0))
    monkeypatch.setattr(calibration, "measure_draft_cost", lambda *a, **kw: speed["c"])
    checks = []
    real = calibration.still_holds
    monkeypatch.setattr(calibration, "still_holds", lambda *a, **kw: checks.append(1) or real(*a, **kw))
    assert not calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).measured_now  # measured here: taken
    assert checks == []
    calibration._checked.clear()  # as a new process finds it
    speed["step"] = step * (1.0 + calibration.DRIFT / 2)  # within DRIFT: kept
    assert not calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).measured_now and checks == [1]
    assert not calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).measured_now and checks == [1]
    calibration._checked.clear()
    speed["v"] = v_last * (1.0 + 2 * calibration.DRIFT)  # v(n_max) moved: measured again, c too
    again = calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    assert again.measured_now and checks == [1, 1]
    assert again.target.verify[-1] == pytest.approx(speed["v"]) and cached_costs(
        target, draft, n_max=3, repeats=1, cache_dir=tmp_path).target == again.target
    calibration._checked.clear()
    speed["step"] = step * (1.0 - 2 * calibration.DRIFT)  # the step moved
    assert calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).measured_now
    monkeypatch.setattr(calibration.time, "monotonic", lambda: 1e12)  # CHECK_EVERY_S later: checked again
    assert not calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).measured_now and len(checks) == 4


def test_a_cached_draft_cost_is_timed_again_once_per_process_and_stored_anew_where_it_moved(pair, tmp_path,
                                                                                             monkeypatch):
    """A c measured while the machine was busy (0.90 where the pair's is 0.31) must not price every later run: read
    from the cache, c is timed again once per process; within DRIFT the cached one stands, beyond it the new one is
    stored (the target's curve, which still holds, is kept)."""
    target, draft = pair
    first = calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    monkeypatch.setattr(calibration, "still_holds", lambda *a, **kw: True)
    now = {"c": first.draft_cost * (1.0 + calibration.DRIFT / 2)}
    timed = []
    monkeypatch.setattr(calibration, "measure_draft_cost", lambda *a, **kw: timed.append(1) or now["c"])
    calibration._checked.clear()  # a new process
    kept = calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    assert not kept.measured_now and kept.draft_cost == first.draft_cost and timed == [1]
    assert calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).draft_cost == first.draft_cost
    assert timed == [1]  # once per process
    calibration._checked.clear()
    now["c"] = 3 * first.draft_cost
    moved = calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    assert moved.measured_now and moved.draft_cost == now["c"] and moved.target == first.target
    assert cached_costs(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).draft_cost == now["c"]


def test_a_recalibration_of_several_drafts_measures_the_targets_curve_once(pair, tmp_path, monkeypatch):
    """Every draft is priced with the one curve the cache keeps (measured again per draft, each measurement would
    replace the one the drafts before it were priced with)."""
    target, draft = pair
    measured = []
    real = calibration.measure_verification

    def counting(model, n_max, repeats, budget=None):
        measured.append(model is target)
        return real(model, n_max, repeats)

    monkeypatch.setattr(calibration, "measure_verification", counting)
    drafts = {"model": draft, "none": None}
    first = calibration.calibrate_drafts(target, drafts, n_max=3, repeats=1, cache_dir=tmp_path)
    again = calibration.calibrate_drafts(target, drafts, n_max=3, repeats=1, cache_dir=tmp_path, recalibrate=True)
    assert measured.count(True) == 2  # once per call, not once per draft
    assert all(costs.measured_now for costs in again.values())  # each draft's c measured again
    assert again["model"].target == again["none"].target != first["model"].target
    assert cached_costs(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).target == again["model"].target

def test_cached_costs_are_read_without_measuring(pair, tmp_path):
    target, draft = pair
    assert cached_costs(target, draft, n_max=3, repeats=1, cache_dir=tmp_path) is None
    measured = calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    cached = cached_costs(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    assert cached.to_dict() == measured.to_dict() | {"measured_now": False}
    assert cached_costs(target, None, n_max=3, repeats=1, cache_dir=tmp_path) is None  # no draft: its own entry


class Wrapping:
    """A drafter of its own that drafts with a model: the protocol alone tells the calibration what to price."""

    cost_key = "Wrapping"

    def __init__(self, model):
        from specdec.drafters import ModelDrafter
        self.inner = ModelDrafter(model)

    @property
    def forwards(self):
        return self.inner.forwards

    @property
    def model(self):
        return self.inner.model

    def reset(self):
        self.inner.reset()

    def prefill(self, prompt_ids):
        return self.inner.prefill(prompt_ids)

    def propose(self, context_ids, n, policy):
        return self.inner.propose(context_ids, n, policy)


def test_calibration_prices_the_model_a_drafter_declares(pair, tmp_path):
    target, draft = pair
    small, large = Wrapping(tiny_model("llama", seed=5, layers=1)), Wrapping(tiny_model("llama", seed=5, layers=4))
    costs = {name: calibrate(target, w, n_max=2, repeats=3, cache_dir=tmp_path) for name, w in
             (("small", small), ("large", large))}
    assert costs["small"].draft_key != costs["large"].draft_key  # each wrapped model has its own entry
    assert costs["small"].draft_cost > 0 and small.forwards > 0  # a model's forwards, not a proposal's time
    assert calibrate(target, Wrapping(tiny_model("llama", seed=9, layers=1)), n_max=2, repeats=3,
                     cache_dir=tmp_path).draft_key == costs["small"].draft_key  # same architecture: same cost


def test_calibration_key_follows_threads_and_dtype(pair, tmp_path):
    target, draft = pair
    base = calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path).measured_now
    finally:
        torch.set_num_threads(threads)
    bf16_target, bf16_draft = (tiny_model("llama", seed=0).to(torch.bfloat16), draft.to(torch.bfloat16))
    assert calibrate(bf16_target, bf16_draft, n_max=3, repeats=1, cache_dir=tmp_path).measured_now
    assert not calibrate(target.float(), draft.float(), n_max=3, repeats=1, cache_dir=tmp_path).measured_now
    assert base.target.key != ""


def test_calibration_key_follows_the_weight_format_the_cpu_and_the_kernel_path(tmp_path, monkeypatch):
    """int8, int8-dynamic and int4 run other kernels with float32 norms alike: each format is its own entry, as is
    another CPU (model or flags) and another int8 kernel path; a repeat reads its entry back."""
    made = {"float32": tiny_model("llama", seed=0)}
    made["int8"] = quant.quantize_int8(copy.deepcopy(made["float32"]))
    made["int8-dynamic"] = quant.couple_rows(quant.quantize_int8(copy.deepcopy(made["float32"])))
    made["int4"] = quantize_int4(copy.deepcopy(made["float32"]))
    assert {name: formats.format_of(model) for name, model in made.items()} == {name: name for name in made}
    same = lambda model: LoadedModel("m", model, None, "test", tmp_path / "m", "float32")  # noqa: E731 one name
    keys = {calibrate(same(model), n_max=2, repeats=1, cache_dir=tmp_path).target.key for model in made.values()}
    assert len(keys) == len(made)
    int8 = same(made["int8"])
    assert not calibrate(int8, n_max=2, repeats=1, cache_dir=tmp_path).measured_now
    monkeypatch.setattr(calibration, "kernel_path", lambda: "fbgemm/63")
    assert calibrate(int8, n_max=2, repeats=1, cache_dir=tmp_path).measured_now
    monkeypatch.setattr(hardware, "cpu", lambda: {"model": "Another CPU", "flags": ["avx2"]})
    assert calibrate(int8, n_max=2, repeats=1, cache_dir=tmp_path).measured_now


def test_stats_price_rounds_with_the_calibrated_costs(pair):
    target, draft = pair
    costs = CostModel(TargetCosts(0.01, [1.0, 1.5, 2.0, 2.5, 3.0], "test"), 0.1, "test")
    result = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=24, eos_token_id=[], costs=costs)
    s, rounds = result.stats, result.rounds
    steps = sum(costs.v(len(r.draft_token_ids) + 1) + r.draft_forwards * 0.1 for r in rounds)
    assert s.rounds_speedup == pytest.approx(s.emitted_tokens / steps)
    step = s.target_time_s / s.verify_steps  # the whole call: prefills and bookkeeping as this run paid them
    plain = s.plain_overhead_time_s / s.plain_rounds if s.plain_rounds else 0.0
    alone = s.prefill_time_s - s.draft_prefill_time_s + s.emitted_tokens * (step + plain)
    ours = s.prefill_time_s + step * steps + s.overhead_time_s
    assert s.predicted_speedup == pytest.approx(alone / ours)
    assert 0 < s.draft_prefill_time_s < s.prefill_time_s and s.overhead_time_s > 0
    assert s.verify_cost == pytest.approx(sum(costs.v(len(r.draft_token_ids) + 1) for r in rounds) / len(rounds))
    step = s.target_time_s / sum(costs.v(len(r.draft_token_ids) + 1) for r in rounds)
    assert s.cost_ratio == pytest.approx(s.draft_time_s / sum(r.draft_forwards for r in rounds) / step)
    assert all(len(r.target_top_ids) == len(r.draft_token_ids) + 1 for r in rounds)


def test_on_round_time_is_not_measured(pair):
    import time
    target, draft = pair
    result = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=12, eos_token_id=[],
                                  on_round=lambda r: time.sleep(0.2))
    assert result.stats.wall_time_s < 0.2 * len(result.rounds) / 2


def greedy_round(token, top):
    """A one-row round emitting `token`, with the target's top-2 {id: logit} of that row."""
    return Round([], [], [], [], 0, token, [token], 0.0, 0.01, 0, 0, [list(top)], [list(top.values())])


def result_of(rounds):
    from specdec.core.trace import DecodeStats
    return GenerationResult([t for r in rounds for t in r.emitted_token_ids], rounds, DecodeStats.from_rounds(rounds, 0))


def test_a_constructed_near_tie_is_explained_as_rounding():
    alone = result_of([greedy_round(1, {1: 20.0}), greedy_round(7, {7: 20.01, 9: 20.0})])
    spec = result_of([greedy_round(1, {1: 20.0}), greedy_round(9, {9: 20.02, 7: 19.99})])
    divergence = explain_divergence(spec, alone, "bfloat16")
    assert (divergence.position, divergence.alone_token, divergence.speculative_token) == (1, 7, 9)
    assert divergence.gap_one_token == pytest.approx(0.01) and divergence.gap_batched == pytest.approx(0.03)
    assert divergence.tolerance == pytest.approx(ROUNDING_NOISE["bfloat16"] * 20.02)
    assert divergence.near_tie and "near-tie" in divergence.describe()
    assert explain_divergence(alone, alone, "bfloat16") is None


def test_a_divergence_rounding_cannot_explain_is_called_a_bug():
    alone = result_of([greedy_round(7, {7: 25.0, 9: 20.0})])
    spec = result_of([greedy_round(9, {9: 25.0, 7: 20.0})])
    divergence = explain_divergence(spec, alone, "float32")
    assert not divergence.near_tie and "bug" in divergence.describe()
    far = result_of([greedy_round(9, {9: 25.0, 3: 24.0})])  # the alone token is not even in the top 2
    assert explain_divergence(far, alone, "bfloat16").gap_batched is None


def test_identical_runs_have_no_divergence(pair):
    target, draft = pair
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=16, eos_token_id=[])
    spec = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=16, eos_token_id=[])
    assert explain_divergence(spec, alone, "float32") is None


def test_calibration_keeps_the_faster_product_for_each_size(pair, tmp_path):
    from specdec.models.speed import RowsFirstLinear, apply_speed_levers
    target, draft = pair
    levered = copy.deepcopy(target)
    apply_speed_levers(levered)
    costs = calibrate(levered, draft, n_max=5, repeats=1, cache_dir=tmp_path)
    assert set(costs.target.rows_first) <= {2, 3, 4, 5}
    layers = [m for m in levered.modules() if isinstance(m, RowsFirstLinear)]
    assert layers and all(m.rows_first == frozenset(costs.target.rows_first) for m in layers)
    for m in layers:
        m.rows_first = frozenset({2, 3, 4, 5, 6})  # a fresh load: the default, until the cached choice is applied
    assert not calibrate(levered, draft, n_max=5, repeats=1, cache_dir=tmp_path).measured_now
    assert all(m.rows_first == frozenset(costs.target.rows_first) for m in layers)


def test_calibration_chooses_the_draft_catch_up_product_but_never_touches_a_shared_target(pair, tmp_path):
    from specdec.drafters import SelfSpeculativeDraft
    from specdec.models.speed import RowsFirstLinear, apply_speed_levers
    target, draft = (copy.deepcopy(m) for m in pair)
    apply_speed_levers(target)
    apply_speed_levers(draft)
    calibrate(target, draft, n_max=3, repeats=1, cache_dir=tmp_path)
    chosen = {m.rows_first for m in draft.modules() if isinstance(m, RowsFirstLinear)}
    assert len(chosen) == 1 and chosen.pop() <= {2}  # the draft reads 1 or 2 tokens a forward
    before = {m.rows_first for m in target.modules() if isinstance(m, RowsFirstLinear)}
    calibrate(target, SelfSpeculativeDraft(target, layers=1), n_max=3, repeats=1, cache_dir=tmp_path)
    assert {m.rows_first for m in target.modules() if isinstance(m, RowsFirstLinear)} == before
