"""The forward an int8 llama- or qwen2-style model runs: its int8 layers called directly, and nothing around them.

A one-token step on a CPU spends about as long between the weight products as in them: each int8 Linear is
reached through transformers' attention and MLP modules, shared-input slices and module calls, and every layer
adds its norms' modules, a per-head rotary, keys and values concatenated into a fresh tensor and transformers'
per-layer call chain. `decoder_for(model, attention)` reads the model's layers once into a `Plan` (each layer's int8
Linears, norm weights, sizes) and `Plan.forward` computes the same thing directly: the norms and rotary as
transformers' formulas, q and k rotated as one tensor, keys and values written in place (`Cache`), each int8
Linear's own forward (row-invariant, or coupled for a draft), and the attention the model is configured with,
called as transformers calls it. The logits are bitwise the model's own forward's (tests/test_int8_forward.py),
only sooner (docs/performance.md, "Each int8 model's own forward"), but for a draft's one-token steps: a draft's
precision never changes the output, so there each norm, the rotary with the key/value write and the attention, and
the gated product are one compiled call each (`native`: the same formulas within float rounding, without a dozen
small ops around each), and where all four of a layer's products are 4-bit the whole layer is one call
(`native.draft_layer`: those calls in the same order, bit for bit, without the calls from Python between them).

CachedLM runs it wherever `specdec.models.quant` marked the model (`specdec.core.kv.DECODER_FLAG`: the int8 target
with its row-by-row attention, a coupled draft with sdpa's) and this module knows the layout: DECODER_TYPES, full
attention, SiLU MLPs, every Linear int8 (or the int4-dynamic draft's 4-bit, `specdec.models.quant4`) with q/k/v and
gate/up each one shared-input layer. Any other model (the row-invariant 4-bit one, whose q/k/v are apart), or any
model with SPECDEC_TRANSFORMERS_FORWARD=1, runs its own forward.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from specdec.core.kv import reserved, written
from specdec.models import native

DECODER_TYPES = ("llama", "qwen2")  # model types whose decoder layer `Plan.forward` reproduces


Linear = Callable[[torch.Tensor], torch.Tensor]  # an int8 Linear's own forward: [n, in] -> [n, out]
Attention = Callable[..., tuple]  # transformers' attention interface: (module, q, k, v, mask, scaling=) -> (out, _)


@dataclass(frozen=True)
class Layer:
    """What one decoder layer's forward reads."""

    norm: torch.Tensor  # [d] input RMSNorm weight
    norm_eps: float
    qkv: Linear  # [d] -> [(H + 2·H_kv)·D]: q, k, v columns in that order
    o: Linear  # [H·D] -> [d]
    post_norm: torch.Tensor  # [d] post-attention RMSNorm weight
    post_norm_eps: float
    gate_up: Linear  # [d] -> [2·I]: gate, up columns
    down: Linear  # [I] -> [d]


class Cache:
    """Each layer's keys and values in storage [1, H_kv, capacity, D], its first `length` positions held; a crop only
    shortens `length`. What CachedLM asks of a cache: `is_croppable`, `crop`, `get_seq_length`."""

    is_croppable = True

    def __init__(self, layers: int):
        self.length = 0  # positions held
        self.keys: list[torch.Tensor | None] = [None] * layers  # [1, H_kv, capacity, D] each
        self.values: list[torch.Tensor | None] = [None] * layers

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (negative: drop that many), as transformers' caches do."""
        self.length = self.length + length if length < 0 else min(length, self.length)

    def update(self, index: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer `index`'s new key/value [1, H_kv, n, D] after the held positions (`kv.written`); the views
        [1, H_kv, length + n, D] attention reads (`length` moves on once every layer wrote: `advance`)."""
        end = self.length + key.shape[-2]
        self.keys[index] = written(self.keys[index], self.length, key)
        self.values[index] = written(self.values[index], self.length, value)
        return self.keys[index][..., :end, :], self.values[index][..., :end, :]

    def reserve(self, index: int, like: torch.Tensor, n: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s storages [1, H_kv, capacity, D] holding n positions past the held ones (`kv.reserved`;
        `like` [1, H_kv, 1, D]), for a step that writes its own keys and values there (`native.attend_one`)."""
        end = self.length + n
        self.keys[index] = reserved(self.keys[index], self.length, end, like)
        self.values[index] = reserved(self.values[index], self.length, end, like)
        return self.keys[index], self.values[index]

    def advance(self, n: int) -> None:
        self.length += n


@dataclass(frozen=True)
class Plan:
    """An int8 model's forward, read off its modules once (`decoder_for`)."""

    model: torch.nn.Module  # for its embedding and rotary modules
    layers: tuple[Layer, ...]
    norm: torch.Tensor  # [d] final RMSNorm weight
    norm_eps: float
    head: Linear  # [d] -> [V]
    heads: int  # H
    kv_heads: int  # H_kv
    head_dim: int  # D
    scaling: float  # attention's scale, D**-0.5 as transformers computes it
    intermediate: int  # I
    attention: Attention  # the one the model is configured with (`sdpa_attention`, or the int8 target's row by row)
    fused: bool = False  # a draft's: one-token steps run norms, attention and the gated product compiled (`native`)
    layers4: tuple = ()  # a 4-bit draft's, per layer: what `native.draft_layer` reads (its one-token step in one call)

    def new_cache(self) -> Cache:
        return Cache(len(self.layers))

    def forward(self, ids: torch.Tensor, cache: Cache, logits_to_keep: int = 1, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [1, logits_to_keep, V] of `ids` [1, n] after the positions `cache` holds, which then holds these
        too: bitwise `model(input_ids=ids, ...)`'s. positions [1, n] and mask bool [1, 1, n, past + n]: a draft
        tree's (`specdec.core.kv.tree_layout`; None: in a row, causal). Called inside CachedLM.forward's inference
        mode."""
        n, past = ids.shape[1], cache.length
        base = self.model.base_model
        hidden = self.model.get_input_embeddings()(ids)[0]  # [n, d]
        if positions is None:
            positions, mask = torch.arange(past, past + n, device=ids.device)[None], causal_mask(n, past, ids.device)
        cos, sin = (t[0, :, None] for t in base.rotary_emb(hidden, positions))  # [n, 1, D] each
        for index, layer in enumerate(self.layers):
            hidden = self._layer(layer, index, hidden, cos, sin, mask, cache)
        cache.advance(n)
        return self.head(_rms_norm(hidden[-logits_to_keep:], self.norm, self.norm_eps))[None]  # [1, keep, V]

    def _layer(self, layer: Layer, index: int, hidden, cos, sin, mask, cache: Cache) -> torch.Tensor:
        """One decoder layer over hidden [n, d], as transformers' llama/qwen2 layer computes it."""
        n, heads, kv_heads, dim = hidden.shape[0], self.heads, self.kv_heads, self.head_dim
        if self.fused and (n == 1 or self.layers4):
            return self._fused_step(layer, index, hidden, cos, sin, cache)
        qkv = layer.qkv(_rms_norm(hidden, layer.norm, layer.norm_eps))  # [n, (H + 2·H_kv)·D]
        qkv = qkv.view(n, heads + 2 * kv_heads, dim)
        qk = _rotated(qkv[:, :heads + kv_heads], cos, sin).transpose(0, 1)[None]  # [1, H + H_kv, n, D]
        value = qkv[:, heads + kv_heads:].transpose(0, 1)[None]  # [1, H_kv, n, D]
        key, value = cache.update(index, qk[:, heads:], value)  # [1, H_kv, past + n, D]
        out, _ = self.attention(None, qk[:, :heads], key, value, mask, scaling=self.scaling)  # [1, n, H, D]
        hidden = hidden + layer.o(out.reshape(n, heads * dim))
        gate_up = layer.gate_up(_rms_norm(hidden, layer.post_norm, layer.post_norm_eps))  # [n, 2·I]
        return hidden + layer.down(F.silu(gate_up[:, :self.intermediate]) * gate_up[:, self.intermediate:])

    def _fused_step(self, layer: Layer, index: int, hidden, cos, sin, cache: Cache) -> torch.Tensor:
        """A draft's step through one layer, hidden [n, d] (n = 1 unless every product is 4-bit): the same formulas,
        each norm, the attention and the gated product one compiled call (`native`), so float rounding differs from
        `_layer`'s."""
        if self.layers4:  # every product 4-bit: the whole layer in one call, the same calls inside, row by row
            norms, weights, like = self.layers4[index]
            keys, values = cache.reserve(index, like, hidden.shape[0])  # [1, H_kv, capacity, D]
            native.draft_layer(hidden, norms, weights, cos[:, 0].contiguous(), sin[:, 0].contiguous(), keys, values,
                               cache.length, self.heads, self.scaling)
            return hidden
        qkv = layer.qkv(native.rms_norm(hidden, layer.norm, layer.norm_eps))  # [1, (H + 2·H_kv)·D]
        keys, values = cache.reserve(index, qkv.view(1, -1, 1, self.head_dim)[:, :self.kv_heads])  # [1, H_kv, cap, D]
        out = native.attend_one(qkv[0], cos[0, 0], sin[0, 0], keys, values, cache.length, self.heads, self.scaling)
        hidden = hidden + layer.o(out)  # out [1, H·D]
        gate_up = layer.gate_up(native.rms_norm(hidden, layer.post_norm, layer.post_norm_eps))  # [1, 2·I]
        return hidden + layer.down(native.silu_mul(gate_up))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' llama/qwen2 RMSNorm of float32 x [n, d]: the same operations, so the same bits."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary of x [n, heads, D] (x·cos + rotate_half(x)·sin; cos, sin [n, 1, D])."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def causal_mask(new: int, past: int, device) -> torch.Tensor | None:
    """The mask transformers gives the attention for `new` positions after `past` cached ones: None where the call
    needs none (one new position, or no past: causal by sdpa's own rule), else bool [1, 1, new, past + new]."""
    if new == 1 or past == 0:
        return None
    return causal_rows(new, past, device)[None, None]


def causal_rows(new: int, past: int, device=None) -> torch.Tensor:
    """bool [new, past + new]: new position i sees positions 0..past + i."""
    return torch.ones(new, past + new, dtype=torch.bool, device=device).tril(past)


def sdpa_attention(module, query, key, value, mask, scaling: float, **kwargs) -> tuple[torch.Tensor, None]:
    """sdpa as transformers' sdpa attention calls it: query [1, H, n, D], key/value [1, H_kv, L, D]. No mask: causal
    when n > 1, the key/value heads shared inside sdpa; a mask: key/value repeated per query head. Returns
    ([1, n, H, D], None)."""
    groups = query.shape[1] // key.shape[1]
    if mask is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=query.shape[2] > 1, scale=scaling,
                                             enable_gqa=groups > 1)
    else:
        key, value = (t.repeat_interleave(groups, dim=1) if groups > 1 else t for t in (key, value))
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2), None


def decoder_for(model: torch.nn.Module, attention: Attention) -> Plan | None:
    """The Plan of `model`, an int8 model (or a view of its first layers) whose configured attention `attention`
    computes, or None where its layout is not the one `Plan.forward` reproduces (see the module docstring)."""
    config = model.config
    if os.environ.get("SPECDEC_TRANSFORMERS_FORWARD") == "1" or config.model_type not in DECODER_TYPES:
        return None
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []) \
            or config.hidden_act != "silu":
        return None
    base = model.base_model
    try:
        layers = tuple(_layer_of(layer) for layer in base.layers[:config.num_hidden_layers])
        head = _weight(model.get_output_embeddings())
        first = base.layers[0].self_attn  # every layer's head size and scale are the first one's
        fused = attention is sdpa_attention and native.library() is not None
        return Plan(model, layers, base.norm.weight, base.norm.variance_epsilon, head,
                    config.num_attention_heads, config.num_key_value_heads, first.head_dim,
                    first.scaling, config.intermediate_size, attention, fused=fused,
                    layers4=_layers4(layers, config.num_key_value_heads, first.head_dim) if fused else ())
    except (AttributeError, LayoutError):
        return None


class LayoutError(Exception):
    """A module is not laid out as `Plan.forward` reads it."""


def _layers4(layers: tuple[Layer, ...], kv_heads: int, head_dim: int) -> tuple:
    """Per layer, what `native.draft_layer` reads (norms, `native.weight4` of its four products, a key's shape and
    type), where every product of every layer is a 4-bit draft's; else ()."""
    like = torch.empty(1, kv_heads, 1, head_dim)
    found = []
    for layer in layers:
        owners = [getattr(linear, "__self__", None) for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        if not all(isinstance(getattr(owner, "packed", None), native.Packed4) for owner in owners):
            return ()
        found.append(((layer.norm, layer.norm_eps, layer.post_norm, layer.post_norm_eps),
                      tuple(native.weight4(owner.packed, owner.bias) for owner in owners), like))
    return tuple(found)


def _layer_of(layer: torch.nn.Module) -> Layer:
    attention, mlp = layer.self_attn, layer.mlp
    return Layer(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                 _shared(attention.q_proj, attention.k_proj, attention.v_proj), _weight(attention.o_proj),
                 layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                 _shared(mlp.gate_proj, mlp.up_proj), _weight(mlp.down_proj))


def _shared(*slices: torch.nn.Module) -> Linear:
    """The one int8 layer the shared-input slices read, their columns in order and covering it."""
    shared = slices[0].shared[0]
    starts = [s.start for s in slices] + [shared.out_features]
    if any(s.shared[0] is not shared for s in slices) or starts[0] != 0 \
            or any(s.end != start for s, start in zip(slices, starts[1:])):
        raise LayoutError("slices of different layers, or out of order")
    return _weight(shared)


def _weight(linear: torch.nn.Module) -> Linear:
    """The integer Linear's own forward (an int8 one, or a draft's 4-bit one: `direct`), called without a module
    call around it."""
    if not getattr(linear, "direct", False):
        raise LayoutError("not an int8 or 4-bit draft layer")
    return linear.forward
