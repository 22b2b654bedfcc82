"""Sparse patterns: definitions checked entry by entry against the papers' index rules (written as loops),
O(n sqrt n) counts, the banded kernel equal to dense masked attention, PatternAttention swappable."""
import math

import pytest
import torch

from tformer.attention import MultiHeadAttention, scaled_dot_product_attention
from tformer.masks import causal_mask, sliding_window_mask
from tformer.models import GPT, GPTConfig
from tformer.sparse import (PatternAttention, bigbird_mask, count_pairs, fixed_pattern, longformer_mask,
                            sliding_window_attention, strided_pattern)


def _loops(t, rule):
    return torch.tensor([[bool(rule(i, j)) for j in range(t)] for i in range(t)])


@pytest.mark.parametrize("t,stride,causal", [(9, 3, True), (16, 4, True), (10, 3, False), (5, 8, True)])
def test_strided_pattern_matches_index_rule(t, stride, causal):
    m = strided_pattern(t, stride, causal)
    ok = (lambda i, j: j <= i) if causal else (lambda i, j: True)
    assert torch.equal(m[0], _loops(t, lambda i, j: ok(i, j) and abs(i - j) < stride))
    assert torch.equal(m[1], _loops(t, lambda i, j: ok(i, j) and (i - j) % stride == 0))


@pytest.mark.parametrize("t,stride,c", [(12, 4, 1), (12, 4, 2), (10, 3, 1)])
def test_fixed_pattern_matches_index_rule(t, stride, c):
    m = fixed_pattern(t, stride, c)
    assert torch.equal(m[0], _loops(t, lambda i, j: j <= i and i // stride == j // stride))
    assert torch.equal(m[1], _loops(t, lambda i, j: j <= i and j % stride >= stride - c))


def test_two_hops_reach_every_earlier_token():
    for m in (strided_pattern(30, 5), fixed_pattern(30, 5)):
        a, b = m[0].float(), m[1].float()
        reach = ((b @ a) + (a @ b) + a + b) > 0                         # one or two hops, either order
        assert torch.equal(reach, causal_mask(30))


def test_longformer_mask():
    m = longformer_mask(10, 2, global_tokens=(0, 7))
    expected = _loops(10, lambda i, j: abs(i - j) < 2 or i in (0, 7) or j in (0, 7))
    assert torch.equal(m, expected)
    assert torch.equal(longformer_mask(10, 2, (0, 7), causal=True), expected & causal_mask(10))
    with pytest.raises(ValueError, match="global"):
        longformer_mask(5, 2, (9,))


def test_bigbird_mask_blocks():
    t, blk = 32, 4
    m = bigbird_mask(t, blk, n_random=2, n_global=1, seed=3)
    nb = t // blk
    blocks = m.view(nb, blk, nb, blk)
    assert torch.all(blocks.all(dim=(1, 3)) == blocks.any(dim=(1, 3)))   # block structure: all or nothing
    bm = blocks.any(dim=(1, 3))                                            # (nb, nb)
    assert bm[0].all() and bm[:, 0].all()                                  # the global block
    for i in range(nb):
        window = {j for j in range(nb) if abs(i - j) <= 1}
        assert all(bm[i, j] for j in window)
        extra = set(bm[i].nonzero().flatten().tolist()) - window - {0}
        assert i == 0 or len(extra) == 2                                   # exactly n_random others
    assert torch.equal(m, bigbird_mask(t, blk, 2, 1, seed=3))
    assert not torch.equal(m, bigbird_mask(t, blk, 2, 1, seed=4))
    with pytest.raises(ValueError, match="multiple"):
        bigbird_mask(30, 4)


def test_sparse_transformer_cost_is_n_sqrt_n():
    ns = [256, 1024, 4096]
    counts = [count_pairs(strided_pattern(n, int(math.sqrt(n)))) for n in ns]
    # pairs <= n * (stride + n / stride) = 2 n sqrt(n); dense causal is n(n+1)/2
    for n, c in zip(ns, counts):
        assert n * math.sqrt(n) / 2 < c <= 2 * n * math.sqrt(n)
    slope = math.log(counts[-1] / counts[0]) / math.log(ns[-1] / ns[0])
    assert abs(slope - 1.5) < 0.05
    assert count_pairs(sliding_window_mask(100, 8)) == sum(min(i + 1, 8) for i in range(100))


@pytest.mark.parametrize("t,w,causal", [(1, 3, True), (10, 3, True), (16, 4, False), (5, 8, True), (33, 5, False),
                                        (12, 1, True)])
def test_banded_kernel_equals_dense_masked_attention(t, w, causal):
    torch.manual_seed(t)
    q, k, v = torch.randn(3, 2, 3, t, 8, dtype=torch.float64)
    got = sliding_window_attention(q, k, v, w, causal)
    expected, _ = scaled_dot_product_attention(q, k, v, sliding_window_mask(t, w, causal=causal))
    torch.testing.assert_close(got, expected)


def test_pattern_attention_is_a_drop_in_for_mha():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 12, 16)
    full = PatternAttention(16, 4, pattern=lambda t, dev: torch.ones(t, t, dtype=torch.bool, device=dev))
    full.load_state_dict(mha.state_dict())
    torch.testing.assert_close(full(x, is_causal=True), mha(x, is_causal=True))
    # a (2, T, T) factorized pattern is spread over 4 heads: heads 0, 2 local, heads 1, 3 strided
    sp = PatternAttention(16, 4, pattern=lambda t, dev: strided_pattern(t, 3, device=dev))
    sp.load_state_dict(mha.state_dict())
    _, w = sp(x, is_causal=True, need_weights=True)
    pat = strided_pattern(12, 3)
    assert torch.all(w[:, 0][..., ~pat[0]] == 0) and torch.all(w[:, 1][..., ~pat[1]] == 0)
    banded = PatternAttention(16, 4, window=3)
    banded.load_state_dict(mha.state_dict())
    dense = mha(x, mask=sliding_window_mask(12, 3), is_causal=True)
    torch.testing.assert_close(banded(x, is_causal=True), dense)
    with pytest.raises(ValueError, match="exactly one"):
        PatternAttention(16, 4)


def test_swapped_into_gpt_and_causal():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, context_length=32, n_layers=2, n_heads=2, d_model=16))
    for blk in model.blocks:
        old = blk.attn
        blk.attn = PatternAttention(16, 2, window=4)
        blk.attn.load_state_dict(old.state_dict())
    idx = torch.randint(0, 20, (2, 32))
    other = idx.clone()
    other[:, 20:] = (other[:, 20:] + 1) % 20
    a, b = model(idx), model(other)
    torch.testing.assert_close(a[:, :20], b[:, :20])
    model(idx).sum().backward()
