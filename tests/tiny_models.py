"""Tiny model folders for the dashboard's tests and offline demos (nothing downloaded).

Target and draft share a byte-level BPE tokenizer trained in code (`specdec.testing`; any text,
Chinese included, tokenizes); the draft is a perturbed copy of the target (partial acceptance);
the unaligned draft has a smaller, different tokenizer (its ids mean other tokens).
"""
from __future__ import annotations

from pathlib import Path

from specdec.testing import perturbed_copy, tiny_bpe_tokenizer, tiny_model


def write_tiny_models(folder: str | Path, context: int = 512) -> dict[str, str]:
    """Save target / draft / unaligned-draft HF folders under `folder`; return {role: path}."""
    folder = Path(folder)
    tokenizer, other_tokenizer = tiny_bpe_tokenizer("bytelevel", 400), tiny_bpe_tokenizer("bytelevel", 300)
    target = tiny_model("llama", seed=0, vocab_size=len(tokenizer), context=context)
    models_by_role = {
        "target": (target, tokenizer),
        "draft": (perturbed_copy(target, noise=0.1, seed=1), tokenizer),
        "unaligned": (tiny_model("llama", seed=7, vocab_size=len(other_tokenizer), layers=1, context=context),
                      other_tokenizer),
    }
    paths = {}
    for role, (model, role_tokenizer) in models_by_role.items():
        path = folder / f"tiny-{role}"
        model.save_pretrained(path)
        role_tokenizer.save_pretrained(path)
        paths[role] = str(path)
    return paths


class Progress:
    """Stands in for gr.Progress outside a server."""

    def __call__(self, *args, **kwargs):
        pass

