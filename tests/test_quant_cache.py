"""The int8 cache (specdec.models.quant_store): the first int8 load quantizes and stores the model, later loads
read it without a float32 pass and give the same bits; a stale, old, damaged or half-written store is never
read, it is made again."""
import json

import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.models import cache, load_draft, load_model, loading, quant, quant_store
from specdec.testing import perturbed_copy, tiny_folder
from faults import kill_at
from test_quant import OTHER_LIMIT

PROMPT = [1, 5, 9, 13, 7, 4, 8, 6, 12]
IDS = torch.tensor([PROMPT])  # [1, 9]
KILLED_SAVE = "from specdec.models import load_model; load_model({path!r}, quant='int8')"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


def no_float32_pass(monkeypatch):
    """Make reading the float32 folder or quantizing fail: a load from the store must need neither."""
    def refuse(*args, **kwargs):
        raise AssertionError("a load from the int8 store read float32 weights or quantized")

    monkeypatch.setattr(loading, "_from_folder", refuse)
    monkeypatch.setattr(quant, "quantize_int8", refuse)


def layers(model: torch.nn.Module) -> dict[str, str]:
    """{module name: class name} with whether fbgemm's packed copy exists, for every module."""
    return {name: f"{type(m).__name__}{' packed' if getattr(m, 'packed', None) is not None else ''}"
            for name, m in model.named_modules()}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_a_stored_int8_model_loads_without_a_float32_pass_and_gives_the_same_bits(tmp_path, monkeypatch, arch):
    folder = tiny_folder(tmp_path / arch, seed=0, arch=arch)
    quantized = load_model(str(folder), quant="int8")
    assert quantized.source == "folder" and quantized.path == folder
    store = quant_store.store_folder(folder)
    assert cache.is_ready(store)
    with monkeypatch.context() as patch:
        no_float32_pass(patch)
        stored = load_model(str(folder), quant="int8")
    assert stored.source == "cache (int8)" and stored.path == folder and stored.dtype == "int8"  # path: its identity
    assert stored.load_seconds > 0
    assert layers(stored.model) == layers(quantized.model)
    assert stored.model.config._attn_implementation == quant.ROWWISE_ATTENTION
    assert torch.equal(stored.model(IDS).logits, quantized.model(IDS).logits)
    again = quant.quantize_int8(load_model(str(folder), dtype="float32").model)  # as every load did before
    assert torch.equal(stored.model(IDS).logits, again(IDS).logits)
    text = "def print the a of"
    assert stored.tokenizer(text).input_ids == quantized.tokenizer(text).input_ids


def test_greedy_speculative_with_the_stored_int8_target_equals_the_target_alone(tmp_path):
    target_folder = tiny_folder(tmp_path / "target", seed=0)
    draft_folder = tmp_path / "draft"  # a perturbed copy: some drafts accepted, some not
    plain = load_model(str(target_folder), dtype="float32")
    perturbed_copy(plain.model, noise=0.3).save_pretrained(draft_folder)
    plain.tokenizer.save_pretrained(draft_folder)
    quantized_alone = autoregressive_generate(load_model(str(target_folder), quant="int8").model, PROMPT,
                                              max_new_tokens=30, eos_token_id=[]).token_ids
    target = load_model(str(target_folder), quant="int8")
    assert target.source == "cache (int8)"
    alone = autoregressive_generate(target.model, PROMPT, max_new_tokens=30, eos_token_id=[]).token_ids
    assert alone == quantized_alone
    for draft in (load_draft(str(draft_folder), target).model, target.model):  # partial acceptance; all accepted
        for k in (1, 3, 5):
            result = speculative_generate(target.model, draft, PROMPT, k=k, max_new_tokens=30, eos_token_id=[])
            assert result.token_ids == alone


def test_a_cache_conversion_keeps_its_int8_copy_next_to_its_float32(tmp_path):
    folder = tiny_folder(cache.converted_dir("tiny", "float32"), seed=0)
    cache.mark_ready(folder)
    load_model(str(folder), quant="int8")
    stored = load_model(str(folder), quant="int8")
    assert stored.source == "cache (int8)" and cache.is_ready(cache.converted_dir("tiny", "int8"))
    assert cache.converted_dtypes("tiny") == ["float32"]  # the int8 copy is not a float dtype of the catalogue


def test_a_changed_source_is_quantized_again(tmp_path):
    folder = tiny_folder(tmp_path / "tiny", seed=0)
    first = load_model(str(folder), quant="int8")
    tiny_folder(folder, seed=1)  # other weights in the same folder
    changed = load_model(str(folder), quant="int8")
    assert changed.source == "folder"
    assert not torch.equal(changed.model(IDS).logits, first.model(IDS).logits)
    again = quant.quantize_int8(load_model(str(folder), dtype="float32").model)
    assert torch.equal(changed.model(IDS).logits, again(IDS).logits)
    assert load_model(str(folder), quant="int8").source == "cache (int8)"


def mark_ready_again(store):
    """A READY marker that vouches for the store's files as they are now."""
    (store / cache.READY).unlink()
    cache.mark_ready(store)


def old_format(store):
    (store / quant_store.INT8.marker).write_text(json.dumps({"format": 0, "source": "?"}))
    mark_ready_again(store)


def garbage_weights(store):
    weights = store / quant_store.WEIGHTS
    weights.write_bytes(b"\xff" * weights.stat().st_size)
    mark_ready_again(store)


def truncated_weights(store):
    weights = store / quant_store.WEIGHTS
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


@pytest.mark.parametrize("damage, reason", [(old_format,
                                             f"has format 0, this version reads format {quant_store.INT8.format}"),
                                            (garbage_weights, "cannot be read"),
                                            (truncated_weights, "incomplete")])
def test_an_old_or_damaged_store_is_made_again_with_one_line(tmp_path, capsys, damage, reason):
    folder = tiny_folder(tmp_path / "tiny", seed=0)
    expected = load_model(str(folder), quant="int8").model(IDS).logits
    damage(quant_store.store_folder(folder))
    capsys.readouterr()
    remade = load_model(str(folder), quant="int8")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specdec:")]
    assert len(lines) == 1 and reason in lines[0], lines
    assert remade.source == "folder" and torch.equal(remade.model(IDS).logits, expected)
    stored = load_model(str(folder), quant="int8")
    assert stored.source == "cache (int8)" and torch.equal(stored.model(IDS).logits, expected)


def test_a_killed_save_leaves_nothing_a_load_reads(tmp_path):
    folder = tiny_folder(tmp_path / "tiny", seed=0)
    store = quant_store.store_folder(folder)
    kill_at(KILLED_SAVE.format(path=str(folder)), "half:safetensors.torch.save_file")
    assert not store.exists() and list(store.parent.glob(f"{store.name}.partial-*"))
    loaded = load_model(str(folder), quant="int8")
    assert loaded.source == "folder" and not list(store.parent.glob(f"{store.name}.partial-*"))
    again = quant.quantize_int8(load_model(str(folder), dtype="float32").model)
    assert torch.equal(loaded.model(IDS).logits, again(IDS).logits)
    assert load_model(str(folder), quant="int8").source == "cache (int8)"


def test_a_store_quantized_for_another_weight_limit_is_made_again_for_this_machines(tmp_path, monkeypatch, capsys):
    """A store of 8-bit weights read on a machine whose fast kernel sums exactly only 7-bit ones (AVX2 without
    VNNI) would run the slow kernel, and one of 7-bit weights elsewhere would lose a bit for nothing: it is
    quantized again, with this machine's weight range."""
    folder = tiny_folder(tmp_path / "model", seed=0)
    load_model(str(folder), quant="int8")
    here = quant.weight_limit()
    monkeypatch.setattr(quant, "weight_limit", lambda: OTHER_LIMIT)
    again = load_model(str(folder), quant="int8")
    assert again.source == "folder" and f"weights up to {here}" in capsys.readouterr().err
    layers = [m for m in again.model.modules() if isinstance(m, quant.Int8Linear)]
    assert max(int(m.int8_weight().abs().max()) for m in layers) == OTHER_LIMIT
    with monkeypatch.context() as patch:
        no_float32_pass(patch)
        assert load_model(str(folder), quant="int8").source == "cache (int8)"
