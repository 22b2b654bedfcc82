"""Chapter 13's exercises: independent solutions pass, stubs and named mistakes are recognised."""
import pytest
import torch

from tformer.grading import REGISTRY, check, set_mode
import tformer.grading.exercises  # noqa: F401  (registers every chapter)


@pytest.fixture(autouse=True)
def _learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


def _router(logits, k, normalize=True):
    probs = torch.softmax(logits, dim=-1)
    gates, experts = torch.sort(probs, dim=-1, descending=True)       # a different route than topk
    gates, experts = gates[:, :k], experts[:, :k]
    if normalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates, experts


def _balance(probs, experts):
    n, e = probs.shape
    onehot = torch.nn.functional.one_hot(experts, e).to(probs.dtype)  # (N, k, E)
    f = onehot.sum(dim=(0, 1)) / experts.numel()
    return e * (f * probs.mean(dim=0)).sum()


SOLUTIONS = {"ch13.top_k_router": _router, "ch13.balance_loss": _balance}
NAMES = sorted(n for n in REGISTRY if n.startswith("ch13."))


def test_chapter_13_has_its_exercises():
    assert NAMES == sorted(SOLUTIONS)


@pytest.mark.parametrize("name", NAMES)
def test_independent_solution_passes(name):
    r = check(name, SOLUTIONS[name])
    assert r.passed, r.message
    assert r.cases_run == len(REGISTRY[name].edge_cases()) + REGISTRY[name].n_random


# The stub, named-mistake and reference-guard checks run for every chapter in tests/test_grading.py.


def test_balance_edge_cases_have_the_textbook_values():
    cases = REGISTRY["ch13.balance_loss"].edge_cases()
    assert float(_balance(*cases[0].args)) == pytest.approx(1.0)      # uniform
    assert float(_balance(*cases[1].args)) == pytest.approx(3.0)      # collapse onto 1 of E=3
