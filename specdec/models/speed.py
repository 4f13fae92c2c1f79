"""Load-time speed levers that keep logits unchanged (see README "## Models").

Why a 2-token forward of Qwen2.5 in float32 costs about twice a 1-token one on this CPU: every fp32
linear layer does. One row runs a matrix-vector product that streams each weight once; 2-5 rows take
MKL's GEMM path, which costs about one weight pass per row or two (bf16 takes a kernel that reads the
weights once for all rows). The largest matrix is the [151936, H] LM head, and there the product over
a contiguous copy W_t = W.T ([H, V], a plain GEMM) measured 1.1-1.8x faster than `F.linear` over the
row-major W at every row count, without removing the doubling. `ColumnMajorHead` keeps such a copy
for fp32 CPU inference; the parameter itself (tied to the input embeddings in some checkpoints) is
left as it is, so saving, resizing and training see an ordinary Linear. Cost: one more copy of the
head (0.5 GB for the 0.5B draft, 0.9 GB for the 1.5B target).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F


class ColumnMajorHead(torch.nn.Linear):
    """A Linear whose fp32 inference forward multiplies by a cached contiguous W.T."""

    weight_t: torch.Tensor | None  # [in_features, out_features] copy of weight.T, refreshed when weight changes
    weight_version: int  # weight._version when weight_t was made (in-place updates bump it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.requires_grad and torch.is_grad_enabled():  # training: the real parameter
            return F.linear(x, self.weight, self.bias)
        if self.weight.dtype != torch.float32 or self.weight.device.type != "cpu" or x.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)
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
    if os.environ.get("SPECDEC_NO_HEAD_TRANSPOSE") != "1" and transpose_head_storage(model):
        applied.append("column-major LM head copy")
    return applied


def transpose_head_storage(model: torch.nn.Module) -> bool:
    """Make the fp32 CPU LM head a ColumnMajorHead (same parameters, same logits). Returns whether it did."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return False
    if head.weight.device.type != "cpu" or head.weight.dtype != torch.float32:
        return False
    head.__class__ = ColumnMajorHead
    head.register_buffer("weight_t", None, persistent=False)  # a buffer: counted by pools, never saved
    head._refresh()
    return True
