"""The default pair from the installed packages (slow: `pytest -m real`; converts once into $SPECDEC_CACHE)."""
import time

import pytest

from specdec import autoregressive_generate, speculative_generate
from specdec.models import check_pair, default_name, load_draft, load_model

pytestmark = pytest.mark.real


def test_default_pair_speculative_greedy_equals_target_alone_in_float32():
    target = load_model(default_name("target"), dtype="float32")
    draft = load_draft(default_name("draft"), target, dtype="float32")
    assert check_pair(target, draft).compatible
    prompt = "def quicksort(arr):"
    start = time.perf_counter()
    spec = speculative_generate(target, draft, prompt, k=4, max_new_tokens=16)
    alone = autoregressive_generate(target, prompt, max_new_tokens=16)
    print(f"\nload {target.load_seconds:.1f} s + {draft.load_seconds:.1f} s ({target.source}, {draft.source}); "
          f"speculative {spec.stats.wall_time_s:.2f} s, alone {alone.stats.wall_time_s:.2f} s, "
          f"both {time.perf_counter() - start:.2f} s, acceptance {spec.stats.acceptance_rate:.2f}")
    assert len(spec.token_ids) == 16
    assert spec.token_ids == alone.token_ids
