"""The int8 product compiled on this machine: `int8_kernel.c`, built once by the C compiler at hand for this CPU
(-march=native) and loaded with ctypes. One of the packed kernels `specdec.models.quant` measures: it runs only
where its sums are exact and it is the fastest for a weight shape here, like fbgemm and oneDNN.

Why: one row times an int8 weight is a read of the weight, and fbgemm and oneDNN read it for one row at about two
thirds of the speed a float32 matrix-vector product reads memory on some CPUs; a kernel that reads each weight
vector once for several rows reads at the float product's speed there, and for the k + 1 rows of a verification
costs little more than for one; and a Linear on it is one call instead of a dozen small ops (docs/performance.md).

`pack(weight)` lays an int8 weight [N, K] out for the kernel; `mm(x_q, packed)` gives the exact sums of integer rows
[M, K] with it; `unpack(packed)` is the weight again, bit for bit. Where the CPU has AMX tiles and the OS grants
them, a product of many rows runs on them: from `tile_rows()` rows on, the row count from which they are faster
than the vector path here (timed once per machine, like every other choice of path).

The source has a path for AVX512-VNNI and one for AVX2 without it, both exact for any int8 weight (on AVX2, where
fbgemm is exact only for 7-bit weights, this keeps the int8 model's weights and sums those of every other CPU),
and fails to build on purpose for a CPU with neither (the source's header says why). Without a C compiler, or
where the build fails, `library()` is None and `pack` raises RuntimeError: the kernel is then not exact here and
never runs, and fbgemm and oneDNN do the products.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from specdec.core import files, hardware
from specdec.core.timing import Timer, interleaved, medians
from specdec.models import cache

SOURCE = Path(__file__).with_name("int8_kernel.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")  # for the CPU at hand, no fused
# multiply-adds (a Linear's float operations are torch's, one rounding each); OpenMP is torch's own
ROWS_AT_ONCE = 12  # rows the AVX-512 path reads each weight vector for (MB_MAX in the source; tiles come only with it)
TILE_ROWS = 16  # an AMX tile's rows: the rows of a product on tiles are padded to a multiple of this
GROUP_4 = 32  # inputs per scale and offset of a 4-bit weight (G4 in the source)
PASS_ROWS_4 = (8, 12)  # rows a pass of the 4-bit product may take (the source's MB4 caps it: 12 with AVX-512, 4 AVX2)
PASS_PROBE_ROWS = ((9, 10, 11, 12), (16, 24))  # the row counts the two are timed on, apart: a verification of 8 to
# 11 drafts (up to 12 rows, one pass of 12 reads each weight once where passes of 8 read it twice), and a prompt
K_ALIGN = 64  # the input width is padded to a multiple of this (an AMX tile row: 64 bytes)
N_ALIGN = 16  # outputs per packed block
PROFILED_AS = "specdec::int8_product"  # the product's name in a torch.profiler trace (specdec.lab.breakdown)
NOTHING = contextlib.nullcontext()
TILE_PROBE = (8192, 1536)  # the weight shape [N, K] the tiles' row count is timed on ...
TILE_PROBE_COPIES = 32  # ... in this many copies (400 MB), read one after another from memory, as a forward reads
TILE_PROBE_REPEATS = 3  # timings per path and row count, interleaved; medians compared


class Packed4(NamedTuple):
    """A 4-bit weight [N, K] (code * scale - offset per group of GROUP_4 inputs) packed for the kernel's int4_linear."""

    blocks: torch.Tensor  # [N'/16, K/8, 16, 4] uint8: code[8p + t] | code[8p + 4 + t] << 4; N padded with zeros to N'
    scales: torch.Tensor  # [N'/16, K/GROUP_4, 2, 16] float16: a block and group's 16 scales, then its 16 offsets
    out_features: int  # N
    in_features: int  # K


class Packed(NamedTuple):
    """An int8 weight [N, K] packed for the kernel."""

    blocks: torch.Tensor  # [N'/16, K'/4, 16, 4] int8: N, K padded with zeros to N' (16), K' (64)
    shift: torch.Tensor  # [N] int32: 128 * the row sums (the inputs arrive as u8, x + 128)
    out_features: int  # N
    in_features: int  # K


class Weight4(ctypes.Structure):
    """A 4-bit weight as the source's draft_layer reads it (`weight4`): a Packed4's blocks and scales, its bias."""

    _fields_ = [("blocks", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("out", ctypes.c_int64), ("in_", ctypes.c_int64)]


def weight4(packed: Packed4, bias: torch.Tensor | None) -> Weight4:
    """`packed` and `bias` for `draft_layer` (the tensors must outlive it: the layer that holds them does)."""
    return Weight4(packed.blocks.data_ptr(), packed.scales.data_ptr(), None if bias is None else bias.data_ptr(),
                   packed.out_features, packed.in_features)


def compiler() -> str | None:
    """The C compiler to build with ($CC, else cc or gcc on the PATH), or None."""
    return next((c for c in (os.environ.get("CC"), "cc", "gcc") if c and shutil.which(c)), None)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The kernel built for this machine (once, then from the cache), or None where it cannot be built here."""
    cc = compiler()
    if cc is None:
        return None
    try:
        built = cache.root() / "native" / f"int8-kernel-{build_key()}.so"
        if not built.exists():
            with tempfile.TemporaryDirectory() as scratch, files.atomic_path(built) as partial:
                # built outside the cache: a compiler outliving a killed run never writes there
                subprocess.run([cc, *FLAGS, str(SOURCE), "-o", f"{scratch}/kernel.so"], check=True,
                               capture_output=True, timeout=300)
                shutil.copyfile(f"{scratch}/kernel.so", partial)
        lib = ctypes.CDLL(str(built))
    except (OSError, subprocess.SubprocessError):
        return None
    lib.int8_product.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.int8_product.restype = None
    lib.row_sums.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.int8_linear.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.int8_linear.restype = ctypes.c_int
    lib.int4_linear.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.int4_linear.restype = ctypes.c_int
    lib.attend_one.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    lib.attend_one.restype = ctypes.c_int
    lib.attend_rows.argtypes = [ctypes.c_void_p, *[ctypes.c_int64] * 7, ctypes.c_void_p, ctypes.c_void_p,
                                *[ctypes.c_int64] * 6, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                                ctypes.c_void_p, ctypes.c_int]
    lib.attend_rows.restype = ctypes.c_int
    lib.rms_norm_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float,
                                  ctypes.c_void_p]
    lib.silu_mul_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    weight = ctypes.POINTER(Weight4)
    lib.draft_layer.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float,
                                ctypes.c_void_p, ctypes.c_float, weight, weight, weight, weight, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_int,
                                ctypes.c_int]
    lib.draft_layer.restype = ctypes.c_int
    return lib


@functools.cache
def build_key() -> str:
    """What the built kernel depends on: its source, the compiler, the flags and the CPU it was built for."""
    version = subprocess.run([compiler(), "--version"], capture_output=True, text=True, timeout=30).stdout
    return files.json_key({"source": hashlib.sha256(SOURCE.read_bytes()).hexdigest(), "compiler": version,
                           "flags": FLAGS, "machine": hardware.cpu()})


@functools.cache
def tiles() -> bool:
    """Whether the kernel multiplies on AMX tiles here: built with them, and granted by the OS to this process."""
    return library() is not None and bool(library().amx())


@functools.cache
def tile_rows() -> int | None:
    """The fewest rows (2..ROWS_AT_ONCE + 1) from which a product on the tiles is faster than the vector path here,
    timed once per machine and cached; None where there are no tiles."""
    return _timed_once("tile-rows", _timed_tile_rows) if tiles() else None


@functools.cache
def pass_rows4() -> tuple[int, ...]:
    """The rows the 4-bit product reads each weight vector for at a time (of PASS_ROWS_4), one count per set of
    PASS_PROBE_ROWS (a verification's rows, a prompt's): the fastest here for that set, timed once per machine and
    cached."""
    return tuple(_timed_once("pass-rows-4-by-size", _timed_pass_rows4))


def timed_rows() -> str:
    """The row counts timed for the kernel on this machine (`tile_rows`, `pass_rows4`), for the cache keys of what
    was measured with them: a timing taken with other row counts is not read again."""
    return f"tiles-{tile_rows()}-pass-{'-'.join(map(str, pass_rows4()))}"


def _pass_rows(m: int) -> int:
    """The rows a pass of a 4-bit product of m rows takes: m where that is no more than any count would take (then
    `pass_rows4` is neither timed nor read), else the count timed fastest for the first set of PASS_PROBE_ROWS that
    reaches m (the last set past them all)."""
    if m <= min(PASS_ROWS_4):
        return m
    chosen = pass_rows4()
    return next((rows for rows, sizes in zip(chosen, PASS_PROBE_ROWS) if m <= max(sizes)), chosen[-1])


def _timed_once(name: str, timed: Callable[[], int | list[int]]) -> int | list[int]:
    """Row counts `timed()` measures on this machine, once: cached per build of the kernel and thread count."""
    about = {"library": build_key(), "threads": torch.get_num_threads()}
    path = cache.root() / "native" / f"{name}-{files.json_key(about)}.json"
    try:
        return json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        pass
    rows = timed()
    files.write_text(path, json.dumps({"rows": rows}))
    return rows


def _probe_copies(one):
    """TILE_PROBE_COPIES distinct copies of a packed probe weight, read one after another as a forward reads them."""
    return [one._replace(blocks=one.blocks.clone()) for _ in range(TILE_PROBE_COPIES)]


def _timed_pass_rows4() -> list[int]:
    generator = torch.Generator().manual_seed(0)
    n, k = TILE_PROBE
    weights = _probe_copies(pack4(torch.randint(0, 16, TILE_PROBE, dtype=torch.uint8, generator=generator),
                                  torch.rand(n, k // GROUP_4, generator=generator),
                                  torch.rand(n, k // GROUP_4, generator=generator)))
    x = torch.randn(max(max(sizes) for sizes in PASS_PROBE_ROWS), k, generator=generator)

    def seconds(sizes: tuple[int, ...], rows: int) -> float:
        with Timer("cpu") as timer:
            for m in sizes:
                for weight in weights:
                    linear4(x[:m], weight, None, rows)
        return timer.seconds

    timed = medians(interleaved({(sizes, rows): functools.partial(seconds, sizes, rows)
                                 for sizes in PASS_PROBE_ROWS for rows in PASS_ROWS_4}, TILE_PROBE_REPEATS))
    return [min(PASS_ROWS_4, key=lambda rows: timed[(sizes, rows)]) for sizes in PASS_PROBE_ROWS]


def _timed_tile_rows() -> int:
    generator = torch.Generator().manual_seed(0)
    weights = _probe_copies(pack(torch.randint(-127, 128, TILE_PROBE, dtype=torch.int8, generator=generator)))
    x_q = torch.randint(-127, 128, (ROWS_AT_ONCE, TILE_PROBE[1]), generator=generator).float()

    def seconds(m: int, on_tiles: bool) -> float:
        with Timer("cpu") as timer:
            for weight in weights:
                _product(x_q[:m], weight, on_tiles)
        return timer.seconds

    sizes = range(2, ROWS_AT_ONCE + 1)
    timed = medians(interleaved({(m, t): functools.partial(seconds, m, t) for m in sizes for t in (False, True)},
                                TILE_PROBE_REPEATS))
    return next((m for m in sizes if timed[(m, True)] < timed[(m, False)]), ROWS_AT_ONCE + 1)


def pack(weight: torch.Tensor) -> Packed:
    """The kernel's layout of int8 weight [N, K]; RuntimeError where the kernel cannot be built here."""
    if library() is None:
        raise RuntimeError("the int8 kernel is not built here (no C compiler, or a CPU without AVX2)")
    n, k = weight.shape
    padded = F.pad(weight, (0, -k % K_ALIGN, 0, -n % N_ALIGN)).contiguous()  # [N', K'], a new tensor
    words = padded.view(torch.int32).view(padded.shape[0] // N_ALIGN, N_ALIGN, -1)  # [N'/16, 16, K'/4]: 4 k a word
    blocks = words.transpose(1, 2).contiguous().view(torch.int8)  # [N'/16, K'/4, 16 * 4]
    sums = torch.empty(n, dtype=torch.int32)
    library().row_sums(padded.data_ptr(), n, padded.shape[1], sums.data_ptr(), torch.get_num_threads())  # padding: 0
    return Packed(blocks.view(-1, padded.shape[1] // 4, N_ALIGN, 4), 128 * sums, n, k)


def unpack(packed: Packed) -> torch.Tensor:
    """The int8 weight [N, K] `packed` was made from, bit for bit."""
    blocks = packed.blocks
    weight = blocks.permute(0, 2, 1, 3).reshape(blocks.shape[0] * N_ALIGN, blocks.shape[1] * 4)
    return weight[:packed.out_features, :packed.in_features].contiguous()


def mm(x_q: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Integer rows x_q [M, K] (float32 in [-127, 127]) times the packed weight transposed: the exact sums as
    float32 [M, N]."""
    return _product(x_q, packed, _on_tiles(x_q.shape[0]))


def _on_tiles(m: int) -> bool:
    """Whether a product of m rows runs on the tiles here (`tile_rows`)."""
    rows = tile_rows()
    return rows is not None and m >= rows


def _rows(m: int, on_tiles: bool) -> int:
    """The rows a product of m rows computes: m, or on the tiles m padded to whole tiles."""
    return -(-m // TILE_ROWS) * TILE_ROWS if on_tiles else m


def _profiled():
    """The product's span in a torch.profiler trace, only while one records (`PROFILED_AS`)."""
    return torch.profiler.record_function(PROFILED_AS) if torch.autograd._profiler_enabled() else NOTHING


def _product(x_q: torch.Tensor, packed: Packed, on_tiles: bool) -> torch.Tensor:
    """`mm` on the tiles or not (never on tiles the OS has not granted: the CPU would fault)."""
    m, k = x_q.shape
    on_tiles = on_tiles and tiles()
    rows = _rows(m, on_tiles)
    shifted = F.pad((x_q + 128).to(torch.uint8), (0, packed.blocks.shape[1] * 4 - k, 0, rows - m))  # [rows, K']
    out = torch.empty(rows, packed.out_features)
    with _profiled():
        library().int8_product(shifted.data_ptr(), rows, shifted.shape[1], packed.blocks.data_ptr(),
                               packed.shift.data_ptr(), packed.out_features, out.data_ptr(), on_tiles,
                               torch.get_num_threads())
    return out[:m]


def linear(x: torch.Tensor, packed: Packed, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A row-invariant int8 Linear of float32 rows x [M, K] in one call: each row quantized alone, the exact sums,
    then sums * weight_scale * the row's scale (+ bias): bitwise what `specdec.models.quant.Int8Linear` computes
    with torch ops around `mm` (the same float operations in the same order), without a dozen small ops around it.
    Returns [M, N] float32."""
    m, k = x.shape
    on_tiles = _on_tiles(m)  # tile_rows() is None without tiles
    padded = _rows(m, on_tiles)
    x = x.contiguous()
    out = torch.empty(padded, packed.out_features)
    with _profiled():
        failed = library().int8_linear(x.data_ptr(), m, k, padded, packed.blocks.shape[1] * 4, packed.blocks.data_ptr(),
                                       packed.shift.data_ptr(), packed.out_features, weight_scale.data_ptr(),
                                       None if bias is None else bias.data_ptr(), out.data_ptr(), on_tiles,
                                       torch.get_num_threads())
    if failed:
        raise MemoryError("no memory for an int8 product's rows")
    return out if padded == m else out[:m]


def pack4(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> Packed4:
    """The kernel's layout of a 4-bit weight: codes [N, K] uint8 in 0..15 (K a multiple of GROUP_4), scale and
    offset [N, K / GROUP_4] (weight = code * scale - offset, rounded to float16 here); RuntimeError where the kernel
    cannot be built here."""
    if library() is None:
        raise RuntimeError("the integer kernels are not built here (no C compiler, or a CPU without AVX2)")
    n, k = codes.shape
    pad = -n % N_ALIGN
    pairs = F.pad(codes, (0, 0, 0, pad)).view((n + pad) // N_ALIGN, N_ALIGN, k // 8, 2, 4)  # [N'/16, 16, K/8, 2, 4]
    blocks = (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).permute(0, 2, 1, 3)  # [N'/16, K/8, 16, 4]
    per_block = [F.pad(t.float(), (0, 0, 0, pad)).view(-1, N_ALIGN, k // GROUP_4).transpose(1, 2) for t in (scale, offset)]
    return Packed4(blocks.contiguous(), torch.stack(per_block, dim=2).to(torch.float16).contiguous(), n, k)


def unpack4(packed: Packed4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The codes [N, K] uint8, scale and offset [N, K / GROUP_4] float32 `packed` holds (as float16): `pack4` of
    them gives `packed` again, bit for bit."""
    n, k = packed.out_features, packed.in_features
    blocks = packed.blocks.permute(0, 2, 1, 3)  # [N'/16, 16, K/8, 4]
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=3).reshape(-1, k)[:n]  # [N, K]: 4 low, then 4 high
    scale, offset = (packed.scales[:, :, i].transpose(1, 2).reshape(-1, k // GROUP_4)[:n].float() for i in (0, 1))
    return codes.contiguous(), scale.contiguous(), offset.contiguous()


def attend_one(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               past: int, heads: int, scaling: float) -> torch.Tensor:
    """A draft's one-token attention in one call (the source's attend_one): qkv [(H + 2·H_kv)·D] of the new token,
    cos and sin [D] at its position; its rotated key and its value written at `past` in keys and values [1, H_kv,
    capacity, D] (contiguous float32, capacity > past); returns [1, H·D], the attention over positions 0..past."""
    kv_heads, capacity, dim = keys.shape[1:]
    out = torch.empty(1, heads * dim)
    if library().attend_one(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), keys.data_ptr(), values.data_ptr(),
                            capacity, past, heads, kv_heads, dim, scaling, out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("no memory for a one-token attention's scores")
    return out


def attend_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Each query row's attention alone over its causal slice, in one call (the source's attend_rows): query
    [B, H, n, D], key/value [B, H_kv, L, D] (L = past + n; row i sees positions 0..past + i). tree (one sequence's
    draft tree): (seen, last), int64 [n] each: row i sees positions 0..seen[i] - 2, then last[i]. Every (batch, row,
    head) is computed by the same code whatever n, so a row's bits are a one-row call's over its positions. Returns
    [B, n, H, D]."""
    query, key, value = (t if t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] else t.contiguous()
                         for t in (query, key, value))  # each row's D floats, rows D apart
    (batch, heads, n, dim), (kv_heads, length) = query.shape, key.shape[1:3]
    out = torch.empty(batch, n, heads, dim)
    seen, last = (None, None) if tree is None else (t.data_ptr() for t in tree)
    if library().attend_rows(query.data_ptr(), batch, heads, n, dim, *query.stride()[:3], key.data_ptr(),
                             value.data_ptr(), *key.stride()[:2], *value.stride()[:2], kv_heads, length, seen, last,
                             scaling, out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("no memory for the attention's scores")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """A draft's RMSNorm of contiguous float32 rows x [M, K] in one call (transformers' formula, not torch's bits)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    library().rms_norm_rows(x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), eps, out.data_ptr())
    return out


def draft_layer(hidden: torch.Tensor, norms: tuple[torch.Tensor, float, torch.Tensor, float],
                weights: tuple[Weight4, Weight4, Weight4, Weight4], cos: torch.Tensor, sin: torch.Tensor,
                keys: torch.Tensor, values: torch.Tensor, past: int, heads: int, scaling: float) -> None:
    """A draft's step of M tokens through a decoder layer whose q/k/v, o, gate/up and down weights are 4-bit, in one
    call (the source's draft_layer): hidden [M, d] (contiguous float32) updated in place, the new keys and values
    written from `past` on in keys and values [1, H_kv, capacity, D]. norms: (input norm weight, eps, post-attention
    norm weight, eps); weights: `weight4` of q/k/v, o, gate/up, down; cos and sin [M, D] (contiguous) at the tokens'
    positions."""
    norm, eps, post_norm, post_eps = norms
    kv_heads, capacity, dim = keys.shape[1:]
    m = hidden.shape[0]
    if library().draft_layer(hidden.data_ptr(), m, hidden.shape[-1], norm.data_ptr(), eps, post_norm.data_ptr(),
                             post_eps, *(ctypes.byref(w) for w in weights), cos.data_ptr(), sin.data_ptr(),
                             keys.data_ptr(), values.data_ptr(), capacity, past, heads, kv_heads, dim, scaling,
                             _pass_rows(m), torch.get_num_threads()):
        raise MemoryError("no memory for a draft layer's scratch")


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """A draft's silu(gate) * up of contiguous float32 rows gate_up [M, 2·I] in one call: [M, I]."""
    out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
    library().silu_mul_rows(gate_up.data_ptr(), gate_up.shape[0], out.shape[1], out.data_ptr())
    return out


def linear4(x: torch.Tensor, packed: Packed4, bias: torch.Tensor | None, rows: int | None = None) -> torch.Tensor:
    """float32 rows x [M, K] times a 4-bit weight (+ bias) in one call: each row quantized to int8 alone, each group's
    sums exact, scaled in float32 (the source's int4_linear), `rows` at a time (None: `_pass_rows`; any count gives
    the same bits). Returns [M, N] float32."""
    x = x.contiguous()
    m = x.shape[0]
    rows = rows or _pass_rows(m)
    out = torch.empty(m, packed.out_features)
    with _profiled():
        failed = library().int4_linear(x.data_ptr(), m, x.shape[1], packed.blocks.data_ptr(),
                                       packed.scales.data_ptr(), packed.out_features,
                                       None if bias is None else bias.data_ptr(), out.data_ptr(), rows,
                                       torch.get_num_threads())
    if failed:
        raise MemoryError("no memory for a 4-bit product's rows")
    return out
