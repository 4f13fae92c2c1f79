"""The int8 model built straight from a GGUF (`quant.int8_from_gguf`): one tensor at a time, no float32 copy on disk,
bit for bit the GGUF's float32 conversion quantized by `quantize_int8`; stored once (`specdec.models.quant_store`)
and read back without the GGUF's tensors."""
import json

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import NemotronTensorProcessor

from specdec.models import cache, convert, gguf_read, load_model, loading, quant, quant_store
from specdec.models.loading import prepare
from specdec.testing import tiny_config
from faults import kill_at
from test_models_gguf import install_package, write_tiny_gguf
from test_quant4 import encode
from test_quant_cache import layers

IDS = torch.tensor([[0, 5, 299, 17, 260, 3]])  # [1, 6], within the tiny GGUF's 300 tokens
KILLED_SAVE = "from specdec.models import load_model; load_model({path!r}, quant='int8')"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


def mixed_gguf(folder, arch: str = "llama", tied: bool = False):
    """A tiny GGUF of `arch` with the default target's mix of types (q4_K, q5_0, q8_0, q6_K, f32), head tied or not."""
    config = tiny_config(arch, vocab_size=300, hidden=256)
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = folder / "weights" / "tiny.gguf"
    path.parent.mkdir()
    write_tiny_gguf(path, model, encode)
    return path


def no_gguf_tensors(monkeypatch):
    """Make reading a GGUF's tensors, or a float32 folder, fail: a load from the int8 store needs neither."""
    def refuse(*args, **kwargs):
        raise AssertionError("a load from the int8 store read weights again")

    monkeypatch.setattr(gguf_read, "GGUFWeights", refuse)
    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    monkeypatch.setattr(quant, "int8_from_gguf", refuse)
    monkeypatch.setattr(loading, "_from_folder", refuse)


def converted() -> dict[str, list[str]]:
    """{key: its folders} under the cache's converted/."""
    return {key.name: sorted(p.name for p in key.iterdir()) for key in (cache.root() / "converted").iterdir()}


@pytest.mark.parametrize("arch, tied", [("llama", False), ("qwen2", True)])  # q/k rows reordered; biases, tied head
def test_a_gguf_becomes_int8_with_no_float32_copy_bit_for_bit_its_conversion_quantized(tmp_path, monkeypatch, arch,
                                                                                       tied):
    path = mixed_gguf(tmp_path, arch, tied)
    with monkeypatch.context() as patch:  # tensor by tensor: never transformers' whole-model dequantization
        patch.setattr(convert, "dequantize", lambda *args: pytest.fail("the whole GGUF was dequantized"))
        first = load_model(str(path), quant="int8")
    assert (first.source, first.dtype, first.path, first.name) == ("gguf", "int8", path, "tiny")
    (key, folders), = converted().items()
    assert folders == ["int8"] and cache.is_ready(cache.converted_dir(key, "int8"))  # the int8 store alone
    with monkeypatch.context() as patch:
        no_gguf_tensors(patch)
        stored = load_model(str(path), quant="int8")
        dynamic = load_model(str(path), dtype="int8-dynamic")  # the same store, run by fbgemm's own quantization
    assert stored.source == dynamic.source == "cache (int8)" and stored.path == path
    assert dynamic.dtype == "int8-dynamic" and dynamic.model.config._attn_implementation == "sdpa"
    reference = quant.quantize_int8(load_model(str(path), dtype="float32").model)  # transformers' conversion
    assert layers(first.model) == layers(reference)
    state, expected = first.model.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in expected)
    assert torch.equal(first.model(IDS).logits, reference(IDS).logits)
    assert torch.equal(stored.model(IDS).logits, reference(IDS).logits)
    assert stored.tokenizer("the in").input_ids == first.tokenizer("the in").input_ids


def test_a_catalogue_package_goes_straight_to_int8_and_is_read_back_without_its_gguf(tmp_path, monkeypatch):
    path = mixed_gguf(tmp_path, "qwen2", tied=True)
    name = install_package(path, tmp_path, monkeypatch)
    assert loading.architecture(name).hidden_size == 256  # the GGUF's config: nothing converted
    assert not (cache.root() / "converted").exists()
    store, source = prepare(name, dtype="int8")
    assert (store, source) == (cache.converted_dir(name, "int8"), "package") and converted() == {name: ["int8"]}
    gguf_file = cache.gguf_path("tiny-packaged.gguf")
    gguf_file.unlink()  # the assembled GGUF: the store is read without it
    with monkeypatch.context() as patch:
        no_gguf_tensors(patch)
        loaded = load_model(name, quant="int8")
        assert prepare(name, dtype="int8") == (store, "cache (int8)")
    assert loaded.source == "cache (int8)" and not gguf_file.exists()
    reference = quant.quantize_int8(load_model(str(path), dtype="float32").model)
    assert torch.equal(loaded.model(IDS).logits, reference(IDS).logits)
    assert prepare(name, dtype="int4") == (cache.converted_dir(name, "int4"), "package")
    assert converted()[name] == ["int4", "int8"]  # int4 is no float32 conversion either


def test_a_killed_int8_store_of_a_gguf_is_never_read(tmp_path):
    path = mixed_gguf(tmp_path)
    kill_at(KILLED_SAVE.format(path=str(path)), "half:safetensors.torch.save_file")
    (key, _), = converted().items()
    store = cache.converted_dir(key, "int8")
    assert not store.exists() and list(store.parent.glob("int8.partial-*"))
    loaded = load_model(str(path), quant="int8")
    assert loaded.source == "gguf" and not list(store.parent.glob("int8.partial-*")) and cache.is_ready(store)
    assert [folder for folder in converted()[key] if not folder.startswith("int8.writer-")] == ["int8"]
    assert load_model(str(path), quant="int8").source == "cache (int8)"


def test_an_int8_gguf_of_an_architecture_not_read_straight_is_dequantized_in_memory(tmp_path, monkeypatch):
    """A GGUF whose tensors transformers does more to than reorder rows (here as if llama's norms were stored
    offset, as Nemotron's are) is dequantized by transformers and quantized: still no float32 copy on disk."""
    path = mixed_gguf(tmp_path)
    monkeypatch.setitem(gguf_read.TENSOR_PROCESSORS, "llama", NemotronTensorProcessor)
    assert not gguf_read.reads(path)
    first = load_model(str(path), quant="int8")
    (key, folders), = converted().items()
    assert first.source == "gguf" and folders == ["int8"]
    reference = quant.quantize_int8(load_model(str(path), dtype="float32").model)
    assert torch.equal(first.model(IDS).logits, reference(IDS).logits)
    assert load_model(str(path), quant="int8").source == "cache (int8)"


def tensor_bytes(weights) -> dict[str, int]:
    """{name: bytes} of each tensor in a safetensors file, from its header; asserts the file is header + those."""
    with open(weights, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(length))
    sizes = {name: end - start for name, entry in header.items() if name != "__metadata__"
             for start, end in [entry["data_offsets"]]}
    assert weights.stat().st_size == 8 + length + sum(sizes.values())
    return sizes


@pytest.mark.parametrize("arch, tied", [("llama", False), ("qwen2", True)])
def test_a_store_holds_the_embedding_as_int8_rows_or_not_at_all_when_tied(tmp_path, monkeypatch, arch, tied):
    """The store's bytes: a tied embedding is the head's int8 rows (nothing stored), an untied one int8 rows with a
    float32 scale each, never vocab x dim float32; a load builds the embedding on the meta device, then fills it."""
    path = mixed_gguf(tmp_path, arch, tied)
    first = load_model(str(path), quant="int8")
    (key, _), = converted().items()
    sizes = tensor_bytes(cache.converted_dir(key, "int8") / quant_store.WEIGHTS)
    vocab, dim = 300, 256
    embedding = {name: size for name, size in sizes.items() if name.startswith("model.embed_tokens.")}
    assert embedding == ({} if tied else {"model.embed_tokens.weight": vocab * dim,
                                          "model.embed_tokens.weight_scale": vocab * 4})
    float32_embedding = sum(sizes.values()) - sum(embedding.values()) + vocab * dim * 4  # the former layout
    saved = vocab * dim * 4 if tied else vocab * (3 * dim - 4)
    assert sum(sizes.values()) == float32_embedding - saved
    built, from_config = [], AutoModelForCausalLM.from_config

    def spy(*args, **kwargs):  # the model _read builds from the store's config, as built
        model = from_config(*args, **kwargs)
        built.append([p.device.type for p in model.get_input_embeddings().parameters()])
        return model

    with monkeypatch.context() as patch:
        patch.setattr(AutoModelForCausalLM, "from_config", spy)
        no_gguf_tensors(patch)
        stored = load_model(str(path), quant="int8")
    assert built == [["meta"]]  # no float32 table allocated, then the int8 one filled in
    lookup = stored.model.get_input_embeddings()
    assert isinstance(lookup, quant.Int8Embedding) and lookup.tied == tied
    assert not [t for t in [*stored.model.parameters(), *stored.model.buffers()]
                if t.dtype == torch.float32 and t.shape == (vocab, dim)]
    assert quant.is_tied(stored.model) == tied and stored.model.config.tie_word_embeddings is False
    assert json.loads((cache.converted_dir(key, "int8") / "config.json").read_text())["tie_word_embeddings"] == tied
    assert torch.equal(stored.model(IDS).logits, first.model(IDS).logits)


@pytest.mark.parametrize("arch, tied", [("llama", False), ("qwen2", True)])
def test_the_embedding_rows_are_the_ggufs_within_the_int8_rounding(tmp_path, arch, tied):
    path = mixed_gguf(tmp_path, arch, tied)
    model = load_model(str(path), quant="int8").model
    rows = load_model(str(path), dtype="float32").model.get_input_embeddings().weight  # the GGUF dequantized
    lookup = model.get_input_embeddings()
    step = lookup.weight_scale[:, None]  # [vocab, 1]: one int8 step of each row
    assert ((lookup(torch.arange(300)) - rows).abs() <= step / 2 * (1 + 1e-6)).all()
    assert (lookup.weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()) == tied
