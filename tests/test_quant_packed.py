"""An int8 layer whose products a packed kernel computes holds only its packed copy (specdec.models.quant): its int8
weight, recovered bit for bit from that copy, is what its state_dict, a store and the int8-dynamic form read, so
outputs and stored files are those of layers that keep their weight; the LM head keeps its rows (a tied embedding
and callers read them)."""
import contextlib
import gc
import sys
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from specdec.models import load_model, quant
from specdec.models.quant import Int8Linear, couple_rows, exact_kernels, quantize_int8
from specdec.models.quant4 import quantize_int4
from specdec.testing import tiny_config, tiny_tokenizer

pytestmark = pytest.mark.skipif(not exact_kernels(), reason="no exact packed kernel here: every layer keeps its weight")
IDS = torch.tensor([[1, 5, 9, 13, 7, 4, 8]])  # [1, 7]
QUANTIZERS = {"int8": quantize_int8, "int4": quantize_int4}


def held_weights(model: torch.nn.Module) -> dict[str, int]:
    """{name: bytes} of the real int8 weights held by Int8Linears that also hold a packed or coupled copy."""
    return {name: m.weight.numel() * m.weight.element_size() for name, m in model.named_modules()
            if isinstance(m, Int8Linear) and (m.packed is not None or m.coupled is not None) and not m.weight.is_meta}


def tiny(tied: bool, seed: int = 0) -> torch.nn.Module:
    """A tiny float32 qwen2 whose head is (tied) or is not its input embedding."""
    config = tiny_config("qwen2", vocab_size=len(tiny_tokenizer()))
    config.tie_word_embeddings = tied
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def folder(path: Path, tied: bool) -> Path:
    tiny(tied).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def keeping_weights(monkeypatch):
    """Quantize or load as if the packed kernel computed only products of 2 rows or more: every layer keeps its
    weight, as every layer did before packed copies replaced them (the forward is then the kernel's as well, see
    `restored`)."""
    monkeypatch.setattr(quant, "PACKED_MIN_ROWS", 2)


def expected_held(model: torch.nn.Module) -> dict[str, int]:
    """Only the LM head holds its weight (its rows are a tied embedding's, and callers read its values)."""
    head = model.get_output_embeddings()
    return {"lm_head": head.out_features * head.in_features}


@pytest.mark.parametrize("shape", [(1, 5), (7, 13), (300, 200), (128, 64)])
def test_the_int8_weight_is_recovered_bit_for_bit_from_the_packed_and_the_coupled_copy(shape):
    torch.manual_seed(0)
    weight = torch.randint(-quant.weight_limit(), quant.weight_limit() + 1, shape, dtype=torch.int8)
    weight[0, 0], weight[-1, -1] = quant.weight_limit(), -quant.weight_limit()  # the extremes
    layer = Int8Linear.from_quantized(weight.clone(), torch.rand(shape[0]) + 0.5, torch.randn(shape[0]))
    assert layer.packed is not None and layer.weight.is_meta
    assert (layer.weight.shape, layer.weight.dtype) == (shape, torch.int8)  # still reads as a Linear's
    assert torch.equal(layer.int8_weight(), weight) and torch.equal(layer.state_dict()["weight"], weight)
    layer.couple_rows()
    assert layer.packed is None and layer.weight.is_meta and torch.equal(layer.int8_weight(), weight)


@pytest.mark.parametrize("form", QUANTIZERS)
@pytest.mark.parametrize("tied", [False, True])
def test_quantized_and_coupled_layers_hold_no_int8_weight_beside_their_packed_copy(form, tied):
    model = QUANTIZERS[form](tiny(tied))
    assert held_weights(model) == expected_held(model)
    assert any(m.packed is not None for m in model.modules() if isinstance(m, Int8Linear))  # packed ones run them
    if tied:  # the embedding reads the head's rows in place
        assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    couple_rows(model)
    assert held_weights(model) == expected_held(model)


@pytest.mark.parametrize("form", QUANTIZERS)
@pytest.mark.parametrize("tied", [False, True])
def test_outputs_state_and_coupled_outputs_are_those_of_layers_that_keep_their_weight(monkeypatch, form, tied):
    packed = QUANTIZERS[form](tiny(tied))
    with monkeypatch.context() as patch:
        keeping_weights(patch)
        kept = QUANTIZERS[form](tiny(tied))
    assert not [m for m in kept.modules() if isinstance(m, Int8Linear) and m.weight.is_meta]
    state, kept_state = packed.state_dict(), kept.state_dict()
    assert list(state) == list(kept_state) and all(torch.equal(state[k], kept_state[k]) for k in state)
    with torch.no_grad():
        assert torch.equal(packed(IDS).logits, kept(IDS).logits)
        assert torch.equal(packed(IDS[:, :1]).logits, kept(IDS[:, :1]).logits)  # one row: the packed kernel for both
        assert torch.equal(couple_rows(packed)(IDS).logits, couple_rows(kept)(IDS).logits)


@pytest.mark.parametrize("form", QUANTIZERS)
@pytest.mark.parametrize("tied", [False, True])
def test_a_store_is_byte_identical_to_one_written_with_the_weights_kept(tmp_path, monkeypatch, form, tied):
    source = folder(tmp_path / "model", tied)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "packed"))
    made = load_model(str(source), quant=form)
    assert made.source == "folder" and held_weights(made.model) == expected_held(made.model)
    with monkeypatch.context() as patch:
        keeping_weights(patch)
        patch.setenv("SPECDEC_CACHE", str(tmp_path / "kept"))
        kept = load_model(str(source), quant=form)
    stored = [next((tmp_path / cache).rglob("model.safetensors")).read_bytes() for cache in ("packed", "kept")]
    assert stored[0] == stored[1]
    read = load_model(str(source), quant=form)  # from the store: shells filled, each weight packed once
    assert read.source == f"cache ({form})" and held_weights(read.model) == expected_held(read.model)
    assert read.memory_bytes == kept.memory_bytes  # a packed weight counts its int8 bytes
    with torch.no_grad():
        assert torch.equal(read.model(IDS).logits, kept.model(IDS).logits)


def mappings_of(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, permissions) of every mapping of the file `path` in this process (Linux)."""
    found = []
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) > 5 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.append((start, end, fields[1]))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.parametrize("dtype, tied", [("int8", False), ("int8", True), ("int8-dynamic", False),
                                         ("int8-dynamic", True), ("int4-dynamic", True)])  # int4 untied: 4-bit rows
def test_a_quantized_model_keeps_no_view_of_its_store_file_but_its_lookup_rows_privately_mapped(tmp_path, monkeypatch,
                                                                                                 tied, dtype):
    """The store's tensors are views of one mapping of its file: kept, the weights packed away would stay resident
    (a draft's coupled layers held their biases so, the int4-dynamic draft its 4-bit layers). Only the tables that
    lookups read (the embedding's rows, the head's kept int8 rows) come from the file, through one private mapping,
    made or read alike, gone with the model."""
    source = folder(tmp_path / "model", tied)  # qwen2: q/k/v biases
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    store = "int4" if dtype == "int4-dynamic" else "int8"
    reference = None
    for made in (True, False):
        loaded = load_model(str(source), dtype=dtype)
        weights = next((tmp_path / "cache").rglob("model.safetensors")).resolve()
        assert loaded.dtype == dtype and (loaded.source == f"cache ({store})") is not made
        gc.collect()
        (start, end, permissions), = mappings_of(weights)
        assert permissions.endswith("p")  # private: a write would never reach the file
        tables = [loaded.model.get_input_embeddings().weight, loaded.model.get_output_embeddings().weight]
        assert all(start <= table.data_ptr() < end for table in tables)
        with torch.no_grad():
            logits = loaded.model(IDS).logits
        assert reference is None or torch.equal(logits, reference)
        reference = logits
        del loaded, tables
        gc.collect()
        assert mappings_of(weights) == []


@pytest.mark.parametrize("dtype", ["int8", "int8-dynamic"])
def test_making_a_store_and_coupling_a_load_read_the_weights_held_never_unpacked(tmp_path, monkeypatch, dtype):
    """Unpacking a layer costs about what packing it does: a store is written from the weights kept while it is made
    (`quant.weights_kept`), and the int8-dynamic form is coupled from the weights just read, then they are dropped."""
    unpacked, packed = [], []
    for kernel in quant.KERNELS.values():
        unpack, pack = getattr(quant, kernel.unpack), getattr(quant, kernel.pack)
        monkeypatch.setattr(quant, kernel.unpack, lambda copy, unpack=unpack: unpacked.append(1) or unpack(copy))
        monkeypatch.setattr(quant, kernel.pack, lambda weight, pack=pack: packed.append(1) or pack(weight))
    source = folder(tmp_path / "model", tied=True)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    made = load_model(str(source), dtype=dtype)
    read = load_model(str(source), dtype=dtype)
    assert unpacked == [] and read.source == "cache (int8)"
    assert (packed == []) == (dtype == "int8-dynamic")  # coupled layers pack their own copy only
    assert held_weights(made.model) == held_weights(read.model) == expected_held(read.model)
    with torch.no_grad():
        assert torch.equal(made.model(IDS).logits, read.model(IDS).logits)


@pytest.mark.parametrize("tied", [False, True])
def test_layers_packed_on_the_pool_are_those_packed_one_by_one(monkeypatch, tied):
    """`packing_in_parallel` (every quantization and store load) packs on its pool's threads, and each layer's
    packed and coupled copy is the one made alone: same int8 weight, same outputs."""
    threads = set()
    for kernel in quant.KERNELS.values():
        pack = getattr(quant, kernel.pack)
        monkeypatch.setattr(quant, kernel.pack,
                            lambda weight, pack=pack: threads.add(threading.get_ident()) or pack(weight))
    pooled = quantize_int8(tiny(tied))
    assert threads and threading.get_ident() not in threads  # packed on the pool, never by the caller
    monkeypatch.setattr(quant, "packing_in_parallel", contextlib.nullcontext)  # one by one, as each layer is made
    alone = quantize_int8(tiny(tied))
    for (name, a), (_, b) in zip(pooled.named_modules(), alone.named_modules()):
        if isinstance(a, Int8Linear):
            assert a.packed is not None and torch.equal(a.int8_weight(), b.int8_weight()), name
    with torch.inference_mode():
        assert torch.equal(pooled(IDS).logits, alone(IDS).logits)
        assert torch.equal(couple_rows(pooled)(IDS).logits, couple_rows(alone)(IDS).logits)
