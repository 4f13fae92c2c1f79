"""An int8 model's own forward (specdec.models.int8_forward): CachedLM runs it for llama and qwen2 layouts, the
row-invariant target's and the coupled draft's, its logits bitwise the model's own forward's through prefill,
steps, verification-sized forwards, rollbacks and cache growth (a draft's one-token steps, attending in one
compiled call, within float rounding); every other model, a lever's cache class or SPECDEC_TRANSFORMERS_FORWARD=1
runs the model's forward."""
import functools

import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.core import kv
from specdec.core.kv import CACHE_CLASS_FLAG, CachedLM
from specdec.models import formats, int8_forward, native
from specdec.models.quant4 import quantize_int4
from specdec.testing import perturbed_copy, tiny_model

CONTEXT = [1, 5, 9, 13, 7, 4, 8, 6, 12, 3, 10, 11]


def int8_model(arch: str, form: str = "int8-dynamic", seed: int = 0, **config) -> torch.nn.Module:
    return formats.to_format(tiny_model(arch, seed, **config), form)


def within_rounding(a: torch.Tensor, b: torch.Tensor) -> bool:
    """A draft's compiled one-token step against the torch step: the same formulas, float rounding apart, which
    the layers' int8 rows can turn into one code's step here and there (relative error under 2%)."""
    return bool((a - b).norm() <= 0.02 * b.norm())


def transformers_forward(model: torch.nn.Module) -> CachedLM:
    """A CachedLM that runs transformers' forward of `model`."""
    return CachedLM(model, own_forward=False)


def feeds(lm: CachedLM) -> list[torch.Tensor]:
    """Logits of a prefill, a step, a 5-token forward, a rollback of 3 then 2 tokens, a long catch-up."""
    out = [lm.forward(CONTEXT, logits_to_keep=len(CONTEXT))[0], lm.forward([14])[0],
           lm.forward([15, 16, 17, 18, 19], logits_to_keep=5)[0]]
    feed = lm.pending(lm.token_ids[:-3] + [20, 21])  # three dropped, two new
    out.append(lm.forward(feed, logits_to_keep=len(feed))[0])
    out.append(lm.forward(list(range(30, 70)), logits_to_keep=40)[0])  # past the first capacity below
    return out


# the row-invariant target's, the coupled draft's, the 4-bit draft's
@pytest.mark.parametrize("form", ["int8", "int8-dynamic", "int4-dynamic"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # 4 query heads over 2 key/value heads (tiny_config)
def test_the_own_forward_gives_the_models_own_logits_bit_for_bit(monkeypatch, arch, form):
    monkeypatch.setattr(kv, "MIN_CAPACITY", 16)  # the cache grows twice in `feeds`
    model = int8_model(arch, form)
    lm = CachedLM(model)
    assert isinstance(lm.plan, int8_forward.Plan) and isinstance(lm.cache, int8_forward.Cache)
    ours, theirs = feeds(lm), feeds(transformers_forward(model))
    if lm.plan.fused:  # a draft's one-token step attends in one compiled call: sdpa's within float rounding
        assert all(within_rounding(a, b) for a, b in zip(ours, theirs))
        if not lm.plan.layers4:  # (a 4-bit draft's prefill runs its layers in one call each too)
            assert torch.equal(ours[0], theirs[0])  # the prefill, before any such step
    else:
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert lm.cache.length == len(lm.token_ids) and lm.cache.keys[0].shape[-2] >= lm.cache.length


@pytest.mark.parametrize("form", ["int8", "int8-dynamic", "int4-dynamic"])
def test_a_view_of_the_first_layers_runs_its_own_plan(form):
    model = int8_model("qwen2", form, layers=4)
    view = formats.at_depth(model, 2)
    lm = CachedLM(view)
    assert len(lm.plan.layers) == 2 and len(CachedLM(model).plan.layers) == 4
    same = within_rounding if lm.plan.fused else torch.equal
    assert all(same(a, b) for a, b in zip(feeds(lm), feeds(transformers_forward(view))))


@pytest.mark.skipif(native.library() is None, reason="the compiled product is not built here")
@pytest.mark.parametrize("form", ["int8-dynamic", "int4-dynamic"])
def test_a_drafts_one_token_step_runs_compiled_calls_within_rounding_of_the_torch_step(monkeypatch, form):
    """Only a draft's form fuses (the int8 target keeps its row-invariant forward); each one-token step attends in
    one compiled call a layer, and the keys and values it writes and its logits are the torch step's within float
    rounding, through cache growth."""
    monkeypatch.setattr(kv, "MIN_CAPACITY", 16)
    assert not CachedLM(int8_model("qwen2", "int8")).plan.fused
    model = int8_model("qwen2", form)
    fused, plain = CachedLM(model), CachedLM(model)
    plain.plan = int8_forward.Plan(**{**vars(plain.plan), "fused": False})
    calls = []
    for name in ("attend_one", "draft_layer"):  # a 4-bit draft's whole layer is one call, which attends inside
        monkeypatch.setattr(native, name, functools.partial(lambda f, *args: calls.append(1) or f(*args),
                                                            getattr(native, name)))
    for lm in (fused, plain):
        lm.forward(CONTEXT)
    calls.clear()  # (a 4-bit draft's prefill is one call a layer too)
    for token in range(14, 40):
        ours, theirs = fused.forward([token])[0], plain.forward([token])[0]
        assert within_rounding(ours, theirs)
    assert len(calls) == 26 * len(fused.plan.layers)
    end = fused.cache.length
    assert end == plain.cache.length and fused.cache.keys[0].shape[-2] >= end > 16  # grown past its first capacity
    for layer in range(len(fused.plan.layers)):
        assert within_rounding(fused.cache.keys[layer][..., :end, :], plain.cache.keys[layer][..., :end, :])
        assert within_rounding(fused.cache.values[layer][..., :end, :], plain.cache.values[layer][..., :end, :])


@pytest.mark.skipif(native.library() is None, reason="the compiled product is not built here")
def test_a_4bit_drafts_forward_of_several_tokens_is_bitwise_its_one_token_steps():
    """A 4-bit draft's forward over n tokens (a prefill, the catch-up after a round that passed whole) runs each layer
    as one compiled call over the n rows, each row computed as its own one-token step would: the same keys and
    values and the same last logits, bit for bit, as n one-token steps."""
    model = int8_model("qwen2", "int4-dynamic")
    whole, steps = CachedLM(model), CachedLM(model)
    assert whole.plan.layers4
    for lm in (whole, steps):
        lm.forward(CONTEXT[:3])
    feed = CONTEXT[3:] + [14, 15]
    last = whole.forward(feed)[0]
    for token in feed:
        one = steps.forward([token])[0]
    assert torch.equal(last, one)
    end = whole.cache.length
    assert end == steps.cache.length == len(CONTEXT) + 2
    for layer in range(len(whole.plan.layers)):
        assert torch.equal(whole.cache.keys[layer][..., :end, :], steps.cache.keys[layer][..., :end, :])
        assert torch.equal(whole.cache.values[layer][..., :end, :], steps.cache.values[layer][..., :end, :])


@pytest.mark.skipif(native.library() is None, reason="the compiled product is not built here")
def test_a_4bit_drafts_layer_in_one_call_is_bitwise_its_step_call_by_call():
    """A 4-bit draft runs each layer of a one-token step as one compiled call (`native.draft_layer`), the same calls
    in the same order inside as the step made one by one from Python: the same logits and keys/values, bit for bit.
    Another draft form has no such call."""
    assert not CachedLM(int8_model("qwen2", "int8-dynamic")).plan.layers4
    model = int8_model("qwen2", "int4-dynamic")
    whole, by_call = CachedLM(model), CachedLM(model)
    assert len(whole.plan.layers4) == len(whole.plan.layers)
    by_call.plan = int8_forward.Plan(**{**vars(by_call.plan), "layers4": ()})
    whole.forward(CONTEXT)  # one call a layer over the rows, each row its one-token step (the test above)
    for token in CONTEXT:
        by_call.forward([token])
    for token in range(14, 30):
        assert torch.equal(whole.forward([token])[0], by_call.forward([token])[0])
    end = whole.cache.length
    for layer in range(len(whole.plan.layers)):
        assert torch.equal(whole.cache.keys[layer][..., :end, :], by_call.cache.keys[layer][..., :end, :])
        assert torch.equal(whole.cache.values[layer][..., :end, :], by_call.cache.values[layer][..., :end, :])


def test_other_models_a_cache_lever_and_the_switch_run_transformers_forward(monkeypatch):
    assert CachedLM(tiny_model("llama")).plan is None  # float32
    assert CachedLM(quantize_int4(tiny_model("llama"))).plan is None  # on torch's int4 kernel
    assert CachedLM(int8_model("gpt2", "int8")).plan is None
    model = int8_model("llama")
    setattr(model, CACHE_CLASS_FLAG, type(CachedLM(tiny_model("llama")).cache))
    assert CachedLM(model).plan is None
    replaced = int8_model("llama")
    replaced.forward = replaced.forward  # a lever's compiled forward, say
    assert CachedLM(replaced).plan is None
    monkeypatch.setenv("SPECDEC_TRANSFORMERS_FORWARD", "1")
    assert CachedLM(int8_model("llama")).plan is None


def test_speculative_decoding_with_both_own_forwards_equals_the_target_alone(monkeypatch):
    float_target = tiny_model("qwen2", seed=0)
    draft = formats.to_format(perturbed_copy(float_target, noise=0.3), "int8-dynamic")  # some pass, some fail
    target = formats.to_format(float_target, "int8")
    alone = autoregressive_generate(target, CONTEXT, max_new_tokens=40, eos_token_id=[]).token_ids
    with monkeypatch.context() as patch:
        patch.setenv("SPECDEC_TRANSFORMERS_FORWARD", "1")
        assert autoregressive_generate(target, CONTEXT, max_new_tokens=40, eos_token_id=[]).token_ids == alone
    for k in (1, 4, "auto"):
        result = speculative_generate(target, draft, CONTEXT, k=k, max_new_tokens=40, eos_token_id=[])
        assert result.token_ids == alone
        assert 0 < result.stats.accepted_tokens < result.stats.draft_tokens or k == "auto"
