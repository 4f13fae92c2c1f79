"""specdec.core.theory against Leviathan et al. 2023 (Table 1, Thm 3.8) and its limits."""
import pytest

from specdec.core import theory


@pytest.mark.parametrize("alpha, k, expected", [(0.8, 5, 3.69), (0.6, 2, 1.96), (0.0, 4, 1.0), (1.0, 4, 5.0)])
def test_expected_tokens_per_step_matches_the_paper(alpha, k, expected):
    assert theory.expected_tokens_per_step(alpha, k) == pytest.approx(expected, abs=0.005)


def test_walltime_speedup_divides_by_the_draft_cost():
    assert theory.leviathan_bound(0.8, 5, 0.0) == pytest.approx(theory.expected_tokens_per_step(0.8, 5))
    assert theory.leviathan_bound(0.8, 5, 0.1) == pytest.approx((1 - 0.8 ** 6) / (0.2 * 1.5))
    # alpha > c: k = 1 already gains (1 + alpha) / (1 + c)
    assert theory.leviathan_bound(0.5, 1, 0.2) == pytest.approx(1.5 / 1.2)


def test_optimal_k_is_the_numeric_argmax():
    for alpha, c in [(0.8, 0.05), (0.6, 0.3), (0.9, 0.01), (0.3, 0.5)]:
        best = theory.optimal_k(alpha, c)
        values = [theory.leviathan_bound(alpha, k, c) for k in range(1, 17)]
        assert values[best - 1] == max(values)
    assert theory.optimal_k(0.95, 0.0, k_max=8) == 8


@pytest.mark.parametrize("call", [lambda: theory.expected_tokens_per_step(1.5, 2),
                                  lambda: theory.leviathan_bound(0.5, 2, -1),
                                  lambda: theory.optimal_k(0.5, 0.1, k_max=0)])
def test_out_of_range_arguments_are_refused(call):
    with pytest.raises(ValueError):
        call()
