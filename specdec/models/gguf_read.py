"""A GGUF read one tensor at a time into a transformers model built on the meta device: how the int8 and int4 models
are made straight from a GGUF (`quant.int8_from_gguf`, `quant4.int4_from_gguf`), with no float32 model on disk or in
memory.

`from_gguf(path, fill, form)` builds the architecture from the GGUF's config (parameters on meta, buffers such as
the rotary tables computed) with its tokenizer, and `fill(model, GGUFWeights)` replaces the meta tensors. A
`GGUFWeights` gives each tensor under its transformers name, dequantized bitwise as the gguf package does for
transformers (`gguf_dequant`, in torch) and with its rows in transformers' order, so a tensor comes out bitwise as
in the float32 conversion. Read this way: llama- and qwen2-style GGUFs (`reads`), those whose tensors transformers
only reorders (llama.cpp interleaves the rotary halves of llama q/k rows); others need transformers' own conversion.

A GGUF's metadata holds its tokenizer (150k tokens and as many merges for the catalogue's models), which the gguf
package parses field by field: about 10 s per parse on a 2-core CPU, and building one model from a GGUF used to
parse it four or five times (the format calibration's config, the config, the tokenizer, `reads`, the tensors).
So the file is parsed once while it is used, and faster: `reader(path)` keeps the last `FastReader` (a GGUFReader
reading metadata arrays from one buffer), and transformers' metadata read (`load_gguf_checkpoint` without tensors:
what `AutoConfig` and `AutoTokenizer` call) keeps its last result, made from that same reader; both are kept for
the file's path, size and modification time, and `forget()` drops them once a model is built, so no memory map
outlives its use (an assembled GGUF is removed once stored).
"""
from __future__ import annotations

import contextlib
import copy
import functools
from pathlib import Path
from typing import Callable, Iterator

import gguf
import numpy as np
import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers import modeling_gguf_pytorch_utils
from transformers.modeling_gguf_pytorch_utils import (
    TENSOR_PROCESSORS, LlamaTensorProcessor, TensorProcessor, get_gguf_hf_weights_map, read_field)

from specdec.models import gguf_dequant

ROW_PROCESSORS = (TensorProcessor, LlamaTensorProcessor)  # transformers' GGUF tensor fixes that only reorder rows
UNREADABLE = (OSError, ValueError, KeyError, IndexError)  # what GGUFReader raises on a file that is not a GGUF


def _identity(path) -> tuple[str, int, int]:
    stat = Path(path).stat()
    return str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns


class FastReader(gguf.GGUFReader):
    """GGUFReader with the same fields and tensors, its metadata arrays (a tokenizer's 150k tokens, merges and types)
    read from one buffer instead of one memory-mapped view per element (seconds instead of ~10 s)."""

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type != gguf.GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        item_type, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        kind, n, raw = gguf.GGUFValueType(item_type[0]), int(count[0]), memoryview(self.data)
        parts, offs, scalar = [item_type, count], orig_offs + 12, self.gguf_scalar_to_np.get(kind)
        if scalar is not None:  # each element its own one-value part, as GGUFReader makes them
            values = np.frombuffer(raw, dtype=scalar, count=n, offset=offs)
            parts += [values[i:i + 1] for i in range(n)]
            offs += values.nbytes
        elif kind == gguf.GGUFValueType.STRING:  # each string: its u64 length part, then its bytes part
            for _ in range(n):
                length = np.frombuffer(raw, dtype=np.uint64, count=1, offset=offs)
                parts += [length, np.frombuffer(raw, dtype=np.uint8, count=int(length[0]), offset=offs + 8)]
                offs += 8 + int(length[0])
        else:  # arrays of arrays: as GGUFReader reads them
            return super()._get_field_parts(orig_offs, raw_type)
        data = list(range(2, len(parts))) if scalar is not None else list(range(3, len(parts), 2))
        return offs - orig_offs, parts, data, [gguf.GGUFValueType.ARRAY] + [kind] * (n > 0)


@functools.lru_cache(maxsize=1)
def _reader(identity: tuple[str, int, int]) -> gguf.GGUFReader:
    return FastReader(identity[0])


def reader(path: Path) -> gguf.GGUFReader:
    """The GGUFReader of `path`, parsed once while the file is unchanged (module docstring)."""
    return _reader(_identity(path))


_transformers_metadata = modeling_gguf_pytorch_utils.load_gguf_checkpoint


@functools.lru_cache(maxsize=1)
def _metadata(identity: tuple[str, int, int]) -> dict:
    parse = gguf.GGUFReader
    gguf.GGUFReader = lambda path, *args: _reader(identity)  # transformers reads the one FastReader of this file
    try:
        return _transformers_metadata(identity[0], return_tensors=False)
    finally:
        gguf.GGUFReader = parse


def _load_gguf_checkpoint(gguf_checkpoint_path, return_tensors=False, **kwargs):
    """transformers' `load_gguf_checkpoint`, its metadata-only read kept for the last file (module docstring)."""
    if return_tensors or kwargs:
        return _transformers_metadata(gguf_checkpoint_path, return_tensors, **kwargs)
    return copy.deepcopy(_metadata(_identity(gguf_checkpoint_path)))  # callers may change what they are given


modeling_gguf_pytorch_utils.load_gguf_checkpoint = _load_gguf_checkpoint  # read at each call by AutoConfig/Tokenizer


def forget() -> None:
    """Drop the kept GGUFReader and metadata (their memory map and memory)."""
    _reader.cache_clear()
    _metadata.cache_clear()


def from_gguf(path: Path, fill: Callable[[torch.nn.Module, "GGUFWeights"], None],
              form: str) -> tuple[torch.nn.Module, object]:
    """(model in eval mode, tokenizer) of the GGUF `path`: its architecture on the meta device, filled by
    `fill(model, weights)`; a GGUF that cannot be read this way is one ValueError naming `form` ("int8", "int4")."""
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary tables) computed
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.generation_config = GenerationConfig.from_model_config(config)
        fill(model, GGUFWeights(path, model))
    except (OSError, KeyError, RuntimeError, NotImplementedError) as error:
        raise ValueError(f"cannot build an {form} model from {path.name}: {error}") from error
    finally:
        forget()
    return model.eval(), tokenizer


def reads(path: Path) -> bool:
    """Whether `path` is a GGUF of an architecture read tensor by tensor here (llama- or qwen2-style)."""
    try:
        _processor(reader(path))
    except (*UNREADABLE, NotImplementedError):
        forget()
        return False
    return True


def _processor(reader: gguf.GGUFReader) -> type[TensorProcessor]:
    """transformers' tensor processor of the GGUF's architecture; NotImplementedError for one that does more than
    reorder rows."""
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    if processor not in ROW_PROCESSORS:
        raise NotImplementedError(f"int8 and int4 are read straight from llama- and qwen2-style GGUFs, not "
                                  f"{architecture}")
    return processor


@contextlib.contextmanager
def _one_name_map():
    """Within, gguf's tensor name map is made once per (architecture, depth): transformers' get_gguf_hf_weights_map
    makes it again for every submodule it walks (about 700 times for a 1.5B, seconds)."""
    made = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(made)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = made


class GGUFWeights:
    """A GGUF's tensors under a transformers model's names, read one at a time (memory-mapped), rows in
    transformers' order; a tied head (no `output.weight`) reads the embedding's tensor."""

    tied: bool  # whether the head is the embedding (the GGUF has no `output.weight`)

    def __init__(self, path: Path, model: torch.nn.Module):
        parsed = reader(path)
        self.processor = _processor(parsed)(config=model.config.to_dict())
        with _one_name_map():
            names = get_gguf_hf_weights_map(model, self.processor)  # gguf name -> transformers name
        self.tensors = {names[t.name]: t for t in parsed.tensors if t.name in names}
        head = f"{module_name(model, model.get_output_embeddings())}.weight"
        self.tied = head not in self.tensors
        self.tensors.setdefault(head, self.tensors[f"{module_name(model, model.get_input_embeddings())}.weight"])

    def bits(self, name: str) -> float:
        """Bits per weight tensor `name` is stored in (q4_K 4.5, q6_K 6.56, q8_0 8.5, f32 32)."""
        block, size = gguf.GGML_QUANT_SIZES[self.tensors[name].tensor_type]
        return 8 * size / block

    def float(self, name: str) -> torch.Tensor:
        """Tensor `name` dequantized: [rows, cols] or [n] float32."""
        return gguf_dequant.dequantize(self.raw(name), self.tensors[name].tensor_type)

    def float_rows(self, name: str, rows: int) -> Iterator[torch.Tensor]:
        """Tensor `name` dequantized `rows` rows at a time, in order: [r, cols] float32 each, the rows `float` gives
        (dequantization is block by block, and a block never spans two rows)."""
        raw, kind = self.raw(name), self.tensors[name].tensor_type
        for start in range(0, len(raw), rows):
            yield gguf_dequant.dequantize(raw[start:start + rows], kind)

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor `name`'s shape as transformers holds it: [rows, cols], or [n]."""
        tensor = self.tensors[name]
        return tuple(int(d) for d in reversed(tensor.shape))

    def raw(self, name: str) -> np.ndarray:
        """Tensor `name` as stored (its blocks' bytes [rows, bytes] for a quantized type), rows in transformers'
        order: a copy in memory."""
        return self.tensors[name].data[self.rows(name)]

    def rows(self, name: str) -> np.ndarray:
        """[rows] the order transformers puts tensor `name`'s rows in (the processor applied to row numbers)."""
        tensor = self.tensors[name]
        return self.processor.process(weights=np.arange(tensor.data.shape[0]), name=tensor.name).weights


def module_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    """The name `module` is registered under in `model`."""
    return next(name for name, candidate in model.named_modules() if candidate is module)
