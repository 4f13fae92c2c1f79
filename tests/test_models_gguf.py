"""GGUF paths of specdec.models on a tiny llama GGUF written in code with the `gguf` package."""
import functools
import hashlib
import json
import sys

import gguf
import numpy as np
import pytest
import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode

from specdec.models import cache, entries, load_model, loading
from specdec.testing import tiny_model

MERGES = ["Ġ t", "Ġ a", "h e", "i n"]
LAYER_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
TOP_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


def llama_cpp_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores q/k rows with the rotary halves interleaved; transformers undoes this on load."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path, model, encode=None) -> None:
    """An F32 GGUF of llama or qwen2 `model` with a byte-level BPE tokenizer (256 bytes + 4 merges + EOS), without
    `output.weight` when the head is tied; `encode(gguf name, float32 array)` -> (bytes, GGML type) stores a
    tensor in another type."""
    config = model.config
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES] + ["<|endoftext|>"]
    eos = len(tokens) - 1
    tokens += [f"<|unused{i}|>" for i in range(config.vocab_size - len(tokens))]
    token_types = [3 if i == eos else 1 for i in range(len(tokens))]  # 3 = control
    writer = gguf.GGUFWriter(str(path), config.model_type)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(eos)
    writer.add_eos_token_id(eos)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        gguf_name, array = _gguf_tensor(name, tensor.float().numpy(), config)
        data, kind = encode(gguf_name, array) if encode else (array, None)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _gguf_tensor(name: str, array: np.ndarray, config) -> tuple[str, np.ndarray]:
    if name in TOP_TENSORS:
        return TOP_TENSORS[name], array
    _, _, layer, *rest = name.split(".")  # model.layers.{i}.{module}.weight (or .bias)
    module = ".".join(rest[:-1])
    heads = {"self_attn.q_proj": config.num_attention_heads, "self_attn.k_proj": config.num_key_value_heads}
    if module in heads and config.model_type == "llama":
        array = llama_cpp_order(array, heads[module])
    return f"blk.{layer}.{LAYER_TENSORS[module]}.{rest[-1]}", np.ascontiguousarray(array)


@pytest.fixture
def tiny_gguf(tmp_path):
    model = tiny_model("llama", 0, vocab_size=300)
    path = tmp_path / "weights" / "tiny.gguf"
    path.parent.mkdir()
    write_tiny_gguf(path, model)
    return path, model


IDS = torch.tensor([[5, 17, 260, 3, 99, 261]])


def test_gguf_file_then_cache_give_the_original_logits(tiny_gguf):
    path, original = tiny_gguf
    first = load_model(str(path), dtype="float32")
    second = load_model(str(path), dtype="float32")
    assert (first.source, second.source, first.name) == ("gguf", "cache", "tiny")
    assert second.path == first.path and (second.path / "model.safetensors").is_file()
    expected = original(IDS).logits
    torch.testing.assert_close(first.model(IDS).logits, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(second.model(IDS).logits, first.model(IDS).logits, rtol=0, atol=0)
    assert second.tokenizer("the in")["input_ids"] == first.tokenizer("the in")["input_ids"]
    assert second.tokenizer.decode(second.tokenizer("hello there")["input_ids"]) == "hello there"
    assert not hasattr(second.model.config, "quantization_config")


def test_bfloat16_is_derived_from_the_float32_conversion(tiny_gguf):
    path, _ = tiny_gguf
    fp32 = load_model(str(path), dtype="float32")
    bf16 = load_model(str(path), dtype="bfloat16")
    assert bf16.source == "cache" and bf16.model.dtype == torch.bfloat16
    assert sorted(p.name for p in fp32.path.parent.iterdir()) == ["bfloat16", "float32"]
    torch.testing.assert_close(bf16.model.get_input_embeddings().weight,
                               fp32.model.get_input_embeddings().weight.to(torch.bfloat16), rtol=0, atol=0)


def install_package(path, tmp_path, monkeypatch) -> str:
    """The GGUF `path` as the only entry of a fake catalogue, "tiny-packaged", shipped in two fake chunk packages on
    sys.path (for this test only); returns the entry's name."""
    data = path.read_bytes()
    site = tmp_path / "site"
    for n, start in enumerate(range(0, len(data), len(data) // 2 + 1), 1):
        chunk = site / f"fakechunks_part{n}" / "data" / f"part{n:02d}.bin"
        chunk.parent.mkdir(parents=True)
        (chunk.parent.parent / "__init__.py").write_text("raise ImportError('chunk packages must not be imported')")
        chunk.write_bytes(data[start:start + len(data) // 2 + 1])
    monkeypatch.syspath_prepend(str(site))
    fake = {"models": [{"name": "tiny-packaged", "title": "t", "roles": ["target"], "tokenizer": "t", "licence": "x",
                        "parameters": "1M", "sources": [
                            {"kind": "package", "parts": 2, "module": "fakechunks_part{n}", "file": "data/part{n:02d}.bin",
                             "pip": "fakechunks-part{n}==1", "gguf": "tiny-packaged.gguf",
                             "sha256": hashlib.sha256(data).hexdigest()}]}]}
    catalogue_file = tmp_path / "models.json"
    catalogue_file.write_text(json.dumps(fake))
    monkeypatch.setattr(entries, "CATALOGUE_PATH", catalogue_file)
    # a fresh cache of catalogue entries for this test; the real one's is left as it was
    monkeypatch.setattr(entries, "_entries", functools.cache(entries._entries.__wrapped__))
    return "tiny-packaged"


def test_catalogue_package_source_assembles_chunks_converts_and_caches(tiny_gguf, tmp_path, monkeypatch):
    """A fake chunk package on sys.path and a fake catalogue: the whole offline path, then the cache."""
    path, original = tiny_gguf
    data = path.read_bytes()
    install_package(path, tmp_path, monkeypatch)
    assert [e.status for e in entries.catalogue()] == ["needs assembly"]
    first = load_model("tiny-packaged", dtype="float32")
    assert [e.status for e in entries.catalogue()] == ["ready"]
    second = load_model("tiny-packaged", dtype="float32")
    assert (first.source, second.source) == ("package", "cache")
    assert not cache.gguf_path("tiny-packaged.gguf").exists()  # not kept once converted: assembled when needed
    with loading.assembled(entries.find("tiny-packaged")) as assembled:
        assert assembled == cache.gguf_path("tiny-packaged.gguf") and assembled.read_bytes() == data
    assert not assembled.exists()
    assert not any(name.startswith("fakechunks") for name in sys.modules)
    torch.testing.assert_close(second.model(IDS).logits, original(IDS).logits, rtol=0, atol=1e-5)


def test_not_a_gguf_is_a_clear_error(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model(str(bogus))
    assert not list((tmp_path / "cache" / "converted").glob("*/*"))  # nothing half-written
    with pytest.raises(ValueError, match="not found"):
        load_model(str(tmp_path / "missing.gguf"))
