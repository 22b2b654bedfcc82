"""Chapter 15's exercise: an independent solution passes; the package's fit recovers a known law."""
import pytest
import torch

from tformer.grading import REGISTRY, check, set_mode
from tformer.metrics import fit_power_law
import tformer.grading.exercises  # noqa: F401  (registers every chapter)


@pytest.fixture(autouse=True)
def _learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


def _power_law_fit(n_params, losses, c):
    """torch.linalg.lstsq on [1, log N] -> log(L - c): another route to the same line."""
    x, y = n_params.double().log(), (losses.double() - c).log()
    design = torch.stack([torch.ones_like(x), x], dim=1)
    b = torch.linalg.lstsq(design, y[:, None], driver="gelsd").solution[:, 0]
    return torch.stack([b[0].exp(), -b[1]])


SOLUTIONS = {"ch15.power_law_fit": _power_law_fit}
NAMES = sorted(n for n in REGISTRY if n.startswith("ch15."))


def test_chapter_15_has_its_exercises():
    assert NAMES == sorted(SOLUTIONS)


@pytest.mark.parametrize("name", NAMES)
def test_independent_solution_passes(name):
    r = check(name, SOLUTIONS[name])
    assert r.passed, r.message
    assert r.cases_run == len(REGISTRY[name].edge_cases()) + REGISTRY[name].n_random


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
