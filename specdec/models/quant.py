"""An int8 CPU path in which every row of a forward is computed bitwise as if it were alone.

Why: greedy speculative decoding is lossless only if the target's verification forward over n tokens
gives, row for row, the logits that n one-token steps give. In float32 and bf16 it does not (a GEMM of
M rows sums in another order than a GEMV), so a near-tie can flip the argmax. Here each op is made
row-invariant instead (kernel measurements: docs/performance.md):

- `Int8Linear`: weights int8 per output channel (scale = max|w_row| / W, W = `weight_limit()`), activations int8 per ROW
  (per token: scale = max|x_row| / 127), integer GEMM with int32 sums (exact in any order: `torch._int_mm`,
  or a packed kernel, fbgemm, oneDNN or the one compiled here (`specdec.models.native`), fed integers it
  cannot rescale), then y = sums * w_scale[None, :] * x_scale[:, None] (+ bias) elementwise. Row i depends on
  x[i] only. (One activation scale per tensor, as fbgemm's dynamic quantization does by itself, couples the rows.)
  W is 127 where a packed kernel sums 8-bit weights exactly (VNNI's 32-bit sums; on AVX2 the compiled kernel's
  |x| times w with x's sign), and 63 where the only fast ones sum pairs of u8 x s8 products in 16 bits (fbgemm
  on AVX2 without VNNI and without a C compiler: 2·255·127 saturates, 2·255·63 = 32130 fits): measured on the
  machine at load, never read off CPU flags, so the fast kernel is always an exact one; of the exact ones, the
  fastest on this machine's timing for each weight shape
  (`kernel_for`: oneDNN's cost grows less with the rows where it has int8 matrix units). A layer a packed kernel
  computes holds only its packed copy (one byte a weight in memory); its int8 weight, for a store or the
  int8-dynamic form, is recovered from that copy bit for bit.
- `rowwise_attention`: each query row attends to its own causal slice of keys/values with the same SDPA
  call a one-token step makes, so a verification row is the one-token step's row.
- `Int8Embedding`: the input embedding as int8 rows with a float32 scale each, each looked-up row dequantized
  alone. Tied to the head (one matrix in the float model: `TiedInt8Embedding`), it reads the head's int8 rows and
  scales in place, the head keeping them beside its packed copy: no third copy in memory, none in a store;
  untied, its own rows, per-row scale max|row| / 127.
- RMSNorm (a reduction inside each row), rotary (elementwise), SiLU and residual adds are row-invariant as they
  are (tests/test_quant.py checks each and the whole forward, n = 1..8).

So greedy speculative output with an int8 target equals that int8 target alone, by construction. The
int8 target is a different target from the float32 one: report which one a run verifies against.

Three ways in: `quantize_int8(model)` quantizes a float32 model; `int8_from_gguf(path)` makes the same model, bit
for bit, straight from a GGUF one tensor at a time (no float32 copy); `int8_from_state` rebuilds a stored one
(`specdec.models.quant_store`).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.pytorch_utils import Conv1D

from specdec.core import files, hardware
from specdec.core.kv import DECODER_FLAG, LEAF_ROWS_FLAG
from specdec.core.timing import Timer, interleaved
from specdec.models import cache, gguf_read, int8_forward, native
from specdec.models.gguf_read import GGUFWeights

ROWWISE_ATTENTION = "specdec_rowwise"  # name of rowwise_attention in transformers' attention interface
INT8_MAX = 127  # symmetric range [-127, 127]: -128 is never used, so negation is exact
WEIGHT_LIMITS = (INT8_MAX, 63)  # weight ranges tried, widest first: 63 keeps 16-bit pair sums of u8 x s8 exact
PACKED_MIN_ROWS = 1  # rows from which the packed kernel runs instead of torch._int_mm (all: it is faster)
TINY = torch.finfo(torch.float32).tiny  # scale of an all-zero row (its quantized values are all 0)
BLOCK_BYTES = 1 << 20  # float32 rows of a weight quantized at a time (2.7x faster here than a whole weight at once)
PACK_IN_FLIGHT = 4  # weights waiting for their packing at most, inside `packing_in_parallel` (bounds memory)


def _quantize_rows(x: torch.Tensor, limit: int = INT8_MAX) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 -> (integers in [-limit, limit] as float32 [M, K], scale [M]) with x ≈ q * scale[:, None].

    Row i depends on x[i] only (a max, a division and a rounding per element)."""
    scale = (x.abs().amax(dim=1) / limit).clamp_min(TINY)  # [M]
    return torch.round(x / scale[:, None]).clamp_(-limit, limit), scale


def _int_mm(x_q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Integer rows [M, K] (float32) times int8 weight [N, K] transposed: the exact sums as float32 [M, N]."""
    return torch._int_mm(x_q.to(torch.int8), weight.t()).float()


def _pack(weight: torch.Tensor):
    """fbgemm's prepacked form of an int8 weight [N, K] with unit scales (the real scales are applied after)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated, the kernel behind it is not
        quantized = torch._make_per_channel_quantized_tensor(
            weight, torch.ones(weight.shape[0], dtype=torch.float64), torch.zeros(weight.shape[0], dtype=torch.long), 0)
    return torch.ops.quantized.linear_prepack(quantized, None)


def _fbgemm_mm(x_q: torch.Tensor, packed) -> torch.Tensor:
    """As _int_mm, through fbgemm's dynamic int8 Linear.

    fbgemm quantizes its input with ONE scale per tensor from the min and max; a sentinel row holding -127.5
    and 127.5 makes that scale exactly 1 and the zero point 128, so the integers pass through unchanged
    (x + 128 in [1, 255]) and the int32 sums come out exact (checked by `exact_for` on this machine).
    """
    padded = torch.cat([x_q, _sentinel(x_q.shape[1])])  # [M + 1, K]
    return torch.ops.quantized.linear_dynamic(padded, packed, False)[:-1]  # [M, N]


def _fbgemm_unpack(packed) -> torch.Tensor:
    return torch.ops.quantized.linear_unpack(packed)[0].int_repr()  # [N, K] int8


@functools.cache
def _sentinel(width: int) -> torch.Tensor:
    """[1, width]: -127.5, 127.5, then zeros (see _fbgemm_mm)."""
    with torch.inference_mode(False):
        row = torch.zeros(1, width)
        row[0, :2] = torch.tensor([-INT8_MAX - 0.5, INT8_MAX + 0.5])
    return row


def _onednn_pack(weight: torch.Tensor):
    """oneDNN's prepacked form of an int8 weight [N, K] (an opaque [K, N] tensor)."""
    return torch.ops.onednn.qlinear_prepack(weight, None)


def _onednn_mm(x_q: torch.Tensor, packed) -> torch.Tensor:
    """As _int_mm, through oneDNN's int8 Linear: the integers shifted into u8 (x + 128 in [1, 255], zero point
    128), every scale 1, so the int32 sums come out exact as float32 (checked by `exact_for` on this machine)."""
    scales, zero_points = _unit_scales(packed.shape[1])
    shifted = (x_q + 128).to(torch.uint8)  # [M, K]
    return torch.ops.onednn.qlinear_pointwise(shifted, 1.0, 128, packed, scales, zero_points, None, 1.0, 0,
                                              torch.float32, "none", [], "")  # [M, N]


def _onednn_unpack(packed) -> torch.Tensor:
    return packed.to_dense().t().contiguous()  # [N, K] int8


@functools.cache
def _unit_scales(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([width] float32 ones, [width] int64 zeros): a weight's scales and zero points left at 1 and 0."""
    with torch.inference_mode(False):
        return torch.ones(width), torch.zeros(width, dtype=torch.long)


class Kernel(NamedTuple):
    """An int8 product computed from a weight packed once, exact int32 sums where `exact_for` says so: the names of
    its module functions, looked up when called (`_part`)."""

    pack: str  # int8 weight [N, K] -> the kernel's packed copy
    mm: str  # (integer rows [M, K] float32, packed copy) -> exact sums [M, N] float32
    unpack: str  # packed copy -> the int8 weight [N, K], bit for bit


_native_pack, _native_mm, _native_unpack = native.pack, native.mm, native.unpack  # the kernel compiled here
KERNELS = {"fbgemm": Kernel("_pack", "_fbgemm_mm", "_fbgemm_unpack"),
           "onednn": Kernel("_onednn_pack", "_onednn_mm", "_onednn_unpack"),
           "native": Kernel("_native_pack", "_native_mm", "_native_unpack")}  # the packed kernels, timed where exact
PROBE_ROWS = (1, 5)  # rows each weight shape's kernels are timed at: a one-token step, a verification of 4 drafts
PROBE_REPEATS = 7  # timed products per kernel and row count, interleaved; the fastest kept
PROBE_OUT_MAX = 16384  # outputs of the probe weight at most (a head's 151936 rows time in proportion)
PROBE_BYTES = 32 << 20  # int8 weight bytes one probe timing reads at least, in two or more distinct copies ...
PROBE_COPIES_MAX = 64  # ... and at most this many (a tiny weight's probe needs no more)
KERNEL_METHOD = 2  # bump when what `_fastest` measures changes (2: weights read from memory)


def _part(kernel: str, part: str) -> Callable:
    """The function `part` ("pack", "mm" or "unpack") of KERNELS[kernel]."""
    return globals()[getattr(KERNELS[kernel], part)]


def _packed_mm(kernel: str, x_q: torch.Tensor, packed) -> torch.Tensor:
    """The exact sums [M, N] of integer rows x_q [M, K] and a weight `kernel` packed."""
    return _part(kernel, "mm")(x_q, packed)


@functools.cache
def exact_for(kernel: str, limit: int) -> bool:
    """Whether `kernel` gives the exact integer sums here for weights in [-limit, limit], on random and extreme
    operands, for 1, 5 and 9 rows (int32 VNNI sums: any limit; pairs summed in int16, as fbgemm on AVX2 without
    VNNI: 63 but not 127)."""
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randint(-limit, limit + 1, (64, 256), dtype=torch.int8, generator=generator)
        weight[:8], weight[8:16] = limit, -limit  # worst cases for 16-bit pair sums
        x_q = torch.randint(-INT8_MAX, INT8_MAX + 1, (9, 256), generator=generator).float()
        x_q[0], x_q[1] = INT8_MAX, -INT8_MAX
        packed = _part(kernel, "pack")(weight)
        return all(torch.equal(_packed_mm(kernel, x_q[:m], packed), _int_mm(x_q[:m], weight)) for m in (1, 5, 9))
    except (RuntimeError, AttributeError, NotImplementedError):  # a build without that kernel
        return False


def weight_limit() -> int:
    """The widest weight range of WEIGHT_LIMITS whose sums some packed kernel computes exactly on this machine
    (measured), so every product takes a fast kernel; INT8_MAX when none does (then torch._int_mm, exact and slow,
    does the sums)."""
    return next((limit for limit in WEIGHT_LIMITS if any(exact_for(k, limit) for k in KERNELS)), INT8_MAX)


def exact_kernels() -> list[str]:
    """The packed kernels (KERNELS) whose sums are exact here for `weight_limit()` weights, measured."""
    return [kernel for kernel in KERNELS if exact_for(kernel, weight_limit())]


_CHOSEN: dict[str, str] = {}  # "out x in" -> the kernel chosen for weights of that shape (this process's copy)


def kernel_for(shape: tuple[int, int]) -> str | None:
    """The packed kernel an int8 weight of `shape` [out, in] runs on here: of `exact_kernels()`, the fastest on this
    machine at PROBE_ROWS rows (timed once per shape and machine, `_fastest`, and cached with the machine's
    description); None where none is exact (torch._int_mm). Every one gives the same exact sums, so which one runs
    never changes a bit."""
    exact = exact_kernels()
    if len(exact) < 2:
        return exact[0] if exact else None
    name = f"{shape[0]}x{shape[1]}"
    if not _CHOSEN:
        _CHOSEN.update(_read_choices())
    if _CHOSEN.get(name) not in exact:
        for pending in getattr(_PACKING, "pending", ()):  # packing under way would slow the timings down
            pending.result()
        _CHOSEN[name] = _fastest(exact, shape)
        files.write_text(_choices_path(), json.dumps(_CHOSEN, indent=1, sort_keys=True))
    return _CHOSEN[name]


def forget_kernel_choices() -> None:
    """Time every shape's kernels again when next packed (`--recalibrate`)."""
    _CHOSEN.clear()
    _choices_path().unlink(missing_ok=True)


def kernel_path() -> str:
    """What an int8 product runs here, for cache keys: the exact packed kernels (the fastest of them per shape,
    `kernel_for`; torch._int_mm where none is), the weight range, and the build of the kernel compiled here with the
    row counts timed for it on this machine (`native.timed_rows`)."""
    built = f"/{native.build_key()}/{native.timed_rows()}" if "native" in exact_kernels() else ""
    return f"{'+'.join(exact_kernels()) or 'int_mm'}/{weight_limit()}{built}"


def _fastest(kernels: list[str], shape: tuple[int, int]) -> str:
    """The kernel of `kernels` with the least time over PROBE_ROWS rows on random codes of `shape` (its outputs
    capped at PROBE_OUT_MAX: a product's time grows in proportion beyond), timings interleaved, fastest kept. Each
    timing runs through two or more distinct packed copies (PROBE_BYTES at least, PROBE_COPIES_MAX at most), as a
    forward reads one weight after another (one weight read again and again times another race: the two kernels
    came out even on it, and the choice flipped from run to run)."""
    generator = torch.Generator().manual_seed(0)
    probe = (min(shape[0], PROBE_OUT_MAX), shape[1])
    weight = torch.randint(-weight_limit(), weight_limit() + 1, probe, dtype=torch.int8, generator=generator)
    copies = min(max(-(-PROBE_BYTES // weight.numel()), 2), PROBE_COPIES_MAX)
    with ThreadPoolExecutor(max(torch.get_num_threads(), 1)) as pool:  # a kernel packs one weight on one thread
        packed = {kernel: list(pool.map(lambda _, pack=_part(kernel, "pack"): pack(weight), range(copies)))
                  for kernel in kernels}
    rows = {m: torch.randint(-INT8_MAX, INT8_MAX + 1, (m, shape[1]), generator=generator).float()
            for m in PROBE_ROWS}

    def seconds(kernel: str, m: int) -> float:
        with Timer("cpu") as timer:
            for copy in packed[kernel]:
                _packed_mm(kernel, rows[m], copy)
        return timer.seconds

    for kernel in kernels:
        for m in PROBE_ROWS:
            seconds(kernel, m)  # warm-up: a kernel's first call at a row count sets it up
    samples = interleaved({(k, m): functools.partial(seconds, k, m) for k in kernels for m in PROBE_ROWS},
                          PROBE_REPEATS)
    return min(kernels, key=lambda k: sum(min(samples[(k, m)]) for m in PROBE_ROWS))


def _choices_path() -> Path:
    about = {**hardware.describe("cpu"), "kernels": kernel_path(), "method": KERNEL_METHOD}  # the native build too
    return cache.root() / "costs" / f"int8-kernels-{files.json_key(about)}.json"


def _read_choices() -> dict[str, str]:
    try:
        data = json.loads(_choices_path().read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measured again
    return {k: v for k, v in data.items() if isinstance(k, str) and v in KERNELS} if isinstance(data, dict) else {}


_PACKING = threading.local()  # .pool, .pending: where `Int8Linear._take` packs inside `packing_in_parallel`


@contextlib.contextmanager
def packing_in_parallel():
    """Inside: each int8 layer's packed copy is made on a pool of torch's CPU threads while the next layer is
    read (a kernel packs one weight on one thread), every one done when the block ends; at most PACK_IN_FLIGHT
    weights wait. Nested blocks pack on the outermost one's pool."""
    if getattr(_PACKING, "pool", None) is not None:
        yield
        return
    with ThreadPoolExecutor(max(torch.get_num_threads(), 1)) as pool:
        _PACKING.pool, _PACKING.pending = pool, collections.deque()
        try:
            yield
            while _PACKING.pending:
                _PACKING.pending.popleft().result()
        finally:
            _PACKING.pool = None


def _packed_soon(pack, *args) -> None:
    """pack(*args) now, or on `packing_in_parallel`'s pool inside one (waiting while PACK_IN_FLIGHT are pending)."""
    pool = getattr(_PACKING, "pool", None)
    if pool is None:
        pack(*args)
        return
    _PACKING.pending.append(pool.submit(pack, *args))
    while len(_PACKING.pending) > PACK_IN_FLIGHT:
        _PACKING.pending.popleft().result()


def _same_sums(kernel: str, packed, weight: torch.Tensor) -> bool:
    """Whether `kernel`'s and torch._int_mm's sums agree for this weight on two probe rows (extreme, random)."""
    generator = torch.Generator().manual_seed(0)
    x_q = torch.randint(-INT8_MAX, INT8_MAX + 1, (2, weight.shape[1]), generator=generator).float()
    x_q[0] = INT8_MAX
    return torch.equal(_packed_mm(kernel, x_q, packed), _int_mm(x_q, weight))


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (int8 [out, in] in [-W, W], float32 scale [out]), W = `weight_limit()`, row by row."""
    return _row_codes(weight, weight_limit())


_RANDOM = threading.local()  # .generator: inside `random_codes`, where codes are drawn instead of quantized
DRAWN_PERIOD = 65521  # codes drawn per weight inside `random_codes`, repeated (a prime: rows do not line up)


@contextlib.contextmanager
def random_codes(seed: int = 0):
    """Within, int8 and 4-bit weights are codes drawn at random for each weight's shape instead of quantized from its
    values, scaled as a float weight of std in**-0.5 (what `specdec.models.formats` draws): a model that times as
    the quantized one (timings depend on shapes, not values), made without a pass over every float weight."""
    _RANDOM.generator = torch.Generator().manual_seed(seed)
    try:
        yield
    finally:
        _RANDOM.generator = None


def drawn_codes(shape: tuple[int, int], low: int, high: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Codes in low..high of `shape` drawn inside `random_codes` (None outside: quantize the weight): DRAWN_PERIOD
    codes drawn, repeated to fill the shape (a kernel's time does not depend on the values; drawing every code
    took seconds per model)."""
    generator = getattr(_RANDOM, "generator", None)
    if generator is None:
        return None
    return repeated(lambda count: torch.randint(low, high + 1, (count,), generator=generator, dtype=dtype), shape)


def repeated(draw: Callable[[int], torch.Tensor], shape) -> torch.Tensor:
    """A tensor of `shape` holding draw(count)'s values over and over, count = DRAWN_PERIOD at most (drawn values
    for a weight whose values no timing depends on)."""
    count = torch.Size(shape).numel()
    period = draw(min(count, DRAWN_PERIOD))  # [period] 1-d
    return period.repeat(-(-count // len(period)))[:count].view(shape)


def _row_codes(weight: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] float -> (int8 [M, K] in [-limit, limit], float32 scale [M]): quantized row by row (`_quantize_rows`),
    or drawn inside `random_codes` (uniform codes of std limit/sqrt(3), the scale giving std K**-0.5)."""
    codes = drawn_codes(tuple(weight.shape), -limit, limit, torch.int8)
    if codes is None:
        return _quantized_blocks(weight.detach().float(), limit)
    return codes, torch.full(weight.shape[:1], (3 / weight.shape[1]) ** 0.5 / limit)


def _quantized_blocks(weight: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`_quantize_rows` of [M, K] float32 `weight` as int8, BLOCK_BYTES of its rows at a time: the same rows (each
    row depends on itself alone), made where the temporaries stay in cache (one pass over a whole weight
    makes and reads several weight-sized ones)."""
    step = block_rows(weight.shape[1])
    return _quantized_chunks((weight[start:start + step] for start in range(0, weight.shape[0], step)),
                             tuple(weight.shape), limit)


def block_rows(width: int) -> int:
    """Rows of float32 [*, width] quantized at a time: BLOCK_BYTES of them."""
    return max(1, BLOCK_BYTES // (4 * width))


def _quantized_chunks(chunks: Iterable[torch.Tensor], shape: tuple[int, int],
                      limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [M, K], scale [M]) of a weight of `shape` whose float32 rows arrive as `chunks` [r, K], in order,
    each quantized row by row as it arrives (`_quantize_rows`)."""
    codes, scales = torch.empty(shape, dtype=torch.int8), torch.empty(shape[0])
    start = 0
    for chunk in chunks:
        rows = slice(start, start + chunk.shape[0])
        codes[rows], scales[rows] = _quantize_rows(chunk, limit)
        start = rows.stop
    if start != shape[0]:
        raise ValueError(f"{start} rows arrived for a weight of {shape[0]}")
    return codes, scales


_KEPT = [0]  # depth of `weights_kept`: above 0, layers keep their int8 weight beside the packed copy
_UNPACKED = [0]  # depth of `weights_kept(packed=False)`: above 0, layers make no row-invariant packed copy


@contextlib.contextmanager
def weights_kept(packed: bool = True):
    """Within, int8 layers made or coupled keep their int8 weight beside their packed copy, so what reads the
    weights next (a store's state_dict, `couple_rows`) takes them as they are instead of unpacking every layer again
    (about as slow as packing); `release_weights(model)` drops them after. Nested, the outermost one's release
    counts (an inner release keeps them for what the outer one still reads). packed=False: no row-invariant
    packed copy is made within, at all (a model about to be coupled: `couple_rows` packs its own)."""
    _KEPT[0] += 1
    _UNPACKED[0] += not packed
    try:
        yield
    finally:
        _KEPT[0] -= 1
        _UNPACKED[0] -= not packed


def release_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Drop the int8 weights kept within `weights_kept` wherever a packed copy computes every product (not inside
    another `weights_kept`: that one's caller releases them, `Int8Linear.release_weight`)."""
    for module in model.modules():
        if isinstance(module, Int8Linear):
            module.release_weight()
    return model


class Int8Linear(torch.nn.Module):
    """y = x W.T + b with W int8 per output channel (|w| <= weight_limit()), x int8 per row, exact integer sums
    (row-invariant).

    A packed kernel (`kernel_for`: fbgemm, oneDNN or the one compiled here, the fastest exact one here for the
    shape) or torch._int_mm (PACKED_MIN_ROWS) give the same exact sums, then the same y = (sums * w_scale) * x_scale
    + b, so which kernel ran never changes a bit.

    Where the packed kernel computes every product, its packed copy is the only one in memory: `weight` is then a
    meta tensor of the int8 weight's shape and dtype, and `int8_weight()` recovers the weight bit for bit from the
    packed copy (for `state_dict`, `couple_rows` and the torch._int_mm fallback), so the state_dict is the same
    either way.
    """

    direct = True  # `int8_forward` may call its forward without a module call around it
    weight: torch.Tensor  # [out, in] int8 (a buffer: `.weight.shape` still reads as a Linear's; meta when packed)
    weight_scale: torch.Tensor  # [out] float32: W ≈ weight * weight_scale[:, None]
    bias: torch.Tensor | None  # [out] float32

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self._hold(*quantize_weight(weight), bias)

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> "Int8Linear":
        """From a torch Linear (any subclass) or a transformers Conv1D (whose weight is [in, out])."""
        weight = module.weight.t() if isinstance(module, Conv1D) else module.weight
        return cls(weight, module.bias)

    @classmethod
    def from_quantized(cls, weight: torch.Tensor, weight_scale: torch.Tensor,
                       bias: torch.Tensor | None = None) -> "Int8Linear":
        """The layer whose `state_dict` holds these (int8 weight [out, in], float32 weight_scale [out], bias [out]),
        as `cls(w, b)` made it, without quantizing again. Meta tensors make a shell that `load_state_dict` fills."""
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._hold(weight, weight_scale, bias)
        return layer

    def _hold(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Register the quantized weight and its scales and bias, and the packed kernel's copy where it is exact."""
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.coupled = None  # fbgemm's dynamic-quantization copy, once `couple_rows` made the layer a draft's
        self.keeps_weight = False  # whether `weight` stays in memory beside a packed copy (`keep_weight`)
        self._take(weight)

    def _take(self, weight: torch.Tensor) -> None:
        """Hold int8 `weight` [out, in] as the packed kernel's copy where that is exact, and the weight itself only
        where a product or a reader still needs it (a meta weight: a shell, nothing packed until loaded); inside
        `packing_in_parallel`, packed on its pool."""
        self.register_buffer("weight", weight)
        self.packed, self.kernel = None, None  # the packed copy and the KERNELS entry that made it
        kernel = kernel_for(tuple(weight.shape)) if not weight.is_meta and not _UNPACKED[0] else None  # this thread
        _packed_soon(self._pack_weight, weight, kernel)

    def _pack_weight(self, weight: torch.Tensor, kernel: str | None) -> None:
        if kernel is not None and weight.numel() and int(weight.abs().max()) > weight_limit():
            kernel = None  # a stored weight wider than this machine's kernels sum exactly
        packed = _part(kernel, "pack")(weight) if kernel is not None else None
        if packed is not None and not _same_sums(kernel, packed, weight):
            kernel, packed = None, None  # never seen; a kernel path for this shape that is not exact falls back
        self.packed, self.kernel = packed, kernel
        self.release_weight()

    def _drops_weight(self) -> bool:
        """Whether the int8 weight need not stay in memory: a packed copy computes every product, no reader wants it."""
        packed = self.coupled is not None or (self.packed is not None and PACKED_MIN_ROWS <= 1)
        return packed and not self.keeps_weight

    def release_weight(self) -> None:
        """Drop the int8 weight where `_drops_weight` says it may go, unless inside `weights_kept` (the one place
        that rule is applied: packing, coupling and `release_weights` all come here)."""
        if _KEPT[0] == 0 and self._drops_weight():
            self.weight = self.weight.to("meta")

    def int8_weight(self) -> torch.Tensor:
        """The int8 weight [out, in]: the one held, or recovered bit for bit from the packed copy that replaced it."""
        if not self.weight.is_meta or (self.coupled is None and self.packed is None):
            return self.weight  # held (a shell's is meta until loaded)
        if self.coupled is not None:
            return _fbgemm_unpack(self.coupled)
        return _part(self.kernel, "unpack")(self.packed)

    def keep_weight(self) -> None:
        """Hold the int8 weight in memory from now on, whatever kernel runs: an LM head's rows are read (a tied
        embedding's lookups, and the values of `get_output_embeddings().weight` that callers read)."""
        self.keeps_weight = True
        self.register_buffer("weight", self.int8_weight())

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.int8_weight()  # the int8 weight, held or recovered from the packed copy

    def _load_from_state_dict(self, state_dict, prefix, *args) -> None:
        """As any module's, then the loaded int8 weight packed (and dropped where its kernel computes every product)."""
        super()._load_from_state_dict(state_dict, prefix, *args)
        if prefix + "weight" in state_dict:
            self._take(state_dict[prefix + "weight"])

    def couple_rows(self) -> None:
        """Run as fbgemm's dynamic int8 Linear: the weight packed with its scales and bias, one activation scale per
        tensor (see `couple_rows` below: a draft's form, rows not independent). The 7-bit activations of
        `reduce_range` where this machine's fbgemm does not sum 8-bit weights exactly (16-bit pair sums). The
        coupled copy is then the only one (the int8 weight, recovered from it, is kept only where `keep_weight`)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            weight = torch._make_per_channel_quantized_tensor(
                self.int8_weight(), self.weight_scale.double(), torch.zeros(self.out_features, dtype=torch.long), 0)
        bias = None if self.bias is None else self.bias.clone()  # the packed copy holds it: never a store file's view
        self.coupled = torch.ops.quantized.linear_prepack(weight, bias)
        self.reduce_range = not exact_for("fbgemm", INT8_MAX)
        self.packed, self.kernel = None, None  # the row-invariant copy is not used any more
        self.release_weight()

    def kept_rows(self, rows: torch.Tensor) -> "Int8Linear":
        """A layer computing only the output rows `rows` [S] of this one, with the same int8 weights and scales, in
        this layer's form (coupled where this one is): a pruned draft vocabulary's head."""
        bias = None if self.bias is None else self.bias[rows]
        with weights_kept(packed=self.coupled is None):  # a coupled layer's row-invariant copy would go unused
            kept = Int8Linear.from_quantized(self.int8_weight()[rows], self.weight_scale[rows], bias)
            if self.coupled is not None:
                kept.couple_rows()
        kept.release_weight()
        return kept

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._rows(x.reshape(-1, self.in_features).float())  # [M, out], M = tokens
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The layer of float32 rows [M, in]: [M, out]."""
        if self.coupled is not None:
            return torch.ops.quantized.linear_dynamic(rows, self.coupled, self.reduce_range)
        if isinstance(self.packed, native.Packed) and rows.shape[0] >= PACKED_MIN_ROWS:  # the same bits, one call
            return native.linear(rows, self.packed, self.weight_scale, self.bias)
        x_q, x_scale = _quantize_rows(rows)
        if self.packed is not None and rows.shape[0] >= PACKED_MIN_ROWS:
            sums = _packed_mm(self.kernel, x_q, self.packed)  # [M, out]
        else:
            sums = _int_mm(x_q, self.int8_weight())  # [M, out]
        y = sums * self.weight_scale * x_scale[:, None]  # [M, out]
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8Embedding(torch.nn.Module):
    """An embedding table as int8 rows and a float32 scale per row: row i = weight[i] * weight_scale[i], each
    looked-up row dequantized alone (row-invariant). A tied one (`TiedInt8Embedding`) reads the int8 head's rows."""

    tied = False  # whether the rows are a tied head's
    weight: torch.Tensor  # [num, dim] int8
    weight_scale: torch.Tensor  # [num] float32

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "Int8Embedding":
        """Its own int8 copy of a float table [num, dim], row by row in [-127, 127] (no kernel sums embeddings, so
        the full range whatever `weight_limit()`)."""
        return cls(*_row_codes(weight, INT8_MAX))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids].float() * self.weight_scale[ids].unsqueeze(-1)  # [..., dim] float32

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}{', rows of the int8 head' if self.tied else ''}"


class TiedInt8Embedding(Int8Embedding):
    """The input embedding as a tied Int8Linear head's rows and scales, read in place as the head holds them now:
    one copy in memory (a head keeps its int8 weight beside its packed copy, `_int8_layers`), nothing stored."""

    tied = True

    def __init__(self, head: Int8Linear):
        torch.nn.Module.__init__(self)
        self.head = [head]  # a list: the head is registered once, on the model (and keeps its weight)
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    @property
    def weight(self) -> torch.Tensor:  # [num, dim] int8: the head's
        return self.head[0].weight

    @property
    def weight_scale(self) -> torch.Tensor:  # [num] float32: the head's
        return self.head[0].weight_scale


def is_tied(model: torch.nn.Module) -> bool:
    """Whether `model`'s input embedding and LM head are one matrix: one Parameter (a float model), or an
    Int8Embedding reading the int8 head's rows (a quantized one)."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    return getattr(embedding, "tied", False) or (head is not None and head.weight is getattr(embedding, "weight", None))


def set_embedding(model: torch.nn.Module, own: torch.nn.Module | None) -> None:
    """Make `model`'s input embedding `own`, or (None: a tied model) the Int8Embedding of its int8 head's rows."""
    model.set_input_embeddings(own if own is not None else TiedInt8Embedding(model.get_output_embeddings()))


def stored_embedding(state: dict[str, torch.Tensor], name: str) -> Int8Embedding | None:
    """The own Int8Embedding stored under module name `name` in `state`, or None when the store has none (tied)."""
    if f"{name}.weight_scale" not in state:
        return None
    return Int8Embedding(state[f"{name}.weight"], state[f"{name}.weight_scale"])


class SharedInput:
    """A layer read by several slices of its output columns (`Int8Slice`), each former Linear of one input: the first
    slice called with an input computes all columns; the others, called with that same tensor object, take theirs."""

    members: int  # the slices reading this layer (each counts itself in)

    def share(self) -> None:
        self.members, self.last_input, self.last_output, self.unread = 0, None, None, 0

    def output_for(self, x: torch.Tensor) -> torch.Tensor:
        """This layer's output for `x`: computed once per input for all members, then read by each."""
        if self.unread == 0 or x is not self.last_input:
            self.last_input, self.last_output, self.unread = x, self(x), self.members
        output, self.unread = self.last_output, self.unread - 1
        if self.unread == 0:
            self.last_input = self.last_output = None  # keep no activations between forwards
        return output


class SharedInputInt8(SharedInput, Int8Linear):
    """Linears that read the same input (q/k/v, gate/up) as one Int8Linear: one quantization, one GEMM.

    Each former Linear becomes an `Int8Slice` of its output columns. Rows are quantized with the same scale either
    way and the sums are exact, so the bits are those of separate layers.
    """

    def __init__(self, modules: list[torch.nn.Module]):
        weights = [m.weight.t() if isinstance(m, Conv1D) else m.weight for m in modules]
        has_bias = modules[0].bias is not None
        super().__init__(torch.cat(weights), torch.cat([m.bias for m in modules]) if has_bias else None)

    def _hold(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super()._hold(weight, weight_scale, bias)
        self.share()


class Int8Slice(torch.nn.Module):
    """Columns start:end of a SharedInput layer's output (a SharedInputInt8's, or a 4-bit draft's): what one of the
    Linears it replaced computed."""

    def __init__(self, shared: SharedInput, start: int, end: int):
        super().__init__()
        self.shared = [shared]  # a list: the shared layer is registered once, on the parent module
        shared.members += 1
        self.start, self.end = start, end
        self.in_features, self.out_features = shared.in_features, end - start

    @property
    def weight(self) -> torch.Tensor:  # [out, in] int8, for code that reads a Linear's shape
        return self.shared[0].weight[self.start:self.end]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared[0].output_for(x)[..., self.start:self.end]

    def extra_repr(self) -> str:
        return f"columns {self.start}:{self.end} of a shared-input layer"


SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # sibling Linears fed one tensor


def rowwise_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of each query row alone over its causal slice, as a one-token step computes it.

    query [B, H, n, D]; key, value [B, H_kv, L, D] hold the cache plus the n new positions (L = past + n,
    a DynamicCache); attention_mask None or bool [B, 1, n, L] (padding, or one sequence's draft tree over its new
    positions: `specdec.core.kv.tree_layout`; True = attend).
    Returns (output [B, n, H, D], None) as transformers' attention interface expects.
    Without padding, one compiled call (`native.attend_rows`; where the kernel is not built here, sdpa row by row,
    each the call of a one-token step without a mask), a tree's rows each over its own positions; padding, sdpa row
    by row with each row's mask.
    """
    if dropout:
        raise ValueError("rowwise_attention is for inference (dropout 0)")
    n, length = query.shape[2], key.shape[2]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    gqa = query.shape[1] != key.shape[1]
    kind, tree = (None, None) if attention_mask is None else _mask_kind(attention_mask)
    if kind != PADDING:  # the causal rows (and a tree's leaves) are all it holds
        return _rows_over(query, key, value, scaling, gqa, tree), None
    rows = []
    for i in range(n):
        end = length - n + i + 1  # row i sees positions 0..past+i
        mask = attention_mask[:, :, i:i + 1, :end]  # [B, 1, 1, end]
        rows.append(F.scaled_dot_product_attention(query[:, :, i:i + 1], key[:, :, :end], value[:, :, :end],
                                                   attn_mask=None if bool(mask.all()) else mask, scale=scaling,
                                                   enable_gqa=gqa))  # [B, H, 1, D]
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None  # [B, n, H, D]


TREE_ROWS, PADDING = "tree", "padding"  # what a mask holds besides the causal rows (`_mask_kind`)
_mask_read: tuple = (None, None, None)  # the last mask read, its kind and tree: one read serves a forward's layers


def _mask_kind(mask: torch.Tensor) -> tuple[str | None, tuple[torch.Tensor, torch.Tensor] | None]:
    """What bool mask [B, 1, n, L] holds, and a tree's rows: (None, None) for the causal rows alone; (TREE_ROWS,
    (seen, last)) for one sequence whose rows see the positions before the new ones and, of the new ones, a prefix
    and perhaps one more (a draft tree: row i sees 0..seen[i] - 2 and last[i], int64 [n] each); (PADDING, None)
    otherwise. Read once per mask object (every layer of a forward is given the same one)."""
    global _mask_read
    read = _mask_read
    if read[0] is mask:
        return read[1:]
    n, length = mask.shape[-2:]
    past = length - n
    if bool((mask | ~int8_forward.causal_rows(n, past, mask.device)).all()):
        _mask_read = (mask, None, None)
        return None, None
    rows = mask[0, 0]  # [n, L]
    seen = rows.sum(-1)  # [n]
    last = length - 1 - rows.flip(-1).to(torch.uint8).argmax(-1)  # [n]: the last position each row sees
    places = torch.arange(length, device=mask.device)
    tree = (places < (seen - 1)[:, None]) | (places == last[:, None])  # [n, L]: 0..seen - 2, and last
    if mask.shape[0] > 1 or not bool(rows[:, :past + 1].all()) or not torch.equal(tree, rows):
        _mask_read = (mask, PADDING, None)
    else:
        _mask_read = (mask, TREE_ROWS, (seen.contiguous(), last.contiguous()))
    return _mask_read[1:]


def _rows_over(query, key, value, scaling: float, gqa: bool,
               tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Rows query [B, H, n, D] over key, value [B, H_kv, past + n, D], row i seeing 0..past + i (a tree's: 0..seen[i]
    - 2 and last[i]), as a one-token step over those positions computes each: the compiled call, else sdpa row by
    row without a mask over the row's positions. Returns [B, n, H, D]."""
    if native.library() is not None:
        return native.attend_rows(query.float(), key.float(), value.float(), scaling, tree).to(query.dtype)
    n, length = query.shape[2], key.shape[2]
    rows = []
    for i in range(n):
        end = length - n + i + 1 if tree is None else int(tree[0][i])  # row i sees end positions
        if tree is None or int(tree[1][i]) == end - 1:  # a causal slice: 0..end - 1
            keys, values = key[:, :, :end], value[:, :, :end]
        else:  # a leaf: 0..end - 2, then its own
            seen = torch.cat([torch.arange(end - 1), tree[1][i:i + 1]])
            keys, values = key[:, :, seen], value[:, :, seen]
        rows.append(F.scaled_dot_product_attention(query[:, :, i:i + 1], keys, values, scale=scaling,
                                                   enable_gqa=gqa))  # [B, H, 1, D]
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous()


AttentionInterface.register(ROWWISE_ATTENTION, rowwise_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ROWWISE_ATTENTION, sdpa_mask)  # a padding mask when there is one


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Make a float32 CPU causal LM row-invariant in place (see the module docstring) and return it.

    Every Linear (RowsFirstLinear and ColumnMajorHead included) and Conv1D becomes an Int8Linear (siblings
    that read one input, q/k/v and gate/up, one SharedInputInt8 read through Int8Slices); the LM head too. The
    input embedding becomes an Int8Embedding: the head's rows when the two are tied, else its own int8 copy.
    Attention becomes `rowwise_attention`.
    """
    parameter = next(model.parameters())
    if parameter.dtype != torch.float32 or parameter.device.type != "cpu":
        raise ValueError(f"quantize_int8 takes a float32 CPU model, got {parameter.dtype} on {parameter.device}")
    tied = is_tied(model)
    _int8_layers(model, _quantized_layer)
    set_embedding(model, None if tied else Int8Embedding.from_float(model.get_input_embeddings().weight))
    return model


def int8_from_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The model `quantize_int8` made, from its `state_dict()` (`state`) and `model`, the same architecture built
    from its config with parameters on the meta device (buffers real); in place, without a float32 pass.

    Each int8 layer is made a shell of its stored shapes (`Int8Linear.from_quantized` of meta tensors), the
    embedding from its stored rows or (none stored: tied) the head's; then every tensor is assigned from `state`,
    each int8 weight packed once as quantizing packs it. A missing or unexpected key raises.
    """
    def stored_layer(name: str, modules: list[torch.nn.Module]) -> Int8Linear:
        bias = None if modules[0].bias is None else state[f"{name}.bias"]
        return _int8_layer(modules, *on_meta(state[f"{name}.weight"], state[f"{name}.weight_scale"], bias))

    embedding = gguf_read.module_name(model, model.get_input_embeddings())
    _int8_layers(model, stored_layer)
    set_embedding(model, stored_embedding(state, embedding))
    with packing_in_parallel():
        model.load_state_dict(state, strict=True, assign=True)
    return model


def int8_from_gguf(path: Path) -> tuple[torch.nn.Module, object]:
    """(int8 model in eval mode, tokenizer) of a llama- or qwen2-style GGUF, one tensor at a time, no float32 model
    (`specdec.models.gguf_read`): the model `quantize_int8` makes of the GGUF's float32 conversion, bit for bit.

    Each tensor is dequantized (gguf's dequantization, as the conversion's) and every Linear's weight, q/k/v and
    gate/up joined as quantize_int8 shares them, quantized to int8 row by row, a block of rows at a time
    (`gguf_codes`); the input embedding is the head's rows (a GGUF without `output.weight`: tied) or its own int8
    copy; norms and biases stay float32.
    """
    return gguf_read.from_gguf(path, _fill, "int8")


def _fill(model: torch.nn.Module, weights: GGUFWeights) -> None:
    """Replace `model`'s meta Linears and embedding by int8 layers quantized from `weights`, then assign the rest
    (float32)."""
    names = {module: name for name, module in model.named_modules()}  # before any is replaced
    embedding = names[model.get_input_embeddings()]

    def layer(name: str, modules: list[torch.nn.Module]) -> Int8Linear:
        members = [names[module] for module in modules]  # one Linear, or the siblings of a shared input
        bias = None if modules[0].bias is None else torch.cat([weights.float(f"{m}.bias") for m in members])
        return _int8_layer(modules, *gguf_codes(weights, [f"{m}.weight" for m in members], weight_limit()), bias)

    _int8_layers(model, layer)
    set_embedding(model, None if weights.tied else Int8Embedding(*gguf_codes(weights, [f"{embedding}.weight"],
                                                                              INT8_MAX)))
    rest = {name: weights.float(name) for name, parameter in model.named_parameters() if parameter.is_meta}
    model.load_state_dict(rest, strict=False, assign=True)


def gguf_codes(weights: GGUFWeights, names: list[str], limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [out, in], scale [out]) of the GGUF tensors `names`, their rows one after another (q/k/v, gate/up),
    quantized row by row in [-limit, limit] as `_row_codes` quantizes their float32 values: dequantized and quantized
    a block of rows at a time (`block_rows`), so no float32 copy of a whole weight is made."""
    shape = (sum(weights.shape(name)[0] for name in names), weights.shape(names[0])[1])
    step = block_rows(shape[1])
    return _quantized_chunks(itertools.chain.from_iterable(weights.float_rows(name, step) for name in names), shape,
                             limit)


def on_meta(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Meta tensors of these tensors' shapes and dtypes (None stays None): what a shell layer holds until loaded."""
    return [None if tensor is None else tensor.to("meta") for tensor in tensors]


def _int8_layer(modules: list[torch.nn.Module], weight: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None) -> Int8Linear:
    """The int8 layer of `modules` (siblings reading one input, or one Linear) holding these quantized tensors."""
    cls = SharedInputInt8 if len(modules) > 1 else Int8Linear
    return cls.from_quantized(weight, weight_scale, bias)


def _quantized_layer(name: str, modules: list[torch.nn.Module]) -> Int8Linear:
    """The int8 layer of float `modules` (siblings reading one input, or one Linear / Conv1D), quantized now."""
    return SharedInputInt8(modules) if len(modules) > 1 else Int8Linear.from_module(modules[0])


def _int8_layers(model: torch.nn.Module, layer, share_inputs: bool = True) -> torch.nn.Module:
    """Replace the Linears and Conv1Ds of `model` by `layer(name, modules)`, the int8 layer registered at `name` for
    `modules` (a SHARED_INPUTS group when `share_inputs`, or one module); untie the head, which keeps its int8
    weight (`Int8Linear.keep_weight`: a tied embedding reads its rows, callers its values); make attention rowwise.
    Returns `model`."""
    with packing_in_parallel():
        if share_inputs:
            _share_inputs(model, layer)
        names = [name for name, module in model.named_modules() if isinstance(module, (torch.nn.Linear, Conv1D))]
        for name in names:  # one at a time, so each float32 weight is freed as soon as its int8 copy exists
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, layer(name, [getattr(parent, child)]))
    head = model.get_output_embeddings()
    if isinstance(head, Int8Linear):  # (a stored head of the product's form holds its rows itself, a RescoredHead)
        head.keep_weight()
    model.config.tie_word_embeddings = False  # the head is its own (int8) copy now
    return _attending(model, ROWWISE_ATTENTION, rowwise_attention)


def _share_inputs(model: torch.nn.Module, layer, takes=lambda m: isinstance(m, torch.nn.Linear),
                  suffix: str = "_int8") -> None:
    """Replace each group of SHARED_INPUTS layers that `takes` (same input width, all or none with a bias; torch
    Linears by default) by Int8Slices of one `layer(name, modules)`, registered on their parent as
    q_proj_k_proj_v_proj`suffix` (gate_proj_up_proj`suffix`)."""
    parents = [name for name, module in model.named_modules() if any(hasattr(module, n[0]) for n in SHARED_INPUTS)]
    for parent_name in parents:  # names, not modules: replaced weights are freed as we go
        parent = model.get_submodule(parent_name)
        for names in SHARED_INPUTS:
            modules = [getattr(parent, name, None) for name in names]
            if not all(takes(m) for m in modules) \
                    or len({m.in_features for m in modules}) > 1 or len({m.bias is None for m in modules}) > 1:
                continue
            child = _shared_child(names, suffix)
            shared = layer(f"{parent_name}.{child}" if parent_name else child, modules)
            parent.add_module(child, shared)
            start = 0
            for name, module in zip(names, modules):
                setattr(parent, name, Int8Slice(shared, start, start + module.out_features))
                start += module.out_features


def _shared_child(names: tuple[str, ...], suffix: str) -> str:
    """The name the one layer of sibling Linears `names` is registered under on their parent."""
    return "_".join(names) + suffix


def stored_shares(model: torch.nn.Module, state: dict[str, torch.Tensor], suffix: str) -> set[int]:
    """ids of `model`'s sibling Linears (SHARED_INPUTS) that `state` holds as one layer (`_share_inputs` with
    `suffix`): the ones to share again before it is loaded."""
    held = {key.rpartition(".")[0] for key in state}  # the modules `state` holds tensors of
    found = set()
    for parent_name, parent in model.named_modules():
        for names in SHARED_INPUTS:
            child = _shared_child(names, suffix)
            if (f"{parent_name}.{child}" if parent_name else child) in held:
                found |= {id(getattr(parent, name)) for name in names}
    return found


def couple_rows(model: torch.nn.Module) -> torch.nn.Module:
    """Turn an int8 model (`quantize_int8`, `int8_from_state`) into fbgemm's own dynamic quantization, in place: each
    int8 layer's weight packed with its real per-channel scales, activations quantized with one scale per tensor
    inside the kernel (`quantized::linear_dynamic`), attention back to SDPA. One op per layer instead of a
    dozen, so the cheapest per-token form on CPUs with fbgemm, but rows are no longer computed alone: a draft's
    form (verification decides the output, so a draft's precision never changes it), never a target's.
    """
    with packing_in_parallel():
        for module in model.modules():
            if isinstance(module, Int8Linear):
                _packed_soon(module.couple_rows)
    return _attending(model, "sdpa", int8_forward.sdpa_attention)


def _attending(model: torch.nn.Module, implementation: str, attention) -> torch.nn.Module:
    """`model` (and its sub-configs) configured with transformers' attention `implementation`, and marked to run its
    own forward with the same `attention` (`specdec.core.kv.DECODER_FLAG`: CachedLM runs its plan where
    `int8_forward` knows the layout). Returns `model`."""
    for config in (model.config, *[getattr(model.config, key) for key in model.config.sub_configs]):
        if config is not None:
            config._attn_implementation = implementation
    setattr(model, DECODER_FLAG, functools.partial(int8_forward.decoder_for, attention=attention))
    setattr(model, LEAF_ROWS_FLAG, attention is rowwise_attention)  # a tree's rows, each as a one-token step
    return model
