"""The 4-bit path (specdec.models.quant4) is row-invariant like the int8 one: a verification forward over n tokens
gives, bit for bit, the logits of n one-token steps, so greedy speculative output equals the int4 target alone.
It is built from a float32 model or straight from a GGUF (q4_K codes as they are), and stored bit for bit."""
import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from specdec import autoregressive_generate, speculative_generate
from specdec.core.kv import CachedLM
from specdec.models import cache, formats, gguf_read, load_draft, load_model, native, quant, quant4, quant_store
from specdec.models.gguf_dequant import dequantize_groups
from specdec.models.quant import ROWWISE_ATTENTION, Int8Embedding, Int8Linear
from specdec.models.quant4 import GROUP_SIZE, Int4Embedding, Int4Linear, quantize_int4
from specdec.testing import perturbed_copy, tiny_folder, tiny_model
from test_models_gguf import LAYER_TENSORS, write_tiny_gguf
from test_quant import (CONTEXT, OTHER_LIMIT, PROMPT, assert_greedy_identity_at_a_near_tie, assert_n_tokens_are_n_steps,
                        assert_speculative_is_target_alone, quantized_pair, rows_alone_equal)

Q = gguf.GGMLQuantizationType
KERNEL = torch.ops.aten._weight_int4pack_mm_for_cpu


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


def random_q4_k(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Valid q4_K bytes [rows, cols / 256 * 144]: small fp16 d and dmin, random 6-bit scales, mins and codes."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = rng.uniform(2e-4, 6e-4, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = rng.uniform(5e-4, 2e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def random_q6_k(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Valid q6_K bytes [rows, cols / 256 * 210]: random codes and int8 scales, a small fp16 d last."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = rng.uniform(1e-4, 3e-4, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("out_features, in_features, group", [(48, 64, 32), (208, 256, 64), (1120, 384, 128)])
def test_torch_int4_kernel_gives_each_row_as_if_alone(out_features, in_features, group, threads):
    """The claim the path rests on, checked on this machine: row i of M = 1..9 rows is that row alone, bitwise,
    whatever the thread count (outputs not a multiple of the kernel's 64-wide blocks included)."""
    torch.manual_seed(0)
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, quant4.INNER_K_TILES)
    scales_and_zeros = (torch.randn(in_features // group, out_features, 2) * 0.05).to(torch.bfloat16)
    x = (torch.randn(9, in_features) * torch.logspace(-2, 2, 9)[:, None]).to(torch.bfloat16)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = [KERNEL(x[i:i + 1], packed, group, scales_and_zeros) for i in range(9)]
        for rows in range(1, 10):
            together = KERNEL(x[:rows], packed, group, scales_and_zeros)
            assert all(torch.equal(together[i:i + 1], alone[i]) for i in range(rows)), f"M={rows}"
    finally:
        torch.set_num_threads(previous)
    one_thread = torch.cat(alone)
    weight = (codes.float() - 8) * scales_and_zeros[..., 0].float().repeat_interleave(group, 0).t() \
        + scales_and_zeros[..., 1].float().repeat_interleave(group, 0).t()  # [out, in]: (code - 8) * scale + zero
    torch.testing.assert_close(one_thread.float(), x.float() @ weight.t(), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("shape", [(48, 64), (208, 96), (8960 // 8, 1536 // 4)])
def test_int4_linear_row_i_of_m_rows_is_row_i_alone(shape):
    torch.manual_seed(0)
    weight = torch.randn(shape)
    groups = quant4.groups_from_float(weight)
    layer = Int4Linear(groups, torch.randn(shape[0]))
    for rows in range(1, 10):
        x = torch.randn(1, rows, shape[1]) * torch.logspace(-2, 2, rows)[None, :, None]  # rows of other scales
        assert rows_alone_equal(layer, x)
    x = torch.randn(5, shape[1])
    reference = torch.nn.functional.linear(x, dequantize_groups(*groups), layer.bias)
    assert torch.allclose(layer(x), reference, rtol=0.02, atol=0.02 * reference.abs().max().item())


def test_float_groups_are_within_half_a_step_and_constant_groups_exact():
    torch.manual_seed(0)
    weight = torch.randn(16, 4 * GROUP_SIZE)
    weight[3, :GROUP_SIZE] = 0.25  # a constant group
    groups = quant4.groups_from_float(weight)
    assert groups.codes.dtype == torch.uint8 and int(groups.codes.max()) <= quant4.CODE_MAX
    error = (dequantize_groups(*groups) - weight).abs().unflatten(-1, (-1, GROUP_SIZE)).amax(-1)  # [16, 4]
    assert (error <= groups.scale / 2 * (1 + 1e-5) + 1e-7).all()
    assert torch.equal(dequantize_groups(*groups)[3, :GROUP_SIZE], weight[3, :GROUP_SIZE])


def test_q4_k_codes_scales_and_offsets_are_the_gguf_ones():
    """Dequantized, the groups read from q4_K bytes are bitwise what gguf dequantizes; so is an embedding row."""
    data = random_q4_k(48, 512)
    expected = torch.from_numpy(gguf.quants.dequantize(data, Q.Q4_K))  # [48, 512]
    groups = quant4.groups_from_q4_k(data)
    assert groups.codes.shape == (48, 512) and groups.scale.shape == (48, 512 // GROUP_SIZE)
    assert torch.equal(dequantize_groups(*groups), expected)
    embedding = Int4Embedding(groups)
    ids = torch.tensor([[3, 47, 3, 0]])
    assert torch.equal(embedding(ids), expected[ids])
    layer = Int4Linear(groups)  # scale and zero rounded to bf16: close, not equal
    x = torch.randn(3, 512)
    torch.testing.assert_close(layer(x), x @ expected.t(), rtol=0.02, atol=0.02 * float((x @ expected.t()).abs().max()))


def quantized(arch: str, seed: int = 0, **config) -> torch.nn.Module:
    return quantize_int4(tiny_model(arch, seed, **config))


def on_product(model: torch.nn.Module) -> torch.nn.Module:
    """The int4 target as a load makes it where specdec's compiled product builds."""
    return quant4.rows_on_product(quantize_int4(model))


BUILT = pytest.mark.skipif(native.library() is None, reason="the compiled product is not built here")
FORMS = [pytest.param(quantize_int4, id="torch-kernel"), pytest.param(on_product, id="product", marks=BUILT)]


@pytest.mark.parametrize("tied", [False, True])
def test_linears_become_int4_the_head_int8_and_the_embedding_4_bit_or_the_tied_heads_rows(tied):
    from specdec.testing import tiny_config

    config = tiny_config("qwen2")
    config.tie_word_embeddings = tied
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    embedding = model.get_input_embeddings().weight.detach().clone()
    quantize_int4(model)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    head = model.get_output_embeddings()
    assert isinstance(head, Int8Linear)
    assert sum(isinstance(m, Int4Linear) for m in model.modules()) == 7 * config.num_hidden_layers
    lookup = model.get_input_embeddings()
    ids = torch.tensor([[0, 5, 127]])
    if tied:  # the int8 head's rows, read in place: no 4-bit copy
        assert isinstance(lookup, Int8Embedding) and lookup.weight.data_ptr() == head.weight.data_ptr()
        assert torch.equal(lookup(ids), head.weight[ids].float() * head.weight_scale[ids][..., None])
        assert not [name for name in model.state_dict() if name.startswith("model.embed_tokens")]
    else:
        assert isinstance(lookup, Int4Embedding)
        assert torch.equal(lookup(ids), dequantize_groups(*quant4.groups_from_float(embedding))[ids])
    assert model.config._attn_implementation == ROWWISE_ATTENTION
    with pytest.raises(ValueError, match="float32 CPU"):
        quantize_int4(tiny_model("qwen2").to(torch.bfloat16))


@pytest.mark.skipif(native.library() is None, reason="the compiled product is not built here")
@pytest.mark.parametrize("tied", [False, True])
def test_the_int4_dynamic_draft_reads_its_head_in_4_bits_and_a_tied_embedding_keeps_the_int8_rows(tied):
    """The head is a draft step's largest weight: it becomes 4-bit groups like every other Linear, its logits the
    4-bit product's as they are (a draft rescores nothing), within 4-bit rounding of the int8 head's; a tied
    embedding reads the int8 head's rows (bit for bit), which the head keeps."""
    from specdec.testing import tiny_config

    config = tiny_config("qwen2")
    config.tie_word_embeddings = tied
    model = quantize_int4(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval())
    int8_head, ids = model.get_output_embeddings(), torch.tensor([[0, 5, 127]])
    rows = model.get_input_embeddings()(ids)
    hidden = torch.randn(3, config.hidden_size)
    int8_logits = int8_head(hidden)
    quant4.dynamic_rows(model)
    head = model.get_output_embeddings()
    assert isinstance(head, quant4.RescoredHead) and head.rescored == 0
    assert torch.equal(head(hidden), head.coarse(hidden))
    assert float((head(hidden) - int8_logits).norm() / int8_logits.norm()) < 0.1
    assert torch.equal(model.get_input_embeddings()(ids), rows)
    assert getattr(model.get_input_embeddings(), "tied", False) == tied  # the head's own rows, not a second copy


@pytest.mark.skipif(native.library() is None, reason="the compiled product is not built here")
@pytest.mark.parametrize("tied", [False, True])
def test_the_int4_targets_head_takes_its_largest_logits_from_the_int8_rows_bit_for_bit(tied):
    """Each row's RESCORED largest 4-bit logits become the int8 head's own logits (the same exact sums, bit for bit),
    the others stay the 4-bit product's; a row is the same alone as among 1..9 rows."""
    from specdec.testing import tiny_config

    config = tiny_config("qwen2")
    config.tie_word_embeddings = tied
    model = quantize_int4(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval())
    hidden = torch.randn(9, config.hidden_size) * 4
    int8_logits = model.get_output_embeddings()(hidden)
    quant4.rows_on_product(model)
    head = model.get_output_embeddings()
    assert isinstance(head, quant4.RescoredHead) and head.rescored == quant4.RESCORED
    logits, coarse = head(hidden), head.coarse(hidden)
    top = coarse.topk(quant4.RESCORED, dim=-1).indices
    assert torch.equal(logits.gather(-1, top), int8_logits.gather(-1, top))
    others = torch.ones_like(logits, dtype=torch.bool).scatter_(-1, top, False)
    assert torch.equal(logits[others], coarse[others])
    for rows in range(1, 10):
        assert torch.equal(head(hidden[:rows]), logits[:rows])
    assert torch.equal(head(hidden[4:5]), logits[4:5])


@pytest.mark.skipif(native.library() is None, reason="the compiled product is not built here")
def test_the_kernel_table_of_an_int4_target_names_its_mlp_and_its_head_apart(capsys):
    """`profile --kernels` times the widest layer as "MLP" and the head as "LM head": a rescored head's 4-bit layer
    is the head's, even where the vocabulary is wider than the MLP."""
    from specdec.cli.profile import print_kernels
    from specdec.testing import tiny_config

    config = tiny_config("qwen2")
    config.vocab_size = 512  # wider than gate/up joined (2 x 128)
    model = quant4.rows_on_product(quantize_int4(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()))
    print_kernels(model)
    out = capsys.readouterr().out
    assert f"MLP      [{2 * config.intermediate_size}, {config.hidden_size}]" in out
    assert f"LM head  [{config.vocab_size}, {config.hidden_size}]" in out


def test_a_rows_largest_logits_are_found_through_the_largest_blocks():
    logits = torch.randn(3, 1000)
    logits[1, 998] = 50.0  # in the last, partial block
    logits[2, :] = 1.0
    logits[2, 77] = 2.0
    for k in (1, 4, 9):
        found = quant4._largest(logits, k)
        assert found.shape == (3, k)
        assert torch.equal(logits.gather(-1, found).sort(-1).values, logits.topk(k, dim=-1).values.sort(-1).values)
    assert int(quant4._largest(logits, 1)[1, 0]) == 998 and int(quant4._largest(logits, 1)[2, 0]) == 77


@pytest.mark.skipif(native.library() is None, reason="the compiled product is not built here")
def test_a_4_bit_layer_unpacks_to_its_groups_and_keeps_rows_bit_for_bit():
    groups = quant4.groups_from_float(torch.randn(40, 96))
    packed = native.pack4(*groups)
    codes, scale, offset = native.unpack4(packed)
    again = native.pack4(codes, scale, offset)
    assert torch.equal(again.blocks, packed.blocks) and torch.equal(again.scales, packed.scales)
    assert torch.equal(codes, groups.codes.to(codes.dtype))
    layer = quant4.Int4DynamicLinear(groups, torch.randn(40))
    rows, x = torch.tensor([3, 17, 39, 0]), torch.randn(2, 96)
    assert torch.equal(layer.kept_rows(rows)(x), layer(x)[:, rows])


@pytest.mark.parametrize("rows", [16, 64, 80, 192])
def test_torch_int4_layers_unpack_to_their_own_codes(rows):
    """The packed layout's order, repeated block by block where the weight is whole blocks, gives back every code."""
    groups = quant4.groups_from_float(torch.randn(rows, 96))
    layer = quant4.Int4Linear(groups)
    assert torch.equal(quant4._groups_of(layer).codes, groups.codes)
    assert torch.equal(quant4._packed_order(rows, 96), quant4._found_order(rows, 96))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int4_forward_of_n_tokens_equals_n_one_token_steps(arch, form):
    assert_n_tokens_are_n_steps(form(tiny_model(arch, 0)), CONTEXT, most=9, vocab=128)


@BUILT
def test_the_int4_target_on_the_product_is_the_drafts_layers_with_attention_row_by_row():
    model = on_product(tiny_model("qwen2", 0))
    layers = [m for m in model.modules() if isinstance(m, (Int4Linear, quant4.Int4DynamicLinear, Int8Linear))]
    assert {type(m) for m in layers} == {quant4.Int4DynamicLinear}  # the head too: float32 logits, no bf16
    assert model.config._attn_implementation == ROWWISE_ATTENTION and formats.format_of(model) == "int4"
    plan = CachedLM(model).plan
    assert plan is not None and not plan.fused  # its own forward, never the draft's one-call step
    draft = quant4.dynamic_rows(model)  # the draft's form made from it: the same layers, SDPA
    assert formats.format_of(draft) == "int4-dynamic" and CachedLM(draft).plan.fused


@pytest.mark.parametrize("form", FORMS)
def test_int4_forward_is_row_invariant_at_the_target_widths(form):
    """One layer at Qwen2.5 1.5B's widths (2 KV heads), 30 tokens cached (long caches: tests/test_quant.py)."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=1536, intermediate_size=8960, num_hidden_layers=1,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)
    model = form(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval())
    context = [(7919 * i) % 500 + 5 for i in range(30)]
    assert_n_tokens_are_n_steps(model, context, most=9, vocab=512)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_speculative_equals_int4_target_alone(arch, form):
    target, draft = quantized_pair(arch, form)
    for k in (1, 3, 5, 8):
        assert_speculative_is_target_alone(target, draft, k)


@pytest.mark.parametrize("form", FORMS)
def test_greedy_identity_holds_at_a_constructed_near_tie(form):
    assert_greedy_identity_at_a_near_tie("qwen2", form)


def test_a_row_coupled_int4_linear_breaks_the_identity(monkeypatch):
    """Control: an Int4Linear whose rows share one input scale (max over all rows, as per-tensor schemes do)
    gives the tests above something to catch."""
    target, draft = quantized("llama"), quantize_int4(perturbed_copy(tiny_model("llama", seed=0), noise=0.2))
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=40, eos_token_id=[]).token_ids
    forward = Int4Linear.forward

    def coupled(self, x):  # rounds every row to the bf16 grid of the largest row: row i depends on the others
        step = x.abs().amax() * 2 ** -7
        return forward(self, torch.round(x / step) * step)

    monkeypatch.setattr(Int4Linear, "forward", coupled)
    rows = torch.randn(1, 6, 64) * torch.logspace(-2, 1, 6)[None, :, None]  # [1, n, hidden] of other scales
    assert not rows_alone_equal(target.model.layers[0].mlp, rows)
    diverged = [speculative_generate(target, d, PROMPT, k=k, max_new_tokens=40, eos_token_id=[]).token_ids != alone
                for k in (1, 3, 5, 8) for d in (draft, target)]
    assert any(diverged)


def no_rebuild(monkeypatch):
    """Make building an int4 model fail: a load from the store must need neither a GGUF nor a float32 pass."""
    def refuse(*args, **kwargs):
        raise AssertionError("a load from the int4 store built the model again")

    from specdec.models import loading
    monkeypatch.setattr(loading, "_from_folder", refuse)
    monkeypatch.setattr(quant4, "quantize_int4", refuse)
    monkeypatch.setattr(quant4, "int4_from_gguf", refuse)
    if native.library() is not None:  # the store holds the product's form: a load packs nothing again either
        monkeypatch.setattr(native, "pack4", refuse)


IDS = torch.tensor([PROMPT])  # [1, 7]
FOLDER_IDS = torch.tensor([[1, 5, 9, 13, 7, 4, 8, 6, 12]])  # within a tiny folder's 19-word vocabulary


def test_a_folder_loads_as_int4_then_from_its_store_bit_for_bit(tmp_path, monkeypatch):
    folder = tiny_folder(tmp_path / "tiny", seed=0)
    first = load_model(str(folder), quant="int4")
    assert (first.source, first.dtype, first.quant, first.path) == ("folder", "int4", "int4", folder)
    store = quant_store.store_folder(folder, quant_store.INT4)
    assert cache.is_ready(store) and store != quant_store.store_folder(folder)  # not the int8 copy's folder
    with monkeypatch.context() as patch:
        no_rebuild(patch)
        stored = load_model(str(folder), quant="int4")
    assert stored.source == "cache (int4)"
    assert {k: v for k, v in stored.model.state_dict().items()}.keys() == first.model.state_dict().keys()
    assert all(torch.equal(v, first.model.state_dict()[k]) for k, v in stored.model.state_dict().items())
    assert torch.equal(stored.model(FOLDER_IDS).logits, first.model(FOLDER_IDS).logits)
    again = formats.to_format(load_model(str(folder), dtype="float32").model, "int4")  # on the product where built
    assert torch.equal(stored.model(FOLDER_IDS).logits, again(FOLDER_IDS).logits)
    draft = load_draft(str(folder), load_model(str(folder), quant="int8"), dtype="int4")  # an int8 target's draft
    assert draft.dtype == "int4" and formats.format_of(draft.model) == "int4"
    assert load_model(str(folder), dtype="int4").source == "cache (int4)"  # dtype int4 = quant int4
    with monkeypatch.context() as patch:  # the int4-dynamic draft: the same store, on the compiled product
        no_rebuild(patch)
        dynamic = load_draft(str(folder), stored, dtype="int4-dynamic")
    assert (dynamic.dtype, dynamic.source) == ("int4-dynamic", "cache (int4)")
    assert formats.format_of(dynamic.model) == "int4-dynamic" and CachedLM(dynamic.model).plan is not None
    assert "int4-dynamic" in formats.candidates("cpu", "draft") and "int4-dynamic" not in formats.candidates(
        "cpu", "target")  # a draft's form
    logits, expected = dynamic.model(FOLDER_IDS).logits, stored.model(FOLDER_IDS).logits
    assert float((logits - expected).norm() / expected.norm()) < 0.05  # the same 4-bit weights, rows in int8
    alone = autoregressive_generate(stored.model, FOLDER_IDS, max_new_tokens=16, eos_token_id=[])
    result = speculative_generate(stored.model, dynamic, FOLDER_IDS, k=4, max_new_tokens=16, eos_token_id=[])
    assert result.token_ids == alone.token_ids
    with pytest.raises(ValueError, match="quantizes float32"):
        load_model(str(folder), quant="int4", dtype="bfloat16")
    with pytest.raises(ValueError, match="CPU only"):
        load_model(str(folder), dtype="int4", device="cuda")
    with monkeypatch.context() as patch:  # where the compiled product cannot be built: one line, before any load
        patch.setattr(native, "library", lambda: None)
        assert "int4-dynamic" not in formats.candidates("cpu", "draft")
        with pytest.raises(ValueError, match="cannot be built here"):
            load_draft(str(folder), stored, dtype="int4-dynamic")


@pytest.mark.parametrize("module, name, value, reason", [
    (quant4, "packed_layout", "torch 0.0 OTHER", "it changed since its int4 copy was made"),  # the 4-bit packing
    (quant, "weight_limit", OTHER_LIMIT, f"its int4 copy holds weights up to {quant.weight_limit()}"),  # its int8
])  # head's fast kernel
def test_a_store_for_another_kernel_is_made_again(tmp_path, monkeypatch, capsys, module, name, value, reason):
    folder = tiny_folder(tmp_path / "tiny", seed=0)
    load_model(str(folder), quant="int4")
    monkeypatch.setattr(module, name, lambda: value)
    capsys.readouterr()
    remade = load_model(str(folder), quant="int4")
    assert remade.source == "folder" and reason in capsys.readouterr().err
    assert load_model(str(folder), quant="int4").source == "cache (int4)"


# A tiny llama GGUF with the default target's mix of types, at widths whole in q4_K's 256-wide blocks.
GGUF_TYPES = {"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q5_0, "attn_output": Q.Q8_0, "ffn_gate": Q.Q4_K,
              "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K, "token_embd": Q.Q4_K, "output": Q.Q6_K}


def encode(name: str, array: np.ndarray):
    """(bytes, type) of a GGUF tensor: q4_K / q6_K random valid blocks, q5_0 / q8_0 quantized by gguf."""
    kind = next((kind for part, kind in GGUF_TYPES.items() if f"{part}.weight" in name), None)
    if kind == Q.Q4_K:
        return random_q4_k(*array.shape, seed=len(name)), kind
    if kind == Q.Q6_K:
        return random_q6_k(*array.shape, seed=len(name)), kind
    if kind is not None:
        return gguf.quants.quantize(array, kind), kind
    return array, None


@pytest.fixture
def tiny_q4_k_gguf(tmp_path):
    model = tiny_model("llama", 0, vocab_size=300, hidden=256)
    path = tmp_path / "weights" / "tiny-q4.gguf"
    path.parent.mkdir()
    write_tiny_gguf(path, model, encode)
    return path


def test_a_gguf_becomes_int4_without_a_float32_copy_and_loads_back_bit_for_bit(tiny_q4_k_gguf, monkeypatch):
    path = tiny_q4_k_gguf
    first = load_model(str(path), quant="int4")
    assert (first.source, first.dtype, first.path, first.name) == ("gguf", "int4", path, "tiny-q4")
    assert not list((cache.root() / "converted").glob("*/float32"))  # no float32 copy on disk
    reference = load_model(str(path), dtype="float32").model  # transformers' dequantization of the same file
    built, _ = quant4.int4_from_gguf(path)  # as stored: its layers before they run on the compiled product
    layers = dict(built.named_modules())
    for name, module in reference.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        kind = GGUF_TYPES["output" if name == "lm_head" else LAYER_TENSORS[name.split(".", 3)[3]]]
        layer, weight = layers[name], module.weight.detach()
        if kind in (Q.Q6_K, Q.Q8_0):  # int8 of the dequantized weight, bit for bit as quantize_int8 makes it
            assert isinstance(layer, Int8Linear) and torch.equal(layer.int8_weight(), Int8Linear(weight).int8_weight())
            continue
        assert isinstance(layer, Int4Linear), name
        x = torch.randn(4, weight.shape[1])
        reference_y = x @ weight.t()
        tolerance = (0.01 if kind == Q.Q4_K else 0.1) * float(reference_y.abs().max())  # q5_0 is requantized
        torch.testing.assert_close(layer(x), reference_y, rtol=0, atol=tolerance)  # rows in llama's order
    ids = torch.tensor([[0, 5, 299, 17]])
    assert isinstance(first.model.get_input_embeddings(), Int4Embedding)
    assert torch.equal(first.model.get_input_embeddings()(ids), reference.get_input_embeddings()(ids))  # q4_K exact
    logits, expected = built(IDS).logits, reference(IDS).logits
    rms = lambda t: t.pow(2).mean().sqrt()  # noqa: E731 (the largest of 1200 errors swings with the int8 layers' range)
    assert rms(logits - expected) < 0.1 * rms(expected)
    assert torch.equal(first.model(IDS).logits, quant4.rows_on_product(built)(IDS).logits)  # as loaded
    assert_n_tokens_are_n_steps(first.model, CONTEXT, most=9, vocab=300)
    with monkeypatch.context() as patch:
        no_rebuild(patch)
        stored = load_model(str(path), quant="int4")
    assert stored.source == "cache (int4)" and stored.path == path
    assert all(torch.equal(v, first.model.state_dict()[k]) for k, v in stored.model.state_dict().items())
    assert stored.model.state_dict().keys() == first.model.state_dict().keys()
    assert torch.equal(stored.model(IDS).logits, first.model(IDS).logits)
    assert stored.tokenizer("the in").input_ids == first.tokenizer("the in").input_ids
    alone = autoregressive_generate(stored.model, PROMPT, max_new_tokens=20, eos_token_id=[]).token_ids
    for k in (1, 4):
        assert speculative_generate(stored.model, first.model, PROMPT, k=k, max_new_tokens=20,
                                    eos_token_id=[]).token_ids == alone


def test_a_gguf_of_another_architecture_is_one_clear_line(tmp_path, monkeypatch):
    from transformers.modeling_gguf_pytorch_utils import GPT2TensorProcessor

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_model("llama", 0, vocab_size=300))
    monkeypatch.setitem(gguf_read.TENSOR_PROCESSORS, "llama", GPT2TensorProcessor)  # as if it needed another fix
    with pytest.raises(ValueError, match="llama- and qwen2-style GGUFs") as error:
        load_model(str(path), quant="int4")
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="not found"):
        load_model(str(tmp_path / "missing.gguf"), quant="int4")


def test_the_app_runs_the_int4_path_through_its_pool(tmp_path):
    from specdec.dashboard.config import AppConfig
    from specdec.dashboard.hub import ModelHub
    from specdec.models import ModelPool
    folder = str(tiny_folder(tmp_path / "t", seed=0))
    hub = ModelHub(AppConfig.from_env({"SPECDEC_DTYPE": "int4"}), ModelPool(budget_bytes=2**30))
    target, draft = hub.pair(folder, folder)
    assert target.dtype == "int4" and draft.dtype == "int4" and formats.format_of(target.model) == "int4"
    result = speculative_generate(target, draft, "def print the", k=3, max_new_tokens=8, costs=hub.costs(target, draft))
    assert result.token_ids == autoregressive_generate(target, "def print the", max_new_tokens=8).token_ids
