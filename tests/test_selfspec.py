"""Self-speculative draft: a no-copy view of the target's first L layers; greedy identity; lossless sampling."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM, Gemma3TextConfig, MistralConfig, Qwen3Config

from faults import ROOT
from specdec import autoregressive_generate, speculative_generate
from specdec.core import theory
from specdec.drafters import PromptLookupDraft
from specdec.drafters.selfspec import SelfSpeculativeDraft, decoder_layers, layer_view, tensor_bytes
from specdec.lab.measure import (Calibration, DraftMeasurement, _recommendation, calibrate_layers, default_candidates,
                                 recommend_fallback)
from specdec.testing import tiny_model

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6]
OTHER_CONFIGS = {  # supported families that specdec.testing does not build
    "qwen3": Qwen3Config, "mistral": MistralConfig,
    "gemma3_text": lambda **kw: Gemma3TextConfig(head_dim=16, sliding_window=4, **kw),  # sliding-window layers
}


def other_tiny_model(model_type: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = OTHER_CONFIGS[model_type](
        vocab_size=128, bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_size=64, intermediate_size=128,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return AutoModelForCausalLM.from_config(config).eval()


def final_norm(model):
    return model.transformer.ln_f if model.config.model_type == "gpt2" else model.model.norm


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_view_is_first_layers_then_final_norm_and_head(arch):
    model = tiny_model(arch, seed=1, layers=3)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        full = model(ids, output_hidden_states=True)
        for layers in (1, 2):  # hidden_states[L] = output of decoder layer L (before the final norm)
            expected = model.lm_head(final_norm(model)(full.hidden_states[layers]))
            torch.testing.assert_close(layer_view(model, layers)(ids).logits, expected)
        torch.testing.assert_close(layer_view(model, 3)(ids).logits, full.logits)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_target_is_not_modified(arch):
    model = tiny_model(arch, seed=1, layers=3)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        before = model(ids).logits
    config_before = model.config.to_dict()
    draft = SelfSpeculativeDraft(model, layers=1)
    assert len(decoder_layers(model)) == 3 and len(decoder_layers(draft.lm.model)) == 1
    assert model.config.to_dict() == config_before and draft.lm.model.config.num_hidden_layers == 1
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before)


def test_every_draft_parameter_is_a_target_tensor():
    model = tiny_model("qwen2", seed=1, layers=4)
    draft = SelfSpeculativeDraft(model, layers=2)
    target_ptrs = {p.data_ptr() for p in model.parameters()}
    assert all(p.data_ptr() in target_ptrs for p in draft.lm.model.parameters())
    used = [model.model.embed_tokens.weight, model.model.norm.weight, model.lm_head.weight,
            *(p for layer in model.model.layers[:2] for p in layer.parameters())]
    report = draft.memory_report()
    assert report.copied_weight_bytes == 0 and report.shared_weight_bytes == tensor_bytes(used)
    assert (report.layers, report.total_layers, report.kv_cache_bytes) == (2, 4, 0)
    speculative_generate(model, draft, PROMPT, k=3, max_new_tokens=6, eos_token_id=[])
    # keys + values of 2 layers, 2 kv heads of 16 dims, fp32, for the tokens the draft has cached
    assert report.added_bytes == 0 and draft.memory_report().kv_cache_bytes == 2 * 2 * 2 * 16 * 4 * len(
        draft.lm.token_ids)


RSS_PROBE = """
import copy, json, psutil
from specdec.drafters.selfspec import SelfSpeculativeDraft, tensor_bytes
from specdec.testing import tiny_model
rss = lambda: psutil.Process().memory_info().rss
model = tiny_model("llama", seed=1, layers=2, vocab_size=32000, hidden=256)  # ~70 MB of weights
before = rss()
draft = SelfSpeculativeDraft(model, layers=2)
grown = rss() - before
copied = copy.deepcopy(draft.lm.model)  # control: a real copy of the same view is visible in the RSS
print(json.dumps({"weights": tensor_bytes(model.parameters()), "grown": grown,
                  "grown_by_copy": rss() - before - grown}))
"""


def test_building_the_draft_does_not_grow_memory_by_the_weights():
    # A fresh interpreter: in this one, memory freed by earlier tests stays resident and a copy could reuse it unseen.
    done = subprocess.run([sys.executable, "-c", RSS_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.splitlines()[-1])
    weights, grown = probe["weights"], probe["grown"]
    assert grown < 0.1 * weights, f"building the draft grew RSS by {grown / 2**20:.1f} MiB"
    assert probe["grown_by_copy"] > 0.5 * weights, "the RSS probe cannot see a copy of the weights"


@pytest.mark.parametrize("layers", [0, 4, 1.5, "2"])
def test_layers_out_of_range_are_refused(layers):
    with pytest.raises(ValueError, match=r"integer in 1\.\.3"):
        SelfSpeculativeDraft(tiny_model("llama", layers=3), layers=layers)


def test_unsupported_architecture_is_refused():
    model = SimpleNamespace(config=SimpleNamespace(model_type="t5"))
    with pytest.raises(ValueError, match="does not support model_type 't5'.*--draft lookup"):
        SelfSpeculativeDraft(model, layers=1)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_greedy_identity_with_the_target_alone(arch):
    model = tiny_model(arch, seed=2, layers=3)
    reference = model.generate(torch.tensor([PROMPT]), max_new_tokens=17, min_new_tokens=17, do_sample=False,
                               pad_token_id=0)[0, len(PROMPT):].tolist()
    assert autoregressive_generate(model, PROMPT, max_new_tokens=17, eos_token_id=[]).token_ids == reference
    for layers, k in [(1, 1), (1, 4), (2, 3), (2, 5)]:  # 17 new tokens is a multiple of none of k + 1
        draft = SelfSpeculativeDraft(model, layers=layers)
        spec = speculative_generate(model, draft, PROMPT, k=k, max_new_tokens=17, eos_token_id=[])
        assert spec.token_ids == reference, f"L={layers} k={k}"


def test_a_reused_draft_and_a_loaded_model_wrapper_stay_exact():
    model = tiny_model("qwen2", seed=2, layers=3)
    draft = SelfSpeculativeDraft(SimpleNamespace(model=model, tokenizer=None), layers=2)
    for prompt in (PROMPT, [9, 3, 4, 11]):
        alone = autoregressive_generate(model, prompt, max_new_tokens=9, eos_token_id=[])
        assert speculative_generate(model, draft, prompt, k=3, max_new_tokens=9, eos_token_id=[]).token_ids == \
            alone.token_ids


def test_all_layers_draft_is_the_target_and_is_always_accepted():
    model = tiny_model("llama", seed=2, layers=2)
    stats = speculative_generate(model, SelfSpeculativeDraft(model, 2), PROMPT, k=4, max_new_tokens=16,
                                 eos_token_id=[]).stats
    assert stats.acceptance_rate == 1.0 and stats.accepted_tokens == stats.draft_tokens > 0


@pytest.mark.parametrize("model_type", list(OTHER_CONFIGS))
def test_other_families_view_and_greedy_identity(model_type):
    model = other_tiny_model(model_type)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        full = model(ids, output_hidden_states=True)
        torch.testing.assert_close(layer_view(model, 2)(ids).logits,
                                   model.lm_head(model.model.norm(full.hidden_states[2])))
    alone = autoregressive_generate(model, PROMPT, max_new_tokens=13, eos_token_id=[])
    spec = speculative_generate(model, SelfSpeculativeDraft(model, 2), PROMPT, k=4, max_new_tokens=13, eos_token_id=[])
    assert spec.token_ids == alone.token_ids


# --- sampling law: the first two tokens follow the target's exact law (chi-square) ---

VOCAB, TEMPERATURE, SAMPLES = 8, 1.5, 800


def exact_two_token_law(model, prompt) -> torch.Tensor:
    """P(t1, t2) of the target alone at TEMPERATURE, [V, V]."""
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([prompt])).logits[0, -1] / TEMPERATURE, -1)  # [V]
        contexts = torch.tensor([prompt + [t] for t in range(VOCAB)])  # [V, T+1]
        p2 = torch.softmax(model(contexts).logits[:, -1] / TEMPERATURE, -1)  # [V, V]
    return p1[:, None] * p2


def chi_square_p_value(samples: list[tuple[int, int]], law: torch.Tensor) -> float:
    """Pearson chi-square of the sample counts against `law`, cells with expected count < 5 pooled."""
    counts = torch.zeros(VOCAB * VOCAB)
    for t1, t2 in samples:
        counts[t1 * VOCAB + t2] += 1
    expected = law.flatten().double() * len(samples)
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    return chisquare(observed.numpy(), expected.numpy() * observed.sum().item() / expected.sum().item()).pvalue


def draft_factories(model):
    return {"self:1": lambda: SelfSpeculativeDraft(model, layers=1), "lookup": PromptLookupDraft}


@pytest.fixture
def one_thread():
    """Tiny forwards run faster on one thread (and fight less with other processes for the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("draft_name", ["self:1", "lookup"])
def test_sampling_law_is_the_targets(draft_name, one_thread):
    model = tiny_model("qwen2", seed=4, layers=2, vocab_size=VOCAB, hidden=32)
    prompt = [3, 4, 5, 3, 4]  # lookup proposes [5, 3] for this prompt: its first round is not empty
    make_draft = draft_factories(model)[draft_name]
    samples, accepted = [], 0
    for seed in range(SAMPLES):
        result = speculative_generate(model, make_draft(), prompt, k=2, max_new_tokens=2, temperature=TEMPERATURE,
                                      seed=seed, eos_token_id=[])
        samples.append(tuple(result.token_ids))
        accepted += result.stats.accepted_tokens
    assert 0 < accepted < SAMPLES  # both the accept and the reject/residual paths were exercised
    law = exact_two_token_law(model, prompt)
    assert chi_square_p_value(samples, law) > 1e-3
    # the same test rejects the draft's own law: it is sensitive enough to see a wrong sampler
    draft_law = exact_two_token_law(layer_view(model, 1), prompt)
    if draft_name == "self:1":
        assert chi_square_p_value(samples, draft_law) < 1e-6


# --- calibration and the probe's fallback recommendation ---

def test_default_candidates_spread_over_depth():
    assert default_candidates(28) == [7, 10, 14, 18, 21]
    assert default_candidates(2) == [1] and default_candidates(1) == [1]


def test_calibration_reports_alpha_c_and_the_bound_per_layer():
    model = tiny_model("llama", seed=2, layers=3)
    calibration = calibrate_layers(model, [PROMPT, [9, 3, 4, 11]], k=3, candidates=[3, 1, 2], max_new_tokens=8)
    assert [layers for layers, _ in calibration.results] == [1, 2, 3]
    for layers, m in calibration.results:
        assert m.draft == f"self:{layers}" and 0 <= m.acceptance_rate <= 1 and m.cost_ratio > 0 and m.measured_speedup > 0
        assert m.leviathan_bound == pytest.approx(theory.leviathan_bound(m.acceptance_rate, 3, m.cost_ratio))
    assert dict(calibration.results)[3].acceptance_rate == 1.0  # all layers: the draft is the target
    assert calibration.best.leviathan_bound == max(m.leviathan_bound for _, m in calibration.results)
    assert calibration.to_dict()["best_layers"] == calibration.best_layers
    assert Calibration.from_dict(calibration.to_dict()) == calibration  # what bench's calibration.json holds


def test_each_draft_is_measured_against_the_target_alone_timed_just_before_it_on_the_same_prompt(monkeypatch):
    """A machine whose speed drifts over a long measurement must move both sides of each ratio: each prompt's
    target alone runs right before the draft on it, and the speedup is of those runs, not of one early baseline."""
    import specdec.lab.measure as measure

    calls, alone, drafted = [], measure.autoregressive_generate, measure.speculative_generate

    def alone_on(model, prompt, **kw):
        calls.append(("alone", tuple(prompt)))
        return alone(model, prompt, **kw)

    def drafted_on(model, draft, prompt, **kw):
        calls.append(("draft", tuple(prompt)))
        return drafted(model, draft, prompt, **kw)

    monkeypatch.setattr(measure, "autoregressive_generate", alone_on)
    monkeypatch.setattr(measure, "speculative_generate", drafted_on)
    model = tiny_model("llama", seed=2, layers=3)
    prompts = [PROMPT, [9, 3, 4, 11]]
    trials = measure.DraftTrials(model, prompts, k=3, max_new_tokens=8)
    calls.clear()
    trial = trials.run(PromptLookupDraft())
    assert calls == [("alone", tuple(PROMPT)), ("draft", tuple(PROMPT)), ("alone", (9, 3, 4, 11)),
                     ("draft", (9, 3, 4, 11))]
    assert [a.token_ids for a in trial.alone] == [a.token_ids for a in trials.alone]
    pooled = lambda results: sum(len(r.token_ids) for r in results) / sum(r.stats.wall_time_s for r in results)
    assert trial.measured_speedup == pytest.approx(pooled(trial.results) / pooled(trial.alone))


def test_recommend_fallback_names_the_measured_winner():
    model = tiny_model("qwen2", seed=2, layers=3)
    report = recommend_fallback(model, [PROMPT, [9, 3, 4, 11]], k=3, candidates=[1, 2], max_new_tokens=8)
    self_spec, lookup = report["self_speculation"], report["prompt_lookup"]
    assert self_spec["layers"] in (1, 2) and self_spec["draft"] == f"self:{self_spec['layers']}"
    assert lookup["draft"] == "lookup" and lookup["cost_ratio"] == 0.0 and len(report["calibration"]) == 2
    winner = max(self_spec, lookup, key=lambda m: m["measured_speedup"])
    assert report["best_draft"] == (winner["draft"] if winner["measured_speedup"] > 1 else None)
    assert f"{winner['measured_speedup']:.2f}x" in report["recommendation"]


def measurement(draft, speedup):
    return DraftMeasurement(draft, acceptance_rate=0.7, cost_ratio=0.3, leviathan_bound=1.5, mean_accepted_length=2.1,
                            drafted_rounds=1.0, measured_speedup=speedup)


def test_recommendation_text():
    text = _recommendation(measurement("self:14", 1.31), measurement("lookup", 1.05), prompts=4)
    assert text.startswith("Fall back to self-speculation with the first 14 layers (--draft self:14): measured 1.31x")
    text = _recommendation(measurement("lookup", 0.93), measurement("self:7", 0.61), prompts=4)
    assert "turn speculation off" in text and "prompt lookup: 0.93x" in text
