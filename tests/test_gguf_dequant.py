"""GGUF tensors dequantized in torch (`specdec.models.gguf_dequant`): bit for bit `gguf.quants.dequantize`, for
every type done in torch, across chunks, through the fallback to gguf's numpy and through GGUFWeights."""
import gguf
import numpy as np
import pytest
import torch

from specdec.models import gguf_dequant, gguf_read
from test_quant_gguf import mixed_gguf

Q = gguf.GGMLQuantizationType
HALVES = {Q.Q4_K: (0, 2), Q.Q5_0: (0,), Q.Q6_K: (208,), Q.Q8_0: (0,)}  # where a block's fp16 scales (d, dmin) start
SPECIAL_HALVES = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF]  # zeros, subnormals, extremes
SHAPES = [(1, 1), (3, 2), (700, 3)]  # (rows, blocks a row): one block, a few, many rows


def finite_halves(rng: np.random.Generator, count: int) -> np.ndarray:
    """[count, 2] uint8: fp16 values of random bits, none inf or NaN, the special ones first."""
    bits = rng.integers(0, 1 << 16, count, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0x83FF  # an all-ones exponent cleared: a subnormal or zero
    bits[:len(SPECIAL_HALVES)] = SPECIAL_HALVES[:count]
    return bits.view(np.uint8).reshape(count, 2)


def random_tensor(kind: Q, rows: int, per_row: int, seed: int = 0) -> np.ndarray:
    """A tensor of `kind` as a GGUFReader gives it: random bytes, fp16 scales finite; f32 / f16 arrays of values."""
    rng = np.random.default_rng(seed)
    size, type_size = gguf.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, (rows * per_row, type_size), dtype=np.uint8)
    for start in HALVES.get(kind, ()):
        blocks[:, start:start + 2] = finite_halves(rng, len(blocks))
    if kind == Q.F16:
        blocks = finite_halves(rng, len(blocks))
    return blocks.reshape(rows, -1).view({Q.F32: np.float32, Q.F16: np.float16}.get(kind, np.uint8))


def assert_bitwise(values: torch.Tensor, expected: np.ndarray) -> None:
    assert values.dtype == torch.float32 and values.shape == expected.shape
    assert torch.equal(values.view(torch.int32), torch.from_numpy(np.ascontiguousarray(expected)).view(torch.int32))


@pytest.mark.parametrize("kind", list(gguf_dequant.BLOCKS))
@pytest.mark.parametrize("rows, per_row", SHAPES)
def test_each_type_done_in_torch_is_bitwise_gguf(kind, rows, per_row):
    data = random_tensor(kind, rows, per_row, seed=rows)
    assert_bitwise(gguf_dequant.dequantize(data, kind), gguf.quants.dequantize(data, kind))


@pytest.mark.parametrize("kind", list(gguf_dequant.BLOCKS))
def test_chunks_that_split_rows_give_the_same_bits(kind, monkeypatch):
    """Chunks of a few blocks, not whole rows, the last one partial: still gguf's values, in place."""
    data = random_tensor(kind, 37, 3)
    monkeypatch.setattr(gguf_dequant, "CHUNK_WEIGHTS", 5 * gguf.GGML_QUANT_SIZES[kind][0])  # 111 blocks: 23 chunks
    assert_bitwise(gguf_dequant.dequantize(data, kind), gguf.quants.dequantize(data, kind))


@pytest.mark.parametrize("kind, dtype", [(Q.F16, np.float16), (Q.BF16, np.uint8)])
def test_every_16_bit_float_infinities_and_nans_included_is_bitwise_gguf(kind, dtype):
    data = np.arange(1 << 16, dtype=np.uint16).view(dtype)  # [65536] or [131072] bytes
    assert_bitwise(gguf_dequant.dequantize(data, kind), gguf.quants.dequantize(data, kind))


def test_a_one_dimensional_f32_tensor_is_a_copy_of_its_values():
    data = np.random.default_rng(0).standard_normal(300).astype(np.float32)  # a norm's weight
    values = gguf_dequant.dequantize(data, Q.F32)
    assert_bitwise(values, data)
    values[0] = 7.0
    assert data[0] != 7.0


def test_types_not_done_in_torch_go_through_gguf_numpy_and_the_others_do_not(monkeypatch):
    numpy_dequantize, calls = gguf.quants.dequantize, []

    def spy(data, kind):
        calls.append(kind)
        return numpy_dequantize(data, kind)

    monkeypatch.setattr(gguf.quants, "dequantize", spy)
    data = gguf.quants.quantize(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), Q.Q5_1)
    assert Q.Q5_1 not in gguf_dequant.BLOCKS
    assert_bitwise(gguf_dequant.dequantize(data, Q.Q5_1), numpy_dequantize(data, Q.Q5_1))
    gguf_dequant.dequantize(random_tensor(Q.Q4_K, 2, 1), Q.Q4_K)
    assert calls == [Q.Q5_1]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # llama: q/k rows reordered
def test_gguf_weights_give_each_tensor_as_gguf_numpy_did(tmp_path, arch):
    """Every tensor of a tiny GGUF of q4_K, q5_0, q8_0, q6_K and f32 comes out of GGUFWeights as gguf's numpy
    dequantization with its rows in transformers' order gave it."""
    compared = {}

    def fill(model, weights):
        for name, tensor in weights.tensors.items():
            expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)[weights.rows(name)]
            assert_bitwise(weights.float(name), expected)
            compared[name] = tensor.tensor_type

    gguf_read.from_gguf(mixed_gguf(tmp_path, arch), fill, "int8")
    assert {Q.Q4_K, Q.Q5_0, Q.Q6_K, Q.Q8_0, Q.F32} <= set(compared.values())
    assert "model.layers.0.self_attn.q_proj.weight" in compared
