"""Chapter 14's exercises: independent solutions pass, stubs and named mistakes are recognised."""
import math

import pytest
import torch

from tformer.grading import REGISTRY, check, set_mode
import tformer.grading.exercises  # noqa: F401  (registers every chapter)


@pytest.fixture(autouse=True)
def _learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


def _kv_step(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    t_q, t_k = q.shape[2], k_all.shape[2]
    scores = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
    visible = torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v_all, k_all, v_all


def _accept(p, q, draft, u):
    k = draft.shape[0]
    n = 0
    while n < k and u[n] < p[n, draft[n]] / q[n, draft[n]]:
        n += 1
    if n == k:
        return torch.tensor(n), p[k]
    r = torch.clamp(p[n] - q[n], min=0)
    return torch.tensor(n), r / r.sum()


def _int8(w):
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
    return torch.clamp(torch.round(w / scale[:, None]), -128, 127).to(torch.int8), scale


SOLUTIONS = {"ch14.kv_step": _kv_step, "ch14.accept": _accept, "ch14.int8": _int8}
NAMES = sorted(n for n in REGISTRY if n.startswith("ch14."))


def test_chapter_14_has_its_exercises():
    assert NAMES == sorted(SOLUTIONS)


@pytest.mark.parametrize("name", NAMES)
def test_independent_solution_passes(name):
    r = check(name, SOLUTIONS[name])
    assert r.passed, r.message
    assert r.cases_run == len(REGISTRY[name].edge_cases()) + REGISTRY[name].n_random


# The stub, named-mistake and reference-guard checks run for every chapter in tests/test_grading.py.


def test_kv_step_reference_matches_cached_multi_head_attention():
    """The kv_step reference equals a model's cached decoding: one layer of MultiHeadAttention."""
    from tformer import MultiHeadAttention
    from tformer.cache import KVCache
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 7, 16)
    cache = KVCache()
    with torch.no_grad():
        mha(x[:, :4], is_causal=True, cache=cache)
        k_past, v_past = (t.clone() for t in cache.get())
        q, k, v = mha.qkv(x[:, 4:]).split(16, -1)
        split = lambda t: t.view(1, 3, 2, 8).transpose(1, 2)  # noqa: E731
        out, _, _ = REGISTRY["ch14.kv_step"].reference(split(q), split(k), split(v), k_past, v_past)
        want = mha(x, is_causal=True)[:, 4:]
    torch.testing.assert_close(mha.out(out.transpose(1, 2).reshape(1, 3, 16)), want, atol=1e-5, rtol=1e-4)
