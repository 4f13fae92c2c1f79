"""Losslessness, linear cost, stats and input checks of the engine on tiny seeded models."""
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.core import engine, theory
from specdec.drafters import Drafter, ModelDrafter
from specdec.testing import ARCHITECTURES, perturbed_copy, tiny_model

PROMPT = [1, 5, 9, 33, 17, 60, 4]


def reference(model, prompt, max_new_tokens, eos_token_id=None):
    """The target alone through transformers' own generate()."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0,
                         eos_token_id=eos_token_id, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=ARCHITECTURES)
def models(request):
    target = tiny_model(request.param, seed=0)
    return {
        "target": target,
        "self": target,  # everything accepted
        "perturbed": perturbed_copy(target, noise=0.3),  # partial acceptance
        "unrelated": tiny_model(request.param, seed=123),  # almost nothing accepted
        "expected_37": reference(target, PROMPT, 37),  # 37: not a multiple of k+1 for most k
    }


@pytest.mark.parametrize("draft_name", ["self", "perturbed", "unrelated"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_is_token_identical_to_generate(models, draft_name, k):
    target = models["target"]
    result = speculative_generate(target, models[draft_name], PROMPT, k=k, max_new_tokens=37, eos_token_id=[])
    assert result.token_ids == models["expected_37"]
    assert len(result.token_ids) == 37


def test_acceptance_follows_draft_quality(models):
    target = models["target"]
    rates = {name: speculative_generate(target, models[name], PROMPT, k=4, max_new_tokens=40,
                                        eos_token_id=[]).stats.acceptance_rate
             for name in ("self", "perturbed", "unrelated")}
    assert rates["self"] == 1.0
    assert rates["self"] > rates["perturbed"] > rates["unrelated"]


def test_baseline_matches_generate(models):
    target = models["target"]
    assert autoregressive_generate(target, PROMPT, max_new_tokens=30, eos_token_id=[]).token_ids == \
        reference(target, PROMPT, 30)


def test_stops_after_eos_like_generate(models):
    target = models["target"]
    free_run = reference(target, PROMPT, 40)
    position = next(i for i in range(5, 40) if free_run[i] not in free_run[:i])  # first appearance mid-way
    eos = free_run[position]
    expected = reference(target, PROMPT, 40, eos_token_id=eos)
    assert expected[-1] == eos and len(expected) == position + 1
    for draft in ("self", "perturbed"):
        result = speculative_generate(target, models[draft], PROMPT, k=4, max_new_tokens=40, eos_token_id=eos)
        assert result.token_ids == expected


def test_padded_vocabularies_work_and_padding_is_never_proposed():
    target = tiny_model("qwen2", seed=0, vocab_size=128)
    padded_draft = perturbed_copy(target, noise=0.2)
    padded_draft.resize_token_embeddings(129)  # one padding row, like Qwen's 151936 vs 152064
    with torch.no_grad():
        padded_draft.get_output_embeddings().weight[128] = 50.0  # the padding id would win every argmax
    result = speculative_generate(target, padded_draft, PROMPT, k=4, max_new_tokens=30, eos_token_id=[])
    assert result.token_ids == reference(target, PROMPT, 30)
    assert all(t < 128 for r in result.rounds for t in r.draft_token_ids)


def count_fed_tokens(model):
    counter = {"tokens": 0}

    def hook(module, args, kwargs):
        counter["tokens"] += kwargs["input_ids"].shape[1]

    return counter, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_each_model_is_fed_a_linear_number_of_tokens():
    target = tiny_model("llama", seed=0)
    draft = perturbed_copy(target, noise=0.3)
    prompt = list(range(3, 40))
    target_count, h1 = count_fed_tokens(target)
    draft_count, h2 = count_fed_tokens(draft)
    k, new = 4, 120
    result = speculative_generate(target, draft, prompt, k=k, max_new_tokens=new, eos_token_id=[])
    h1.remove(), h2.remove()
    rounds = result.stats.rounds
    # every token once, plus the k drafted positions of each round (re-read only when rejected)
    assert target_count["tokens"] <= len(prompt) + new + k * rounds
    assert draft_count["tokens"] <= len(prompt) + new + k * rounds
    # a quadratic loop would re-read the prompt every round
    assert target_count["tokens"] < len(prompt) * rounds


def test_a_drafter_reused_across_requests_reads_each_prompt_from_an_empty_cache():
    target = tiny_model("llama", seed=0)
    drafter = ModelDrafter(perturbed_copy(target, noise=0.3))
    prompt = list(range(3, 40))
    runs = [speculative_generate(target, drafter, prompt, k=3, max_new_tokens=12, eos_token_id=[]) for _ in range(2)]
    fed = drafter.tokens_fed
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].stats.draft_forwards == runs[1].stats.draft_forwards  # this request's forwards, not a running total
    assert fed >= len(prompt) - 1  # the second request read its whole prompt again: no prefix came free


def test_stats_are_consistent(models):
    target = models["target"]
    result = speculative_generate(target, models["perturbed"], PROMPT, k=4, max_new_tokens=33, eos_token_id=[])
    s = result.stats
    assert sum(len(r.emitted_token_ids) for r in result.rounds) == len(result.token_ids) == s.emitted_tokens
    assert s.accepted_tokens == sum(r.num_accepted for r in result.rounds)
    assert 0.0 <= s.acceptance_rate <= 1.0 and 0.0 <= s.draft_acceptance_rate <= s.acceptance_rate + 1e-12
    assert s.mean_accepted_length == pytest.approx(s.emitted_tokens / s.rounds)
    assert len(s.per_position_acceptance) == 4
    accepted_at = [sum(r.num_accepted > i for r in result.rounds) for i in range(4)]
    assert accepted_at == sorted(accepted_at, reverse=True)
    assert s.rounds == len(result.rounds) and s.target_forwards == s.rounds + 1  # + prefill
    for r in result.rounds:
        assert r.matches[: r.num_accepted] == [True] * r.num_accepted
        assert r.num_accepted == len(r.matches) or r.matches[r.num_accepted] is False
        assert len(r.draft_probs) == len(r.target_probs) == len(r.draft_token_ids)
    assert s.cost_ratio > 0 and s.theoretical_speedup >= 1.0


def test_counts_add_up_and_both_per_position_conventions_come_from_them(models):
    """Counts of two runs added equal the counts of their rounds together; the rates come from those counts."""
    from specdec.core.trace import Counts, DecodeStats, pooled_stats

    target = models["target"]
    runs = [speculative_generate(target, models["perturbed"], PROMPT, k=k, max_new_tokens=21, eos_token_id=[])
            for k in (2, 4)]
    pooled = pooled_stats(runs, 4)
    rounds = runs[0].rounds + runs[1].rounds
    assert runs[0].stats.counts + runs[1].stats.counts == pooled.counts
    whole_call = ("prefill_time_s", "draft_prefill_time_s", "wall_time_s", "target_forwards", "draft_forwards")
    assert pooled.counts == Counts.of(rounds, **{name: sum(getattr(r.stats, name) for r in runs) for name in
                                                 whole_call})
    assert pooled == DecodeStats.from_rounds(rounds, 4, **{n: getattr(pooled, n) for n in whole_call})
    reached = [sum(len(r.draft_token_ids) > i and r.num_accepted >= i for r in rounds) for i in range(4)]
    accepted = [sum(r.num_accepted > i for r in rounds) for i in range(4)]
    assert pooled.reached == reached and pooled.accepted_at == accepted
    assert pooled.per_position_acceptance == pytest.approx([a / n if n else 0.0 for a, n in zip(accepted, reached)])
    assert pooled.per_position_unconditional == pytest.approx([a / len(rounds) for a in accepted])
    assert len(runs[0].stats.per_position_acceptance) == 2  # a k=2 run reports its two positions


def test_on_round_streams_and_can_stop(models):
    seen = []
    result = speculative_generate(models["target"], models["perturbed"], PROMPT, k=3, max_new_tokens=40,
                                  eos_token_id=[], on_round=lambda r: seen.append(r) or len(seen) < 3)
    assert result.stopped_early and len(result.rounds) == 3 and seen == result.rounds


def test_same_seed_same_sample(models):
    run = lambda seed: speculative_generate(models["target"], models["perturbed"], PROMPT, k=3,  # noqa: E731
                                            max_new_tokens=25, temperature=1.0, seed=seed, eos_token_id=[]).token_ids
    assert run(7) == run(7)
    assert run(7) != run(8)


def test_model_drafter_satisfies_the_protocol(models):
    from specdec.drafters import ModelDrafter, NoDraft
    assert isinstance(ModelDrafter(models["target"]), Drafter) and isinstance(NoDraft(), Drafter)


@pytest.mark.parametrize("kwargs, message", [
    ({"input_ids": torch.ones(2, 4, dtype=torch.long)}, "batch size 2"),
    ({"input_ids": []}, "empty prompt"),
    ({"k": 0}, "k must be"),
    ({"k": 100}, "k must be"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"input_ids": [5] * 250}, "context of 256"),
    ({"input_ids": [1, 500]}, "outside the target's vocabulary"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"input_ids": "hello"}, "needs a tokenizer"),
])
def test_bad_input_is_refused_with_a_clear_message(models, kwargs, message):
    args = {"input_ids": PROMPT, "k": 4, "max_new_tokens": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        speculative_generate(models["target"], models["self"], args.pop("input_ids"), **args)


def test_vocabulary_mismatch_is_refused():
    target = tiny_model("llama", seed=0, vocab_size=128)
    foreign = tiny_model("llama", seed=1, vocab_size=300)
    with pytest.raises(ValueError, match="vocabulary mismatch.*align"):
        speculative_generate(target, foreign, PROMPT, k=2, max_new_tokens=4)


def test_k_auto_is_lossless(models):
    for draft in ("self", "unrelated"):
        result = speculative_generate(models["target"], models[draft], PROMPT, k="auto", max_new_tokens=37,
                                      eos_token_id=[])
        assert result.token_ids == models["expected_37"]


def test_k_auto_drafts_past_the_k_chosen_while_the_draft_is_sure_and_stays_lossless(models, monkeypatch):
    """schedule.GO_ON_ABOVE: a sure draft goes on past the controller's k, to K_AUTO_MAX but never past the tokens
    left; the output stays the target's. Here every token counts as sure, and every one as paying (no prices)."""
    from specdec.core import schedule
    from specdec.core.limits import K_AUTO_MAX
    monkeypatch.setattr(schedule, "GO_ON_ABOVE", -1.0)
    monkeypatch.setattr(schedule.AdaptiveK, "round_times", lambda self, most: ())
    result = speculative_generate(models["target"], models["self"], PROMPT, k="auto", max_new_tokens=37,
                                  eos_token_id=[])
    assert result.token_ids == models["expected_37"]
    emitted = 0
    for round_ in result.rounds:
        if round_.draft_token_ids:
            assert len(round_.draft_token_ids) == min(K_AUTO_MAX, 37 - emitted - 1) >= round_.k
        emitted += len(round_.emitted_token_ids)
    assert any(len(r.draft_token_ids) > r.k for r in result.rounds)


def synthetic_round(num_drafted, num_accepted, draft_time, target_time):
    from specdec.core.trace import Round
    return Round([0] * num_drafted, [], [], [True] * num_accepted + [False] * (num_drafted - num_accepted),
                 num_accepted, 0, [], draft_time, target_time, num_drafted)


def test_k_auto_follows_the_optimal_k_of_what_it_measured():
    from specdec.core.limits import K_AUTO_MAX, K_AUTO_START
    from specdec.core.schedule import AdaptiveK
    cheap_and_good, costly_and_poor = AdaptiveK(), AdaptiveK()
    assert cheap_and_good.next_k() == K_AUTO_START
    for _ in range(20):
        cheap_and_good.observe(synthetic_round(4, 4, draft_time=4 * 0.01, target_time=1.0))  # c = 0.01
        costly_and_poor.observe(synthetic_round(4, 0, draft_time=4 * 0.5, target_time=1.0))  # c = 0.5
    assert cheap_and_good.next_k() == K_AUTO_MAX  # every position passes and drafting is nearly free
    assert costly_and_poor.next_k() == 0  # nothing passes: plain target steps are faster


def test_k_auto_prices_verification_with_the_calibrated_curve():
    from specdec.core.costmodel import CostModel, TargetCosts
    from specdec.core.schedule import AdaptiveK
    flat = CostModel(TargetCosts(0.1, [1.0] * 9, "test"), 0.05, "test")
    steep = CostModel(TargetCosts(0.1, [1.0 + 0.6 * n for n in range(9)], "test"), 0.05, "test")
    controllers = {"flat": AdaptiveK(flat), "steep": AdaptiveK(steep)}
    for costs, controller in zip((flat, steep), controllers.values()):
        for accepted in [8, 6, 8, 3, 8, 7, 5, 8] * 4:  # a_i high but below 1 at every position
            # rounds that paid what the calibration says: 8 drafts at c = 0.05 steps, a verification of v(9) steps
            controller.observe(synthetic_round(8, accepted, draft_time=8 * 0.05 * 0.1, target_time=0.1 * costs.v(9)))
    rates = controllers["steep"].position_rates()
    best_steep = controllers["steep"].next_k()
    expected = theory.tokens_per_round_by_k(rates)
    assert best_steep == max(range(len(expected)), key=lambda k: (expected[k] / steep.round_cost(k, k), -k))
    assert best_steep < controllers["flat"].next_k()


def test_copy_rounds_are_priced_from_their_own_rates_and_leave_the_models_alone():
    """A copy (prompt lookup in a round given no model drafts) is verified as far as its own rates say it pays; its
    rounds never move the model's rates, and count for the model as time without drafting."""
    from specdec.core.schedule import AdaptiveK, FixedK
    from specdec.core.trace import COPY
    assert FixedK(4).copy_k(8) == 0
    controller = AdaptiveK()
    assert controller.copy_k(8) == 0  # nothing observed yet
    controller.observe(synthetic_round(4, 0, draft_time=0.4, target_time=1.0))  # the model missed
    reached, accepted = list(controller.reached), list(controller.accepted)
    assert controller.copy_k(8) == 8 and controller.copy_k(3) == 3 and controller.copy_k(0) == 0  # Laplace's 1/2, v = 1
    passed, failed = AdaptiveK(), AdaptiveK()
    for controller_, accepted_ in ((passed, 6), (failed, 0)):
        controller_.observe(synthetic_round(4, 0, draft_time=0.4, target_time=1.0))
        for _ in range(6):
            copy = synthetic_round(6, accepted_, draft_time=0.0, target_time=1.0)
            copy.draft_source, copy.emitted_token_ids = COPY, [0] * (accepted_ + 1)
            controller_.observe(copy)
        assert controller_.reached == reached and controller_.accepted == accepted
        assert controller_.missed == 6 * (accepted_ + 1)
    assert passed.copy_k(8) >= 6 and failed.copy_k(8) == 0


def test_a_copy_takes_a_round_of_one_draft_only_where_it_is_priced_above_that_round():
    """A round the controller gives one model draft (a draft kept in play, or k = 1 chosen) verifies the free copy
    instead where the copy's rates price it above that round by MARGIN, as a round of none does against a plain
    step; a model whose one draft nearly always passes keeps its round from a short copy."""
    from specdec.core.schedule import AdaptiveK
    unsure = AdaptiveK()
    unsure.observe(synthetic_round(4, 0, draft_time=1.2, target_time=1.0))  # the first draft missed
    assert unsure.next_k() == 1 and unsure.copy_k(8, 1) == 8  # a copy of 8 at Laplace's 1/2: 2 tokens a step
    sure = AdaptiveK()
    for _ in range(10):
        sure.observe(synthetic_round(1, 1, draft_time=0.01, target_time=1.0))  # c = 0.01, every draft passes
    assert sure.copy_k(2, 1) == 0 and sure.copy_k(2, 0) == 2  # 1.75 tokens a step: below 1.96, above 1


def test_a_copy_is_made_only_where_the_schedule_could_take_one(models):
    """A hybrid remembers the copies it makes, so the engine asks for one only where the schedule could verify it:
    never under a fixed k (k = 1 included), and under k = auto in a round of at most one model draft."""
    from specdec.core.drafter import NoDraft, Proposal

    class Copier(NoDraft):
        asked = 0

        def copy(self, context_ids, n, policy):
            self.asked += 1
            return Proposal([], None)

    fixed = Copier()
    result = speculative_generate(models["target"], fixed, PROMPT, k=1, max_new_tokens=8, eos_token_id=[])
    assert fixed.asked == 0 and result.token_ids == models["expected_37"][:8]


def ks_chosen_when_nothing_passes(rounds: int) -> list[int]:
    """The k a fresh controller picks over `rounds` rounds in which no draft passes and each costs 0.3 steps."""
    from specdec.core.schedule import AdaptiveK
    controller, chosen = AdaptiveK(), []
    for _ in range(rounds):
        chosen.append(controller.next_k())
        controller.observe(synthetic_round(chosen[-1], 0, draft_time=0.3 * chosen[-1], target_time=1.0))
    return chosen


def test_k_auto_falls_back_to_plain_steps_and_probes_again():
    chosen = ks_chosen_when_nothing_passes(400)
    assert chosen[0] > 0 and chosen[1:].count(0) >= 360  # a probe costs 0.3 of a 1 s plain step: one per 15
    assert 1 in chosen[100:]  # a probe after a stretch of k = 0


def test_k_auto_prices_rounds_at_what_this_run_paid_not_the_calibration():
    """A calibration that says drafting is free, in a run whose drafts cost half a step each and whose rounds
    pay overhead besides their forwards: the controller goes by what the rounds cost."""
    from specdec.core.costmodel import CostModel, TargetCosts
    from specdec.core.schedule import AdaptiveK
    optimistic = CostModel(TargetCosts(0.1, [1.0] * 9, "test"), 0.0, "test")
    controller = AdaptiveK(optimistic)
    for accepted in [0, 0, 1] * 6:  # the first draft passes a third of the time
        controller.observe(synthetic_round(4, accepted, draft_time=4 * 0.05, target_time=0.1))  # c = 0.5 measured
    assert controller.prices.draft == pytest.approx(0.05) and controller.prices.step == pytest.approx(0.1)
    assert controller.next_k() == 0  # 1.33 tokens for 1.5 steps at k = 1: slower than plain steps
    free = AdaptiveK(optimistic)
    for accepted in [0, 0, 1] * 6:
        free.observe(synthetic_round(4, accepted, draft_time=0.0, target_time=0.1))
    assert free.next_k() > 0  # the same acceptance with free drafts pays


def test_k_auto_counts_the_overhead_of_rounds_and_keeps_a_margin():
    """Per-round and per-draft overhead measured from the rounds' wall time: a draft that would win on forwards
    alone loses once each drafted token's bookkeeping is paid; at k = 0 the price is the target alone's."""
    from specdec.core.schedule import MARGIN, AdaptiveK
    controller = AdaptiveK()
    plain = synthetic_round(0, 0, draft_time=0.0, target_time=0.1)
    plain.wall_time_s = 0.11  # 0.01 s besides the forward
    drafted = synthetic_round(4, 3, draft_time=4 * 0.01, target_time=0.1)
    drafted.wall_time_s = 0.1 + 0.04 + 0.01 + 4 * 0.1  # 0.1 s per drafted token besides its forward
    for round_ in [plain, drafted] * 10:
        controller.observe(round_)
    assert controller.prices.base == pytest.approx(0.01) and controller.prices.extra == pytest.approx(0.1)
    assert controller.round_time(0) == pytest.approx(0.11)
    assert controller.next_k() == 0
    cheap = AdaptiveK()
    drafted.wall_time_s = 0.1 + 0.04 + 0.01  # no overhead per drafted token
    for round_ in [plain, drafted] * 10:
        cheap.observe(round_)
    speeds = [e / cheap.round_time(k) for k, e in enumerate(theory.tokens_per_round_by_k(cheap.position_rates()))]
    assert cheap.next_k() > 0 and max(speeds) >= speeds[0] * (1 + MARGIN)


def test_k_auto_splits_drafting_rounds_overhead_into_per_round_and_per_token_before_a_plain_step():
    """Before any plain step, drafting rounds of 1, 2 and 4 tokens paying 0.01 s a round and 0.02 s a drafted token
    besides their forwards: a plain step is priced with its 0.01 s (not 0), a round of k drafts at 0.01 + 0.02·k; with
    one draft length only, nothing tells the two apart and the per-token price takes it all, as before."""
    from specdec.core.schedule import AdaptiveK
    controller, single = AdaptiveK(), AdaptiveK()
    for drafted in [1, 2, 4] * 4:
        round_ = synthetic_round(drafted, 0, draft_time=drafted * 0.01, target_time=0.1)
        round_.wall_time_s = 0.1 + drafted * 0.01 + 0.01 + 0.02 * drafted
        controller.observe(round_)
        one = synthetic_round(2, 0, draft_time=0.02, target_time=0.1)
        one.wall_time_s = 0.1 + 0.02 + 0.01 + 0.04
        single.observe(one)
    assert controller.round_time(0) == pytest.approx(0.1 + 0.01)
    assert controller.round_time(3) - controller.round_time(0) == pytest.approx(3 * (0.01 + 0.02), rel=1e-6)
    assert single.round_time(0) == pytest.approx(0.1) and single.round_time(2) == pytest.approx(0.1 + 0.02 + 0.05)


def test_k_auto_probes_cost_at_most_their_share_of_the_plain_steps():
    """Probes at k = 0 are paid from EXPLORE of the time spent in plain steps, and a probe's catch-up grows with the
    tokens the draft missed: with a steep catch-up the draft is looked at less often than with a flat one, yet
    at least every LOOK_AFTER_MAX plain steps."""
    from specdec.core.costmodel import CostModel, TargetCosts
    from specdec.core.schedule import EXPLORE, LOOK_AFTER_MAX, AdaptiveK

    def probes(slope: float) -> list[int]:
        controller = AdaptiveK(CostModel(TargetCosts(1.0, [1.0 + slope * n for n in range(9)], "test"), 0.3, "test"))
        chosen, spent, plain = [], 0.0, 0.0
        for _ in range(2000):
            chosen.append(k := controller.next_k())
            price = controller.probe_price() if k == 1 and controller.missed else 0.0  # a look after plain steps
            round_ = synthetic_round(k, 0, draft_time=0.3 * controller._v(controller.missed + 1) * (k > 0),
                                     target_time=controller._v(k + 1))
            round_.wall_time_s = round_.draft_time_s + round_.target_time_s
            controller.observe(round_)
            spent, plain = spent + price, plain + (round_.wall_time_s if k == 0 else 0.0)
        if slope == 0.0:  # what the probes cost, at most EXPLORE of the plain steps (+ the last one)
            assert spent <= EXPLORE * plain + price
        return [i for i, k in enumerate(chosen) if k == 1 and i > 0]

    flat, steep = probes(0.0), probes(0.3)
    assert len(flat) >= 3 and len(steep) >= 3
    assert len(steep) < len(flat)
    assert max(b - a for a, b in zip(steep, steep[1:])) <= LOOK_AFTER_MAX + 1


def test_k_auto_with_a_useless_draft_is_lossless_and_mostly_plain_steps(models):
    result = speculative_generate(models["target"], models["unrelated"], PROMPT, k="auto", max_new_tokens=37,
                                  eos_token_id=[])
    assert result.token_ids == models["expected_37"]
    assert sum(r.k == 0 for r in result.rounds) > len(result.rounds) // 2


def test_k_auto_keeps_an_unsure_draft_in_play_one_token_a_round_until_it_has_been_judged():
    """A first round whose first draft missed says little: the controller drafts one token a round until EVIDENCE
    rounds (decayed) have judged the first position, the draft kept caught up, and only then turns to plain steps."""
    from specdec.core.schedule import DECAY, EVIDENCE
    chosen = ks_chosen_when_nothing_passes(12)
    judged = [sum(DECAY ** j for j in range(i)) for i in range(1, 12)]  # rounds that judged position 1, decayed
    in_play = 1 + next(i for i, count in enumerate(judged) if count >= EVIDENCE)
    assert chosen[1:in_play] == [1] * (in_play - 1) and in_play >= 3
    assert chosen[in_play:] == [0] * (12 - in_play)


def test_k_auto_keeps_a_caught_up_draft_that_may_pay_and_leaves_one_left_behind_to_the_probes():
    """A draft whose first position passes a third of the time at c = 0.3 (break-even 0.3, the margin asks 0.365):
    the point estimate prefers plain steps, yet within half a standard deviation of its estimate one draft a round
    pays, so a caught-up draft stays in play; once a plain step has left it behind, only the probe budget brings it
    back. A draft that passes a tenth of the time is dropped."""
    from specdec.core.schedule import MARGIN, AdaptiveK

    def after(pattern: list[int]) -> AdaptiveK:
        controller = AdaptiveK()
        for accepted in pattern:
            round_ = synthetic_round(1, accepted, draft_time=0.3, target_time=1.0)
            round_.wall_time_s = 1.3
            controller.observe(round_)
        return controller

    third = after([1, 0, 0] * 6)
    speeds, expected = third.speeds(), theory.tokens_per_round_by_k(third.position_rates())
    assert speeds == [e / third.round_time(k) for k, e in enumerate(expected)]
    assert max(speeds[1:]) < speeds[0] * (1 + MARGIN) and third.may_pay()
    assert third.next_k() == 1
    plain = synthetic_round(0, 0, draft_time=0.0, target_time=1.0)
    plain.wall_time_s = 1.0
    third.observe(plain)
    assert third.next_k() == 0
    tenth = after([1] + [0] * 9 + [1] + [0] * 9)
    assert not tenth.may_pay() and tenth.next_k() == 0


def test_k_auto_prices_a_draft_forward_apart_from_a_probes_catch_up():
    """A probe after m plain steps first catches the draft up on the m tokens it missed (one forward of m + 1 tokens,
    draft·v(m + 1)): that forward is not a draft step's price, or every probe would make drafting look dearer."""
    from specdec.core.costmodel import CostModel, TargetCosts
    from specdec.core.schedule import AdaptiveK
    costs = CostModel(TargetCosts(0.1, [1.0 + 0.25 * n for n in range(9)], "test"), 0.3, "test")
    controller = AdaptiveK(costs)
    controller.observe(synthetic_round(4, 0, draft_time=4 * 0.03, target_time=0.1 * costs.v(5)))
    for _ in range(8):
        controller.observe(synthetic_round(0, 0, draft_time=0.0, target_time=0.1))
    assert controller.missed == 8
    controller.observe(synthetic_round(1, 1, draft_time=0.03 * costs.v(9), target_time=0.1 * costs.v(2)))
    assert controller.prices.draft == pytest.approx(0.03)


def test_each_rounds_top_two_target_logits_are_topks_and_the_logits_stay_as_they_were():
    logits = torch.randn(9, 1000)
    logits[3] = float("-inf")
    logits[3, 7] = 1.0  # one finite logit: the second largest is a -inf one
    before = logits.clone()
    ids, values = engine._top(logits)
    assert torch.equal(logits, before)
    top = before.topk(2, dim=-1)
    assert [row[0] for row in ids] == top.indices[:, 0].tolist() and values == top.values.tolist()
    assert all(row[0] != row[1] for row in ids)
