"""specdec.models without network or real weights: folders, pool, pair check, chunk assembly, fail-fast hubs."""
import hashlib
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import Vocabulary
from specdec.models import (LoadedModel, ModelPool, add_model_arguments, cache, catalogue, check_pair, hub, load_draft,
                            load_model, transpose_head_storage)
from specdec.models.pool import NotLoaded
from specdec.testing import WORDS, tiny_folder, tiny_model, tiny_tokenizer

@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


def loaded(model, tokenizer, name="m") -> LoadedModel:
    return LoadedModel(name, model, tokenizer, "folder", Path("."), "float32")


def fails_fast(spec: str, match: str) -> None:
    """load_model(spec) raises a ValueError matching `match` within 5 seconds."""
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        load_model(spec)
    assert time.perf_counter() - start < 5


def test_catalogue_lists_required_entries_with_a_status():
    entries = {e.name: e for e in catalogue()}
    for name in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct",
                 "gemma-3-270m", "qwen1.5-0.5b-chat", "qwen1.5-1.8b-chat", "qwen2.5-0.5b-instruct",
                 "qwen2.5-1.5b-instruct"):
        assert entries[name].status in ("ready", "needs assembly", "needs download")
    assert entries["qwen2.5-coder-1.5b-instruct"].default_for == "target"
    assert entries["qwen2.5-coder-0.5b-instruct"].default_for == "draft"
    assert entries["qwen1.5-0.5b-chat"].modelscope_id == "qwen/Qwen1.5-0.5B-Chat"
    assert entries["qwen1.5-1.8b-chat"].package is None and entries["qwen1.5-1.8b-chat"].sources[-1] == "modelscope"
    assert len(entries["qwen2.5-coder-1.5b-instruct"].package.requirements()) == 22


def test_folder_loads_in_eval_mode_with_its_tokenizer(tmp_path):
    folder = tiny_folder(tmp_path / "tiny")
    m = load_model(str(folder), dtype="float32")
    assert (m.source, m.dtype, m.device, m.name) == ("folder", "float32", "cpu", "tiny")
    assert not m.model.training and m.load_seconds > 0
    reference = tiny_model("llama", 0, vocab_size=len(m.tokenizer))
    ids = torch.tensor([m.tokenizer("def print the")["input_ids"]])
    torch.testing.assert_close(m.model(ids).logits, reference(ids).logits, rtol=0, atol=1e-5)
    assert load_model(str(folder), dtype="bfloat16").model.dtype == torch.bfloat16


def test_folder_without_safetensors_is_refused(tmp_path):
    folder = tiny_folder(tmp_path / "tiny")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ValueError, match="safetensors only"):
        load_model(str(folder))


@pytest.mark.parametrize("spec", ["", "no such thing!", "qwen9-imaginary"])
def test_unknown_spec_says_what_is_accepted(spec):
    with pytest.raises(ValueError, match="catalogue name"):
        load_model(spec)


def test_bad_dtype_is_refused(tmp_path):
    with pytest.raises(ValueError, match="dtype must be"):
        load_model(str(tiny_folder(tmp_path / "t")), dtype="float16")


def test_offline_hub_id_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fails_fast("hf:specdec-tests/not-a-model", "HF_HUB_OFFLINE is set.*huggingface-cli download")


def test_unreachable_hub_fails_fast_without_offline_flag(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SPECDEC_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub, "_hub_url", lambda: "https://10.255.255.1")  # connects here, then never answers
    fails_fast("specdec-tests/not-a-model", "does not answer")


def test_modelscope_without_package_fails_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setitem(sys.modules, "modelscope", None)  # as on an install without the package
    fails_fast("modelscope:qwen/Qwen1.5-0.5B-Chat", "pip install modelscope")


def test_modelscope_cache_folder_loads_without_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    tiny_folder(tmp_path / "ms" / "models" / "qwen" / "Qwen1___5-0___5B-Chat")  # ModelScope spells "." as "___"
    m = load_model("modelscope:qwen/Qwen1.5-0.5B-Chat")
    assert m.source == "modelscope" and m.name == "qwen/Qwen1.5-0.5B-Chat"


def test_hub_only_catalogue_entry_offline_fails_fast_with_both_ways(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    fails_fast("qwen1.5-0.5b-chat", "qwen1.5-0.5b-chat is not available.*Qwen/Qwen1.5-0.5B-Chat.*modelscope")


def test_assembly_verifies_sha256_and_leaves_nothing_on_mismatch(tmp_path):
    chunks = []
    for n, payload in enumerate([b"abc" * 1000, b"def" * 7, b"g"]):
        chunks.append(tmp_path / f"part{n}.bin")
        chunks[-1].write_bytes(payload)
    good = hashlib.sha256(b"abc" * 1000 + b"def" * 7 + b"g").hexdigest()
    out_dir = tmp_path / "out"
    with pytest.raises(ValueError, match="sha256 mismatch.*reinstall"):
        cache.assemble(chunks, "0" * 64, out_dir / "model.gguf")
    assert list(out_dir.iterdir()) == []  # no file, no .partial
    assert cache.assemble(chunks, good, out_dir / "model.gguf").read_bytes() == b"abc" * 1000 + b"def" * 7 + b"g"


def test_check_pair_identical_padded_different():
    tok, other = tiny_tokenizer(), tiny_tokenizer(WORDS[1:] + WORDS[:1] + ["extra"])
    base = loaded(tiny_model("llama", 0, vocab_size=128), tok)
    same = check_pair(base, loaded(tiny_model("llama", 1, vocab_size=128), tok))
    padded = check_pair(base, loaded(tiny_model("llama", 1, vocab_size=129), tiny_tokenizer()))
    different = check_pair(base, loaded(tiny_model("llama", 1, vocab_size=128), other))
    assert (same.kind, same.compatible) == ("identical", True)
    assert (padded.kind, padded.compatible, padded.draft_rows) == ("padded", True, 129)
    assert (different.kind, different.compatible) == ("different", False)
    assert different.shared_tokens == 4  # only the special tokens keep their ids
    assert "python -m specdec align" in different.message and "text bridge" in different.message


def test_load_draft_takes_its_own_format_and_respects_bridge_false(tmp_path):
    target = load_model(str(tiny_folder(tmp_path / "t")), dtype="bfloat16")
    other = tiny_folder(tmp_path / "d", words=WORDS[::-1] + ["x"])
    draft = load_draft(str(other), target, bridge=Vocabulary.AS_IS)
    assert isinstance(draft, LoadedModel)  # auto: the format measured fastest here for a draft, not the target's
    assert draft.dtype == load_model(str(other), role="draft").dtype
    assert load_draft(str(other), target, dtype="int8-dynamic", bridge=Vocabulary.AS_IS).dtype == "int8-dynamic"
    with pytest.raises(ValueError, match="bridge must be"):
        load_draft(str(other), target, bridge="yes")
    with pytest.raises(ValueError, match="self:8"):
        load_draft("self:x", target)


def test_load_draft_wraps_a_different_tokenizer_in_the_text_bridge(tmp_path):
    target = load_model(str(tiny_folder(tmp_path / "t")))
    draft = load_draft(str(tiny_folder(tmp_path / "d", words=WORDS[::-1] + ["x"])), target)
    assert type(draft).__name__ == "TextBridgeDrafter"
    assert isinstance(load_draft(str(tiny_folder(tmp_path / "s", seed=3)), target), LoadedModel)


def test_pool_loads_each_model_once_even_from_threads():
    calls = []

    def slow_loader(spec, **kw):
        calls.append(spec)
        time.sleep(0.2)
        return loaded(tiny_model("llama", 0, vocab_size=64), None, spec)

    pool = ModelPool(budget_bytes=10**9, loader=slow_loader)
    results = []
    threads = [threading.Thread(target=lambda: results.append(pool.get("a", dtype="float32"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["a"] and all(r is results[0] for r in results)
    pool.get("a", dtype="bfloat16")  # another dtype is another model
    assert calls == ["a", "a"]


def test_pool_evicts_least_recently_used_over_budget():
    pool = ModelPool(budget_bytes=0, loader=lambda spec, **kw: loaded(tiny_model("llama", 0, vocab_size=64), None, spec))
    size = pool.get("a").memory_bytes
    pool.budget_bytes = 2 * size
    pool.get("b")
    pool.get("a")  # a is now the most recent
    pool.get("c")
    assert [m.name for m in pool.loaded()] == ["a", "c"]
    pool.budget_bytes = 0
    pool.get("d")  # alone over budget: kept
    assert [m.name for m in pool.loaded()] == ["d"]


def test_pool_held_only_returns_a_model_in_memory_and_loads_nothing():
    calls = []
    pool = ModelPool(budget_bytes=10**9, loader=lambda spec, **kw: calls.append(spec) or loaded(
        tiny_model("llama", 0, vocab_size=64), None, spec))
    with pytest.raises(NotLoaded, match="a is not in memory as a target"):
        pool.get("a", held_only=True)
    a = pool.get("a")
    pool.get("b", dtype="bfloat16", role="draft")
    assert pool.get("a", held_only=True) is a and calls == ["a", "b"]
    assert [m.name for m in pool.loaded()] == ["a", "b"]  # a look keeps the least-recently-used order
    assert [(h.spec, h.dtype, h.role) for h in pool.held()] == [("a", "auto", "target"), ("b", "bfloat16", "draft")]
    with pytest.raises(NotLoaded):
        pool.get("a", role="draft", held_only=True)  # held as a target only


def test_pool_and_engine_on_tiny_folders(tmp_path):
    pool = ModelPool(budget_bytes=10**9)
    target = pool.get(str(tiny_folder(tmp_path / "t")))
    draft = pool.draft(str(tiny_folder(tmp_path / "d", seed=1)), target)
    assert pool.get(str(tmp_path / "t")) is target and len(pool.loaded()) == 2
    spec = speculative_generate(target, draft, "def print the", k=3, max_new_tokens=12)
    alone = autoregressive_generate(target, "def print the", max_new_tokens=12)
    assert spec.token_ids == alone.token_ids


@pytest.mark.parametrize("tied", [False, True])
def test_column_major_head_keeps_logits_ties_and_saving(tied, tmp_path):
    model = tiny_model("qwen2", 0, vocab_size=128)
    if tied:
        model.lm_head.weight = model.get_input_embeddings().weight
    ids = torch.tensor([[5, 9, 33, 2, 70, 71]])
    before = model(ids).logits
    assert transpose_head_storage(model)
    assert model.lm_head.weight_t.is_contiguous() and model.lm_head.weight_t.shape == (64, 128)
    assert (model.get_input_embeddings().weight is model.lm_head.weight) == tied
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=1e-5)
    model.save_pretrained(tmp_path / "saved")  # an ordinary Linear to save_pretrained
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # an in-place change (an optimizer step) refreshes the copy
        torch.testing.assert_close(model(ids).logits, F.linear(model.model(ids)[0], model.lm_head.weight))
    assert not transpose_head_storage(tiny_model("qwen2", 0, vocab_size=128).to(torch.bfloat16))


def test_column_major_head_trains_the_real_parameter():
    model = tiny_model("llama", 0, vocab_size=128)
    transpose_head_storage(model)
    model(torch.tensor([[5, 9, 33]])).logits.sum().backward()
    assert model.lm_head.weight.grad is not None


def test_add_model_arguments():
    import argparse

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(["--target", "x"])
    assert (args.target, args.dtype) == ("x", "auto")
    with pytest.raises(SystemExit):
        parser.parse_args(["--target", "x", "--dtype", "float16"])


@pytest.mark.parametrize("spec, drafter", [("lookup", "PromptLookupDraft"), ("self:1", "SelfSpeculativeDraft")])
def test_load_draft_model_free_drafters_stay_lossless(spec, drafter, tmp_path):
    target = load_model(str(tiny_folder(tmp_path / "t")))
    draft = load_draft(spec, target)
    assert type(draft).__name__ == drafter
    spec_ids = speculative_generate(target, draft, "def print the", k=3, max_new_tokens=10).token_ids
    assert spec_ids == autoregressive_generate(target, "def print the", max_new_tokens=10).token_ids


def test_rows_first_linears_keep_logits_for_every_row_count():
    from specdec.models.speed import RowsFirstLinear, rows_first_linears

    model = tiny_model("qwen2", 0, vocab_size=128)  # qwen2: q/k/v projections carry a bias
    ids = torch.tensor([[5, 9, 33, 2, 70, 71, 8, 9, 10]])
    with torch.inference_mode():
        before = [model(ids[:, :n]).logits for n in (1, 2, 5, 9)]
    assert rows_first_linears(model) > 0
    assert all(type(m) is not torch.nn.Linear for m in model.modules())
    assert isinstance(model.model.layers[0].mlp.up_proj, RowsFirstLinear)
    with torch.inference_mode():
        for n, expected in zip((1, 2, 5, 9), before):
            torch.testing.assert_close(model(ids[:, :n]).logits, expected, rtol=0, atol=1e-5)
    model(ids).logits.sum().backward()  # training still reaches the parameters
    assert model.model.layers[0].mlp.up_proj.weight.grad is not None
