"""Leaves: a greedy round verifies the draft's second choice at a few positions as extra rows of the same forward (a
one-level draft tree). Each leaf row is, bit for bit, the one-token step after its own prefix on a row-invariant
target, so a leaf that passes adds the target's next token and the output stays the target alone's."""
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.core.costmodel import CostModel, TargetCosts
from specdec.core.drafter import SamplingPolicy
from specdec.core.kv import LEAF_ROWS_FLAG, CachedLM, tree_layout
from specdec.core.limits import LEAVES_MAX
from specdec.core.schedule import AdaptiveK
from specdec.core.trace import DecodeStats, GenerationResult, Round
from specdec.dashboard.chips import chips_html
from specdec.dashboard.tabs.step import step_html
from specdec.lab.report import round_rows
from specdec.models import native, quant, quant4
from specdec.models.quant import quantize_int8
from specdec.testing import perturbed_copy, tiny_model
from test_quant import PROMPT, quantized

FORMS = [pytest.param(quantize_int8, id="int8"), pytest.param(quant4.quantize_int4, id="int4")]


def one_token_step(model, prefix: list[int]) -> torch.Tensor:
    """The target alone's logits [V] after `prefix`: its prefix read, then one one-token forward."""
    lm = CachedLM(model)
    lm.prefill(prefix)
    return lm.forward(lm.pending(prefix))[0][0]


def test_tree_layout_places_each_leaf_after_its_parent_seeing_its_ancestors_and_itself():
    layout = tree_layout(past=3, chain=3, parents=[0, 2])
    assert layout["positions"].tolist() == [[3, 4, 5, 4, 6]]
    mask = layout["mask"][0, 0].int().tolist()  # [5, 8]: 3 cached, 3 chain, 2 leaves
    assert mask == [[1, 1, 1, 1, 0, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 0, 0],
                    [1, 1, 1, 1, 1, 1, 0, 0],
                    [1, 1, 1, 1, 0, 0, 1, 0],  # after chain token 0, itself
                    [1, 1, 1, 1, 1, 1, 0, 1]]  # after chain tokens 0..2, itself


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "sdpa"])
def test_rowwise_attention_gives_each_tree_row_its_own_positions_as_a_one_row_call(compiled, monkeypatch):
    """A tree's rows in one call against each row alone over a cache of exactly its positions (the compiled kernel,
    and sdpa where none is built)."""
    if not compiled:
        monkeypatch.setattr(native, "library", lambda: None)
    elif native.library() is None:
        pytest.skip("no C compiler here")
    torch.manual_seed(0)
    past, chain, parents, heads, kv_heads, dim = 20, 5, [0, 3, 1], 12, 2, 64
    size = chain + len(parents)
    query = torch.randn(1, heads, size, dim)
    key, value = torch.randn(2, 1, kv_heads, past + size, dim)
    mask = tree_layout(past, chain, parents)["mask"]
    together, _ = quant.rowwise_attention(torch.nn.Module(), query, key, value, mask, scaling=dim ** -0.5)
    for row in range(size):
        seen = mask[0, 0, row].nonzero()[:, 0]
        alone, _ = quant.rowwise_attention(torch.nn.Module(), query[:, :, row:row + 1].clone(),
                                           key[:, :, seen].clone(), value[:, :, seen].clone(), None,
                                           scaling=dim ** -0.5)
        assert torch.equal(together[:, row:row + 1], alone), f"row {row}"


@pytest.mark.parametrize("form, arch", [(quantize_int8, "llama"), (quantize_int8, "qwen2"), (quantize_int8, "gpt2"),
                                        (quant4.quantize_int4, "llama"), (quant4.quantize_int4, "qwen2")])
def test_each_leaf_row_is_the_one_token_step_after_its_prefix(form, arch):
    """Chain rows and leaf rows of one forward against one-token steps, bitwise (the model's own forward where it has
    one, transformers' elsewhere); the cache then holds the chain alone."""
    model = quantized("gpt2") if arch == "gpt2" else form(tiny_model(arch, seed=0))
    lm = CachedLM(model)
    assert lm.takes_leaves
    base, chain, leaves = PROMPT[:-1], [PROMPT[-1], 5, 6, 7], [(9, 1), (11, 0), (12, 3)]
    lm.prefill(PROMPT)
    logits, _ = lm.forward(chain, logits_to_keep=len(chain), leaves=leaves)  # [4 + 3, V]
    assert lm.token_ids == base + chain and lm.cache.get_seq_length() == len(base + chain)
    for row in range(len(chain)):
        assert torch.equal(logits[row], one_token_step(model, base + chain[:row + 1])), f"chain row {row}"
    for index, (leaf, parent) in enumerate(leaves):
        expected = one_token_step(model, base + chain[:parent + 1] + [leaf])
        assert torch.equal(logits[len(chain) + index], expected), f"leaf {index}"
    after, _ = lm.forward(lm.pending(base + chain + [8]))  # the next round reads on from the chain
    assert torch.equal(after[0], one_token_step(model, base + chain + [8]))


def test_a_model_without_row_invariant_attention_takes_no_leaves():
    model = tiny_model("llama", seed=0)
    lm = CachedLM(model)
    assert not lm.takes_leaves
    with pytest.raises(ValueError, match="cannot verify leaves"):
        lm.forward(PROMPT, leaves=[(3, 0)])
    result = speculative_generate(model, perturbed_copy(model, noise=0.3), PROMPT, k="auto", max_new_tokens=30,
                                  eos_token_id=[])
    assert result.stats.leaf_rows == 0


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_with_leaves_equals_the_target_alone_and_leaves_pass(form, arch):
    """k = "auto" without calibrated costs prices a row at nothing (v = 1), so every round that drafts verifies
    leaves; some pass, each adding a token; the output is the target alone's. Marked as taking none, the same run
    verifies none and gives the same output."""
    target = form(tiny_model(arch, seed=0))
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=48, eos_token_id=[]).token_ids
    passed = 0
    for noise in (0.1, 0.2):
        draft = form(perturbed_copy(tiny_model(arch, seed=0), noise=noise, seed=2))
        result = speculative_generate(target, draft, PROMPT, k="auto", max_new_tokens=48, eos_token_id=[])
        assert result.token_ids == alone
        assert result.stats.leaf_rows > 0 and result.stats.leaf_tokens <= result.stats.rejections
        assert all(len(r.emitted_token_ids) == r.num_accepted + 1 + r.leaf_passed for r in result.rounds)
        assert all(len(r.leaf_token_ids) <= LEAVES_MAX for r in result.rounds)
        passed += result.stats.leaf_tokens
    assert passed > 0
    setattr(target, LEAF_ROWS_FLAG, False)
    result = speculative_generate(target, draft, PROMPT, k="auto", max_new_tokens=48, eos_token_id=[])
    assert result.token_ids == alone and result.stats.leaf_rows == 0


def test_a_fixed_k_and_sampling_verify_no_leaves():
    target = quantize_int8(tiny_model("llama", seed=0))
    draft = quantize_int8(perturbed_copy(tiny_model("llama", seed=0), noise=0.3))
    for settings in ({"k": 4}, {"k": "auto", "temperature": 0.8, "seed": 1}):
        result = speculative_generate(target, draft, PROMPT, max_new_tokens=30, eos_token_id=[], **settings)
        assert result.stats.leaf_rows == 0


def priced(row_s: float, round_s: float = 1.0, temperature: float = 0.0) -> SamplingPolicy:
    """A policy whose rounds of any length cost round_s and whose every verification row costs row_s more."""
    return SamplingPolicy(temperature, 1.0, torch.Generator(), 100, round_times=(round_s,) * 9,
                          row_times=tuple(n * row_s for n in range(13)))


def test_leaves_go_where_they_add_most_while_they_pay():
    confidences, seconds = [0.9, 0.5, 0.9], [0.05, 0.4, 0.08]
    # gains P_(i-1)·s_i: 0.05, 0.36, 0.036; E = 1 + 0.9 + 0.45 + 0.405 = 2.755 tokens in 1 s
    assert priced(0.0).leaves(confidences, seconds) == [0, 1]  # free rows: the two largest gains, in order
    assert priced(0.1).leaves(confidences, seconds) == [1]  # 0.36 > 2.755 · 0.1; then 0.05 · 1.1 < 3.115 · 0.1
    assert priced(0.2).leaves(confidences, seconds) == []  # 0.36 < 2.755 · 0.2
    assert priced(0.0, temperature=0.7).leaves(confidences, seconds) == []  # sampling: never
    assert SamplingPolicy(0.0, 1.0, torch.Generator(), 100).leaves(confidences, seconds) == []  # no prices: never


def test_a_passed_leaf_shows_in_the_chips_the_step_view_and_the_round_table():
    """The token after a passed leaf is emitted: a chip of its own, named in the step view, the round table's kind."""
    round_ = Round([5, 6, 7], [0.9, 0.5, 0.7], [0.95, 0.1, 0.3], [True, False, True], 1, 8, [5, 8, 3],
                   draft_time_s=0.01, target_time_s=0.1, draft_forwards=3, leaf_positions=[1], leaf_token_ids=[8],
                   leaf_passed=True)
    assert round_.rows == 5
    html = chips_html([round_], tokenizer=None)
    assert html.count("chip chip-leaf") == 1 and html.count("chip chip-correction") == 1 and ">3 <" in html
    assert "position 2: 8" in step_html(1, round_, None, greedy=True) and "gave the target's next token" in \
        step_html(1, round_, None, greedy=True)
    result = GenerationResult([5, 8, 3], [round_], DecodeStats.from_rounds([round_], 3))
    assert round_rows(result)[0]["kind"] == "correction, a leaf"
    stats = result.stats
    assert (stats.leaf_rows, stats.leaf_tokens, stats.mean_accepted_length) == (1, 1, 3.0)


def test_the_controller_credits_the_leaves_its_rounds_passed_and_prices_their_rows():
    """k = "auto" values a drafting round with the leaves passed per drafting round and charges the leaf rows
    verified (each as one more row of v): the same rounds with leaves that pass predict more tokens per second,
    with leaves that never pass, on a steep v, less."""
    costs = CostModel(TargetCosts(0.04, [1.0 + 0.2 * n for n in range(11)], "t"), 0.2, "d")

    def controller(leaves: int, passed: bool) -> AdaptiveK:
        schedule = AdaptiveK(costs)
        for _ in range(6):
            schedule.observe(Round([5, 6], [0.9, 0.4], [0.9, 0.1], [True, False], 1, 7, [5, 7] + [8] * passed,
                                   draft_time_s=0.016, target_time_s=0.04 * (1.2 + 0.2 * leaves),
                                   draft_forwards=2, leaf_positions=[1] * leaves, leaf_token_ids=[7] * leaves,
                                   leaf_passed=passed, wall_time_s=0.06 + 0.008 * leaves))
        return schedule

    plain, credited, idle = controller(0, False).speeds(), controller(1, True).speeds(), controller(1, False).speeds()
    assert credited[0] == pytest.approx(plain[0], rel=0.05)  # a plain step is priced alike
    assert all(c > p for c, p in zip(credited[1:], plain[1:]))
    assert all(i < p for i, p in zip(idle[1:], plain[1:]))
