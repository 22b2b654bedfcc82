"""tformer.training.metrics.fit_power_law (chapter 15's reference, and the exponent fit of chapters 8 and 9):
it recovers a known law, falling or growing, and names bad input; compute_optimal inverts C = 6 N D with D = r N.
The exercises themselves run in tests/test_exercises.py with the solutions in tests/exercise_solutions/ch15.py."""
import math

import pytest
import torch

from tformer.training.metrics import compute_optimal, fit_power_law


def test_fit_recovers_chinchilla_like_law():
    n = torch.tensor([1e7, 1e8, 1e9, 1e10], dtype=torch.float64)
    a, alpha = fit_power_law(n, 406.4 * n ** -0.34 + 1.69, c=1.69)
    assert abs(float(a) - 406.4) < 1e-6 * 406.4 and abs(float(alpha) - 0.34) < 1e-9


def test_a_growing_cost_is_a_negative_alpha():
    n = [64, 128, 256, 512]                                      # plain lists, as chapters 8 and 9 pass them
    a, alpha = fit_power_law(n, [3.0 * v ** 2 for v in n])
    assert abs(float(alpha) + 2) < 1e-9 and abs(float(a) - 3) < 1e-6
    assert abs(float(fit_power_law(n, [v ** 1.5 for v in n])[1]) + 1.5) < 1e-9


@pytest.mark.parametrize("n, loss, c, match", [
    ([1.0, 2.0], [3.0], 0.0, "same shape"),
    ([1.0], [3.0], 0.0, "K >= 2"),
    ([1.0, 2.0], [1.0, 0.5], 0.8, "loss > c"),
    ([0.0, 2.0], [1.0, 0.5], 0.0, "n > 0"),
    ([2.0, 2.0], [1.0, 0.5], 0.0, "two different sizes"),
])
def test_fit_rejects_bad_input(n, loss, c, match):
    with pytest.raises(ValueError, match=match):
        fit_power_law(torch.tensor(n), torch.tensor(loss), c)


def test_compute_optimal_matches_chinchilla():
    n, d = compute_optimal(6 * 70e9 * 1.4e12)                    # Chinchilla: 70B parameters, 1.4T tokens
    assert abs(d / n - 20) < 1e-9 and abs(6 * n * d / (6 * 70e9 * 1.4e12) - 1) < 1e-12
    assert abs(n / math.sqrt(70e9 * 1.4e12 / 20) - 1) < 1e-12
    with pytest.raises(ValueError, match="flops > 0"):
        compute_optimal(0.0)
