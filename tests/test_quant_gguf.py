"""The int8 model built straight from a GGUF (`quant.int8_from_gguf`): one tensor at a time, no float32 copy on disk,
bit for bit the GGUF's float32 conversion quantized by `quantize_int8`; stored once (`specdec.models.quant_store`)
and read back without the GGUF's tensors."""
import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import NemotronTensorProcessor

from specdec.models import cache, convert, gguf_read, load_model, loading, quant
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
