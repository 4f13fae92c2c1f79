"""GGUF -> safetensors conversion into the cache, once per (model, dtype).

transformers dequantizes a GGUF on every `from_pretrained(dir, gguf_file=...)` (48 s for the 1.5B
target on 2 cores). Converting once and saving plain safetensors makes later loads take about a
second. The quantizer is dropped before saving so the saved folder is an ordinary checkpoint.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, ContextManager

import torch
from tqdm import tqdm

from specdec.core import files
from specdec.models import cache
from specdec.models.cache import Progress

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def ensure_converted(key: str, dtype: str, gguf: Callable[[], ContextManager[Path]],
                     progress: Progress | None = None) -> Path:
    """The cached folder of `key` in `dtype`, converting it first if needed.

    `gguf()` gives the GGUF file for the length of a `with` (it may assemble it and hold it for reading,
    `cache.assembled`); it is called only when no usable conversion exists. bfloat16 is derived from a cached
    float32 conversion when there is one (a cast, seconds) instead of dequantizing again (the same values: both
    round the fp32 weights). A folder without a valid READY marker (a killed or truncated write) is converted
    again; one process converts at a time, the others wait and use its result.
    """
    folder = cache.converted_dir(key, dtype)
    if cache.is_ready(folder):
        return folder
    with cache.locked(folder):
        if not cache.is_ready(folder):
            if (folder / cache.READY).exists():
                _report(progress, f"the cached {dtype} copy of {key} is damaged (it no longer matches its "
                                  "fingerprints); converting it again", 0.0)
            _convert(key, dtype, folder, gguf, progress)
    return folder


def _convert(key: str, dtype: str, folder: Path, gguf: Callable[[], ContextManager[Path]],
             progress: Progress | None) -> None:
    base = cache.converted_dir(key, "float32")
    if dtype != "float32" and cache.is_ready(base):
        _report(progress, f"casting {key} to {dtype}", 0.0)
        _save(*_load_folder(base, dtype), folder)
    else:
        with gguf() as path:
            _report(progress, f"converting {path.name} to {dtype} safetensors (once; about a minute per GB)", 0.0)
            model, tokenizer = dequantize(path, dtype)
        _save(model, tokenizer, folder)
    _report(progress, f"{key} converted", 1.0)


def dequantize(path: Path, dtype: str):
    """(model, tokenizer) of the GGUF `path`, dequantized by transformers into `dtype` on the CPU, in memory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=TORCH_DTYPES[dtype])
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (OSError, KeyError, NotImplementedError) as error:
        raise ValueError(f"cannot convert {path}: {error} (is it a GGUF of an architecture transformers "
                         "supports?)") from error
    model.hf_quantizer = None  # the weights are plain tensors now: save them as such
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def _load_folder(folder: Path, dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=TORCH_DTYPES[dtype], use_safetensors=True)
    return model, AutoTokenizer.from_pretrained(folder)


def _save(model, tokenizer, folder: Path) -> None:
    with files.atomic_path(folder) as partial:
        model.save_pretrained(partial)  # safetensors
        tokenizer.save_pretrained(partial)
        cache.mark_ready(partial)


def _report(progress: Progress | None, message: str, fraction: float) -> None:
    """One line on stderr (a one-time, minute-long step deserves a word) and the caller's callback."""
    tqdm.write(f"specdec: {message}", file=sys.stderr)
    if progress:
        progress(message, fraction)
