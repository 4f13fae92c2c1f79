"""Where a forward's CPU time goes (`python -m specdec profile --breakdown`).

`torch.profiler` records every op of a few timed forwards (pytorch.org/docs/stable/profiler.html). Each op's self
CPU time (its time minus its children's) is put in one group, so the groups partition the profiled total:

- GEMM: matrix products inside a linear layer (mm, addmm, linear, matmul, torch._int_mm, fbgemm's
  quantized::linear_dynamic, oneDNN's, the int8 product compiled here);
- linear overhead: the rest of a linear layer (int8: quantizing each row, the scales, the bias, Python);
- attention: the attention module's own work (SDPA, the per-row loop of the int8 path, reshapes, Python);
- norms/rotary/elementwise: RMSNorm/LayerNorm, the rotary embedding, and elementwise ops anywhere else
  (rotary application, SiLU, residual adds);
- cache ops: the KV cache's update (DynamicCache's torch.cat, or the preallocated cache's in-place writes);
- other: everything else (embedding, masks, the logits' copy, Python between modules).

Which module an op ran in is known from `record_function` ranges opened by forward hooks (and around the cache's
update and the whole forward); an op belongs to its nearest labelled ancestor. Python time inside a module is the
self time of its range, listed as "(Python in <range>)".
The profiler slows Python down, so the shares matter more than the absolute milliseconds.

The memory floor: a one-token step reads every weight once (`weight_bytes_per_step`); at this machine's read
bandwidth (`read_bandwidth`, the faster of a matrix-vector product and a plain sum over a buffer far beyond any
cache) that alone takes bytes / bandwidth, however fast the kernels, so no one-token step of this model in this
format is faster.
"""
from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile
from transformers.pytorch_utils import Conv1D

from specdec.core.forwards import forward_seconds, primed_cache
from specdec.core.kv import CachedLM
from specdec.core.timing import time_median, warm_up
from specdec.models import native
from specdec.models.quant import Int8Linear, Int8Slice
from specdec.models.quant4 import Int4DynamicLinear, Int4Linear

GROUPS = ("GEMM", "linear overhead", "attention", "norms/rotary/elementwise", "cache ops", "other")
LABEL = "specdec:"  # prefix of the record_function ranges this module opens
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::_int_mm", "aten::bmm",
            "quantized::linear_dynamic", "onednn::qlinear_pointwise", "aten::_weight_int4pack_mm_for_cpu",
            native.PROFILED_AS}
ELEMENTWISE_OPS = {"aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::sub", "aten::neg", "aten::div",
                   "aten::rsqrt", "aten::pow", "aten::mean", "aten::silu", "aten::sigmoid", "aten::cos", "aten::sin",
                   "aten::exp", "aten::tanh", "aten::gelu"}
TOP_OPS = 12  # ops listed by self time
READ_BUFFER_MAX = 1 << 30  # bytes read to time memory reads at most: far beyond any cache, and spares memory
READ_WIDTH = 4096  # columns of the matrix `read_bandwidth` multiplies a vector by


@dataclass
class Breakdown:
    """Self CPU seconds per group and per op over `forwards` profiled forwards."""

    forwards: int
    wall_s: float  # the forwards' own wall time under the profiler (CachedLM.forward's clock)
    groups: dict[str, float]  # group -> seconds, all forwards
    ops: dict[tuple[str, str], float]  # (op name, group) -> seconds, all forwards

    @property
    def total_s(self) -> float:
        """Sum of all self times: the CPU time of everything profiled."""
        return sum(self.ops.values())


def profile_forwards(model: torch.nn.Module, new_tokens: int, forwards: int) -> Breakdown:
    """Profile `forwards` forwards over `new_tokens` new tokens after CONTEXT_TOKENS cached ones, through
    transformers' forward: its modules label the ops (an int8 model's own forward, which the product runs, calls
    the same ops without the modules around them)."""
    lm, base = primed_cache(model, own_forward=False)
    forward_seconds(lm, base, new_tokens)  # warm-up: first-call allocations
    with _labelled(model, lm), profile(activities=[ProfilerActivity.CPU]) as profiler:
        wall_s = sum(forward_seconds(lm, base, new_tokens) for _ in range(forwards))
    return _grouped(profiler.events(), forwards, wall_s)


def _grouped(events, forwards: int, wall_s: float) -> Breakdown:
    groups, ops = dict.fromkeys(GROUPS, 0.0), defaultdict(float)
    for event in events:
        group = group_of(event.name, _nearest_label(event))
        seconds = event.self_cpu_time_total / 1e6  # microseconds -> seconds
        groups[group] += seconds
        ops[(event.name, group)] += seconds
    return Breakdown(forwards, wall_s, groups, dict(ops))


def _nearest_label(event) -> str | None:
    """The label of the innermost specdec range holding `event` (itself included), or None."""
    while event is not None and not event.name.startswith(LABEL):
        event = event.cpu_parent
    return None if event is None else event.name.removeprefix(LABEL)


def group_of(op: str, label: str | None) -> str:
    """The group of an op named `op` run inside the range `label` (see the module docstring)."""
    if label == "linear":
        return "GEMM" if op in GEMM_OPS else "linear overhead"
    if label == "cache":
        return "cache ops"
    if label in ("norm", "rotary") or op in ELEMENTWISE_OPS:
        return "norms/rotary/elementwise"
    if label == "attention":
        return "attention"
    return "GEMM" if op in GEMM_OPS else "other"


def module_label(module: torch.nn.Module) -> str | None:
    """Which range a module's forward opens: linear, norm, rotary, attention, or none."""
    kind = type(module).__name__
    if isinstance(module, (torch.nn.Linear, Conv1D, Int8Linear, Int8Slice)):
        return "linear"
    if kind.endswith(("RMSNorm", "LayerNorm")) or isinstance(module, torch.nn.LayerNorm):
        return "norm"
    if "Rotary" in kind:
        return "rotary"
    return "attention" if kind.endswith("Attention") else None


@contextlib.contextmanager
def _labelled(model: torch.nn.Module, lm: CachedLM):
    """Open a record_function range around each labelled module's forward and around the cache's update."""
    handles = []
    for module in model.modules():
        if (label := "forward" if module is model else module_label(module)) is not None:
            ranges = []
            handles.append(module.register_forward_pre_hook(lambda *_, r=ranges, n=label: _enter(r, n)))
            handles.append(module.register_forward_hook(lambda *_, r=ranges: r.pop().__exit__(None, None, None)))
    update = lm.cache.update
    lm.cache.update = record_function(LABEL + "cache")(update)
    try:
        yield
    finally:
        lm.cache.update = update
        for handle in handles:
            handle.remove()


def _enter(ranges: list, label: str) -> None:
    ranges.append(record_function(LABEL + label))
    ranges[-1].__enter__()


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of weights one one-token forward reads: every linear layer (int8: a byte per weight plus a float32
    scale per output row; int4: its packed codes and bf16 scales and zeros; int4-dynamic: its packed codes and
    float16 scales and offsets; else the weight's own dtype); embeddings excluded (a token reads one row)."""
    total = 0
    for module in model.modules():
        if isinstance(module, Int4Linear):
            total += module.packed.numel() * module.packed.element_size() + 2 * module.scales_and_zeros.numel()
        elif isinstance(module, Int4DynamicLinear):
            total += module.packed.blocks.numel() + 2 * module.packed.scales.numel()
        elif isinstance(module, Int8Linear):
            total += module.weight.numel() + 4 * module.out_features
        elif isinstance(module, (torch.nn.Linear, Conv1D)):
            total += module.weight.numel() * module.weight.element_size()
    return total


def read_bandwidth(n_bytes: int, repeats: int = 5) -> float:
    """Bytes per second this machine reads weights from memory: the faster of a float32 matrix-vector product (a
    one-token step's access pattern) and a plain sum over one buffer of `n_bytes` (at most READ_BUFFER_MAX, already
    far beyond any cache), medians of `repeats`. Which of the two reads at the memory's speed depends on the CPU and
    its math library: on one CPU the product read 29 GB/s and the sum 23-24; on another the sum 42 and the product
    23, where fbgemm's int8 kernel read 43."""
    width = READ_WIDTH
    matrix = torch.ones(max(min(n_bytes, READ_BUFFER_MAX) // (4 * width), 1), width)  # [bytes / 4 / width, width]
    vector = torch.ones(width)  # [width]
    reads = (functools.partial(torch.mv, matrix, vector), matrix.sum)
    warm_up(*reads)
    return matrix.numel() * 4 / min(time_median(read, repeats, matrix.device)[1] for read in reads)


def print_breakdown(title: str, breakdown: Breakdown) -> None:
    """Groups (ms per forward, share), then the top ops by self time."""
    per_forward = 1000 / breakdown.forwards
    total = breakdown.total_s
    print(f"{title}: {total * per_forward:.2f} ms of profiled CPU time per forward, "
          f"{breakdown.wall_s * per_forward:.2f} ms wall under the profiler ({breakdown.forwards} forwards)")
    print(f"  {'group':26s} | ms/forward | share")
    for group, seconds in breakdown.groups.items():
        print(f"  {group:26s} | {seconds * per_forward:10.2f} | {seconds / total:6.1%}")
    print("  top ops by self time:")
    for (op, group), seconds in sorted(breakdown.ops.items(), key=lambda item: -item[1])[:TOP_OPS]:
        name = f"(Python in {op.removeprefix(LABEL)})" if op.startswith(LABEL) else op
        print(f"    {name[:44]:44s} {group:26s} {seconds * per_forward:8.2f} ms {seconds / total:6.1%}")
