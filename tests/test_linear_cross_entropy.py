"""The LM head fused into the cross-entropy (tformer.training.losses.linear_cross_entropy, GPT.loss): the same
loss and gradients as F.cross_entropy on materialised logits, in float64, whatever the chunking."""
import pytest
import torch
import torch.nn.functional as F

from tformer.models.gpt import GPT, GPTConfig
from tformer.training import linear_cross_entropy


def _pair(n=37, d=8, v=29, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(v, d, generator=g, dtype=dtype, requires_grad=True)
    y = torch.randint(0, v, (n,), generator=g)
    return h, w, y


def _grads(loss, *xs):
    return torch.autograd.grad(loss, xs)


@pytest.mark.parametrize("chunk", [1, 5, 37, 1024])          # 37 rows: chunks that do and do not divide them
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_and_gradients_equal_cross_entropy_on_the_logits(chunk, reduction):
    h, w, y = _pair()
    y[[3, 10, 11]] = -100                                       # ignored rows count nothing
    ref = F.cross_entropy(h @ w.t(), y, reduction=reduction)
    out = linear_cross_entropy(h, w, y, chunk=chunk, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    got = _grads(out * 3.0, h, w)                               # an incoming gradient other than 1
    for a, b in zip(got, _grads(ref * 3.0, h, w)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert got[0][[3, 10, 11]].abs().max() == 0


def test_under_cpu_bf16_autocast_it_stays_close_to_float32():
    h, w, y = _pair(n=64, d=32, v=101, dtype=torch.float32)
    ref = F.cross_entropy(h @ w.t(), y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear_cross_entropy(h, w, y, chunk=16)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=3e-2, atol=3e-2)
    gh, gw = _grads(out, h, w)
    assert gh.dtype == h.dtype and gw.dtype == w.dtype


def test_gpt_loss_equals_the_cross_entropy_of_its_logits_with_the_tied_head():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=53, context_length=16, n_layers=2, n_heads=2, d_model=16)).double()
    idx = torch.randint(0, 53, (3, 12))
    tgt = torch.randint(0, 53, (3, 12))
    ref = F.cross_entropy(m(idx).flatten(0, 1), tgt.flatten())
    out = m.loss(idx, tgt, chunk=7)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    params = [p for p in m.parameters()]
    for a, b in zip(torch.autograd.grad(out, params), torch.autograd.grad(ref, params)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)       # the tied table gets both of its gradients


def test_bad_shapes_name_what_was_expected():
    h, w, y = _pair()
    with pytest.raises(ValueError, match=r"expected h \(N, d\), weight \(V, d\), target \(N,\)"):
        linear_cross_entropy(h, w[:, :4], y)
    with pytest.raises(ValueError, match="reduction must be mean or sum"):
        linear_cross_entropy(h, w, y, reduction="none")
