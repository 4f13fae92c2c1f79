"""A request's `Budget` (prompt tokens, a deadline) in the engine, the calibration and a model's first load in the
app, on tiny seeded models."""
import time

import gradio as gr
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.core.drafter import Proposal
from specdec.core.engine import PREFILL_CHUNK
from specdec.core.limits import Budget, BudgetExceeded
from specdec.costs.calibration import calibrate
from specdec.dashboard.config import AppConfig
from specdec.dashboard.handlers import speculate
from specdec.dashboard.hub import ModelHub
from specdec.models import ModelPool, cache, convert
from specdec.testing import perturbed_copy, tiny_model
from test_models_gguf import install_package, write_tiny_gguf

LONG = 2 * PREFILL_CHUNK + 100  # a prompt read in three chunks


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, context=1024)


def long_prompt() -> list[int]:
    return torch.randint(4, 128, (LONG,), generator=torch.Generator().manual_seed(0)).tolist()


class Recorder:
    """A drafter that proposes nothing and records the prompt lengths it is asked to prefill (optionally slowly)."""

    forwards = 0
    model = None
    cost_key = "recorder"

    def __init__(self, sleep_s: float = 0.0):
        self.sleep_s, self.prefilled = sleep_s, []

    def reset(self):
        pass

    def prefill(self, prompt_ids):
        self.prefilled.append(len(prompt_ids))
        time.sleep(self.sleep_s)
        return 0.0

    def propose(self, context_ids, n, policy):
        return Proposal([], None)


def test_a_long_prompt_is_read_in_chunks_and_greedy_output_stays_the_target_s(target):
    prompt = long_prompt()
    ids = torch.tensor([prompt])
    expected = target.generate(ids, do_sample=False, max_new_tokens=12, pad_token_id=0, eos_token_id=None,
                               attention_mask=torch.ones_like(ids))[0, LONG:].tolist()
    result = speculative_generate(target, perturbed_copy(target, noise=0.3), prompt, k=3, max_new_tokens=12,
                                  eos_token_id=[])
    assert result.token_ids == expected
    assert result.stats.target_forwards == 3 + len(result.rounds)  # three prefill chunks, one forward a round
    drafter = Recorder()
    autoregressive_generate(target, prompt, max_new_tokens=2)
    speculative_generate(target, drafter, prompt, k=2, max_new_tokens=2)
    assert drafter.prefilled == [PREFILL_CHUNK + 1, 2 * PREFILL_CHUNK + 1, LONG]  # each call one more chunk


def test_the_deadline_stops_the_prefill_between_chunks(target):
    drafter = Recorder(sleep_s=0.3)
    with pytest.raises(BudgetExceeded, match="time limit of 0.2 s while reading the prompt"):
        speculative_generate(target, drafter, long_prompt(), k=2, max_new_tokens=4, budget=Budget(seconds=0.2))
    assert drafter.prefilled == [PREFILL_CHUNK + 1]  # the second chunk was never read


def test_the_prompt_cap_counts_tokens_and_refuses_before_any_forward(target):
    drafter = Recorder()
    with pytest.raises(BudgetExceeded, match=f"prompt is {LONG} tokens; at most {LONG - 1}"):
        speculative_generate(target, drafter, long_prompt(), k=2, max_new_tokens=4,
                             budget=Budget(prompt_tokens=LONG - 1))
    assert drafter.prefilled == []
    assert speculative_generate(target, drafter, long_prompt(), k=2, max_new_tokens=2,
                                budget=Budget(prompt_tokens=LONG)).token_ids


def test_a_calibration_past_the_deadline_stops_and_stores_nothing(target, tmp_path):
    with pytest.raises(BudgetExceeded, match="while measuring what verification"):
        calibrate(target, None, n_max=2, repeats=1, cache_dir=tmp_path, budget=Budget(seconds=0))
    assert list(tmp_path.iterdir()) == []
    assert calibrate(target, None, n_max=2, repeats=1, cache_dir=tmp_path).measured_now


TIME_LIMIT_S = 4  # the host's limit in the load test: a load from the assembled GGUF fits it


def test_a_first_load_past_the_time_limit_stops_at_its_next_stage_and_the_app_keeps_serving(tmp_path, monkeypatch):
    """A catalogue package is assembled (slowly: past the limit), then would be converted: the request stops
    before converting, with one line; the assembled GGUF is kept, and the next request converts and answers."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, tiny_model("llama", 0, vocab_size=300))
    name = install_package(gguf, tmp_path, monkeypatch)
    assemblies, conversions = [], []
    concatenate, dequantize = cache._concatenate, convert.dequantize

    def slow_assembly(*args):
        assemblies.append(concatenate(*args))
        time.sleep(TIME_LIMIT_S + 0.2)
    monkeypatch.setattr(cache, "_concatenate", slow_assembly)
    monkeypatch.setattr(convert, "dequantize", lambda *args: (conversions.append(args), dequantize(*args))[1])
    hub = ModelHub(AppConfig(time_limit_s=TIME_LIMIT_S, dtype="float32"), pool=ModelPool())
    ask = lambda: speculate(hub, name, "lookup", "the tiny prompt", 2, 4, 0.0, 0)  # noqa: E731
    with pytest.raises(gr.Error) as stopped:
        ask()
    message = str(stopped.value)
    assert f"time limit of {TIME_LIMIT_S} s while loading the target {name}, at: converting" in message
    assert "\n" not in message and str(cache.root()) not in message and "What it finished is kept" in message
    assert (len(assemblies), conversions, hub.pool.loaded()) == (1, [], [])  # stopped before converting
    assert cache.gguf_path("tiny-packaged.gguf").is_file() and cache.converted_dtypes(name) == []
    answer = ask()
    assert answer["token_ids"] and (len(assemblies), len(conversions)) == (1, 1)  # the GGUF was not assembled again
    assert cache.converted_dtypes(name) == ["float32"]
