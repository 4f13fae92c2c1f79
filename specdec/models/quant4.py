"""A 4-bit CPU path in which every row of a forward is computed bitwise as if it were alone (as quant.py's int8).

Why 4 bits: a one-token step reads every weight once, so its time follows the bytes of weights (1.5B target:
6.2 GB in float32, 1.55 GB in int8, about 1 GB here). Why row-invariant: greedy speculative decoding is
lossless only if the verification forward over n tokens gives, row for row, the logits of n one-token steps
(quant.py's docstring). Here:

- `Int4Linear`: W as 4-bit codes per group of GROUP_SIZE inputs, W = (code - 8) * scale + zero with bf16
  scale and zero per (group, output), through torch's int4 CPU kernel (`_weight_int4pack_mm_for_cpu`): x is
  rounded to bf16 element by element, each output is one float32 fused multiply-add chain over the inputs in
  order (the same whatever the number of rows or threads: tests/test_quant4.py checks it, M = 1..9), rounded
  to bf16, then float32 (+ bias). Row i depends on x[i] only. The kernel's float32 input path is scalar
  (30x slower), so bf16 it is (docs/int4.md has the measurements).
- The LM head stays an `Int8Linear` (quant.py): its logits stay float32 instead of being rounded to bf16,
  which would tie near-equal logits.
- The input embedding: tied to the head, quant.py's `Int8Embedding` reading the int8 head's rows in place (no
  second copy); untied, an `Int4Embedding`, codes, scale and offset per group (row = code * scale - offset), each
  looked-up row dequantized alone (an `Int8Embedding` of its own where its width is not whole groups).
- Attention is quant.py's `rowwise_attention`; norms, rotary, activations and residual adds are row-invariant.

Where specdec's compiled product builds (`specdec.models.native`), the model is then run on it
(`rows_on_product`): every Linear of whole groups, the head and the 6-bit layers too (requantized to 4-bit groups),
becomes an `Int4DynamicLinear`, each row quantized to int8 alone, exact integer sums per group, float32 sums over
the groups in one fixed order, no bf16 rounding; attention stays row by row, so a verification row is still bitwise
a one-token step, and 5 rows cost about one step where torch's kernel takes 2.4 (docs/int4.md). The head's largest
logits per row are then recomputed from its int8 rows (`RescoredHead`), which undoes most of what its 4 bits cost
in agreement with the float model. That is the int4 target "auto" weighs against int8.

A draft may run the same layers faster still where rows need not be bitwise one-token steps (a draft's precision
never changes the output): `dynamic_rows(model)` makes the int4 model the int4-dynamic draft, the same layers with
SDPA attention (a one-token step one compiled call per layer), run by the model's own forward
(`specdec.models.int8_forward`).

Two ways in: `quantize_int4(model)` quantizes a float32 model (min/max per group), and `int4_from_gguf(path)`
builds the model from a GGUF one tensor at a time without a float32 copy: a q4_K tensor's codes are taken as
they are (its sub-blocks of 32 are the groups; only scale and zero are rounded to bf16), other types of
fewer than INT4_BELOW_BITS bits per weight (q5_0, q4_0, ...) are dequantized and requantized to 4 bits, and
q6_K, q8_0 and float tensors become Int8Linear. A store (`specdec.models.quant_store`) holds the model in
`stored_form` (on the product where it builds) and `int4_from_state` rebuilds it bit for bit.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, NamedTuple

import gguf
import numpy as np
import torch

from specdec.models import gguf_read, int8_forward, native, quant
from specdec.models.gguf_dequant import dequantize_groups, q4_k_groups
from specdec.models.gguf_read import GGUFWeights, module_name
from specdec.models.quant import Int8Linear, SharedInput

GROUP_SIZE = 32  # inputs per scale and zero: q4_K's sub-block (the kernel takes 32..256 at one speed here)
CODE_MAX = 15  # codes 0..15; the kernel reads them as code - 8
CHUNK_ROWS = 4096  # rows a conversion to groups handles at once (its temporaries then fit the cache)
CODE_OFFSET = 8
OUT_MULTIPLE = 16  # the kernel packs outputs in blocks of 16 (other layers stay int8)
INNER_K_TILES = 1  # argument of the packing op; the CPU layout does not depend on it
ORDER_BLOCK = 64  # rows the packed layout's order is found for, then repeated (`_packed_order`)
INT4_BELOW_BITS = 6  # GGUF types of fewer bits per weight become 4-bit; q6_K (6.6), q8_0 (8.5), floats int8
RESCORED = 4  # a target's largest 4-bit logits per row recomputed from the head's int8 rows (`RescoredHead`)
SCAN_BLOCK = 128  # logits per block whose maximum is taken first when finding a row's largest (`_largest`)
FORMAT = 4  # layout of an int4 store (specdec.models.quant_store); bump on any change
SHARED_SUFFIX = "_int4"  # of the one layer siblings of one input become on the product (q_proj_k_proj_v_proj_int4)


class Int4Groups(NamedTuple):
    """A [rows, cols] weight in 4 bits: row = codes * scale - offset, group by group of GROUP_SIZE columns."""

    codes: torch.Tensor  # [rows, cols] uint8 in 0..15
    scale: torch.Tensor  # [rows, cols / GROUP_SIZE] float32
    offset: torch.Tensor  # [rows, cols / GROUP_SIZE] float32


def groups_from_float(weight: torch.Tensor) -> Int4Groups:
    """[rows, cols] float -> Int4Groups spanning each group's min..max in 16 levels (inside `quant.random_codes`:
    codes drawn for its shape, groups spanning ±sqrt(3 / cols), a float weight's std cols**-0.5)."""
    codes = quant.drawn_codes(tuple(weight.shape), 0, CODE_MAX, torch.uint8)
    if codes is not None:
        rows, cols = weight.shape
        scale = torch.full((rows, cols // GROUP_SIZE), 2 * (3 / cols) ** 0.5 / CODE_MAX)
        return Int4Groups(codes, scale, scale * CODE_MAX / 2)
    if weight.shape[0] > CHUNK_ROWS:  # row by row alike: in chunks, each op's temporaries stay in the cache (2x faster)
        return _by_rows(weight.shape[0], lambda rows: groups_from_float(weight[rows]))
    grouped = weight.detach().float().unflatten(-1, (-1, GROUP_SIZE))  # [rows, cols / G, G]
    low, high = grouped.amin(-1), grouped.amax(-1)  # [rows, cols / G]
    scale = (high - low) / CODE_MAX
    steps = torch.where(scale > 0, scale, 1.0)  # a constant group: every code 0, the value is its offset
    codes = torch.round((grouped - low[..., None]) / steps[..., None]).clamp_(0, CODE_MAX)
    return Int4Groups(codes.to(torch.uint8).flatten(-2), scale, -low)


def four_bit_values(weight: torch.Tensor) -> torch.Tensor:
    """[rows, cols] float -> the float32 values its 4-bit groups (`groups_from_float`) hold: what an int4 model's
    layer multiplies by, but for the 16-bit rounding of each group's scale and offset."""
    return dequantize_groups(*groups_from_float(weight))


def _by_rows(count: int, groups_of: Callable[[slice], Int4Groups]) -> Int4Groups:
    """The groups of `count` rows made CHUNK_ROWS rows at a time (`groups_of(rows)`), joined."""
    return _joined([groups_of(slice(start, start + CHUNK_ROWS)) for start in range(0, count, CHUNK_ROWS)])


def _joined(parts: list[Int4Groups]) -> Int4Groups:
    """Groups of consecutive rows as one: each field concatenated."""
    return Int4Groups(*(torch.cat(field) for field in zip(*parts)))


def groups_from_q4_k(blocks: np.ndarray) -> Int4Groups:
    """A q4_K tensor's bytes [rows, cols / 256 * 144] -> its own codes, with scale d * sc and offset dmin * m
    per sub-block of 32 (float32, exact: fp16 times a 6-bit integer)."""
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K][1]
    parts = q4_k_groups(torch.from_numpy(np.array(blocks).reshape(-1, size)))  # [B, 256], [B, 8], [B, 8]
    return Int4Groups(*(part.reshape(len(blocks), -1) for part in parts))


def fits_int4(out_features: int, in_features: int) -> bool:
    """Whether the kernel takes a [out, in] weight: whole groups of inputs, whole blocks of outputs."""
    return in_features % GROUP_SIZE == 0 and out_features % OUT_MULTIPLE == 0


def packed_layout() -> str:
    """What a store's packed bits depend on besides the weight (`stored_form`): the compiled product's layout where
    it builds here, else torch's kernel's (its CPU capability and torch's version)."""
    if native.library() is not None:
        return "specdec product"
    return f"torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()}"


class Int4Linear(torch.nn.Module):
    """y = x W.T + b with W 4-bit per group (bf16 scale and zero), x rounded to bf16, a fixed float32 sum order
    per output (row-invariant; see the module docstring)."""

    packed: torch.Tensor  # [out, in / 2] uint8 in the kernel's layout (packed_layout())
    scales_and_zeros: torch.Tensor  # [in / GROUP_SIZE, out, 2] bf16: W = (code - 8) * scale + zero
    bias: torch.Tensor | None  # [out] float32

    def __init__(self, groups: Int4Groups, bias: torch.Tensor | None = None):
        super().__init__()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.codes.to(torch.int32), INNER_K_TILES)
        zero = CODE_OFFSET * groups.scale - groups.offset  # (code - 8) * scale + zero = code * scale - offset
        scales_and_zeros = torch.stack([groups.scale, zero], dim=-1).transpose(0, 1)  # [in / G, out, 2]
        self._hold(packed, scales_and_zeros.to(torch.bfloat16).contiguous(), bias)

    @classmethod
    def from_quantized(cls, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
                       bias: torch.Tensor | None = None) -> "Int4Linear":
        """The layer whose `state_dict` holds these, as `cls(groups, bias)` made it, without packing again."""
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._hold(packed, scales_and_zeros, bias)
        return layer

    def _hold(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = packed.shape[0], packed.shape[1] * 2
        self.group_size = self.in_features // scales_and_zeros.shape[0]
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [M, in]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_size,
                                                       self.scales_and_zeros).float()  # [M, out]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"bias={self.bias is not None}")


class Int4DynamicLinear(SharedInput, torch.nn.Module):
    """A 4-bit Linear on specdec's compiled product: the weight's groups as they are (code * scale - offset, scale
    and offset rounded to float16), each row of x quantized to int8 alone, exact integer sums per group, float32
    sums over the groups in one order (`native.linear4`). Rows never meet: row i is bitwise what x[i] alone gives
    (the int4 target's layers, `rows_on_product`, and the int4-dynamic draft's, `dynamic_rows`). Several Linears of
    one input may share it (`Int8Slice`)."""

    direct = True  # `int8_forward` may call its forward without a module call around it

    def __init__(self, groups: Int4Groups, bias: torch.Tensor | None = None):
        super().__init__()
        self._hold(native.pack4(*groups), None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_packed(cls, blocks: torch.Tensor, scales: torch.Tensor, out_features: int,
                    bias: torch.Tensor | None = None) -> "Int4DynamicLinear":
        """The layer whose `state_dict` holds these (a store's, `stored_form`), without packing again."""
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._hold(native.Packed4(blocks, scales, out_features, blocks.shape[1] * 8), bias)
        return layer

    def _hold(self, packed: native.Packed4, bias: torch.Tensor | None) -> None:
        self.packed = packed  # what each call passes the kernel; its tensors are the buffers below (the state_dict's)
        self.out_features, self.in_features = packed.out_features, packed.in_features
        self.weight = torch.empty(self.out_features, self.in_features, dtype=torch.uint8, device="meta")  # a shape
        self.register_buffer("blocks", packed.blocks)
        self.register_buffer("scales", packed.scales)
        self.register_buffer("bias", bias)
        self.share()

    def own_memory(self) -> None:
        """Its buffers copied into memory of its own (out of a store file's mapping), its kernel's arguments with
        them (`specdec.models.quant_store`)."""
        self.blocks, self.scales = self.blocks.clone(), self.scales.clone()
        self.bias = None if self.bias is None else self.bias.clone()
        self.packed = self.packed._replace(blocks=self.blocks, scales=self.scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.float32:  # rows [M, in], as the model's own forward calls it: no reshape
            return native.linear4(x, self.packed, self.bias)  # (a draft step makes ~100 calls; this saves 3% of it)
        y = native.linear4(x.reshape(-1, self.in_features).float(), self.packed, self.bias)  # [M, out]
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def kept_rows(self, rows: torch.Tensor) -> "Int4DynamicLinear":
        """A layer computing only the output rows `rows` [S] of this one, with the same codes, scales and offsets: a
        pruned draft vocabulary's head."""
        codes, scale, offset = native.unpack4(self.packed)
        return Int4DynamicLinear(Int4Groups(codes[rows], scale[rows], offset[rows]),
                                 None if self.bias is None else self.bias[rows])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class RescoredHead(torch.nn.Module):
    """An LM head on the 4-bit product whose largest logits are recomputed from the int8 rows it was made from.

    The head is a step's largest weight and its 4-bit groups (requantized from the GGUF's 6-bit rows) are what most
    often flips the target's near-ties against its float model (top-1 agreement 96.5 % on the held-out suite, 97.8 %
    with this; docs/int4.md). Each row's RESCORED largest 4-bit logits are replaced by exact integer sums of the
    row quantized to int8 with those tokens' int8 rows, so a step still reads the 4-bit head once plus RESCORED int8
    rows. Row i depends on x[i] only, as every layer of the int4 target: its 4-bit logits, its own largest (a max is
    exact in any order), its int8 row and integer sums. The int8 rows are `weight` and `weight_scale`, as an
    Int8Linear head holds them, so a tied embedding reads them in place (`quant.TiedInt8Embedding`). A draft's head
    (`dynamic_rows`) keeps the 4-bit logits as they are (`rescored` 0): a draft's precision never changes the output.
    """

    direct = True  # `int8_forward` may call its forward without a module call around it
    rescored = RESCORED  # logits per row recomputed; 0: the 4-bit product's as they are

    def __init__(self, coarse: Int4DynamicLinear, weight: torch.Tensor, weight_scale: torch.Tensor):
        super().__init__()
        self.coarse = coarse  # the 4-bit head
        self.out_features, self.in_features = coarse.out_features, coarse.in_features
        self.register_buffer("weight", weight)  # [V, H] int8, the rows the 4-bit groups were made from
        self.register_buffer("weight_scale", weight_scale)  # [V] float32: row v = weight[v] * weight_scale[v]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # [M, H]
        logits = self.coarse(rows)  # [M, V]
        if self.rescored:
            top = _largest(logits, self.rescored)  # [M, K]
            codes, scale = quant._quantize_rows(rows)  # [M, H] integers, [M]
            sums = (self.weight[top].int() * codes.int()[:, None, :]).sum(-1)  # [M, K] exact
            exact = sums.float() * self.weight_scale[top] * scale[:, None]
            if self.coarse.bias is not None:
                exact = exact + self.coarse.bias[top]
            logits.scatter_(-1, top, exact)
        return logits.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def kept_rows(self, rows: torch.Tensor) -> Int4DynamicLinear:
        """The 4-bit head of only the output rows `rows` [S]: a pruned draft vocabulary's (a draft rescores nothing)."""
        return self.coarse.kept_rows(rows)


def _largest(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [M, k] of each row's k largest of `logits` [M, V]: the k blocks of SCAN_BLOCK with the largest maxima
    hold them, so only those are searched (a third of `topk`'s time over the whole row here)."""
    rows, width = logits.shape
    padded = torch.nn.functional.pad(logits, (0, -width % SCAN_BLOCK), value=float("-inf"))  # [M, blocks * B]
    blocks = padded.view(rows, -1, SCAN_BLOCK).amax(-1).topk(min(k, padded.shape[1] // SCAN_BLOCK), dim=-1).indices
    index = (blocks[:, :, None] * SCAN_BLOCK + torch.arange(SCAN_BLOCK)).flatten(1)  # [M, k * B]
    best = padded.gather(-1, index).topk(min(k, width), dim=-1).indices  # [M, k]
    return index.gather(-1, best)


def rows_on_product(model: torch.nn.Module) -> torch.nn.Module:
    """The int4 target on specdec's compiled product where it builds here, in place: every Linear of whole groups, the
    head and the GGUF's 6-bit layers too (their int8 weights requantized to 4-bit groups), becomes an
    Int4DynamicLinear (q/k/v and gate/up each one), run by the model's own forward with `rowwise_attention`. Each
    row is quantized to int8 alone, its integer sums are exact, and its float sums over the groups run in one fixed
    order whatever the number of rows (compiled without fused multiply-adds): a verification row is still bitwise a
    one-token step, as on torch's int4 kernel, but 5 rows cost about one step where torch's kernel took 2.4
    (docs/int4.md); the head is a RescoredHead. Where the product is not built, the model stays on torch's kernel.
    Returns `model`."""
    if native.library() is None:
        return model
    return quant._attending(_on_product(model), quant.ROWWISE_ATTENTION, quant.rowwise_attention)


def stored_form(model: torch.nn.Module) -> torch.nn.Module:
    """The form an int4 store holds (`specdec.models.quant_store`), in place: where the compiled product builds, its
    layers as `_on_product` makes them (what `rows_on_product` and `dynamic_rows` run, so a load repacks nothing),
    else torch's kernel's. `packed_layout` names which."""
    return model if native.library() is None else _on_product(model)


def dynamic_rows(model: torch.nn.Module) -> torch.nn.Module:
    """Turn an int4 model (`quantize_int4`, `int4_from_gguf`, `int4_from_state`, `rows_on_product`) into the
    int4-dynamic draft, in place: the same layers as `rows_on_product` makes, with SDPA attention (a one-token step
    one compiled call per layer, `native.draft_layer`). A draft's form, never a target's (SDPA's rows are not
    one-token steps). Its head's logits are the 4-bit product's as they are (`RescoredHead.rescored` 0). RuntimeError
    where the kernel is not built."""
    head = _on_product(model).get_output_embeddings()
    if isinstance(head, RescoredHead):
        head.rescored = 0
    return quant._attending(model, "sdpa", int8_forward.sdpa_attention)


def _on_product(model: torch.nn.Module) -> torch.nn.Module:
    """Every 4-bit or int8 Linear of whole groups as an Int4DynamicLinear, in place: a 4-bit layer's groups as they
    are, an int8 layer's weight requantized to 4-bit groups; siblings of one input (q/k/v, gate/up) as one, read
    through Int8Slices. The head is a step's largest weight (the 0.5B's: 136 MB of int8 against 0.38 GB in all); in 4
    bits a step reads 51 MB less (docs/performance.md), and a RescoredHead keeps its int8 rows for its largest logits
    (read in place by a tied embedding, as before)."""
    head = model.get_output_embeddings()
    if isinstance(head, Int8Linear) and _fits_dynamic(head):
        model.set_output_embeddings(RescoredHead(Int4DynamicLinear(_groups_of(head), head.bias), head.int8_weight(),
                                                 head.weight_scale))
        if getattr(model.get_input_embeddings(), "tied", False):
            quant.set_embedding(model, None)  # the same rows, now the RescoredHead's

    def shared(name: str, modules: list[torch.nn.Module]) -> Int4DynamicLinear:
        parts = [_groups_of(m) for m in modules]
        bias = None if modules[0].bias is None else torch.cat([m.bias for m in modules])
        return Int4DynamicLinear(_joined(parts), bias)

    quant._share_inputs(model, shared, takes=_fits_dynamic, suffix=SHARED_SUFFIX)
    for parent in list(model.modules()):
        for name, module in list(parent.named_children()):
            if _fits_dynamic(module):
                setattr(parent, name, Int4DynamicLinear(_groups_of(module), module.bias))
    _packed_order.cache_clear()  # an index per shape, needed while unpacking only
    return model


def _fits_dynamic(module) -> bool:
    """Whether `module` becomes an Int4DynamicLinear: a 4-bit or int8 Linear of whole groups."""
    return isinstance(module, (Int4Linear, Int8Linear)) and fits_int4(module.out_features, module.in_features)


def _groups_of(layer: torch.nn.Module) -> Int4Groups:
    """An Int4Linear's groups as they are (unpacked from the kernel's layout), or an Int8Linear's weight requantized."""
    if isinstance(layer, Int8Linear):
        codes, scale = layer.int8_weight(), layer.weight_scale  # dequantized a chunk at a time: no whole float copy
        return _by_rows(codes.shape[0], lambda rows: groups_from_float(codes[rows].float() * scale[rows, None]))
    packed = layer.packed.flatten()
    nibbles = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten()  # byte * 2 + high: each code
    codes = nibbles[_packed_order(layer.out_features, layer.in_features)]  # [out * in]
    scale, zero = layer.scales_and_zeros.float().transpose(0, 1).unbind(-1)  # [out, in / G] each
    return Int4Groups(codes.view(layer.out_features, -1), scale, CODE_OFFSET * scale - zero)


@functools.cache
def _packed_order(rows: int, cols: int) -> torch.Tensor:
    """For codes [rows, cols] packed by torch's int4 CPU layout: index [rows * cols] into the packed bytes' nibbles
    (byte * 2 + high) of each code. The layout packs blocks of rows alone (of 32 or 64, by the CPU's vector width), so
    a weight of whole ORDER_BLOCK blocks repeats one block's order, shifted, where two blocks' found order does;
    anything else is found whole (`_found_order`)."""
    block = ORDER_BLOCK
    if rows % block or rows == block:
        return _found_order(rows, cols)
    one, two = _found_order(block, cols), _found_order(2 * block, cols)
    if not torch.equal(two, torch.cat([one, one + block * cols])):
        return _found_order(rows, cols)
    shift = torch.arange(0, rows * cols, block * cols).repeat_interleave(block * cols)  # [rows * cols]
    return one.repeat(rows // block) + shift


def _found_order(rows: int, cols: int) -> torch.Tensor:
    """`_packed_order` found by packing codes that spell out their own position, 4 bits at a time."""
    position = torch.arange(rows * cols, dtype=torch.int64)
    source = torch.zeros(rows * cols, dtype=torch.int64)  # the position whose code each nibble holds
    for shift in range(0, max(position[-1].item(), 1).bit_length(), 4):
        codes = ((position >> shift) & 0x0F).view(rows, cols).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES).flatten().long()
        nibbles = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten()
        source |= nibbles << shift
    order = torch.empty_like(source)
    order[source] = torch.arange(rows * cols)
    return order


class Int4Embedding(torch.nn.Module):
    """An embedding table held as Int4Groups, two codes a byte; each looked-up row is dequantized alone."""

    codes: torch.Tensor  # [num, dim / 2] uint8: column 2j in the low nibble, 2j + 1 in the high one
    scale: torch.Tensor  # [num, dim / GROUP_SIZE] float32
    offset: torch.Tensor  # [num, dim / GROUP_SIZE] float32: row = codes * scale - offset

    def __init__(self, groups: Int4Groups):
        super().__init__()
        codes = groups.codes
        self._hold(codes[:, 0::2] | (codes[:, 1::2] << 4), groups.scale, groups.offset)

    @classmethod
    def from_quantized(cls, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> "Int4Embedding":
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._hold(codes, scale, offset)
        return layer

    def _hold(self, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> None:
        self.num_embeddings, self.embedding_dim = codes.shape[0], codes.shape[1] * 2
        self.register_buffer("codes", codes.contiguous())
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pairs = self.codes[ids]  # [..., dim / 2]
        codes = torch.stack([pairs & 0x0F, pairs >> 4], dim=-1).flatten(-2)  # [..., dim]
        return dequantize_groups(codes, self.scale[ids], self.offset[ids])  # [..., dim] float32

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, group_size={GROUP_SIZE}"


def quantize_int4(model: torch.nn.Module) -> torch.nn.Module:
    """Make a float32 CPU causal LM row-invariant with 4-bit weights, in place, and return it.

    Each Linear whose shape the kernel takes becomes an Int4Linear (min/max per group); the LM head, Conv1Ds and
    other shapes an Int8Linear; the input embedding the int8 head's rows when tied, else an Int4Embedding (its own
    Int8Embedding when its width is not whole groups); attention `rowwise_attention`.
    """
    parameter = next(model.parameters())
    if parameter.dtype != torch.float32 or parameter.device.type != "cpu":
        raise ValueError(f"quantize_int4 takes a float32 CPU model, got {parameter.dtype} on {parameter.device}")
    head = module_name(model, model.get_output_embeddings())

    def layer(name: str, modules: list[torch.nn.Module]) -> torch.nn.Module:
        (module,) = modules
        if name == head or not isinstance(module, torch.nn.Linear) or not fits_int4(*module.weight.shape):
            return Int8Linear.from_module(module)
        return Int4Linear(groups_from_float(module.weight), module.bias)

    embedding, tied = model.get_input_embeddings(), quant.is_tied(model)
    quant._int8_layers(model, layer, share_inputs=False)
    quant.set_embedding(model, None if tied else _own_embedding(
        embedding.embedding_dim, lambda: groups_from_float(embedding.weight), lambda: embedding.weight))
    return model


def _own_embedding(dim: int, groups: Callable[[], Int4Groups], weight: Callable[[], torch.Tensor]) -> torch.nn.Module:
    """An untied embedding of width `dim`: an Int4Embedding of `groups()` when that is whole groups, else an
    Int8Embedding of the float table `weight()`."""
    return Int4Embedding(groups()) if dim % GROUP_SIZE == 0 else quant.Int8Embedding.from_float(weight())


def int4_from_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The model `quantize_int4` or `int4_from_gguf` made, from its `state_dict()` (`state`) and `model`, the same
    architecture built from its config with parameters on the meta device (buffers real); in place, no int4 packing
    (its Int8Linear layers, shells until loaded, are packed once as they are loaded). A missing or unexpected key
    raises."""
    def stored_layer(name: str, modules: list[torch.nn.Module]) -> torch.nn.Module:
        if f"{name}.coarse.blocks" in state:
            return RescoredHead(stored_layer(f"{name}.coarse", modules), state[f"{name}.weight"],
                                state[f"{name}.weight_scale"])
        bias = None if modules[0].bias is None else state[f"{name}.bias"]
        if f"{name}.blocks" in state:
            return Int4DynamicLinear.from_packed(state[f"{name}.blocks"], state[f"{name}.scales"],
                                                 sum(m.out_features for m in modules), bias)
        if f"{name}.packed" in state:
            return Int4Linear.from_quantized(state[f"{name}.packed"], state[f"{name}.scales_and_zeros"], bias)
        return Int8Linear.from_quantized(*quant.on_meta(state[f"{name}.weight"], state[f"{name}.weight_scale"], bias))

    embedding = module_name(model, model.get_input_embeddings())
    shared = quant.stored_shares(model, state, SHARED_SUFFIX)  # the product's form: siblings of one input as one
    quant._share_inputs(model, stored_layer, takes=lambda module: id(module) in shared, suffix=SHARED_SUFFIX)
    quant._int8_layers(model, stored_layer, share_inputs=False)
    own = quant.stored_embedding(state, embedding)
    if f"{embedding}.codes" in state:
        own = Int4Embedding.from_quantized(state[f"{embedding}.codes"], state[f"{embedding}.scale"],
                                           state[f"{embedding}.offset"])
    quant.set_embedding(model, own)
    model.load_state_dict(state, strict=True, assign=True)
    return model


def int4_from_gguf(path: Path) -> tuple[torch.nn.Module, object]:
    """(int4 model in eval mode, tokenizer) of a llama- or qwen2-style GGUF, one tensor at a time, no float32 model
    (`specdec.models.gguf_read`).

    Linears: q4_K codes kept; other types under INT4_BELOW_BITS requantized (Int4Linear); the rest, the head
    and shapes the kernel does not take Int8Linear. The embedding the head's int8 rows when tied (no
    `output.weight`), else an Int4Embedding (q4_K codes kept); norms and biases float32.
    """
    return gguf_read.from_gguf(path, _fill, "int4")


def _fill(model: torch.nn.Module, weights: GGUFWeights) -> None:
    """Replace `model`'s meta Linears and embedding by quantized layers of `weights`, then assign the rest."""
    head = module_name(model, model.get_output_embeddings())
    embedding = module_name(model, model.get_input_embeddings())

    def layer(name: str, modules: list[torch.nn.Module]) -> torch.nn.Module:
        (module,) = modules
        weight = f"{name}.weight"
        bias = None if module.bias is None else weights.float(f"{name}.bias")
        if name != head and weights.bits(weight) < INT4_BELOW_BITS and fits_int4(module.out_features,
                                                                                  module.in_features):
            return Int4Linear(_groups(weights, weight), bias)
        return Int8Linear.from_quantized(*quant.gguf_codes(weights, [weight], quant.weight_limit()), bias)

    dim, table = model.get_input_embeddings().embedding_dim, f"{embedding}.weight"
    quant._int8_layers(model, layer, share_inputs=False)
    quant.set_embedding(model, None if weights.tied else _own_embedding(
        dim, lambda: _groups(weights, table), lambda: weights.float(table)))
    rest = {name: weights.float(name) for name, parameter in model.named_parameters() if parameter.is_meta}
    model.load_state_dict(rest, strict=False, assign=True)


def _groups(weights: GGUFWeights, name: str) -> Int4Groups:
    """Tensor `name` as Int4Groups: a q4_K tensor's own codes (rows in transformers' order), any other
    requantized."""
    if weights.tensors[name].tensor_type != gguf.GGMLQuantizationType.Q4_K:  # CHUNK_ROWS dequantized at a time
        return _joined([groups_from_float(rows) for rows in weights.float_rows(name, CHUNK_ROWS)])
    return groups_from_q4_k(weights.raw(name))
