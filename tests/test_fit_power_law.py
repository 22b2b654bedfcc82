"""tformer.training.metrics.fit_power_law (chapter 15's reference): it recovers a known law and names bad input.
The exercise itself runs in tests/test_exercises.py with the solution in tests/exercise_solutions/ch15.py."""
import pytest
import torch

from tformer.training.metrics import fit_power_law


def test_fit_recovers_chinchilla_like_law():
    n = torch.tensor([1e7, 1e8, 1e9, 1e10], dtype=torch.float64)
    a, alpha = fit_power_law(n, 406.4 * n ** -0.34 + 1.69, c=1.69)
    assert abs(float(a) - 406.4) < 1e-6 * 406.4 and abs(float(alpha) - 0.34) < 1e-9


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
