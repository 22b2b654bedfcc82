"""Attention: the reference against float64 math, the fast path against the reference, bad input."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from tformer import MultiHeadAttention, KVCache, causal_mask, combine_masks, padding_mask, scaled_dot_product_attention
from tformer.kernels import fast_attention


def explicit64(q, k, v, mask=None):
    """softmax(QK^T / sqrt(d)) V written out in float64, with a Python loop over rows (independent of tformer)."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        mask = mask.expand(scores.shape)
    out = torch.zeros(*scores.shape[:-1], v.shape[-1], dtype=torch.float64)
    for idx in itertools.product(*(range(n) for n in scores.shape[:-1])):
        s = scores[idx]
        keep = mask[idx] if mask is not None else torch.ones_like(s, dtype=torch.bool)
        if keep.any():
            e = torch.exp(s[keep] - s[keep].max())
            out[idx] = (e / e.sum()) @ v[idx[:-1]][keep]
    return out


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_mask", [False, True])
def test_reference_equals_float64_math(with_mask):
    q, k, v = rand(2, 3, 5, 8, seed=1), rand(2, 3, 7, 8, seed=2), rand(2, 3, 7, 4, seed=3)
    mask = (rand(2, 1, 5, 7, seed=4) > 0) if with_mask else None
    out, w = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out.double(), explicit64(q, k, v, mask), atol=1e-6, rtol=1e-5)
    assert out.dtype == torch.float32 and w.shape == (2, 3, 5, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))


def test_fully_masked_row_gives_zero_not_nan():
    q, k, v = rand(1, 1, 3, 4), rand(1, 1, 3, 4, seed=1), rand(1, 1, 3, 4, seed=2)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert torch.all(w[0, 0, 1] == 0) and torch.all(out[0, 0, 1] == 0)
    assert torch.all(w[0, 0, 0, 2] == 0)                         # masked key: exactly zero weight
    fast = fast_attention(q, k, v, mask)
    torch.testing.assert_close(fast, out)
    q.requires_grad_(True)                                      # and the gradient is finite
    fast_attention(q, k, v, mask).sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("case", ["none", "padding", "causal", "causal+padding", "cross"])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_fast_path_equals_reference(case, n_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    x, ctx = rand(3, 6, 32, seed=5), rand(3, 9, 32, seed=6)
    tokens = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    pad = padding_mask(tokens, 0)
    kw = {"none": {}, "padding": {"mask": pad}, "causal": {"is_causal": True},
          "causal+padding": {"mask": pad, "is_causal": True}, "cross": {"context": ctx}}[case]
    fast = mha(x, **kw)
    ref, w = mha(x, need_weights=True, **kw)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    if case == "causal":
        assert torch.all(w.triu(1) == 0)


def test_gqa_equals_mha_with_repeated_kv_heads():
    """A GQA layer is an MHA layer whose key/value heads are copied across each group."""
    torch.manual_seed(0)
    gqa = MultiHeadAttention(32, 4, n_kv_heads=2).eval()
    mha = MultiHeadAttention(32, 4).eval()
    hd = 8
    wq, wk, wv = gqa.qkv.weight.split([32, 16, 16])
    bq, bk, bv = gqa.qkv.bias.split([32, 16, 16])
    rep = lambda t: t.view(2, hd, *t.shape[1:]).repeat_interleave(2, 0).reshape(32, *t.shape[1:])
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, rep(bk), rep(bv)]))
        mha.out.load_state_dict(gqa.out.state_dict())
    x = rand(2, 5, 32)
    torch.testing.assert_close(gqa(x, is_causal=True), mha(x, is_causal=True), atol=1e-5, rtol=1e-5)


def test_kv_cache_decoding_equals_full_pass():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, n_kv_heads=1).eval()
    x = rand(2, 7, 16)
    full = mha(x, is_causal=True)
    cache = KVCache(max_len=7)
    steps = [mha(x[:, :3], is_causal=True, cache=cache)]       # prefill 3 tokens, then one at a time
    steps += [mha(x[:, t:t + 1], is_causal=True, cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 7 and cache.k.shape == (2, 1, 7, 8)   # the cache holds n_kv_heads heads
    with pytest.raises(ValueError, match="max_len"):
        mha(x[:, :1], is_causal=True, cache=cache)


def test_masks():
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(1, 3).tolist() == [[True, True, True]]   # the newest query sees all cached keys
    assert padding_mask(torch.tensor([[5, 0]]), 0).shape == (1, 1, 1, 2)
    with pytest.raises(ValueError, match="broadcast"):
        combine_masks(torch.ones(2, 3, dtype=torch.bool), torch.ones(4, 5, dtype=torch.bool))


@pytest.mark.parametrize("bad, match", [
    (lambda m, x: m(x[0]), r"\(B, T, d_model\)"),                                   # wrong rank
    (lambda m, x: m(torch.randn(2, 5, 24)), "d_model = 32"),                       # wrong width
    (lambda m, x: m(x, mask=torch.zeros(5, 5)), "torch.bool"),                     # float mask
    (lambda m, x: m(x, mask=torch.ones(2, 4, dtype=torch.bool)), r"T_q=5, T_k=5"),  # wrong mask shape
    (lambda m, x: m(x, context=torch.randn(3, 4, 32)), "batch"),                   # batch mismatch
])
def test_bad_input_names_what_was_expected(bad, match):
    mha = MultiHeadAttention(32, 4)
    with pytest.raises((ValueError, TypeError), match=match):
        bad(mha, torch.randn(2, 5, 32))


def test_bad_construction():
    with pytest.raises(ValueError, match="must divide d_model"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="must divide n_heads"):
        MultiHeadAttention(32, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="same feature size"):
        scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 3, 5), torch.randn(2, 3, 5))


def test_reference_matches_torch_sdpa_with_dropout_off():
    q, k, v = rand(2, 2, 4, 8), rand(2, 2, 6, 8, seed=1), rand(2, 2, 6, 8, seed=2)
    mask = rand(2, 1, 4, 6, seed=3) > -0.5
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask)[0],
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype, grad, t, picks", [
    (torch.bfloat16, True, 16, "math"),        # a short bf16 training step: the fused backward is the slower
    (torch.bfloat16, True, 512, "fused"),      # long sequences: fused
    (torch.bfloat16, False, 16, "fused"),      # inference: the fused forward is always the faster
    (torch.float32, True, 16, "fused"),        # float32: fused
])
def test_cpu_picks_math_for_short_bf16_training_steps(monkeypatch, dtype, grad, t, picks):
    """attend's choice on a CPU (bench_cpu_attention.py measures why), and the two paths give the same output."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4).to(dtype)
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    x = rand(2, t, 32).to(dtype)
    with torch.set_grad_enabled(grad):
        out = mha(x, is_causal=True)
        ref, _ = mha(x, is_causal=True, need_weights=True)
    assert ("fused" if calls else "math") == picks
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
