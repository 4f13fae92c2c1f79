"""Per-forward overhead levers, each one alone against none, on one loaded model (`python -m specdec profile --levers`).

With the int8 path (`specdec.models.quant`) the GEMMs are fast, so what a forward does around them (attention,
norms, the KV cache's growth, Python between ops) is a large share of a step. Each lever here removes one kind of
that overhead and can be switched on and off around any forward, so they are timed interleaved in one process:

- `static-cache`: `PreallocatedCache`, the keys/values of each layer in storage allocated ahead and written in
  place, instead of transformers' DynamicCache, which concatenates (copies the whole layer cache) every forward.
  Chosen by a flag on the model that `specdec.core.kv.CachedLM` reads, so the one rollback rule of specdec.core.kv applies
  unchanged (a crop shortens the valid length; the next forward overwrites the dropped positions).
- `compile`: `torch.compile` of the model's forward with dynamic shapes, so the number of new tokens and the cache
  length vary without a recompilation per step (pytorch.org/docs/stable/generated/torch.compile.html); an int8
  model's packed int8 GEMMs enter the graph as one custom op each instead of splitting it.
- `sdpa-math`: scaled_dot_product_attention's math backend instead of the kernel torch picks
  (`torch.nn.attention.sdpa_kernel`).

Off by default everywhere: nothing here runs unless a lever is entered (`with LEVERS[name](model): ...`). Every arm
times transformers' forward, the one these levers change: an int8 llama/qwen2 model's own forward
(`specdec.models.int8_forward`, which the product runs) already writes its cache in place and calls no modules.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.cache_utils import DynamicCache, DynamicLayer

from specdec.core.engine import autoregressive_generate
from specdec.core.forwards import forward_seconds, primed_cache, timing_context
from specdec.core.kv import CACHE_CLASS_FLAG, CachedLM, common_prefix_length, written
from specdec.core.timing import Timer, interleaved
from specdec.models import quant

VERIFY_TOKENS = 5  # new tokens of the timed verification forward, v(5)
PROMPT_TOKENS = 16  # prompt of the target-alone run that checks a lever changes no output
IDENTITY_TOKENS = 16  # greedy tokens of that run
WARMUP_ROUNDS = 3  # untimed (step, verification) pairs first: torch.compile settles after ~3 (0/1 sizes, strides)
COMPILE_MODE = "default"  # torch.compile mode ("max-autotune-no-cudagraphs" also autotunes the GEMMs)
RECOMPILE_LIMIT = 64  # graphs per code object (torch's default 8 runs out: transformers' decorators share one wrapper)


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views of storage allocated ahead and written in place.

    DynamicLayer.update runs torch.cat: every forward copies the whole layer cache. Here `update` writes only the
    new positions into `key_storage`/`value_storage` [B, H_kv, capacity, D] (`specdec.core.kv.written`: the
    capacity doubles when full, so copies are amortised O(1) per token), and `keys`/`values` are their first
    `length` positions, so attention, masks and get_seq_length see exactly what a DynamicLayer holds. DynamicLayer.crop(-n) keeps working as is: it
    shortens the views, and the next update overwrites the dropped positions (as transformers' StaticLayer does).
    Not transformers' StaticCache itself: its layers return all max_cache_len positions behind a mask, which
    `specdec.models.quant.rowwise_attention` (keys = cached + new positions) cannot read, and which every
    attention call would then span.
    """

    key_storage: torch.Tensor | None  # [B, H_kv, capacity, D]
    value_storage: torch.Tensor | None  # [B, H_kv, capacity, D]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_storage = self.value_storage = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append key_states/value_states [B, H_kv, S, D]; returns the views (keys, values) [B, H_kv, length, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        self.key_storage = written(self.key_storage, start, key_states)
        self.value_storage = written(self.value_storage, start, value_states)
        self.keys, self.values = self.key_storage[..., :end, :], self.value_storage[..., :end, :]
        return self.keys, self.values


class PreallocatedCache(DynamicCache):
    """A DynamicCache whose full-attention layers are PreallocatedLayers (sliding-window layers stay as they are)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for layer in self.layers:
            if type(layer) is DynamicLayer:
                layer.__class__ = PreallocatedLayer  # not initialised yet: nothing to convert
        if self.layer_class_to_replicate is DynamicLayer:
            self.layer_class_to_replicate = PreallocatedLayer


@contextlib.contextmanager
def preallocated_cache(model: torch.nn.Module):
    """CachedLMs made for `model` inside this block keep a PreallocatedCache (they keep it after the block)."""
    before = getattr(model, CACHE_CLASS_FLAG, None)
    setattr(model, CACHE_CLASS_FLAG, PreallocatedCache)
    try:
        yield
    finally:
        _restore(model, CACHE_CLASS_FLAG, before)


_PACKED: list = []  # (kernel, packed int8 weight) of each traced layer, by the index its TraceablePacked key holds
_PACKED_MM = quant._packed_mm  # the eager kernel call


@dataclass(frozen=True)
class TraceablePacked:
    """Stands in for an Int8Linear's packed weight while compiled: dynamo cannot trace a packed weight (fbgemm's is
    a TorchScript object) into a graph, so every int8 Linear would split the graph; a tensor key can be traced."""

    key: torch.Tensor  # [out_features] int64, every entry the weight's index in _PACKED


@torch.library.custom_op("specdec::packed_mm", mutates_args=())
def _packed_op(x_q: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """quant._packed_mm(x_q [M, K], the packed weight `key` names) -> exact sums [M, N], as one op of the graph."""
    kernel, packed = _PACKED[int(key[0])]
    return _PACKED_MM(kernel, x_q, packed)


@_packed_op.register_fake
def _(x_q: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    return x_q.new_empty((x_q.shape[0], key.shape[0]))  # [M, N]


def _traceable_packed_mm(kernel: str, x_q: torch.Tensor, packed) -> torch.Tensor:
    """quant._packed_mm while the compile lever is on: a TraceablePacked goes through the custom op."""
    if isinstance(packed, TraceablePacked):
        return _packed_op(x_q, packed.key)
    return _PACKED_MM(kernel, x_q, packed)


@contextlib.contextmanager
def _traceable_int8(model: torch.nn.Module):
    """Inside the block `model`'s packed int8 Linears hold TraceablePacked keys (made once per layer)."""
    layers = [m for m in model.modules() if isinstance(m, quant.Int8Linear) and m.packed is not None]
    for layer in layers:
        if not hasattr(layer, "specdec_traceable"):
            _PACKED.append((layer.kernel, layer.packed))
            layer.specdec_traceable = TraceablePacked(torch.full((layer.out_features,), len(_PACKED) - 1))
        layer.packed = layer.specdec_traceable
    quant._packed_mm = _traceable_packed_mm
    try:
        yield
    finally:
        quant._packed_mm = _PACKED_MM
        for layer in layers:
            layer.packed = _PACKED[int(layer.specdec_traceable.key[0])][1]


@contextlib.contextmanager
def compiled_forward(model: torch.nn.Module, mode: str = COMPILE_MODE):
    """Inside this block `model(...)` runs `torch.compile(model.forward, dynamic=True)` (compiled once per model:
    the first forwards compile, later blocks reuse what was compiled).

    Dynamo caches graphs per code object, and transformers' decorators wrap every forward in the same wrapper code,
    so the default limit of 8 graphs per code object runs out and the rest falls back to eager; RECOMPILE_LIMIT
    raises it inside the block. An int8 model's packed GEMMs enter the graph as one custom op each (_traceable_int8).
    """
    compiled = getattr(model, "specdec_compiled_forward", None)
    if compiled is None:
        compiled = model.specdec_compiled_forward = torch.compile(model.forward, dynamic=True, mode=mode)
    model.forward = compiled
    try:
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT), _traceable_int8(model):
            yield
    finally:
        del model.forward  # the class's forward again


def math_attention(model: torch.nn.Module) -> ContextManager:
    """SDPA's math backend for every attention call inside the block."""
    return sdpa_kernel([SDPBackend.MATH])


def _restore(model: torch.nn.Module, name: str, value) -> None:
    if value is None:
        delattr(model, name)
    else:
        setattr(model, name, value)


LEVERS: dict[str, Callable[[torch.nn.Module], ContextManager]] = {
    "static-cache": preallocated_cache,
    "compile": compiled_forward,
    "sdpa-math": math_attention,
}
NO_LEVER = "none"


@dataclass
class LeverRow:
    """One lever's medians (or none's), interleaved with the others in the same repeats."""

    name: str
    warmup_s: float  # the greedy check and WARMUP_ROUNDS untimed step/verification pairs (compilation included)
    identity: str  # "identical", or "differs at token i" (greedy target-alone tokens against no lever)
    lm: CachedLM = field(repr=False)  # this lever's cache, holding the context
    base: list[int] = field(repr=False)  # that context (`specdec.core.forwards.primed_cache`)
    step: list[float] = field(default_factory=list)  # seconds of each one-token step
    verify: list[float] = field(default_factory=list)  # seconds of each VERIFY_TOKENS-token forward

    @property
    def step_s(self) -> float:
        return statistics.median(self.step)

    @property
    def verify_s(self) -> float:
        return statistics.median(self.verify)


def compare_levers(model: torch.nn.Module, names, repeats: int,
                   lever_table: dict[str, Callable] = LEVERS) -> tuple[list[LeverRow], list[str]]:
    """Time the one-token step and v(VERIFY_TOKENS) with no lever and with each of `names` alone, interleaved
    (none, lever 1, lever 2, ..., none, lever 1, ...: drift hits every arm alike), `repeats` times each.

    Returns (rows, none first; one line per lever that could not run, with the reason)."""
    arms = {NO_LEVER: contextlib.nullcontext, **{name: lever_table[name] for name in names}}
    reference = _greedy(model)
    rows, failures = [], []
    for name, lever in arms.items():
        try:
            rows.append(_prepare(model, name, lever, reference))
        except Exception as error:  # a lever this machine cannot run (a compiler missing, an op not traceable)
            failures.append(f"{name}: not measured ({type(error).__name__}: {_first_line(error)})")

    def forward(row: LeverRow, new_tokens: int) -> float:
        with arms[row.name](model):
            return forward_seconds(row.lm, row.base, new_tokens)

    seconds = interleaved({(row.name, n): functools.partial(forward, row, n) for row in rows
                           for n in (1, VERIFY_TOKENS)}, repeats)
    for row in rows:
        row.step, row.verify = seconds[(row.name, 1)], seconds[(row.name, VERIFY_TOKENS)]
    return rows, failures


def _prepare(model, name: str, lever: Callable, reference: list[int]) -> LeverRow:
    """The lever's cache holding the timing context, its warm-up time and its output check."""
    with lever(model), Timer(model.device) as warm_up:
        tokens = _greedy(model)
        lm, base = primed_cache(model, own_forward=False)  # every arm times transformers' forward
        for _ in range(WARMUP_ROUNDS):
            forward_seconds(lm, base, 1)
            forward_seconds(lm, base, VERIFY_TOKENS)
    return LeverRow(name, warm_up.seconds, identity(tokens, reference), lm, base)


def _greedy(model: torch.nn.Module) -> list[int]:
    """IDENTITY_TOKENS greedy tokens of the model alone after a fixed prompt."""
    prompt = timing_context(model, PROMPT_TOKENS)
    return autoregressive_generate(model, prompt, max_new_tokens=IDENTITY_TOKENS, eos_token_id=[]).token_ids


def identity(tokens: list[int], reference: list[int]) -> str:
    """"identical", or "differs at token i" (0-based) for the first token where the runs part."""
    if tokens == reference:
        return "identical"
    return f"differs at token {common_prefix_length(tokens, reference)}"


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else "no message"
