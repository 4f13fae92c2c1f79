"""The int8 path (specdec.models.quant) is row-invariant: a verification forward over n tokens gives, bit for
bit, the logits of n one-token steps, so greedy speculative output equals the int8 target alone, near-ties
included."""
import copy
import time

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from specdec import autoregressive_generate, speculative_generate
from specdec.core.kv import CachedLM
from specdec.core.trace import ROUNDING_NOISE
from specdec.models import apply_speed_levers, load_draft, load_model, native, quant
from specdec.models.quant import (Int8Embedding, Int8Linear, ROWWISE_ATTENTION, quantize_int8,
                                  rowwise_attention)
from specdec.testing import perturbed_copy, tiny_config, tiny_folder, tiny_model

ARCHS = ("llama", "qwen2", "gpt2")
CONTEXT = [1, 5, 9, 33, 17, 60, 4]
PROMPT = [1, 5, 9, 33, 17, 60, 4]
OTHER_LIMIT = 63 if quant.weight_limit() == quant.INT8_MAX else quant.INT8_MAX  # the weight range of the other
# kind of CPU than this one (7 bits where pair sums are 16-bit, as on AVX2 without VNNI; else 8)


def rows_alone_equal(op, x: torch.Tensor) -> bool:
    """Whether op(x)[..., i, :] == op(x[..., i:i+1, :]) bitwise for every row i (x [1, M, H])."""
    together = op(x)
    return all(torch.equal(together[:, i:i + 1], op(x[:, i:i + 1])) for i in range(x.shape[1]))


def quantized(arch: str, seed: int = 0, **config) -> torch.nn.Module:
    model = tiny_model(arch, seed, **config)
    apply_speed_levers(model)  # RowsFirstLinear / ColumnMajorHead, as load_model leaves them
    return quantize_int8(model)


def test_a_weight_quantized_in_blocks_of_rows_is_the_whole_weight_quantized(monkeypatch):
    """`quantize_weight` takes BLOCK_BYTES of rows at a time: the codes and scales of one pass over the whole
    weight, bit for bit, a last partial block and an all-zero row included."""
    torch.manual_seed(0)
    weight = torch.randn(1000, 96) * 0.05
    weight[7] = 0.0
    monkeypatch.setattr(quant, "BLOCK_BYTES", 4 * 96 * 64)  # 64 rows a block: 16 blocks, the last one of 40
    codes, scales = quant.quantize_weight(weight)
    whole, whole_scales = quant._quantize_rows(weight, quant.weight_limit())
    assert codes.dtype == torch.int8 and torch.equal(codes, whole.to(torch.int8))
    assert torch.equal(scales, whole_scales) and not codes[7].any()


@pytest.mark.parametrize("shape", [(48, 64), (200, 96), (8960 // 8, 1536 // 4)])
def test_int8_linear_row_i_of_m_rows_is_row_i_alone(shape):
    torch.manual_seed(0)
    layer = Int8Linear(torch.randn(shape), torch.randn(shape[0]))
    for rows in range(1, 10):
        x = torch.randn(1, rows, shape[1]) * torch.logspace(-2, 2, rows)[None, :, None]  # rows of other scales
        assert rows_alone_equal(layer, x)
    x = torch.randn(5, shape[1])
    reference = torch.nn.functional.linear(x, layer.int8_weight().float() * layer.weight_scale[:, None], layer.bias)
    assert torch.allclose(layer(x), reference, rtol=0.05, atol=0.05 * reference.abs().max().item())


@pytest.mark.parametrize("kernel", quant.KERNELS)
def test_each_packed_kernel_exact_here_gives_torch_int_mm_sums_and_its_weight_back(kernel):
    """At the widest weight range the kernel sums exactly here (fbgemm on AVX2 without VNNI: 7 bits, though the
    compiled kernel's 8 bits set the machine's range)."""
    limit = next((limit for limit in quant.WEIGHT_LIMITS if quant.exact_for(kernel, limit)), None)
    if limit is None:
        pytest.skip(f"{kernel} sums no weight range exactly here")
    torch.manual_seed(0)
    weight = torch.randint(-limit, limit + 1, (300, 200), dtype=torch.int8)
    packed = quant._part(kernel, "pack")(weight)
    for rows in range(1, 18):
        x_q = torch.randint(-127, 128, (rows, 200)).float()
        x_q[0] = 127  # extremes
        assert torch.equal(quant._packed_mm(kernel, x_q, packed), quant._int_mm(x_q, weight))
    assert torch.equal(quant._part(kernel, "unpack")(packed), weight)


def test_each_shape_runs_the_fastest_exact_kernel_measured_here_once_per_machine(monkeypatch, tmp_path):
    """Timed on this machine (never read off flags) once per weight shape, the choice kept with the machine's
    description: a kernel slower here for that shape, or inexact, is not chosen."""
    limit = next((limit for limit in quant.WEIGHT_LIMITS  # where one kernel alone is exact at 8 bits, the 7-bit
                  if sum(quant.exact_for(kernel, limit) for kernel in quant.KERNELS) >= 2), None)  # range's race
    if limit is None:
        pytest.skip("fewer than two exact packed kernels here")
    monkeypatch.setattr(quant, "weight_limit", lambda: limit)
    exact = quant.exact_kernels()
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(quant, "_CHOSEN", {})
    fast, slow = exact[0], exact[1]
    for other in exact[1:]:
        def slower(x_q, packed, mm=quant._part(other, "mm")):
            time.sleep(0.002)  # slower than any product of the probe's shape
            return mm(x_q, packed)

        monkeypatch.setattr(quant, quant.KERNELS[other].mm, slower)
    timed = []
    fastest = quant._fastest
    monkeypatch.setattr(quant, "_fastest", lambda kernels, shape: timed.append(shape) or fastest(kernels, shape))
    assert quant.kernel_for((96, 64)) == fast and quant.kernel_for((96, 64)) == fast and timed == [(96, 64)]
    quant._CHOSEN.clear()  # another process on this machine reads the choice back
    assert quant.kernel_for((96, 64)) == fast and timed == [(96, 64)]
    quant.forget_kernel_choices()  # --recalibrate
    monkeypatch.setattr(quant, "exact_for", lambda kernel, limit: kernel == slow)
    assert quant.kernel_for((96, 64)) == slow  # the only exact one, however slow
    assert quant.kernel_path() == f"{slow}/{quant.weight_limit()}"


def without_packed_copy(layer: Int8Linear) -> Int8Linear:
    """`layer`'s int8 weight, scales and bias in a layer with no packed copy: torch._int_mm on the weight it holds."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant, "kernel_for", lambda shape: None)
        plain = Int8Linear.from_quantized(layer.int8_weight(), layer.weight_scale, layer.bias)
    assert plain.packed is None and not plain.weight.is_meta
    return plain


@pytest.mark.parametrize("min_rows", [1, 4, 100])
def test_int8_linear_bits_do_not_depend_on_the_kernel(monkeypatch, min_rows):
    """The packed kernel from min_rows rows on, torch._int_mm below, or _int_mm only (no packed copy): the same
    bits."""
    torch.manual_seed(0)
    layer = Int8Linear(torch.randn(96, 64), torch.randn(96))
    x = torch.randn(7, 64)
    expected = layer(x)
    monkeypatch.setattr(quant, "PACKED_MIN_ROWS", min_rows)
    assert torch.equal(layer(x), expected)
    assert rows_alone_equal(layer, x[None])
    assert torch.equal(without_packed_copy(layer)(x), expected)


def test_int8_linear_zero_row_gives_bias():
    layer = Int8Linear(torch.randn(8, 16), torch.arange(8.0))
    assert torch.equal(layer(torch.zeros(2, 16)), torch.arange(8.0).expand(2, 8))


def test_shared_input_slices_equal_separate_layers_bitwise():
    torch.manual_seed(0)
    linears = [torch.nn.Linear(64, out) for out in (64, 32, 32)]  # q, k, v
    shared = quant.SharedInputInt8(linears)
    slices = [quant.Int8Slice(shared, 0, 64), quant.Int8Slice(shared, 64, 96), quant.Int8Slice(shared, 96, 128)]
    for rows in (1, 5):
        x, other = torch.randn(1, rows, 64), torch.randn(1, rows, 64)
        assert all(torch.equal(s(x), Int8Linear.from_module(m)(x)) for s, m in zip(slices, linears))
        assert shared.last_input is None  # every member read it: nothing kept between forwards
        assert torch.equal(slices[0](x), Int8Linear.from_module(linears[0])(x))
        assert torch.equal(slices[1](other), Int8Linear.from_module(linears[1])(other))  # a new input: recomputed
        shared.unread = 0


@pytest.mark.parametrize("tied", [False, True])
def test_every_linear_becomes_int8_and_the_embedding_int8_rows_the_tied_heads(tied):
    config = tiny_config("qwen2")
    config.tie_word_embeddings = tied
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    apply_speed_levers(model)
    embedding = model.get_input_embeddings().weight.detach().clone()
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    quantize_int8(model)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    head, lookup = model.get_output_embeddings(), model.get_input_embeddings()
    assert isinstance(head, Int8Linear) and head.weight.shape == (128, 64) and head.weight.dtype == torch.int8
    assert isinstance(lookup, Int8Embedding) and lookup.weight.dtype == torch.int8 and quant.is_tied(model) == tied
    assert (lookup.weight.data_ptr() == head.weight.data_ptr()) == tied  # tied: the head's rows, no second copy
    assert not [t for t in model.state_dict().values() if t.dtype == torch.float32 and t.shape == embedding.shape]
    assert ("model.embed_tokens.weight" in model.state_dict()) == (not tied)  # nothing of a tied one is stored
    ids = torch.arange(128)
    step = (lookup.weight_scale if tied else embedding.abs().amax(1) / quant.INT8_MAX)[:, None]  # [128, 1]
    assert ((lookup(ids) - embedding).abs() <= step / 2 * (1 + 1e-6)).all()  # within the int8 rounding
    assert model.config._attn_implementation == ROWWISE_ATTENTION


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_each_op_is_row_invariant(arch):
    """RMSNorm, rotary, the SiLU MLP, residual adds and attention: rows together equal rows alone."""
    model = quantized(arch)
    layer, base = model.model.layers[0], model.model
    torch.manual_seed(0)
    x = torch.randn(1, 8, 64) * 3  # [B, n, hidden]
    assert rows_alone_equal(layer.input_layernorm, x)
    assert rows_alone_equal(base.norm, x)
    assert rows_alone_equal(layer.mlp, x)  # gate/up/down Int8Linear and SiLU
    assert rows_alone_equal(lambda h: h + layer.mlp(h), x)  # residual
    assert rows_alone_equal(layer.mlp.act_fn, x)
    positions = torch.arange(20, 28)[None]  # [1, n]: positions after a 20-token context
    cos, sin = base.rotary_emb(x, positions)  # [1, n, head_dim]
    for i in range(8):
        cos_i, sin_i = base.rotary_emb(x[:, i:i + 1], positions[:, i:i + 1])
        assert torch.equal(cos[:, i:i + 1], cos_i) and torch.equal(sin[:, i:i + 1], sin_i)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    q = torch.randn(1, 4, 8, 16)  # [B, H, n, head_dim]
    q_rot, _ = apply_rotary_pos_emb(q, q, cos, sin)
    for i in range(8):
        q_i, _ = apply_rotary_pos_emb(q[:, :, i:i + 1], q[:, :, i:i + 1], cos[:, i:i + 1], sin[:, i:i + 1])
        assert torch.equal(q_rot[:, :, i:i + 1], q_i)


@pytest.mark.parametrize("length", [1, 30, 600])
def test_rowwise_attention_rows_equal_one_token_steps(length):
    torch.manual_seed(length)
    n, heads, kv_heads, dim = 8, 12, 2, 128
    query = torch.randn(1, heads, n, dim)  # [B, H, n, D]
    key, value = torch.randn(2, 1, kv_heads, length + n, dim)  # [B, H_kv, past + n, D]
    module = torch.nn.Module()
    together, _ = rowwise_attention(module, query, key, value, None, scaling=dim ** -0.5)  # [B, n, H, D]
    for i in range(n):
        end = length + i + 1
        step, _ = rowwise_attention(module, query[:, :, i:i + 1].clone(), key[:, :, :end].clone(),
                                    value[:, :, :end].clone(), None, scaling=dim ** -0.5)
        assert torch.equal(together[:, i:i + 1], step)
    causal = torch.ones(n, length + n, dtype=torch.bool).tril(length)[None, None]  # a full mask changes nothing
    assert torch.equal(rowwise_attention(module, query, key, value, causal, scaling=dim ** -0.5)[0], together)


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: rowwise_attention runs sdpa row by row")
@pytest.mark.parametrize("length", [0, 40])
def test_rowwise_attention_in_one_call_is_sdpas_attention_and_padding_takes_sdpa(length, monkeypatch):
    """The compiled call computes each row's causal attention (sdpa's within float rounding); a padding mask sends
    the rows to sdpa, one by one, as before."""
    torch.manual_seed(length)
    n, heads, kv_heads, dim = 5, 12, 2, 128
    query = torch.randn(1, heads, n, dim)
    key, value = torch.randn(2, 1, kv_heads, length + n, dim)
    reference = torch.cat([F.scaled_dot_product_attention(query[:, :, i:i + 1], key[:, :, :length + i + 1],
                                                          value[:, :, :length + i + 1], enable_gqa=True)
                           for i in range(n)], dim=2).transpose(1, 2)  # [B, n, H, D]
    together, _ = rowwise_attention(torch.nn.Module(), query, key, value, None, scaling=dim ** -0.5)
    torch.testing.assert_close(together, reference, rtol=1e-5, atol=1e-5)
    padded = torch.ones(1, 1, n, length + n, dtype=torch.bool).tril(length)
    padded[..., 0] = False  # the first position is padding
    calls = []
    original = native.attend_rows
    monkeypatch.setattr(native, "attend_rows", lambda *args: calls.append(args) or original(*args))
    rowwise_attention(torch.nn.Module(), query, key, value, padded, scaling=dim ** -0.5)
    rowwise_attention(torch.nn.Module(), query, key, value, None, scaling=dim ** -0.5)
    assert len(calls) == 1  # the unpadded call only


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_of_n_tokens_equals_n_one_token_steps(arch):
    assert_n_tokens_are_n_steps(quantized(arch), CONTEXT)


def assert_n_tokens_are_n_steps(model, context: list[int], most: int = 8, vocab: int = 104) -> None:
    """After `context`, one forward of n new tokens equals n one-token steps bitwise, n = 1..most."""
    for n in range(1, most + 1):
        new = [(7 * j + 3) % (vocab - 4) + 4 for j in range(n)]
        batched, stepwise = CachedLM(model), CachedLM(model)
        batched.forward(context)
        stepwise.forward(context)
        together = batched.forward(new, logits_to_keep=n)[0]  # [n, V]
        alone = torch.cat([stepwise.forward([token])[0] for token in new])  # [n, V]
        assert torch.equal(together, alone), f"n={n}"


@pytest.mark.parametrize("hidden, heads, mlp", [(1536, 12, 8960), (896, 14, 4864)])  # Qwen2.5 1.5B, 0.5B
def test_forward_is_row_invariant_at_qwen_widths(hidden, heads, mlp):
    """One layer at the default pair's widths (2 KV heads), 300 tokens cached."""
    from transformers import Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=2, tie_word_embeddings=True)
    model = quantize_int8(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval())
    context = [(7919 * i) % 500 + 5 for i in range(300)]
    new = [(7 * j + 3) % 400 + 4 for j in range(8)]
    batched, stepwise = CachedLM(model), CachedLM(model)
    batched.forward(context)
    stepwise.forward(context)
    assert torch.equal(batched.forward(new, logits_to_keep=8)[0],
                       torch.cat([stepwise.forward([token])[0] for token in new]))


def quantized_pair(arch: str, quantize) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(target, a perturbed copy as draft), both quantized."""
    target = tiny_model(arch, seed=0)
    draft = perturbed_copy(target, noise=0.3)
    return quantize(target), quantize(draft)


def assert_speculative_is_target_alone(target, draft, k: int) -> None:
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=37, eos_token_id=[]).token_ids
    for drafter in (draft, target):  # partial acceptance; everything accepted
        result = speculative_generate(target, drafter, PROMPT, k=k, max_new_tokens=37, eos_token_id=[])
        assert result.token_ids == alone


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    return quantized_pair(request.param, quantize_int8)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_speculative_equals_int8_target_alone(pair, k):
    assert_speculative_is_target_alone(*pair, k)


def test_int8_target_alone_matches_transformers_generate(pair):
    """HF generate reads the prompt in one forward, our loop reads all but its last token first: same rows."""
    target, _ = pair
    ids = torch.tensor([PROMPT])
    expected = target.generate(ids, do_sample=False, max_new_tokens=30, pad_token_id=0, eos_token_id=None,
                               attention_mask=torch.ones_like(ids))[0, len(PROMPT):].tolist()
    assert autoregressive_generate(target, PROMPT, max_new_tokens=30, eos_token_id=[]).token_ids == expected


def near_tie_model(arch: str, quantize=quantize_int8):
    """A quantized model whose head row `b` is row `a` scaled by (1 + 2^-21): wherever a or b leads, the two
    logits differ by ~2^-21 relative, far below float32 rounding noise (trace.ROUNDING_NOISE, 2^-14), or not at
    all where the quantizer rounds both rows alike (4-bit groups, float16 scales). Its input embedding row b is row
    a, so the text goes on alike whichever wins."""
    model = tiny_model(arch, seed=0)
    alone = autoregressive_generate(quantize(copy.deepcopy(model)), PROMPT, max_new_tokens=40,
                                    eos_token_id=[]).token_ids
    a = max(set(alone), key=alone.count)  # the target's most frequent token
    b = next(t for t in range(4, 128) if t not in alone + PROMPT)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[b] = head[a] * (1 + 2 ** -21)
        embedding = model.get_input_embeddings().weight
        if embedding is not head:  # whichever of a and b wins, the next step reads the same row: the ties go on
            embedding[b] = embedding[a]
    return quantize(model), a, b


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_identity_holds_at_a_constructed_near_tie(arch):
    assert_greedy_identity_at_a_near_tie(arch, quantize_int8)


def assert_greedy_identity_at_a_near_tie(arch: str, quantize) -> None:
    """At least 3 genuine near-ties in the target's own output, and speculative output equal to it."""
    target, a, b = near_tie_model(arch, quantize)
    draft = quantize(perturbed_copy(tiny_model(arch, seed=0), noise=0.2))
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=40, eos_token_id=[]).token_ids
    ties = 0
    lm = CachedLM(target)
    lm.forward(PROMPT[:-1])
    for position, token in enumerate(alone):  # every position where a or b won: a genuine near-tie
        logits = lm.forward([(PROMPT + alone)[len(PROMPT) - 1 + position]])[0][0]  # [V]
        if token in (a, b):
            top2 = logits.topk(2)
            assert set(top2.indices.tolist()) == {a, b}
            gap = (top2.values[0] - top2.values[1]).item()
            assert gap < ROUNDING_NOISE["float32"] * top2.values[0].abs().item()
            ties += 1
    assert ties >= 3
    for k in (1, 3, 5, 8):
        for drafter in (draft, target):
            result = speculative_generate(target, drafter, PROMPT, k=k, max_new_tokens=40, eos_token_id=[])
            assert result.token_ids == alone, f"k={k}"


def test_the_near_tie_catches_a_row_coupled_quantizer(monkeypatch):
    """Control: with ONE activation scale per tensor (fbgemm's dynamic int8), a verification row is no longer the
    one-token step, and the same greedy comparison diverges.

    Where the first flip comes depends on the last bits of the float work around the products (norms, attention),
    which differ from CPU to CPU: 40 tokens flipped on one machine and not on another, 80 flip on both."""
    target, _, _ = near_tie_model("llama")  # weights quantized per row before the patch
    draft = quantize_int8(perturbed_copy(tiny_model("llama", seed=0), noise=0.2))

    def per_tensor(x):  # x [M, K] -> one scale for all M rows
        scale = (x.abs().amax() / quant.INT8_MAX).clamp_min(quant.TINY).expand(x.shape[0])  # [M]
        return torch.round(x / scale[:, None]).clamp_(-quant.INT8_MAX, quant.INT8_MAX), scale

    def unfused(x, packed, weight_scale, bias):  # the compiled Linear's one call, through the patched quantizer
        x_q, scale = quant._quantize_rows(x)
        y = quant._native_mm(x_q, packed) * weight_scale * scale[:, None]
        return y if bias is None else y + bias

    monkeypatch.setattr(quant, "_quantize_rows", per_tensor)
    monkeypatch.setattr(quant.native, "linear", unfused)
    rows = CachedLM(target).forward(PROMPT)[0]  # [len(PROMPT), V]: the prompt read at once
    step = CachedLM(target)
    step.forward(PROMPT[:-1])
    assert not torch.equal(rows[-1], step.forward(PROMPT[-1:])[0][-1])  # its last row is not the one-token step
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=80, eos_token_id=[]).token_ids
    diverged = [speculative_generate(target, drafter, PROMPT, k=k, max_new_tokens=80, eos_token_id=[]).token_ids
                != alone for k in (1, 3, 5, 8) for drafter in (draft, target)]
    assert any(diverged)


def test_load_model_int8_and_quant_argument(tmp_path):
    folder = tiny_folder(tmp_path / "tiny", seed=0)
    loaded = load_model(str(folder), quant="int8", device="cpu")
    assert loaded.dtype == "int8" and loaded.quant == "int8"
    assert isinstance(loaded.model.get_output_embeddings(), Int8Linear)
    draft = load_draft(str(folder), loaded, dtype="int8")  # a draft's format is its own: here asked for
    assert draft.dtype == "int8" and isinstance(draft.model.get_output_embeddings(), Int8Linear)
    plain = load_model(str(folder), dtype="float32", device="cpu")
    assert plain.quant == "none"
    with pytest.raises(ValueError, match="quant"):
        load_model(str(folder), quant="int3")
    with pytest.raises(ValueError, match="float32"):
        load_model(str(folder), quant="int8", dtype="bfloat16")

    import argparse
    from specdec.models import add_model_arguments
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert parser.parse_args(["--target", "x", "--quant", "int8"]).quant == "int8"
    assert parser.parse_args(["--target", "x"]).quant == "none"


def test_the_app_runs_the_int8_path_through_its_pool(tmp_path):
    from specdec.dashboard.config import AppConfig
    from specdec.dashboard.hub import ModelHub
    from specdec.models import ModelPool
    folder = str(tiny_folder(tmp_path / "t", seed=0))
    config = AppConfig.from_env({"SPECDEC_DTYPE": "int8"})
    hub = ModelHub(config, ModelPool(budget_bytes=2**30))
    target, draft = hub.pair(folder, folder)
    assert target.dtype == "int8" and draft.dtype == "int8"
    assert any(isinstance(m, Int8Linear) for m in target.model.modules())
    result = speculative_generate(target, draft, "def print the", k=3, max_new_tokens=8, costs=hub.costs(target, draft))
    assert result.token_ids == autoregressive_generate(target, "def print the", max_new_tokens=8).token_ids


def _saturating_mm(x_q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """An int8 GEMM as AVX2 without VNNI computes it: u8 x s8 products summed in pairs with int16 saturation
    (vpmaddubsw), then in int32; the zero point 128 of x + 128 corrected exactly afterwards."""
    weight = weight.long()  # [N, K]
    u = (x_q.long() + 128)  # [M, K] in [1, 255]
    products = u[:, None, :] * weight[None, :, :]  # [M, N, K]
    if products.shape[-1] % 2:
        products = torch.nn.functional.pad(products, (0, 1))
    pairs = products.reshape(*products.shape[:2], -1, 2).sum(-1).clamp(-32768, 32767)  # [M, N, K/2]
    return (pairs.sum(-1) - 128 * weight.sum(1)[None, :]).float()  # [M, N]


@pytest.fixture
def avx2_without_vnni(monkeypatch):
    """This machine's packed kernels replaced by ones that saturate 16-bit pair sums, the exactness probes and the
    kernel choice measured again."""
    for kernel in quant.KERNELS.values():
        unpack = getattr(quant, kernel.unpack)
        monkeypatch.setattr(quant, kernel.mm, lambda x_q, packed, unpack=unpack: _saturating_mm(x_q, unpack(packed)))
    quant.exact_for.cache_clear()
    yield
    quant.exact_for.cache_clear()


def test_a_saturating_kernel_is_measured_inexact_for_8_bit_weights_and_exact_for_7(avx2_without_vnni):
    for kernel in quant.KERNELS:
        assert not quant.exact_for(kernel, 127) and quant.exact_for(kernel, 63)
    assert quant.weight_limit() == 63 and quant.kernel_for((96, 64)) in quant.KERNELS
    assert quant.kernel_path().split("/")[1] == "63"


def test_without_vnni_int8_layers_keep_7_bit_weights_on_the_fast_kernel_row_invariant(avx2_without_vnni):
    torch.manual_seed(0)
    layer = Int8Linear(torch.randn(96, 64), torch.randn(96))
    assert int(layer.int8_weight().abs().max()) == 63 and layer.packed is not None  # packed, never the slow fallback
    x = torch.randn(1, 9, 64) * torch.logspace(-2, 2, 9)[None, :, None]
    assert rows_alone_equal(layer, x)
    fast = layer(x)
    assert torch.equal(fast, without_packed_copy(layer)(x))  # torch._int_mm: the exact sums


def test_a_store_of_8_bit_weights_is_not_run_on_a_kernel_that_sums_them_inexactly(avx2_without_vnni):
    torch.manual_seed(0)
    weight = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
    layer = Int8Linear.from_quantized(weight, torch.ones(32))
    assert layer.packed is None  # |w| up to 127 would saturate: the exact torch._int_mm instead


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_without_vnni_greedy_speculative_output_equals_the_int8_target_alone(avx2_without_vnni, arch):
    target, draft = quantized(arch, seed=0), quantized(arch, seed=1)
    assert all(layer.packed is not None for layer in target.modules() if isinstance(layer, Int8Linear))
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=24)
    for k in (1, 4, 8):
        assert speculative_generate(target, draft, PROMPT, k=k, max_new_tokens=24).token_ids == alone.token_ids
