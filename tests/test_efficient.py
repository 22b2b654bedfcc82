"""Efficient attention: tiled attention exact vs F.scaled_dot_product_attention (values and gradients,
causal, masks, odd sizes) with memory linear in T; Linformer and Performer against exact attention."""
import math

import pytest
import torch
import torch.nn.functional as F

from tformer.attention import MultiHeadAttention, scaled_dot_product_attention
from tformer.efficient import (LinformerAttention, PerformerAttention, TiledAttention, favor_features,
                               online_softmax_step, orthogonal_gaussian, performer_attention, tiled_attention)
from tformer.masks import causal_mask
from tformer.models import GPT, GPTConfig
from tformer.measure.timing import peak_memory


@pytest.mark.parametrize("t_q,t_k,block,causal", [
    (1, 1, 4, False), (10, 10, 3, False), (10, 10, 3, True), (7, 13, 4, False), (7, 13, 4, True),
    (64, 64, 16, True), (5, 5, 128, True), (33, 33, 1, True)])
def test_tiled_equals_sdpa_float32_values_and_grads(t_q, t_k, block, causal):
    torch.manual_seed(t_q * 100 + t_k)
    q = torch.randn(2, 3, t_q, 16, requires_grad=True)
    k = torch.randn(2, 3, t_k, 16, requires_grad=True)
    v = torch.randn(2, 3, t_k, 8, requires_grad=True)
    got = tiled_attention(q, k, v, is_causal=causal, block=block)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t_q, t_k) if causal else None)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)                 # float32 rounding
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_tiled_float64_with_padding_mask_and_empty_rows():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 9, 4, dtype=torch.float64)
    mask = torch.rand(2, 1, 9, 9) > 0.5
    mask[0, 0, 3] = False                                              # a query that sees nothing
    got = tiled_attention(q, k, v, mask=mask, block=2)
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(got, ref)
    assert torch.all(got[0, :, 3] == 0)
    q.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q_: tiled_attention(q_, k, v, mask=mask, is_causal=True, block=4), (q,))


def test_online_softmax_blocks_give_the_softmax():
    torch.manual_seed(0)
    s, v = torch.randn(4, 10, dtype=torch.float64) * 5, torch.randn(10, 3, dtype=torch.float64)
    m, l, acc = torch.full((4, 1), -math.inf, dtype=torch.float64), torch.zeros(4, 1, dtype=torch.float64), \
        torch.zeros(4, 3, dtype=torch.float64)
    for j in range(0, 10, 3):
        m, l, acc = online_softmax_step(m, l, acc, s[:, j:j + 3], v[j:j + 3])
    torch.testing.assert_close(acc / l, torch.softmax(s, -1) @ v)
    torch.testing.assert_close(m, s.amax(-1, keepdim=True))
    # a fully masked block changes nothing, even before anything was seen
    m2, l2, acc2 = online_softmax_step(torch.full((4, 1), -math.inf), torch.zeros(4, 1), torch.zeros(4, 3),
                                       torch.full((4, 2), -math.inf), torch.randn(2, 3))
    assert torch.all(l2 == 0) and torch.all(acc2 == 0) and not torch.isnan(acc2).any()


def test_tiled_memory_is_linear_in_t():
    def mem(t, fn):
        q = torch.randn(1, 1, t, 16)
        return peak_memory(lambda: fn(q))
    tiled = [mem(t, lambda q: tiled_attention(q, q, q, is_causal=True, block=128)) for t in (512, 2048)]
    explicit = [mem(t, lambda q: scaled_dot_product_attention(q, q, q, causal_mask(q.shape[-2]))[0])
                for t in (512, 2048)]
    assert tiled[1] / tiled[0] < 5                                    # ~4x for 4x longer: linear
    assert explicit[1] / explicit[0] > 12                             # ~16x: quadratic
    assert tiled[1] * 8 < explicit[1]


def test_tiled_module_equals_mha_and_works_in_gpt():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    tiled = TiledAttention(16, 4, block=5)
    tiled.load_state_dict(mha.state_dict())
    x = torch.randn(2, 13, 16)
    torch.testing.assert_close(tiled(x, is_causal=True), mha(x, is_causal=True), rtol=1e-5, atol=1e-6)
    model = GPT(GPTConfig(vocab_size=11, context_length=16, n_layers=1, n_heads=2, d_model=8, positional="rope"))
    idx = torch.randint(0, 11, (2, 16))
    ref = model(idx)
    old = model.blocks[0].attn
    model.blocks[0].attn = TiledAttention(8, 2, block=4)
    model.blocks[0].attn.load_state_dict(old.state_dict())
    torch.testing.assert_close(model(idx), ref, rtol=1e-5, atol=1e-6)


def test_linformer_with_identity_projections_is_exact_attention():
    torch.manual_seed(0)
    t = 10
    mha = MultiHeadAttention(16, 2)
    lin = LinformerAttention(16, 2, max_len=t, k=t)
    lin.load_state_dict({**mha.state_dict(), "E": torch.eye(t), "F": torch.eye(t)})
    x = torch.randn(3, t, 16)
    torch.testing.assert_close(lin(x), mha(x), rtol=1e-5, atol=1e-6)
    pad = torch.tensor([[True] * 7 + [False] * 3] * 3)[:, None, None, :]
    # padded tokens are zeroed before the projection: what they hold cannot change the real tokens' outputs
    x2 = x.clone()
    x2[:, 7:] = torch.randn(3, 3, 16) * 10
    torch.testing.assert_close(lin(x, mask=pad)[:, :7], lin(x2, mask=pad)[:, :7])
    assert not torch.allclose(lin(x)[:, :7], lin(x2)[:, :7])
    with pytest.raises(ValueError, match="causal"):
        lin(x, is_causal=True)
    with pytest.raises(ValueError, match="max_len"):
        lin(torch.randn(1, t + 1, 16))
    with pytest.raises(ValueError, match="padding"):
        lin(x, mask=causal_mask(t))


def test_linformer_cost_projection_shapes():
    lin = LinformerAttention(32, 4, max_len=64, k=8, share_kv=True)
    assert lin.E is lin.F and lin.E.shape == (8, 64)
    y = lin(torch.randn(2, 40, 32))                                    # shorter than max_len: first 40 columns
    assert y.shape == (2, 40, 32)
    y.sum().backward()
    assert lin.E.grad[:, 40:].abs().sum() == 0 and lin.E.grad[:, :40].abs().sum() > 0


def test_orthogonal_features():
    w = orthogonal_gaussian(40, 16, torch.Generator().manual_seed(0), torch.float64)
    assert w.shape == (40, 16)
    for blk in (w[:16], w[16:32]):
        gram = blk @ blk.T
        torch.testing.assert_close(gram - torch.diag(torch.diagonal(gram)), torch.zeros(16, 16, dtype=torch.float64),
                                   atol=1e-10, rtol=0)
    assert 2 < w.norm(dim=-1).mean() < 6                               # ~ sqrt(16): Gaussian-length rows


def test_favor_features_are_positive_and_unbiased():
    torch.manual_seed(0)
    d = 8
    q, k = torch.randn(5, d, dtype=torch.float64) * 0.25, torch.randn(5, d, dtype=torch.float64) * 0.25
    w = orthogonal_gaussian(12800, d, torch.Generator().manual_seed(1), torch.float64)   # 1600 orthogonal blocks
    pq, pk = favor_features(q, w, True), favor_features(k, w, False)
    assert torch.all(pq > 0) and torch.all(pk > 0)
    # undo the stabilizers (they cancel inside attention) to get the raw kernel estimate
    cq, ck = (q @ w.T).amax(-1, keepdim=True), (k @ w.T).amax()
    est = (pq - 1e-6) @ (pk - 1e-6).T * torch.exp(cq + ck)
    # a lognormal estimator has heavy tails: 5% at 12,800 features (dropping the -|x|^2/2 term is ~60% off)
    torch.testing.assert_close(est, torch.exp(q @ k.T), rtol=0.05, atol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_approaches_softmax_attention_as_features_grow(causal):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 50, 16, dtype=torch.float64) * torch.tensor([0.5, 0.5, 1.0]).view(3, 1, 1, 1, 1).double()
    exact = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    errs = []
    for m in (16, 256, 4096):
        w = orthogonal_gaussian(m, 16, torch.Generator().manual_seed(0), torch.float64)
        errs.append((performer_attention(q, k, v, w, causal, chunk=7) - exact).abs().mean().item())
    assert errs[0] > errs[1] > errs[2] and errs[2] < 0.01


def test_performer_causal_chunks_agree_and_future_is_ignored():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 20, 8, dtype=torch.float64)
    w = orthogonal_gaussian(32, 8, torch.Generator().manual_seed(0), torch.float64)
    a = performer_attention(q, k, v, w, True, chunk=3)
    b = performer_attention(q, k, v, w, True, chunk=20)
    torch.testing.assert_close(a, b)
    # the prefix-sum form equals the quadratic form with a causal mask on phi(Q) phi(K)^T
    qf, kf = favor_features(q * 8 ** -0.25, w, True), favor_features(k * 8 ** -0.25, w, False)
    a_mat = (qf @ kf.transpose(-2, -1)).tril()
    torch.testing.assert_close(a, (a_mat @ v) / a_mat.sum(-1, keepdim=True))


def test_performer_module_swaps_into_gpt():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context_length=24, n_layers=2, n_heads=2, d_model=16))
    for blk in model.blocks:
        old = blk.attn
        blk.attn = PerformerAttention(16, 2, n_features=32)
        blk.attn.load_state_dict(old.state_dict(), strict=False)
    idx = torch.randint(0, 11, (2, 24))
    other = idx.clone()
    other[:, 15:] = (other[:, 15:] + 3) % 11
    torch.testing.assert_close(model(idx)[:, :15], model(other)[:, :15])
    model(idx).sum().backward()
    w0 = model.blocks[0].attn.w.clone()
    model.blocks[0].attn.redraw_features()
    assert not torch.equal(w0, model.blocks[0].attn.w)
    with pytest.raises(ValueError, match="self-attention"):
        model.blocks[0].attn(torch.randn(1, 3, 16), context=torch.randn(1, 3, 16))
