"""The forward a coupled (int8-dynamic) llama- or qwen2-style draft runs: one fbgemm call per weight and nothing
else around it.

A draft's one-token step on a CPU spends about as long between its weight products as in them: each coupled
Linear is reached through transformers' attention and MLP modules, shared-input slices and a wrapper that
reshapes and casts, and every layer adds its norms' modules, a per-head rotary, keys and values concatenated
into a fresh tensor and transformers' per-layer call chain. `decoder_for(model)` reads the model's layers once
into a `Plan` (each layer's packed weights, norm weights, sizes) and `Plan.forward` computes the same thing
directly: the norms and rotary as transformers' formulas, q and k rotated as one tensor, keys and values written
in place (`Cache`), sdpa called as transformers' sdpa attention calls it for that shape. The logits are bitwise
the model's own forward's (tests/test_coupled.py), only sooner (docs/performance.md, "The draft's step").

CachedLM runs it wherever `quant.couple_rows` marked the model (`specdec.core.kv.DECODER_FLAG`) and this module
knows the layout: DECODER_TYPES, full attention, SiLU MLPs, every Linear coupled (q/k/v and gate/up each one
shared-input layer). Any other model, or any model with SPECDEC_TRANSFORMERS_FORWARD=1, runs its own forward.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DECODER_TYPES = ("llama", "qwen2")  # model types whose decoder layer `Plan.forward` reproduces
MIN_CAPACITY = 256  # positions a cache holds at first; it doubles when full


@dataclass(frozen=True)
class Weight:
    """One coupled Linear: fbgemm's packed weight (scales and bias inside) and whether activations use 7 bits."""

    packed: object
    reduce_range: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)  # [n, in] -> [n, out]


@dataclass(frozen=True)
class Layer:
    """What one decoder layer's forward reads."""

    norm: torch.Tensor  # [d] input RMSNorm weight
    norm_eps: float
    qkv: Weight  # [d] -> [(H + 2·H_kv)·D]: q, k, v columns in that order
    o: Weight  # [H·D] -> [d]
    post_norm: torch.Tensor  # [d] post-attention RMSNorm weight
    post_norm_eps: float
    gate_up: Weight  # [d] -> [2·I]: gate, up columns
    down: Weight  # [I] -> [d]


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
        """Write layer `index`'s new key/value [1, H_kv, n, D] after the held positions; the views [1, H_kv,
        length + n, D] attention reads (`length` moves on once every layer wrote: `advance`)."""
        end = self.length + key.shape[-2]
        if self.keys[index] is None or end > self.keys[index].shape[-2]:
            self.keys[index] = _grown(self.keys[index], end, key, self.length)
            self.values[index] = _grown(self.values[index], end, value, self.length)
        self.keys[index][..., self.length:end, :] = key
        self.values[index][..., self.length:end, :] = value
        return self.keys[index][..., :end, :], self.values[index][..., :end, :]

    def advance(self, n: int) -> None:
        self.length += n

    def tensors(self) -> list[torch.Tensor]:
        """The storage tensors (for memory reports)."""
        return [t for t in self.keys + self.values if t is not None]


def _grown(held: torch.Tensor | None, needed: int, new: torch.Tensor, length: int) -> torch.Tensor:
    """Storage like `new` [1, H_kv, n, D] of at least `needed` positions (twice the old, MIN_CAPACITY at first),
    holding the first `length` positions of `held`."""
    old = 0 if held is None else held.shape[-2]
    storage = new.new_empty((*new.shape[:-2], max(needed, MIN_CAPACITY, 2 * old), new.shape[-1]))
    if length:
        storage[..., :length, :] = held[..., :length, :]
    return storage


@dataclass(frozen=True)
class Plan:
    """A coupled model's forward, read off its modules once (`decoder_for`)."""

    model: torch.nn.Module  # for its embedding and rotary modules
    layers: tuple[Layer, ...]
    norm: torch.Tensor  # [d] final RMSNorm weight
    norm_eps: float
    head: Weight  # [d] -> [V]
    heads: int  # H
    kv_heads: int  # H_kv
    head_dim: int  # D
    scaling: float  # attention's scale, D**-0.5 as transformers computes it
    intermediate: int  # I

    def new_cache(self) -> Cache:
        return Cache(len(self.layers))

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: Cache, logits_to_keep: int = 1) -> torch.Tensor:
        """Logits [1, logits_to_keep, V] of `ids` [1, n] after the positions `cache` holds, which then holds these
        too: bitwise `model(input_ids=ids, ...)`'s."""
        n, past = ids.shape[1], cache.length
        base = self.model.base_model
        hidden = self.model.get_input_embeddings()(ids)[0]  # [n, d]
        positions = torch.arange(past, past + n, device=ids.device)[None]  # [1, n]
        cos, sin = (t[0, :, None] for t in base.rotary_emb(hidden, positions))  # [n, 1, D] each
        for index, layer in enumerate(self.layers):
            hidden = self._layer(layer, index, hidden, cos, sin, cache)
        cache.advance(n)
        return self.head(_rms_norm(hidden[-logits_to_keep:], self.norm, self.norm_eps))[None]  # [1, keep, V]

    def _layer(self, layer: Layer, index: int, hidden, cos, sin, cache: Cache) -> torch.Tensor:
        """One decoder layer over hidden [n, d], as transformers' llama/qwen2 layer computes it."""
        n, heads, kv_heads, dim = hidden.shape[0], self.heads, self.kv_heads, self.head_dim
        qkv = layer.qkv(_rms_norm(hidden, layer.norm, layer.norm_eps)).view(n, heads + 2 * kv_heads, dim)
        qk = _rotated(qkv[:, :heads + kv_heads], cos, sin).transpose(0, 1)[None]  # [1, H + H_kv, n, D]
        value = qkv[:, heads + kv_heads:].transpose(0, 1)[None]  # [1, H_kv, n, D]
        key, value = cache.update(index, qk[:, heads:], value)  # [1, H_kv, past + n, D]
        out = _attention(qk[:, :heads], key, value, cache.length, self.scaling)  # [1, H, n, D]
        hidden = hidden + layer.o(out[0].transpose(0, 1).reshape(n, heads * dim))
        gate_up = layer.gate_up(_rms_norm(hidden, layer.post_norm, layer.post_norm_eps))  # [n, 2·I]
        return hidden + layer.down(F.silu(gate_up[:, :self.intermediate]) * gate_up[:, self.intermediate:])


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' llama/qwen2 RMSNorm of float32 x [n, d]: the same operations, so the same bits."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary of x [n, heads, D] (x·cos + rotate_half(x)·sin; cos, sin [n, 1, D])."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attention(query, key, value, past: int, scale: float) -> torch.Tensor:
    """sdpa as transformers' sdpa attention calls it: query [1, H, n, D] after `past` positions, key/value
    [1, H_kv, past + n, D]. One new position or no past: no mask (causal by sdpa's own rule), the key/value heads
    shared inside sdpa; else a boolean causal mask, key/value repeated per query head."""
    n, groups = query.shape[2], query.shape[1] // key.shape[1]
    if n == 1 or past == 0:
        return F.scaled_dot_product_attention(query, key, value, is_causal=n > 1, scale=scale, enable_gqa=groups > 1)
    mask = torch.ones(n, past + n, dtype=torch.bool, device=query.device).tril(past)  # [n, past + n]
    key, value = (t.repeat_interleave(groups, dim=1) if groups > 1 else t for t in (key, value))
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask[None, None], scale=scale)


def decoder_for(model: torch.nn.Module) -> Plan | None:
    """The Plan of `model`, a coupled model (`quant.couple_rows`) or a view of its first layers, or None where
    its layout is not the one `Plan.forward` reproduces (see the module docstring)."""
    config = model.config
    if os.environ.get("SPECDEC_TRANSFORMERS_FORWARD") == "1" or config.model_type not in DECODER_TYPES:
        return None
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []) \
            or config.hidden_act != "silu" or config._attn_implementation != "sdpa":
        return None
    base = model.base_model
    try:
        layers = tuple(_layer_of(layer) for layer in base.layers[:config.num_hidden_layers])
        head = _weight(model.get_output_embeddings())
        attention = base.layers[0].self_attn
        return Plan(model, layers, base.norm.weight, base.norm.variance_epsilon, head,
                    config.num_attention_heads, config.num_key_value_heads, attention.head_dim,
                    attention.scaling, config.intermediate_size)
    except (AttributeError, LayoutError):
        return None


class LayoutError(Exception):
    """A module is not laid out as `Plan.forward` reads it."""


def _layer_of(layer: torch.nn.Module) -> Layer:
    attention, mlp = layer.self_attn, layer.mlp
    return Layer(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                 _shared(attention.q_proj, attention.k_proj, attention.v_proj), _weight(attention.o_proj),
                 layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                 _shared(mlp.gate_proj, mlp.up_proj), _weight(mlp.down_proj))


def _shared(*slices: torch.nn.Module) -> Weight:
    """The one coupled layer the shared-input slices read, their columns in order and covering it."""
    shared = slices[0].shared[0]
    starts = [s.start for s in slices] + [shared.out_features]
    if any(s.shared[0] is not shared for s in slices) or starts[0] != 0 \
            or any(s.end != start for s, start in zip(slices, starts[1:])):
        raise LayoutError("slices of different layers, or out of order")
    return _weight(shared)


def _weight(linear: torch.nn.Module) -> Weight:
    if getattr(linear, "coupled", None) is None:
        raise LayoutError("not a coupled int8 layer")
    return Weight(linear.coupled, linear.reduce_range)
