"""The engine on a GPU: greedy output is the target's alone, sampling keeps the target's law, a timed region
waits for the device, and a model loads on CUDA by default. Skipped without a CUDA device."""
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.core.timing import Timer
from specdec.core.trace import explain_divergence
from specdec.core.verify import logits_to_probs
from specdec.models import load_model
from specdec.testing import perturbed_copy, tiny_folder, tiny_model
from test_sampling import DRAWS, PROMPT, TEMPERATURE, TOP_P, chi_square_p_value

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def pair():
    """test_sampling's pair, on the GPU (the draft is perturbed on the CPU, by its generator, then moved)."""
    target = tiny_model("llama", seed=3, vocab_size=48)
    draft = perturbed_copy(target, noise=0.6, seed=5)
    return target.to("cuda"), draft.to("cuda")


@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_greedy_output_on_cuda_is_the_target_alone(pair, k):
    target, draft = pair
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=40, eos_token_id=[])
    ours = speculative_generate(target, draft, PROMPT, k=k, max_new_tokens=40, eos_token_id=[])
    assert ours.token_ids == alone.token_ids
    assert ours.stats.target_time_s > 0 and ours.stats.draft_time_s > 0


def test_sampling_on_cuda_keeps_the_target_law(pair):
    target, draft = pair
    with torch.no_grad():
        logits = target(torch.tensor([PROMPT], device="cuda")).logits[0, -1].cpu()
    law = logits_to_probs(logits, TEMPERATURE, TOP_P)  # [V]: the target's first token, after temperature/top-p
    first = [speculative_generate(target, draft, PROMPT, k=2, max_new_tokens=3, temperature=TEMPERATURE,
                                  top_p=TOP_P, seed=seed, eos_token_id=[]).token_ids[0] for seed in range(DRAWS)]
    assert chi_square_p_value(first, law) > 1e-3


def test_a_timed_region_on_cuda_is_the_run_time_not_the_launch_time():
    x = torch.randn(4096, 4096, device="cuda")
    x @ x  # warm-up
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with Timer("cuda") as timer:
        start.record()
        for _ in range(50):
            x @ x
        end.record()
    torch.cuda.synchronize()
    assert timer.seconds >= 0.9 * start.elapsed_time(end) / 1000


def test_a_model_loads_on_cuda_by_default_in_a_gpu_format_and_decodes_as_the_target(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target = load_model(str(tiny_folder(tmp_path / "target", seed=0)))
    draft = load_model(str(tiny_folder(tmp_path / "draft", seed=1)), role="draft")
    assert target.device == "cuda" and target.dtype in ("float32", "bfloat16")  # auto: the faster one measured here
    assert next(target.model.parameters()).device.type == "cuda"
    alone = autoregressive_generate(target, "def the", max_new_tokens=16)
    ours = speculative_generate(target, draft, "def the", k=3, max_new_tokens=16)
    divergence = explain_divergence(ours, alone, target.dtype)
    assert divergence is None or divergence.near_tie  # bf16 batched-vs-single rounding only
