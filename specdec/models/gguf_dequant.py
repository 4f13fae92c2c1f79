"""GGUF tensors dequantized in torch, bit for bit as `gguf.quants.dequantize` gives them, on every thread.

The gguf package dequantizes in numpy on one thread: most of the time a model takes to be built from a GGUF. Here
the types of the catalogue's GGUFs (q4_K, q5_0, q6_K, q8_0, f16, bf16, f32: `BLOCKS`) are a few torch ops over many
blocks at once, in gguf's float32 order of operations: a sub-block's scale is one rounded product (d * sc), each
value code * scale (- offset), each its own rounding, never a fused multiply-add. A tensor goes chunk by chunk of
CHUNK_WEIGHTS into one float32 result, so the temporaries (uint8 codes, a few bytes a weight) stay small. Other
types go through gguf's numpy.
"""
from __future__ import annotations

from typing import Callable

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
CHUNK_WEIGHTS = 1 << 22  # weights dequantized at a time: temporaries of a few bytes each, few thread joins
Q4_K_SCALES = slice(4, 16)  # a q4_K block: d, dmin (fp16), 12 bytes of 6-bit scales and mins, 128 of 4-bit codes
Q6_K_CODES, Q6_K_HIGH, Q6_K_SCALES, Q6_K_D = slice(0, 128), slice(128, 192), slice(192, 208), slice(208, 210)
Q5_0_D, Q5_0_HIGH, Q5_0_CODES = slice(0, 2), slice(2, 6), slice(6, 22)  # fp16 d, 32 fifth bits, 32 nibbles


def dequantize_groups(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """codes [..., K] integers, scale and offset [..., K / G] float32 -> [..., K] float32 (into `out` if given):
    code * scale - offset per group of G, in gguf's order of operations (so bitwise as gguf dequantizes)."""
    values = torch.empty(codes.shape, dtype=torch.float32) if out is None else out
    grouped = values.copy_(codes).unflatten(-1, (scale.shape[-1], -1))  # [..., K / G, G]
    grouped.mul_(scale[..., None])
    if offset is not None:
        grouped.sub_(offset[..., None])
    return values


def q4_k_groups(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q4_K blocks [B, 144] uint8 -> their codes [B, 256] uint8 in 0..15, scale d * sc and offset dmin * m
    [B, 8] float32 per sub-block of 32."""
    sc, m = (torch.from_numpy(part) for part in gguf.quants.Q4_K.get_scale_min(blocks[:, Q4_K_SCALES].numpy()))
    scale, offset = _half(blocks[:, 0:2]) * sc.float(), _half(blocks[:, 2:4]) * m.float()  # [B, 8] each
    codes = _fields(blocks[:, Q4_K_SCALES.stop:].unflatten(1, (4, 32)), 4)  # [B, 4, 2, 32]: low nibbles, high ones
    return codes.flatten(1), scale, offset


def _q4_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    dequantize_groups(*q4_k_groups(blocks), out=out)


def _q6_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """q6_K blocks [B, 210] -> out [B, 256]: (d * scale) * (6-bit code - 32), an int8 scale per 16 values."""
    low = _fields(blocks[:, Q6_K_CODES].unflatten(1, (2, 64)), 4).flatten(1)  # [B, 256]: 2 halves x 2 nibbles x 64
    high = _fields(blocks[:, Q6_K_HIGH].unflatten(1, (2, 32)), 2).flatten(1)  # [B, 256]: 2 halves x 4 x 32
    codes = (low | high << 4).view(torch.int8) - 32  # [B, 256] in -32..31
    scale = _half(blocks[:, Q6_K_D]) * blocks[:, Q6_K_SCALES].view(torch.int8).float()  # [B, 16]
    dequantize_groups(codes, scale, out=out)


def _q5_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """q5_0 blocks [B, 22] -> out [B, 32]: d * (5-bit code - 16); value i's fifth bit is bit i of the 32-bit word."""
    low = _fields(blocks[:, Q5_0_CODES], 4).flatten(1)  # [B, 32]: the low nibbles (values 0-15), then the high ones
    high = _fields(blocks[:, Q5_0_HIGH], 1).transpose(1, 2).flatten(1)  # [B, 32]: byte j's bit b is value 8j + b
    codes = (low | high << 4).view(torch.int8) - 16  # [B, 32] in -16..15
    dequantize_groups(codes, _half(blocks[:, Q5_0_D]), out=out)


def _q8_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """q8_0 blocks [B, 34] -> out [B, 32]: int8 code * d."""
    dequantize_groups(blocks[:, 2:].view(torch.int8), _half(blocks[:, 0:2]), out=out)


def _f16(blocks: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(_half(blocks))


def _bf16(blocks: torch.Tensor, out: torch.Tensor) -> None:
    out.view(torch.int32).copy_(blocks.view(torch.int16)).bitwise_left_shift_(16)  # the high half of a float32


def _f32(blocks: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(blocks.view(torch.float32))


BLOCKS: dict[Q, Callable[[torch.Tensor, torch.Tensor], None]] = {  # blocks -> out, in place
    Q.Q4_K: _q4_k, Q.Q5_0: _q5_0, Q.Q6_K: _q6_k, Q.Q8_0: _q8_0, Q.F16: _f16, Q.BF16: _bf16, Q.F32: _f32}


def dequantize(data: np.ndarray, kind: Q) -> torch.Tensor:
    """`gguf.quants.dequantize(data, kind)` as a new float32 tensor, bit for bit: data as a GGUFReader gives it
    ([..., bytes] uint8 for a quantized type); in torch for the types of BLOCKS, by gguf's numpy for the others."""
    fill = BLOCKS.get(kind)
    if fill is None:
        return torch.from_numpy(gguf.quants.dequantize(data, kind))
    size, type_size = gguf.GGML_QUANT_SIZES[kind]
    raw = np.ascontiguousarray(data).view(np.uint8)  # [..., bytes]
    blocks = raw.reshape(-1, type_size)  # [B, type_size]
    out = torch.empty(len(blocks), size, dtype=torch.float32)  # [B, size]
    step = max(1, CHUNK_WEIGHTS // size)
    for start in range(0, len(blocks), step):
        fill(torch.from_numpy(blocks[start:start + step].copy()), out[start:start + step])  # a writable copy
    return out.reshape(gguf.quants.quant_shape_from_byte_shape(raw.shape, kind))


def _half(pairs: torch.Tensor) -> torch.Tensor:
    """[..., 2n] uint8, fp16 values' bytes -> [..., n] float32, exact, NaNs with numpy's bits (torch's conversion
    gives its own)."""
    halves = pairs.view(torch.int16)
    values = halves.view(torch.float16).float()
    nan = values.isnan()
    if nan.any():  # numpy: sign, all-ones exponent, the 10-bit payload shifted up
        bits = (halves.int() & 0x8000) << 16 | 0x7F800000 | (halves.int() & 0x3FF) << 13
        values = torch.where(nan, bits.view(torch.float32), values)
    return values


def _fields(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., n] uint8 -> [..., 8 / bits, n] uint8: each byte's fields of `bits` bits, the lowest first."""
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)[:, None]  # [8 / bits, 1]
    return packed.unsqueeze(-2) >> shifts & (1 << bits) - 1
