"""The int8 cache: a model is quantized once (`quant.quantize_int8`), later int8 loads read the stored result.

Quantizing at each load reads the float32 model and quantizes every Linear again. Instead, the first int8
load of a float32 folder quantizes it and stores:

    converted/<key>/int8/            next to the float32 conversion it was made from (catalogue, .gguf);
    quantized/<name>-<hash>/         for any other folder (a local checkpoint, an aligned draft, a hub
                                     snapshot), the hash naming the folder's resolved path;

holding `model.safetensors` (the quantized model's `state_dict`: int8 weights with their per-row float32
scales and biases, the embeddings and norms in float32), `config.json`, `generation_config.json`, the
tokenizer files, `int8.json` ({"format": FORMAT, "source": the float32 folder's identity, "weight_limit": the
|w| bound it was quantized with, `quant.weight_limit()`}) and the cache's
READY marker, written last. Later loads build the architecture from the config with parameters on the meta
device and fill it from those tensors (`quant.int8_from_state`): no float32 pass, and the same bits as
quantizing at load (tests/test_quant_cache.py).

A store is used only when it is READY, of this FORMAT, made from the float32 folder as it is now (the
names, sizes and modification times of its files) and with this machine's weight limit; anything else (a store of an older layout, a changed
source, unreadable weights) is made again, with one line on stderr saying why. Writes go through
`cache.atomic_path` under `cache.locked`, so a killed save leaves only a partial that no load reads.
Copies of folders that no longer exist stay until `quantized/` is deleted. Bump FORMAT whenever the stored
layout or the quantization changes.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError

from specdec.models import cache, convert, quant
from specdec.models.cache import Progress

FORMAT = 1  # layout of a store; a store of another format is made again
MARKER = "int8.json"  # {"format": FORMAT, "source": the float32 folder's identity, "weight_limit": its |w| bound}
WEIGHTS = "model.safetensors"
CACHE_SOURCE = "cache (int8)"  # LoadedModel.source of a model read from its store
UNREADABLE = (OSError, ValueError, KeyError, RuntimeError, SafetensorError)  # what a damaged store raises when read


def store_folder(source: Path) -> Path:
    """Where the int8 copy of float32 folder `source` is kept (see the module docstring)."""
    if source.name == "float32" and source.resolve().parent.parent == (cache.root() / "converted").resolve():
        return cache.converted_dir(source.parent.name, "int8")
    digest = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
    return cache.root() / "quantized" / f"{source.name}-{digest}"


def source_identity(source: Path) -> str:
    """A digest of `source` as it is now: its resolved path and each file's name, size and modification time."""
    files = sorted(path for path in source.resolve().iterdir() if path.is_file())
    lines = [str(source.resolve())] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def load_int8(source: Path, float32: Callable[[], tuple], trust_remote_code: bool = False,
              progress: Progress | None = None) -> tuple[torch.nn.Module, object, bool]:
    """(int8 model, tokenizer, whether it was read from the store) for float32 folder `source`: read from its
    store when that is current, else `float32()` ((model, tokenizer) in float32 on the CPU) quantized and stored.

    The store's lock is held throughout: one process quantizes, the others wait and read its result, and no
    reader sees a store being replaced."""
    store, identity = store_folder(source), source_identity(source)
    with cache.locked(store):
        problem = _problem(store, identity)
        if problem is None:
            try:
                return (*_read(store, trust_remote_code), True)
            except UNREADABLE as error:
                problem = f"its int8 weights cannot be read ({type(error).__name__}: {str(error)[:200]})"
        convert._report(progress, f"{source}: {problem}; quantizing to int8 and storing it in {store}", 0.0)
        model, tokenizer = float32()
        quant.quantize_int8(model)
        _write(model, tokenizer, store, identity)
    return model, tokenizer, False


def _problem(store: Path, identity: str) -> str | None:
    """Why `store` cannot be used for a source of `identity` (one phrase), or None when it can."""
    if not store.exists():
        return "no int8 copy yet (made once; later loads read it)"
    if not cache.is_ready(store):
        return "its int8 copy is incomplete"
    try:
        marker = json.loads((store / MARKER).read_text())
        made_format, made_from = marker["format"], marker["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its int8 copy has no readable {MARKER}"
    if made_format != FORMAT:
        return f"its int8 copy has format {made_format}, this version reads format {FORMAT}"
    if made_from != identity:
        return "it changed since its int8 copy was made"
    if marker.get("weight_limit", quant.INT8_MAX) != quant.weight_limit():
        return (f"its int8 copy holds weights up to {marker.get('weight_limit', quant.INT8_MAX)}, and this machine's "
                f"fast kernel sums exactly up to {quant.weight_limit()}")
    return None


def _write(model: torch.nn.Module, tokenizer, store: Path, identity: str) -> None:
    """Save the quantized `model` (safetensors), its config and tokenizer, then the marker and READY, atomically."""
    from safetensors.torch import save_file

    with cache.atomic_path(store) as partial:
        partial.mkdir()
        state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}  # Conv1D's are transposed
        save_file(state, str(partial / WEIGHTS), metadata={"format": "pt"})
        model.config.save_pretrained(partial)
        model.generation_config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / MARKER).write_text(json.dumps({"format": FORMAT, "source": identity,
                                                  "weight_limit": quant.weight_limit()}))
        cache.mark_ready(partial)


def _read(store: Path, trust_remote_code: bool):
    """(int8 model in eval mode, tokenizer) built from `store` without a float32 pass."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(store, trust_remote_code=trust_remote_code)
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary tables) computed
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
    quant.int8_from_state(model, load_file(store / WEIGHTS))
    model.generation_config = GenerationConfig.from_pretrained(store)
    return model.eval(), AutoTokenizer.from_pretrained(store, trust_remote_code=trust_remote_code)
