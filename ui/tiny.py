"""Tiny models with a tiny byte-level tokenizer, saved as Hugging Face folders (tests, screenshots, offline demos).

Nothing is downloaded: the tokenizer is 3 special tokens + the 256 bytes (any text, Chinese included,
tokenizes), the models are `specdec.testing.tiny_model`s. The draft is a perturbed copy of the target
(partial acceptance); the unaligned draft has a different tokenizer (ids mean other tokens).
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdec.testing import perturbed_copy, tiny_model

SPECIALS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2 = tiny_config's pad, bos, eos


def byte_tokenizer(offset: int = 0) -> PreTrainedTokenizerFast:
    """Specials then the 256 byte symbols; `offset` rotates the byte ids (another tokenizer, same size)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    symbols = sorted(alphabet)
    symbols = symbols[offset:] + symbols[:offset]
    vocab = {token: i for i, token in enumerate(SPECIALS)} | {s: len(SPECIALS) + i for i, s in enumerate(symbols)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def write_tiny_models(folder: str | Path, context: int = 512) -> dict[str, str]:
    """Save target / draft / unaligned-draft folders under `folder`; return {role: path}."""
    folder = Path(folder)
    tokenizer = byte_tokenizer()
    vocab_size = len(tokenizer)
    target = tiny_model("llama", seed=0, vocab_size=vocab_size, context=context)
    models_by_role = {
        "target": (target, tokenizer),
        "draft": (perturbed_copy(target, noise=0.5, seed=1), tokenizer),
        "unaligned": (tiny_model("llama", seed=7, vocab_size=vocab_size + 40, layers=1, context=context),
                      byte_tokenizer(offset=97)),
    }
    paths = {}
    for role, (model, tok) in models_by_role.items():
        path = folder / f"tiny-{role}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths[role] = str(path)
    return paths
