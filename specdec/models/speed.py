"""Load-time speed levers that keep logits unchanged up to float rounding (measured in docs/performance.md, "Why a
2-token float32 forward costs about twice a 1-token one").

Why a verification forward of k+1 tokens cost several single-token steps in float32 on this CPU:
every fp32 Linear did. One row runs a matrix-vector product that streams each weight once; 2-16 rows
of `F.linear(x, W)` take MKL's GEMM path, measured here (AMD EPYC, 2 threads) at ~2.3x the 1-row time
for 2 rows and ~4.8x for 5, while the same product written `(W @ x.T).T` costs 1.1-1.3x
(`python -m specdec profile --kernels` prints the table). So:

- `RowsFirstLinear`: every float32 CPU Linear computes 2..ROWS_FIRST_MAX rows as W @ x.T (no copy,
  same parameters); 1 row and long prefills keep `F.linear`.
- `ColumnMajorHead`: the LM head additionally keeps a contiguous W.T for the 1-row decode step
  (x @ W_t: ~20% faster than `F.linear` for Qwen's [151936, H] head; costs one more copy of the head,
  0.5 GB for the 0.5B draft, 0.9 GB for the 1.5B target).
Parameters stay ordinary (ties, saving, resizing and training see a Linear); training takes `F.linear`.
SPECDEC_NO_ROWS_FIRST=1 / SPECDEC_NO_HEAD_TRANSPOSE=1 turn a lever off.
"""
from __future__ import annotations

import os

import torch

from specdec.core.limits import K_MAX

ROWS_FIRST_MAX = K_MAX + 1  # row counts 2..K_MAX+1 (a verification of the largest k plus one) take the W @ x.T path


def _fp32_cpu_inference(module: torch.nn.Linear, x: torch.Tensor) -> bool:
    weight = module.weight
    if weight.requires_grad and torch.is_grad_enabled():  # training: autograd through F.linear
        return False
    return weight.dtype == x.dtype == torch.float32 and weight.device.type == "cpu"


class RowsFirstLinear(torch.nn.Linear):
    """A Linear that computes float32 products of `rows_first` row counts as (W @ x.T).T: W [out, in] times x.T.

    Which row counts gain depends on the CPU's GEMM kernels: `specdec.costs.calibration.calibrate` times the whole
    forward both ways for each verification size and keeps the faster (`set_rows_first`)."""

    rows_first: frozenset = frozenset(range(2, ROWS_FIRST_MAX + 1))  # row counts taking W @ x.T (until calibrated)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows not in self.rows_first or not _fp32_cpu_inference(self, x):
            return super().forward(x)
        y = (self.weight @ x.reshape(rows, -1).T).T.reshape(*x.shape[:-1], self.out_features)  # [..., out]
        return y if self.bias is None else y + self.bias


class ColumnMajorHead(RowsFirstLinear):
    """The LM head: one row multiplies by a cached contiguous W.T, 2..16 rows as in RowsFirstLinear."""

    weight_t: torch.Tensor | None  # [in_features, out_features] copy of weight.T, refreshed when weight changes
    weight_version: int  # weight._version when weight_t was made (in-place updates bump it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1] or not _fp32_cpu_inference(self, x):
            return super().forward(x)
        if self.weight_t is None or self.weight_version != self.weight._version or self.weight_t.shape[1] != self.weight.shape[0]:
            self._refresh()
        logits = x @ self.weight_t  # [..., V]
        return logits if self.bias is None else logits + self.bias

    def _refresh(self) -> None:
        with torch.inference_mode(False), torch.no_grad():
            self.weight_t = self.weight.detach().t().contiguous()
        self.weight_version = self.weight._version


def apply_speed_levers(model: torch.nn.Module) -> list[str]:
    """Apply the levers that help `model` here; return their names (for the load report)."""
    applied = []
    if os.environ.get("SPECDEC_NO_ROWS_FIRST") != "1" and rows_first_linears(model):
        applied.append("rows-first float32 linears")
    if os.environ.get("SPECDEC_NO_HEAD_TRANSPOSE") != "1" and transpose_head_storage(model):
        applied.append("column-major LM head copy")
    return applied


def rows_first_linears(model: torch.nn.Module) -> int:
    """Make every plain float32 CPU Linear a RowsFirstLinear (same parameters, no copy). Returns how many."""
    swapped = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32 \
                and module.weight.device.type == "cpu":
            module.__class__ = RowsFirstLinear
            swapped += 1
    return swapped


def transpose_head_storage(model: torch.nn.Module) -> bool:
    """Make the fp32 CPU LM head a ColumnMajorHead (same parameters, same logits). Returns whether it did."""
    head = model.get_output_embeddings()
    if type(head) not in (torch.nn.Linear, RowsFirstLinear):
        return False
    if head.weight.device.type != "cpu" or head.weight.dtype != torch.float32:
        return False
    head.__class__ = ColumnMajorHead
    head.register_buffer("weight_t", None, persistent=False)  # a buffer: counted by pools, never saved
    head._refresh()
    return True


def set_rows_first(model: torch.nn.Module, rows) -> int:
    """Let every RowsFirstLinear of `model` take W @ x.T for exactly these row counts. Returns how many layers."""
    layers = [m for m in model.modules() if isinstance(m, RowsFirstLinear)]
    for layer in layers:
        layer.rows_first = frozenset(rows)
    return len(layers)
