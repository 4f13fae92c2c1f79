"""The one clock: every timed region syncs the device once at each end; the interleaved order; the engine's
generator of rounds (one round per resume, the consumer's time left out)."""
import time

import pytest
import torch

from specdec import autoregressive_generate, speculative_generate, speculative_rounds
from specdec.core import timing
from specdec.core.kv import CachedLM
from specdec.costs.calibration import calibrate
from specdec.drafters import PromptLookupDraft
from specdec.lab.measure import time_generation
from specdec.testing import perturbed_copy, tiny_model

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=0)
    return target, perturbed_copy(target, noise=0.2, seed=1)


@pytest.fixture
def syncs(monkeypatch):
    """The devices `timing.device_sync` is called with, in order (counted instead of synchronised)."""
    calls = []
    monkeypatch.setattr(timing, "device_sync", calls.append)
    return calls


def test_a_timed_region_syncs_once_at_each_end(syncs):
    _, seconds = timing.timed(lambda: time.sleep(0.01), "cpu")
    assert syncs == ["cpu", "cpu"] and seconds >= 0.01
    output, _ = timing.time_median(lambda: "out", 3, "cuda:1")
    assert output == "out" and syncs[2:] == ["cuda:1"] * 6


def test_every_forward_and_the_engine_wall_time_go_through_the_sync(pair, syncs):
    target, draft = pair
    lm = CachedLM(target)
    lm.forward([1, 2, 3])
    assert len(syncs) == 2 and all(d == torch.device("cpu") for d in syncs)
    syncs.clear()
    result = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=12, eos_token_id=[])
    forwards = result.stats.target_forwards + result.stats.draft_forwards
    assert len(syncs) == 2 * (forwards + result.stats.rounds + 1)  # each forward's two ends, each round's, the wall's
    syncs.clear()
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=5, eos_token_id=[])
    assert len(syncs) == 2 * (alone.stats.target_forwards + alone.stats.rounds + 1)
    syncs.clear()
    copied = speculative_generate(target, PromptLookupDraft(), PROMPT * 2, k=3, max_new_tokens=6, eos_token_id=[])
    proposals = sum(r.k > 0 for r in copied.rounds)  # prompt lookup's proposals are timed regions too
    assert len(syncs) == 2 * (copied.stats.target_forwards + copied.stats.rounds + 1 + proposals)


def test_bench_cells_and_calibration_are_timed_through_the_sync(pair, syncs, tmp_path):
    target, draft = pair
    timed = time_generation(lambda: autoregressive_generate(target, PROMPT, max_new_tokens=3, eos_token_id=[]),
                            2, target.device)
    stats = timed.output.stats
    inner = 2 * (stats.target_forwards + stats.rounds + 1)  # one generation's own regions
    assert len(syncs) == 2 * (inner + 2)  # each of the 2 runs: its own region around the generation's
    syncs.clear()
    calibrate(target, None, n_max=3, repeats=2, cache_dir=tmp_path)
    assert len(syncs) >= 2 * 3 * 2  # at least two ends of every timed forward: 3 sizes x 2 repeats


def test_device_sync_waits_for_cuda_and_does_nothing_on_the_cpu(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    timing.device_sync("cpu")
    timing.device_sync(torch.device("cpu"))
    timing.device_sync(None)
    assert waited == []
    timing.device_sync("cuda:0")
    assert waited == ["cuda:0"]


def test_interleaved_takes_the_candidates_round_robin_each_repeat_one_later():
    order = []
    samples = timing.interleaved({name: (lambda n=name: order.append(n) or float(len(order))) for name in "abc"}, 4)
    assert "".join(order) == "abc" + "bca" + "cab" + "abc"
    assert samples == {"a": [1.0, 6.0, 8.0, 10.0], "b": [2.0, 4.0, 9.0, 11.0], "c": [3.0, 5.0, 7.0, 12.0]}
    assert timing.medians(samples) == {"a": 7.0, "b": 6.5, "c": 6.0}


def test_speculative_rounds_yields_each_round_and_returns_the_result(pair):
    target, draft = pair
    decode = speculative_rounds(target, draft, PROMPT, k=3, max_new_tokens=20, eos_token_id=[])
    seen = [next(decode)]
    time.sleep(0.3)  # the consumer holds the round: not measured
    seen.append(decode.send(True))
    with pytest.raises(StopIteration) as end:
        decode.send(False)  # stop after the round just yielded
    result = end.value.value
    assert result.rounds == seen and result.stopped_early and result.stats.wall_time_s < 0.3
    whole = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=20, eos_token_id=[])
    assert whole.token_ids[:len(result.token_ids)] == result.token_ids


def test_speculative_rounds_refuses_a_bad_k_at_once(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="k must be"):
        speculative_rounds(target, draft, PROMPT, k=0)
