"""Tiny seeded causal LMs built in code (no downloads), for tests, notebooks and demos."""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

ARCHITECTURES = ("llama", "qwen2", "gpt2")
WORDS = "def return if else for while in range print the a of to and is".split()


def tiny_config(arch: str = "llama", vocab_size: int = 128, layers: int = 2, hidden: int = 64,
                context: int = 256):
    """A small config of one of `ARCHITECTURES` (eos id 2, bos id 1)."""
    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "gpt2":
        # a wider init than GPT-2's 0.02, or a random 2-layer GPT-2 repeats one token forever
        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=context, initializer_range=0.1,
                          **common)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, **common)


def tiny_model(arch: str = "llama", seed: int = 0, **config_kwargs) -> torch.nn.Module:
    """A randomly initialised, seeded, fp32 causal LM in eval mode."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **config_kwargs), dtype=torch.float32)
    _sharpen(model)
    return model.eval()


def perturbed_copy(model: torch.nn.Module, noise: float, seed: int = 1) -> torch.nn.Module:
    """A copy of `model` with Gaussian noise (relative scale `noise`) on every weight: a partial-acceptance draft."""
    clone = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * noise * p.std().clamp_min(1e-3))
    return clone.eval()


def _sharpen(model: torch.nn.Module) -> None:
    """Scale the final norm so random models have peaked, non-degenerate next-token distributions."""
    base = model.base_model
    final_norm = getattr(base, "norm", None) or getattr(base, "ln_f")
    with torch.no_grad():
        final_norm.weight.mul_(8.0)


TINY_CORPUS = (  # text the tiny tokenizers are trained on (code, finance, prose)
    "import QuantLib as ql\ndef CalcBlackScholesVega(S, K, T, r, sigma):\n    return S * norm.pdf(d1) * sqrt(T)\n",
    "df['EBITDA_Margin'] = df['EBITDA'] / df['Revenue']  # margin of the quarter\n",
    "def price(option, curve):\n    return option.npv(curve.discount(option.maturity))\n",
    "The quick brown fox jumps over the lazy dog. The risk of the counterparty is low.\n",
)


def tiny_bpe_tokenizer(kind: str = "bytelevel", vocab_size: int = 400, corpus=TINY_CORPUS):
    """A BPE tokenizer trained in code: "bytelevel" (GPT-2/Qwen style, Ġ for spaces) or "metaspace"
    (SentencePiece/Llama style, ▁ for spaces). Ids 0, 1, 2 are <pad>, <s>, </s> (as in `tiny_config`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    if kind == "bytelevel":
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    elif kind == "metaspace":
        backend = Tokenizer(models.BPE(unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        backend.decoder = decoders.Metaspace()
        specials, alphabet = specials + ["<unk>"], []
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}: use 'bytelevel' or 'metaspace'")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet,
                                  show_progress=False)
    backend.train_from_iterator(list(corpus) * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def tiny_tokenizer(words: list[str] = WORDS) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer with <pad>/<s>/</s>/<unk> at ids 0..3 (the tiny models' specials)."""
    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def tiny_folder(path: Path, seed: int = 0, words: list[str] = WORDS, extra_rows: int = 0,
                arch: str = "llama") -> Path:
    """Save a tiny model and its tokenizer as an HF folder (safetensors); `extra_rows` pads the embeddings."""
    tokenizer = tiny_tokenizer(words)
    tiny_model(arch, seed, vocab_size=len(tokenizer) + extra_rows).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)
