"""Tiny seeded causal LMs built in code (no downloads), for tests, notebooks and demos."""
from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

ARCHITECTURES = ("llama", "qwen2", "gpt2")


def tiny_config(arch: str = "llama", vocab_size: int = 128, layers: int = 2, hidden: int = 64,
                context: int = 256):
    """A small config of one of `ARCHITECTURES` (eos id 2, bos id 1)."""
    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "gpt2":
        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=context, **common)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, **common)


def tiny_model(arch: str = "llama", seed: int = 0, **config_kwargs) -> torch.nn.Module:
    """A randomly initialised, seeded, fp32 causal LM in eval mode."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **config_kwargs), dtype=torch.float32)
    _sharpen(model, seed)
    return model.eval()


def perturbed_copy(model: torch.nn.Module, noise: float, seed: int = 1) -> torch.nn.Module:
    """A copy of `model` with Gaussian noise (relative scale `noise`) on every weight: a partial-acceptance draft."""
    clone = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * noise * p.std().clamp_min(1e-3))
    return clone.eval()


def _sharpen(model: torch.nn.Module, seed: int) -> None:
    """Scale the output head so random models have peaked, non-degenerate next-token distributions."""
    head = model.get_output_embeddings()
    if head is not None and head.weight is not model.get_input_embeddings().weight:
        with torch.no_grad():
            head.weight.mul_(8.0)
