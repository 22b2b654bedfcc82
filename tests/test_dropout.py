"""tformer.dropout: the cheap CPU mask drops each element with probability p, in every position of the
64-bit draw, scales the survivors so the expectation is the input, and is reproducible from the seed."""
import math

import pytest
import torch
import torch.nn as nn

from tformer.attention import MultiHeadAttention
from tformer.dropout import WORD_BITS, Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_each_word_of_the_draw_drops_at_rate_p(p):
    """Elements 4i..4i+3 share one 64-bit draw; each of the four positions must drop at rate p (a word
    that used the draw's always-zero top bit would drop too rarely or too often there)."""
    torch.manual_seed(0)
    n = 1 << 20
    keep, rate = keep_mask((n,), p)
    assert rate == pytest.approx(1 - p, abs=2 ** -(WORD_BITS + 1))
    per_position = keep.view(-1, 4).float().mean(0)                      # (4,) keep rate of each word
    sigma = math.sqrt(rate * (1 - rate) / (n / 4))
    assert (per_position - rate).abs().max() < 5 * sigma, (per_position, rate)


def test_survivors_are_scaled_so_the_mean_is_kept():
    torch.manual_seed(1)
    x = torch.ones(512, 1024)
    y = dropout(x, 0.3)
    _, rate = keep_mask((1,), 0.3)
    assert torch.unique(y).tolist() == [0.0, pytest.approx(1 / rate)]
    assert float(y.mean()) == pytest.approx(1.0, abs=5 * math.sqrt(0.3 / 0.7 / x.numel()))


def test_gradient_is_the_same_mask_and_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)
    y = dropout(x, 0.25)
    g = torch.randn_like(y)
    y.backward(g)
    factor = y.detach() / x.detach()                                   # 0 where dropped, 1/keep elsewhere
    assert torch.allclose(x.grad, g * factor, rtol=1e-12, atol=0)
    assert 0 < int((factor == 0).sum()) < x.numel()


def test_seeded_masks_repeat_and_keep_dtype_and_shape():
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    torch.manual_seed(3)
    a = dropout(x, 0.5)
    torch.manual_seed(3)
    b = dropout(x, 0.5)
    assert torch.equal(a, b) and a.dtype == torch.bfloat16 and a.shape == x.shape


def test_identity_in_eval_and_at_zero_zeros_at_one_and_bad_p():
    x = torch.randn(4, 4)
    assert dropout(x, 0.5, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert torch.equal(dropout(x, 1 - 2 ** -17), torch.zeros_like(x))      # rounds to "drop all": no 1/0
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        keep_mask((2,), 1.5)


def test_module_is_an_nn_dropout_that_stops_in_eval():
    m = Dropout(0.4)
    assert isinstance(m, nn.Dropout) and m.p == 0.4
    x = torch.randn(8, 8)
    assert torch.equal(m.eval()(x), x)
    assert not torch.equal(m.train()(x), x)


def test_attention_dropout_on_cpu_keeps_the_expected_output():
    """Dropout on the attention weights is linear in them, so its mean over many draws is the
    attention output without dropout (the CPU path draws the mask with tformer.dropout)."""
    torch.manual_seed(4)
    mha = MultiHeadAttention(8, 2, dropout=0.5).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        mha.eval()
        want = mha(x)[0]
        mha.train()
        draws = torch.stack([mha(x)[0] for _ in range(4000)])
    assert not torch.allclose(draws[0], want, atol=1e-3)                 # dropout is on in training
    err = (draws.mean(0) - want).abs().max()
    assert err < 6 * float(draws.std(0).max()) / math.sqrt(len(draws)), err
