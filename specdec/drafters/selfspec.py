"""Self-speculation: the target drafts for itself with its first L decoder layers.

Draft & Verify (Zhang et al. 2023) and LayerSkip (Elhoushi et al. 2024): an early exit of the
target, here its first L decoder layers followed by its own final norm and LM head, is a draft
that needs no second model, no extra weights and always shares the target's tokenizer. The
draft is a *view* of the target: every parameter is the target's own tensor; only the KV cache
of the L layers is new memory. `specdec.lab.measure.calibrate_layers` picks L by measurement.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from specdec.core.drafter import ModelDrafter
from specdec.core.inputs import unwrap

# model_type -> (attribute of the base model in the causal LM, attribute of its decoder layer list)
DECODER_LAYOUT = {
    "llama": ("model", "layers"),
    "qwen2": ("model", "layers"),  # also Qwen1.5
    "qwen3": ("model", "layers"),
    "mistral": ("model", "layers"),
    "gemma3_text": ("model", "layers"),
    "gpt2": ("transformer", "h"),
}


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The target's decoder layer list; ValueError for an architecture this module does not know."""
    model_type = getattr(model.config, "model_type", None)
    if model_type not in DECODER_LAYOUT:
        raise ValueError(
            f"self-speculation does not support model_type {model_type!r} yet (supported: "
            f"{', '.join(DECODER_LAYOUT)}); use a draft model or `--draft lookup` instead")
    base_name, list_name = DECODER_LAYOUT[model_type]
    return getattr(getattr(model, base_name), list_name)


def layer_view(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """A causal LM running the first `layers` decoder layers of `model`, then its final norm and LM head.

    Built from shallow copies with their own child dicts and a config copy saying `layers`
    layers (so a DynamicCache gets that many), so `model` is never modified and every parameter
    of the view is one of `model`'s tensors.
    """
    total = len(decoder_layers(model))
    if not isinstance(layers, int) or not 1 <= layers <= total:
        raise ValueError(
            f"self-speculation layers must be an integer in 1..{total} (the target has {total} decoder "
            f"layers), got {layers!r}; e.g. --draft self:{max(1, total // 2)}")
    base_name, list_name = DECODER_LAYOUT[model.config.model_type]
    config = _truncated_config(model.config, layers)
    base = getattr(model, base_name)
    base_view = _shallow_view(base, config)
    base_view._modules[list_name] = torch.nn.ModuleList(list(getattr(base, list_name))[:layers])
    view = _shallow_view(model, config)
    view._modules[base_name] = base_view
    return view


def _shallow_view(module: torch.nn.Module, config) -> torch.nn.Module:
    """A shallow copy with its own `_modules` dict (copy.copy alone would share it) and `config`."""
    view = copy.copy(module)
    view.__dict__["_modules"] = dict(module._modules)
    view.__dict__["config"] = config
    return view


def _truncated_config(config, layers: int):
    config = copy.deepcopy(config)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:layers])
    config.num_hidden_layers = layers
    return config


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class MemoryReport:
    """What a self-speculative draft adds to the target's memory."""

    layers: int  # decoder layers the draft runs (L)
    total_layers: int  # decoder layers of the target
    shared_weight_bytes: int  # bytes of the draft's parameters that are the target's own tensors
    copied_weight_bytes: int  # bytes of draft parameters that are NOT the target's tensors (0 = no copy)
    kv_cache_bytes: int  # the draft's KV cache right now (grows with the context)

    @property
    def added_bytes(self) -> int:
        """Memory the draft adds on top of the target: copied weights plus its KV cache."""
        return self.copied_weight_bytes + self.kv_cache_bytes


class SelfSpeculativeDraft(ModelDrafter):
    """The target's first L layers + final norm + LM head as a draft (Zhang et al. 2023; Elhoushi et al. 2024).

    Shares the target's parameters (no copy) and keeps its own KV cache of L layers, rolled back
    by the rule of `specdec.core.kv` like any model draft. `target_model` may be a `LoadedModel`.
    """

    def __init__(self, target_model, layers: int):
        target_model, _ = unwrap(target_model, None)
        self.target_model = target_model  # the model whose layers are borrowed (never modified)
        self.layers = layers  # L, decoder layers run by the draft
        super().__init__(layer_view(target_model, layers))

    @property
    def cost_key(self) -> str:
        return f"SelfSpeculativeDraft|layers={self.layers}"

    @property
    def spec(self) -> str:
        """The `--draft` name of this draft."""
        return f"self:{self.layers}"

    def memory_report(self) -> MemoryReport:
        target_ptrs = {p.data_ptr() for p in self.target_model.parameters()}
        params = list(self.lm.model.parameters())
        cache_tensors = [t for layer in self.lm.cache.layers for t in (getattr(layer, "keys", None),
                                                                       getattr(layer, "values", None))
                         if isinstance(t, torch.Tensor)]
        return MemoryReport(
            layers=self.layers,
            total_layers=len(decoder_layers(self.target_model)),
            shared_weight_bytes=tensor_bytes(p for p in params if p.data_ptr() in target_ptrs),
            copied_weight_bytes=tensor_bytes(p for p in params if p.data_ptr() not in target_ptrs),
            kv_cache_bytes=tensor_bytes(cache_tensors),
        )
