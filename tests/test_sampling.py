"""Lossless rejection sampling: the output law is the target's, checked exactly and empirically."""
import pytest
import torch
from scipy.stats import chisquare

from specdec import autoregressive_generate, speculative_generate
from specdec.core.verify import (acceptance_probability, logits_to_probs, residual_distribution, verify_greedy,
                                 verify_sampling)
from specdec.testing import perturbed_copy, tiny_model

PROMPT = [1, 7, 3, 19]
TEMPERATURE, TOP_P = 1.3, 0.95
DRAWS = 1500


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=3, vocab_size=48)
    return target, perturbed_copy(target, noise=0.6, seed=5)


def exact_law_of_two_tokens(model):
    """P(first token) and the marginal P(second token) of the target alone, after temperature/top-p."""
    with torch.no_grad():
        first = logits_to_probs(model(torch.tensor([PROMPT])).logits[0, -1], TEMPERATURE, TOP_P)  # [V]
        V = first.shape[0]
        continued = torch.tensor([PROMPT + [t] for t in range(V)])  # [V, T+1]
        second_given_first = logits_to_probs(model(continued).logits[:, -1], TEMPERATURE, TOP_P)  # [V, V]
    return first, first @ second_given_first


def chi_square_p_value(samples: list[int], law: torch.Tensor) -> float:
    """Goodness of fit of `samples` to `law`, with cells of expected count < 5 pooled into one."""
    observed = torch.bincount(torch.tensor(samples), minlength=law.shape[0]).double()
    expected = law.double() * len(samples)
    small = expected < 5
    observed = torch.cat([observed[~small], observed[small].sum().view(1)])
    expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = expected > 0
    expected = expected[keep] * observed[keep].sum() / expected[keep].sum()
    return float(chisquare(observed[keep].numpy(), expected.numpy()).pvalue)


def draw_first_two(generate) -> tuple[list[int], list[int]]:
    outputs = [generate(seed) for seed in range(DRAWS)]
    return [o[0] for o in outputs], [o[1] for o in outputs]


def assert_the_target_law(target, draft) -> None:
    """The first two tokens of speculative sampling with `draft` follow the target's exact law (chi-square)."""
    first_law, second_law = exact_law_of_two_tokens(target)
    first, second = draw_first_two(lambda seed: speculative_generate(
        target, draft, PROMPT, k=2, max_new_tokens=3, temperature=TEMPERATURE, top_p=TOP_P, seed=seed,
        eos_token_id=[]).token_ids)
    assert chi_square_p_value(first, first_law) > 1e-3
    assert chi_square_p_value(second, second_law) > 1e-3


def test_speculative_sampling_has_the_target_law(pair):
    assert_the_target_law(*pair)


def test_the_chi_square_check_has_power(pair):
    """Sampling from the draft (what an always-accept verifier would emit) must fail the same test."""
    target, draft = pair
    first_law, _ = exact_law_of_two_tokens(target)
    with torch.no_grad():
        draft_law = logits_to_probs(draft(torch.tensor([PROMPT])).logits[0, -1], TEMPERATURE, TOP_P)
    generator = torch.Generator().manual_seed(0)
    draft_samples = torch.multinomial(draft_law, DRAWS, replacement=True, generator=generator).tolist()
    assert chi_square_p_value(draft_samples, first_law) < 1e-6


def test_baseline_sampling_has_the_target_law(pair):
    target, _ = pair
    first_law, _ = exact_law_of_two_tokens(target)
    first = [autoregressive_generate(target, PROMPT, max_new_tokens=1, temperature=TEMPERATURE, top_p=TOP_P,
                                     seed=seed, eos_token_id=[]).token_ids[0] for seed in range(DRAWS)]
    assert chi_square_p_value(first, first_law) > 1e-3


def test_acceptance_and_residual_rules():
    p_target = torch.tensor([0.5, 0.3, 0.2, 0.0])
    p_draft = torch.tensor([0.25, 0.6, 0.0, 0.15])
    assert acceptance_probability(p_target, p_draft).tolist() == pytest.approx([1.0, 0.5, 1.0, 0.0])
    residual = residual_distribution(p_target, p_draft)  # max(0, p_t - p_d) = [.25, 0, .2, 0]
    assert residual.tolist() == pytest.approx([0.25 / 0.45, 0.0, 0.2 / 0.45, 0.0])
    assert residual_distribution(p_target, p_target).tolist() == pytest.approx(p_target.tolist())


def test_one_step_law_is_exact_in_expectation():
    """P(emit x) = p_draft(x)·a(x) + P(reject)·residual(x) equals p_target(x) (Leviathan et al., Thm 3.5)."""
    generator = torch.Generator().manual_seed(0)
    p_target = torch.softmax(torch.randn(10, generator=generator), 0)
    p_draft = torch.softmax(torch.randn(10, generator=generator), 0)
    accept = acceptance_probability(p_target, p_draft)
    reject_mass = 1 - (p_draft * accept).sum()
    emitted = p_draft * accept + reject_mass * residual_distribution(p_target, p_draft)
    assert emitted.tolist() == pytest.approx(p_target.tolist(), abs=1e-6)


def test_verify_greedy_keeps_prefix_and_corrects():
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([2, 4, 1, 5]):
        logits[row, best] = 5.0
    verdict = verify_greedy([2, 3, 1], logits)  # second draft wrong
    assert (verdict.matches, verdict.num_accepted, verdict.target_token_id) == ([True, False, True], 1, 4)
    assert verify_greedy([2, 4, 1], logits).target_token_id == 5  # all accepted: bonus from the last row


def test_verify_sampling_accepts_identical_distributions():
    probs = torch.softmax(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), -1)
    verdict = verify_sampling([1, 2, 3], probs[:3], probs, torch.Generator().manual_seed(0))
    assert verdict.matches == [True, True, True] and verdict.num_accepted == 3


def test_top_p_keeps_the_smallest_nucleus():
    probs = logits_to_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 1.0, 0.8)
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
