"""The default pair from the installed packages (slow: `pytest -m real`; converts once into $SPECDEC_CACHE)."""
import time

import pytest
from transformers import AutoConfig

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import PrunedVocabularyDrafter
from specdec.models import check_pair, default_name, entries, load_draft, load_model, loading, random_weights

pytestmark = pytest.mark.real


def test_default_pair_speculative_greedy_equals_target_alone_in_int8():
    """The shipped pair in the format `auto` gives a target on a CPU, quantized straight from its GGUF files (no
    float32 copy: 8 GB and minutes on a slow CPU): greedy speculative output is the target alone's."""
    target = load_model(default_name("target"), dtype="int8")
    model = load_draft(default_name("draft"), target, dtype="int8", shipped_set=False)
    assert check_pair(target, model).compatible
    draft = load_draft(default_name("draft"), target, dtype="int8")  # over its family's shipped frequent tokens
    assert isinstance(draft, PrunedVocabularyDrafter)
    prompt = "def quicksort(arr):"
    start = time.perf_counter()
    spec = speculative_generate(target, draft, prompt, k=4, max_new_tokens=16)
    alone = autoregressive_generate(target, prompt, max_new_tokens=16)
    print(f"\nload {target.load_seconds:.1f} s + {model.load_seconds:.1f} s ({target.source}, {model.source}); "
          f"speculative {spec.stats.wall_time_s:.2f} s, alone {alone.stats.wall_time_s:.2f} s, "
          f"both {time.perf_counter() - start:.2f} s, acceptance {spec.stats.acceptance_rate:.2f}")
    assert len(spec.token_ids) == 16
    assert spec.token_ids == alone.token_ids


@pytest.mark.parametrize("name", random_weights.shipped())
def test_each_shipped_architecture_is_the_one_its_gguf_describes(name):
    """`architecture` reads a catalogue model's shipped config instead of its GGUF's metadata: the same shapes."""
    entry = entries.find(name)
    if not (entry.package and entry.package.installed()):
        pytest.skip(f"{name}: no installed package")
    with loading.assembled(entry) as gguf:
        described = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    shipped = loading.architecture(name)
    fields = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings", "rope_theta", "rms_norm_eps",
              "max_position_embeddings")
    assert {f: getattr(shipped, f, None) for f in fields} == {f: getattr(described, f, None) for f in fields}
