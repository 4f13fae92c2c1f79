"""The int8 model built straight from a GGUF (`quant.int8_from_gguf`): one tensor at a time, no float32 copy on disk,
bit for bit the GGUF's float32 conversion quantized by `quantize_int8`; stored once (`specdec.models.quant_store`)
and read back without the GGUF's tensors."""
import hashlib
import json
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import NemotronTensorProcessor

from specdec.models import cache, convert, entries, formats, gguf_read, load_model, loading, quant, quant_store
from specdec.cli import models as models_command
from specdec.models.loading import prepare
from specdec.testing import tiny_config
from faults import kill_at, paused
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
        patch.setattr(quant, "BLOCK_BYTES", 4 * 256 * 3)  # 3 rows of 256 dequantized at a time: chunks span tensors
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
    assert not gguf_file.exists()  # the assembled GGUF is removed once the store is made: it is read without it
    with monkeypatch.context() as patch:
        no_gguf_tensors(patch)
        loaded = load_model(name, quant="int8")
        assert prepare(name, dtype="int8") == (store, "cache (int8)")
    assert loaded.source == "cache (int8)" and not gguf_file.exists()
    reference = quant.quantize_int8(load_model(str(path), dtype="float32").model)
    assert torch.equal(loaded.model(IDS).logits, reference(IDS).logits)
    assert prepare(name, dtype="int4") == (cache.converted_dir(name, "int4"), "package")  # assembled again
    assert converted()[name] == ["int4", "int8"]  # int4 is no float32 conversion either
    assert not gguf_file.exists()


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
    rounding = rows.abs() * torch.finfo(torch.float32).eps  # code * scale rounded to float32
    assert ((lookup(torch.arange(300)) - rows).abs() <= step / 2 + rounding).all()
    assert (lookup.weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()) == tied


def packaged(tmp_path, monkeypatch) -> tuple[str, object]:
    """A tiny tied qwen2 GGUF as the catalogue package "tiny-packaged"; (its name, its assembled GGUF's path)."""
    name = install_package(mixed_gguf(tmp_path, "qwen2", tied=True), tmp_path, monkeypatch)
    return name, cache.gguf_path("tiny-packaged.gguf")


def refuse_assembly(monkeypatch):
    monkeypatch.setattr(cache, "assemble", lambda *args, **kwargs: pytest.fail("the GGUF was assembled again"))


def test_the_config_comes_from_the_store_once_the_gguf_is_gone_and_keys_the_same_format_timings(tmp_path,
                                                                                                 monkeypatch):
    name, gguf_file = packaged(tmp_path, monkeypatch)
    from_gguf = loading.architecture(name)
    assert gguf_file.is_file()  # read to know the architecture: kept, since nothing is made from it yet
    prepare(name, dtype="int8")
    assert not gguf_file.exists()
    with monkeypatch.context() as patch:
        refuse_assembly(patch)
        from_store = loading.architecture(name)
    assert from_store.tie_word_embeddings is True and from_store.hidden_size == from_gguf.hidden_size == 256
    assert formats._key(from_store, ("int8",), "cpu") == formats._key(from_gguf, ("int8",), "cpu")


def test_every_path_that_reads_the_gguf_again_assembles_it_and_removes_it_after(tmp_path, monkeypatch):
    name, gguf_file = packaged(tmp_path, monkeypatch)
    assert prepare(name, dtype="int8")[1] == "package" and not gguf_file.exists()
    int4 = load_model(name, quant="int4")
    assert int4.source == "package" and not gguf_file.exists()
    float32 = load_model(name, dtype="float32")
    assert float32.source == "package" and not gguf_file.exists()
    assert sorted(cache.stored(name)) == ["float32", "int4", "int8"]
    assert gguf_read._reader.cache_info().currsize == 0  # no memory map of the removed file left behind
    with monkeypatch.context() as patch:
        refuse_assembly(patch)
        assert load_model(name, quant="int8").source == "cache (int8)"
        assert load_model(name, quant="int4").source == "cache (int4)"
        assert load_model(name, dtype="float32").source == "cache"


def test_the_gguf_is_never_removed_while_another_reads_it(tmp_path, monkeypatch):
    name, gguf_file = packaged(tmp_path, monkeypatch)
    prepare(name, dtype="int8")
    with loading.assembled(entries.find(name)) as path:  # a reader (this thread) holds it
        assert path == gguf_file and path.is_file()
        assert load_model(name, quant="int4").source == "package"  # made from it, by another reader of it
        assert not cache.remove_unread(path) and path.is_file()
    assert not gguf_file.exists()  # the last reader out removes it: both stores are there


def test_a_reader_in_another_process_keeps_the_gguf_until_it_ends(tmp_path):
    chunk = tmp_path / "part.bin"
    chunk.write_bytes(b"gguf bytes" * 100)
    sha = hashlib.sha256(chunk.read_bytes()).hexdigest()
    out = cache.gguf_path("model.gguf")
    code = (f"from pathlib import Path; from specdec.models import cache\n"
            f"with cache.assembled([Path({str(chunk)!r})], {sha!r}, Path({str(out)!r})):\n    pause()")
    with paused(code):
        assert out.read_bytes() == chunk.read_bytes()
        assert not cache.remove_unread(out) and out.is_file()
    assert cache.remove_unread(out) and not out.exists()  # the reader died: its lock went with it


def test_a_store_is_read_after_the_package_is_uninstalled_and_an_assembled_gguf_then_kept(tmp_path, monkeypatch):
    name, gguf_file = packaged(tmp_path, monkeypatch)
    prepare(name, dtype="int8")
    for chunk in (tmp_path / "site").rglob("*.bin"):
        chunk.unlink()  # the package uninstalled
    assert load_model(name, quant="int8").source == "cache (int8)"
    with pytest.raises(ValueError, match="package is not installed: pip install --no-deps fakechunks-part1==1"):
        load_model(name, quant="int4")
    gguf_file.write_bytes((tmp_path / "weights" / "tiny.gguf").read_bytes())  # assembled before the uninstall
    assert load_model(name, quant="int4").source == "package"
    assert gguf_file.is_file()  # the only copy left: not removed


def models(*prepare: str, dtype=("float32", "bfloat16"), json_out: bool = False) -> int:
    """`python -m specdec models [--prepare NAME --dtype ...] [--json]` (the fake catalogue names no default pair,
    which the whole parser's help text needs)."""
    return models_command.run(SimpleNamespace(prepare=list(prepare), dtype=list(dtype), json=json_out))


def listing(capsys) -> tuple[str, str]:
    """(the tiny package's line of `python -m specdec models`, its table row)."""
    assert models() == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("- tiny-packaged: "))
    row = next(line for line in out.splitlines() if line.startswith("tiny-packaged "))
    return line, row


def test_the_models_command_names_each_store_with_its_size_and_one_made_again(tmp_path, monkeypatch, capsys):
    name, gguf_file = packaged(tmp_path, monkeypatch)
    line, row = listing(capsys)
    assert row.rstrip().endswith("needs assembly") and "package installed" in line
    assert models(name, dtype=["int8"]) == 0
    assert f"{name} [int8]: ready from package" in capsys.readouterr().out
    line, row = listing(capsys)
    int8 = cache.size_of(cache.converted_dir(name, "int8"))
    assert row.rstrip().endswith("ready") and line == f"- {name}: in the cache: int8 {cache.size_text(int8)}"
    loading.architecture(name)  # reads the store's config: nothing assembled
    assert models(name, dtype=["int4", "float32"]) == 0
    capsys.readouterr()
    sizes = {form: cache.size_of(cache.converted_dir(name, form)) for form in ("float32", "int4", "int8")}
    line, _ = listing(capsys)
    assert line == f"- {name}: in the cache: " + ", ".join(f"{form} {cache.size_text(size)}"
                                                           for form, size in sizes.items())
    assert sizes["int8"] < sizes["float32"] / 3  # the int8 store: int8 weights, no float32 embedding
    assert models(json_out=True) == 0
    (item,) = json.loads(capsys.readouterr().out)
    assert item["stored"] == sizes and item["remade"] == {} and item["status"] == "ready"
    store = cache.converted_dir(name, "int8")
    (store / quant_store.INT8.marker).write_text(json.dumps({"format": 1, "source": "sha256:?"}))
    (store / cache.READY).unlink()
    cache.mark_ready(store)  # a READY store of the former layout
    line, _ = listing(capsys)
    assert line.endswith(f"; its next int8 load makes int8 again (its int8 copy has format 1, this version reads "
                         f"format {quant_store.INT8.format})")
    with loading.assembled(entries.find(name)):  # assembled while another reads it
        line, _ = listing(capsys)
        assert f"; its GGUF assembled ({cache.size_text(gguf_file.stat().st_size)})" in line


def test_building_a_model_from_a_gguf_parses_its_metadata_once_and_keeps_no_memory_map(tmp_path, monkeypatch):
    """A GGUF's metadata (a whole tokenizer) takes seconds to parse: building the int8 model reads the config, the
    tokenizer and the tensors from one parse (ours, which transformers' reads share), the same model as parsing
    each time, and nothing parsed is kept once it is built (`gguf_read.forget`)."""
    path = mixed_gguf(tmp_path, "qwen2", tied=True)
    parses = []
    original = gguf.GGUFReader.__init__

    def counted(self, *args, **kwargs):
        parses.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counted)
    loading.architecture(str(path))  # the format calibration's config, before the store is made
    made = load_model(str(path), quant="int8")
    assert len(parses) == 1
    assert gguf_read._reader.cache_info().currsize == gguf_read._metadata.cache_info().currsize == 0
    gguf_read.forget()
    monkeypatch.setattr(gguf_read, "_identity", lambda path: (str(path), len(parses), 0))  # a new key per call
    again = quant.int8_from_gguf(path)[0]
    assert len(parses) > 1
    assert torch.equal(made.model(IDS).logits, again(IDS).logits)


def test_the_fast_reader_reads_every_field_and_tensor_as_gguf_does(tmp_path):
    path = mixed_gguf(tmp_path, "qwen2", tied=True)
    full, fast = gguf.GGUFReader(path), gguf_read.FastReader(path)
    assert [(t.name, t.tensor_type, t.data_offset) for t in fast.tensors] == \
        [(t.name, t.tensor_type, t.data_offset) for t in full.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(fast.tensors, full.tensors))
    assert "tokenizer.ggml.tokens" in full.fields and fast.fields.keys() == full.fields.keys()
    for name, field in full.fields.items():
        ours = fast.fields[name]
        assert (ours.offset, ours.name, ours.data, ours.types) == (field.offset, field.name, field.data, field.types)
        assert [bytes(p) for p in ours.parts] == [bytes(p) for p in field.parts], name
        assert [p.dtype for p in ours.parts] == [p.dtype for p in field.parts], name
