"""Chapters 8-9 exercises: independent solutions pass, each named mistake is recognised, references are guarded."""
import pytest
import torch

from tformer.grading import check, set_mode
from tformer.grading.exercises import ch08, ch09


@pytest.fixture(autouse=True)
def learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


def _window(t, window, causal=True):
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    m = (i - j).abs() < window
    return m & (j <= i) if causal else m


def _ntk(hd, base, factor):
    i = torch.arange(0, hd, 2, dtype=torch.float64) / hd
    return ((base * factor ** (hd / (hd - 2))) ** (-i)).float()


def _step(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    p, a = torch.exp(s - m_safe), torch.exp(m - m_safe)
    return m_new, a * l + p.sum(-1, keepdim=True), a * acc + p @ v


def _strided(t, s):
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    d = i - j
    return torch.stack([(d >= 0) & (d < s), (d >= 0) & (d % s == 0)])


@pytest.mark.parametrize("name,fn,mistakes", [
    ("ch08.sliding_window_mask", _window, [ch08._off_by_one, ch08._no_causal, ch08._future_only]),
    ("ch08.ntk_rope", _ntk, [ch08._plain_base_scaled, ch08._position_interpolation]),
    ("ch09.online_softmax_step", _step, [ch09._no_rescale, ch09._rescale_inverted, ch09._block_max_only]),
    ("ch09.strided_pattern", _strided, [ch09._strided_not_causal, ch09._strided_local_off_by_one]),
])
def test_solution_passes_and_mistakes_are_named(name, fn, mistakes):
    assert check(name, fn).passed
    from tformer.grading import REGISTRY
    ex = REGISTRY[name]
    for bug in mistakes:
        r = check(name, bug)
        assert r.status == "failed"
        label = next(k for k, v in ex.mistakes.items() if v is bug)
        assert label in r.message


def test_stub_is_not_attempted_and_reference_is_guarded():
    def stub(*a, **k):
        raise NotImplementedError
    assert check("ch09.online_softmax_step", stub).status == "not attempted"
    from tformer import efficient, masks
    assert check("ch09.online_softmax_step", lambda *a: efficient.online_softmax_step(*a)).status == "error"
    assert check("ch08.sliding_window_mask", lambda t, w, causal=True: masks.sliding_window_mask(t, w, causal=causal)
                 ).status == "error"
