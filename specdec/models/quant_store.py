"""The quantized cache: a model is quantized once (int8: `quant.quantize_int8`; int4: `specdec.models.quant4`),
later loads read the stored result.

Quantizing at each load reads the float32 model and quantizes every Linear again. Instead, the first int8
load quantizes the model once and stores it:

    converted/<key>/int8/            for a GGUF (a catalogue package, a .gguf file), made from it with no
                                     float32 copy on disk (`load_gguf`: one tensor at a time where
                                     `gguf_read` reads the architecture), or next to a float32 conversion;
    quantized/<name>-<hash>/         for any other folder (a local checkpoint, an aligned draft, a hub
                                     snapshot), the hash naming the folder's resolved path;

holding `model.safetensors` (the quantized model's `state_dict`: int8 weights with their per-row float32
scales and biases, the norms in float32; the input embedding int8 per row, or nothing when it is tied to the
head, whose int8 rows it reads), `config.json` (the model's own config: `tie_word_embeddings` says whether the
embedding is the head's rows), `generation_config.json`, the tokenizer files, `int8.json` ({"format": its
Form's format, "source": the identity of what it was made from, "weight_limit": the |w| bound it was quantized
with, `quant.weight_limit()`}) and the cache's READY marker, written last. Later loads build the architecture
from the config with parameters on the meta device and fill it from those tensors (`quant.int8_from_state`): no
float32 pass, and the same bits as quantizing at load (tests/test_quant_cache.py).

A store is used only when it is READY, of its Form's format, made from its source as it is now (a float32
folder: the names, sizes and modification times of its files; a GGUF: a catalogue package's sha256, a .gguf
file's path, size and modification time) and with this machine's weight limit; anything else (a store of an
older layout, a changed source, unreadable weights) is made again, with one line on stderr saying why. Writes
go through `files.atomic_path` under `cache.locked`, so a killed save leaves only a partial that no load reads.
Copies of folders that no longer exist stay until `quantized/` is deleted. Bump a Form's format whenever its
stored layout or its quantization changes.

int4 (`INT4`) is stored the same way, in `converted/<key>/int4/` (a GGUF read straight into 4 bits, or next to
a conversion) or `quantized/<name>-<hash>-int4/`, with `int4.json`. Where specdec's compiled product builds, it
holds the model in the form the product runs (`quant4.stored_form`: every layer of whole groups 4-bit in the
product's layout, the head and q6_K tensors too), so a load repacks nothing; elsewhere torch's kernel's layers. Its
identity adds that layout (`quant4.packed_layout()`: the product's, or torch's version and CPU capability), since
the packed bits are the kernel's own; Int8Linear layers it holds are checked against the weight limit as an int8
store's are.
"""
from __future__ import annotations

import copy
import ctypes
import hashlib
import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, NamedTuple

import torch
from safetensors import SafetensorError

from specdec.core import files
from specdec.models import cache, convert, gguf_read, quant, quant4
from specdec.models.cache import Progress


@dataclass(frozen=True)
class Form:
    """A quantized form the cache stores."""

    name: str  # "int8" or "int4": its store folders, marker file and messages say it
    format: int  # layout of its stores; a store of another format is made again
    from_state: Callable[[torch.nn.Module, dict], torch.nn.Module]  # (model on meta, state_dict) -> quantized
    suffix: str  # of its folder under quantized/ (int8 stores keep their bare name)

    @property
    def marker(self) -> str:  # {"format": format, "source": identity of what it was made from, "weight_limit"}
        return f"{self.name}.json"

    @property
    def cache_source(self) -> str:  # LoadedModel.source of a model read from its store
        return f"cache ({self.name})"


class Quantized(NamedTuple):
    """A quantized model and where it is stored."""

    model: torch.nn.Module  # in eval mode, on the CPU
    tokenizer: object
    store: Path  # the store folder it was read from or written to
    stored: bool  # whether it was read from `store` (else made now, then stored)


INT8 = Form("int8", 2, quant.int8_from_state, "")
INT4 = Form("int4", quant4.FORMAT, quant4.int4_from_state, "-int4")
FORMS = (INT8, INT4)
WEIGHTS = "model.safetensors"
UNREADABLE = (OSError, ValueError, KeyError, RuntimeError, SafetensorError)  # what a damaged store raises when read


def store_folder(source: Path, form: Form = INT8) -> Path:
    """Where the `form` copy of float32 folder `source` is kept (see the module docstring)."""
    if source.name == "float32" and source.resolve().parent.parent == (cache.root() / "converted").resolve():
        return cache.converted_dir(source.parent.name, form.name)
    digest = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
    return cache.root() / "quantized" / f"{source.name}-{digest}{form.suffix}"


def source_identity(source: Path) -> str:
    """A digest of `source` as it is now: its resolved path and each file's name, size and modification time."""
    files = sorted(path for path in source.resolve().iterdir() if path.is_file())
    lines = [str(source.resolve())] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def load_int8(source: Path, float32: Callable[[], tuple], trust_remote_code: bool = False,
              progress: Progress | None = None) -> Quantized:
    """The int8 model of float32 folder `source` (and its tokenizer): read from its store when that is current,
    else `float32()` ((model, tokenizer) in float32 on the CPU) quantized and stored."""
    def quantized() -> tuple:
        model, tokenizer = float32()
        return quant.quantize_int8(model), tokenizer

    return _load(INT8, store_folder(source), source_identity(source), quantized, str(source), trust_remote_code,
                 progress)


def load_int4(source: Path, float32: Callable[[], tuple], trust_remote_code: bool = False,
              progress: Progress | None = None) -> Quantized:
    """As load_int8, in int4 (`quant4.quantize_int4`)."""
    def quantized() -> tuple:
        model, tokenizer = float32()
        return quant4.stored_form(quant4.quantize_int4(model)), tokenizer

    identity = _identity(INT4, source_identity(source))
    return _load(INT4, store_folder(source, INT4), identity, quantized, str(source), trust_remote_code, progress)


def load_gguf(form: Form, key: str, identity: str, gguf: Callable[[], ContextManager[Path]],
              progress: Progress | None = None) -> Quantized:
    """The `form` model of the GGUF `gguf()` gives for the length of a `with` (called only to make the store;
    `cache.assembled`), kept in `converted/<key>/<form>/` for a source of `identity` (a content hash, or path,
    size and modification time).

    Built straight from the GGUF, one tensor at a time (`quant4.int4_from_gguf`, `quant.int8_from_gguf`); an int8
    GGUF of an architecture not read that way (`gguf_read.reads`) is dequantized by transformers in memory and
    quantized. No float32 copy on disk either way."""
    def quantized() -> tuple:
        with gguf() as path:
            if form is INT4:
                model, tokenizer = quant4.int4_from_gguf(path)
                return quant4.stored_form(model), tokenizer
            if gguf_read.reads(path):
                return quant.int8_from_gguf(path)
            model, tokenizer = convert.dequantize(path, "float32")
        return quant.quantize_int8(model), tokenizer

    store = cache.converted_dir(key, form.name)
    return _load(form, store, _identity(form, identity), quantized, key, False, progress)


def gguf_store_problem(form: Form, key: str, identity: str) -> str | None:
    """Why `load_gguf(form, key, identity, ...)` would not read its store `converted/<key>/<form>/` (one phrase),
    or None when it would."""
    return _problem(form, cache.converted_dir(key, form.name), _identity(form, identity))


def _identity(form: Form, source: str) -> str:
    """What a `form` store made from a source of identity `source` depends on: int4's adds the kernel's packing."""
    return f"{source}|{quant4.packed_layout()}" if form is INT4 else source


def _load(form: Form, store: Path, identity: str, quantized: Callable[[], tuple], what: str,
          trust_remote_code: bool, progress: Progress | None) -> Quantized:
    """The model read from `store` when it is current for `identity`, else `quantized()` ((quantized model,
    tokenizer)) made and stored.

    The store's lock is held throughout: one process quantizes, the others wait and read its result, and no
    reader sees a store being replaced."""
    with cache.locked(store):
        problem = _problem(form, store, identity)
        if problem is None:
            try:
                return Quantized(*_read(form, store, trust_remote_code), store, True)
            except UNREADABLE as error:
                problem = f"its {form.name} weights cannot be read ({type(error).__name__}: {str(error)[:200]})"
        convert._report(progress, f"{what}: {problem}; quantizing to {form.name} and storing it in {store}", 0.0)
        with quant.weights_kept():  # the store's state_dict reads the weights, never unpacks them
            model, tokenizer = quantized()
            _write(form, model, tokenizer, store, identity)
        quant.release_weights(model)
    return Quantized(model, tokenizer, store, False)


def _problem(form: Form, store: Path, identity: str) -> str | None:
    """Why `store` cannot be used for a source of `identity` (one phrase), or None when it can."""
    if not store.exists():
        return f"no {form.name} copy yet (made once; later loads read it)"
    if not cache.is_ready(store):
        return f"its {form.name} copy is incomplete"
    try:
        marker = json.loads((store / form.marker).read_text())
        made_format, made_from = marker["format"], marker["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {form.name} copy has no readable {form.marker}"
    if made_format != form.format:
        return f"its {form.name} copy has format {made_format}, this version reads format {form.format}"
    if made_from != identity:
        return f"it changed since its {form.name} copy was made"
    if marker.get("weight_limit", quant.INT8_MAX) != quant.weight_limit():  # its Int8Linear layers (int4's head too)
        return (f"its {form.name} copy holds weights up to {marker.get('weight_limit', quant.INT8_MAX)}, and this "
                f"machine's fast kernel sums exactly up to {quant.weight_limit()}")
    return None


def _write(form: Form, model: torch.nn.Module, tokenizer, store: Path, identity: str) -> None:
    """Save the quantized `model` (safetensors), its config and tokenizer, then the marker and READY, atomically."""
    from safetensors.torch import save_file

    with files.atomic_path(store) as partial:
        partial.mkdir()
        state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}  # Conv1D's are transposed
        save_file(state, str(partial / WEIGHTS), metadata={"format": "pt"})
        config = copy.deepcopy(model.config)
        config.tie_word_embeddings = quant.is_tied(model)  # at run time untied (the head is its own module)
        config.save_pretrained(partial)
        model.generation_config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / form.marker).write_text(json.dumps({"format": form.format, "source": identity,
                                                       "weight_limit": quant.weight_limit()}))
        cache.mark_ready(partial)


def _read(form: Form, store: Path, trust_remote_code: bool):
    """(quantized model in eval mode, tokenizer) built from `store` without a float32 pass."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(store, trust_remote_code=trust_remote_code)
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary tables) computed
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
    form.from_state(model, load_file(store / WEIGHTS))
    model.generation_config = GenerationConfig.from_pretrained(store)
    return model.eval(), AutoTokenizer.from_pretrained(store, trust_remote_code=trust_remote_code)


def settle(made: Quantized) -> None:
    """Once `made.model`'s layers have their final form (packed, coupled, weights released): what it still reads
    of a store file it was read from in memory of its own (`_own_memory`), its lookup tables read through a
    private mapping of its store file (`_map_lookup_rows`), read from it or just written to it, and the memory its
    making freed returned to the OS."""
    if made.stored:
        _own_memory(made.model)
    _map_lookup_rows(made.model, made.store / WEIGHTS)
    _return_freed_pages()


def _return_freed_pages() -> None:
    """Give the heap pages freed while the model was made back to the OS (glibc's `malloc_trim`; nothing where the C
    library has none): glibc keeps freed chunks of up to 32 MB in its heap, and the temporaries of a conversion are
    of that size (a 0.5B int4-dynamic draft held 0.4 GB more than its tensors without this)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _own_memory(model: torch.nn.Module) -> None:
    """Copy `model`'s tensors out of the store file when it dropped some of the file's weights (an Int8Linear
    holding only fbgemm's packed copy), or when it runs on the compiled product (4-bit layers read a little faster
    from memory of their own than from the file's pages, 0.6 % a step on the 1.5B): `load_file`'s tensors all view
    one mapping of the file, resident while any of them lives (a tensor object made from it holds the mapping even
    once its data is replaced: new objects here), which would keep the dropped weights' pages in memory."""
    if not any((isinstance(module, quant.Int8Linear) and module.weight.is_meta)
               or isinstance(module, quant4.Int4DynamicLinear) for module in model.modules()):
        return
    copies: dict[int, tuple] = {}  # id of a tensor -> (it, its copy): a tensor registered twice stays one
    for module in model.modules():
        if isinstance(module, quant4.Int4DynamicLinear):
            module.own_memory()  # its kernel's arguments with its buffers
            continue
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None or tensor.is_meta or (name == "weight" and _holds_lookup_rows(module)):
                    continue  # lookup rows: read through a private mapping next (`_map_lookup_rows`), not copied
                if id(tensor) not in copies:
                    copies[id(tensor)] = (tensor, _copy(tensor))
                table[name] = copies[id(tensor)][1]


def _map_lookup_rows(model: torch.nn.Module, path: Path) -> None:
    """Read the int8 rows that only lookups read (the embedding's own table, or the head's int8 weight that a tied
    embedding reads beside the head's packed copy) from a private mapping of the store file instead of memory: a
    step reads one row per token, so only the pages of the tokens met become resident, not the whole table (the
    1.5B's is 233 MB). The values are the file's, the same bits; a write would go to a private copy of its page."""
    names = {id(module): name for name, module in model.named_modules()}
    tables = [m for m in (model.get_input_embeddings(), model.get_output_embeddings()) if _holds_lookup_rows(m)]
    if not tables:
        return
    header, start, mapping = _mapped(path)
    for module in tables:
        entry = header.get(f"{names[id(module)]}.weight")
        if entry is None or entry["dtype"] != "I8" or list(entry["shape"]) != list(module.weight.shape):
            continue  # not stored as this table: keep the rows as they are (made here: in memory)
        first, end = entry["data_offsets"]
        rows = torch.frombuffer(mapping, dtype=torch.int8, count=end - first, offset=start + first)
        module.register_buffer("weight", rows.view(module.weight.shape))


def _holds_lookup_rows(module: torch.nn.Module) -> bool:
    """Whether `module` holds int8 rows of its own that lookups read: an Int8Embedding's table, an int8 head kept
    beside the packed copy that computes its products (a tied embedding's rows), or a RescoredHead's rows (a few
    read a step, and a tied embedding's)."""
    weight = getattr(module, "_buffers", {}).get("weight")
    if weight is None or weight.is_meta or weight.dtype != torch.int8:
        return False
    if isinstance(module, quant.Int8Linear):
        return module.keeps_weight and (module.packed is not None or module.coupled is not None)
    return isinstance(module, (quant.Int8Embedding, quant4.RescoredHead))


def _mapped(path: Path) -> tuple[dict, int, mmap.mmap]:
    """(the safetensors header of `path`, the offset its data starts at, a private read mapping of the file)."""
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(length))
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    return header, 8 + length, mapping


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A new tensor object with `tensor`'s values in memory of its own (a Parameter stays one)."""
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(tensor.detach().clone(), requires_grad=tensor.requires_grad)
    return tensor.clone()
