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


@pytest.mark.parametrize("chunk", [1, 5, 37])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_label_smoothing_equals_cross_entropy_with_label_smoothing(chunk, reduction):
    h, w, y = _pair(seed=1)
    y[[0, 7]] = -100
    ref = F.cross_entropy(h @ w.t(), y, label_smoothing=0.1, reduction=reduction)
    out = linear_cross_entropy(h, w, y, smoothing=0.1, chunk=chunk, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(_grads(out * 0.7, h, w), _grads(ref * 0.7, h, w)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_without_a_gradient_to_make_it_returns_the_same_loss_and_no_graph():
    h, w, y = _pair(seed=2)
    ref = linear_cross_entropy(h, w, y, smoothing=0.1, chunk=5)
    with torch.no_grad():
        out = linear_cross_entropy(h, w, y, smoothing=0.1, chunk=5)
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)


def test_bad_smoothing_and_target_ids_name_what_was_expected():
    h, w, y = _pair()
    with pytest.raises(ValueError, match=r"0 <= smoothing < 1, got 1.0"):
        linear_cross_entropy(h, w, y, smoothing=1.0)
    y[4] = 29
    with pytest.raises(ValueError, match=r"target ids must be in \[0, 29\) or ignore_index \(-100\), got 0..29"):
        linear_cross_entropy(h, w, y)


def _seq2seq(share: bool):
    from tformer.models import Transformer, TransformerConfig
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=31, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=2,
                            dropout=0.0, context_length=16, share_embeddings=share)
    m = Transformer(cfg).double()
    src = torch.randint(3, 31, (4, 9))
    tgt = torch.randint(3, 31, (4, 7))
    targets = torch.roll(tgt, -1, 1)
    src[1, 6:], tgt[2, 4:], targets[2, 3:], targets[0, 6] = 0, 0, 0, 0     # <pad> (id 0) on both sides
    return m, src, tgt, targets


@pytest.mark.parametrize("share", [True, False])
def test_transformer_with_targets_is_the_label_smoothed_loss_of_its_logits(share):
    from tformer.training import label_smoothed_cross_entropy
    m, src, tgt, targets = _seq2seq(share)
    ref = label_smoothed_cross_entropy(m(src, tgt), targets, 0.1, ignore_index=0, reduction="sum")
    out = m(src, tgt, targets, label_smoothing=0.1)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    params = list(m.parameters())
    for a, b in zip(torch.autograd.grad(out, params), torch.autograd.grad(ref, params)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match=r"targets \(4, 6\) must have tgt's shape \(4, 7\)"):
        m(src, tgt, targets[:, :6])


def test_seq2seq_loss_takes_the_fused_head_for_the_course_model_and_the_logits_for_another(monkeypatch):
    from tformer.data.batching import Seq2SeqBatch
    from tformer.translate.pipeline import Seq2SeqLoss
    from tformer.training import losses
    calls = []
    real = losses.linear_cross_entropy
    monkeypatch.setattr(losses, "linear_cross_entropy", lambda *a, **k: calls.append(1) or real(*a, **k))
    m, src, tgt, targets = _seq2seq(True)
    batch = Seq2SeqBatch(src, tgt, targets)
    fused, n = Seq2SeqLoss(0.1, 0)(m, batch)
    assert calls == [1] and int(n) == int((targets != 0).sum())

    class Logits(torch.nn.Module):                  # any other model: logits out, the loss taken on them
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, s, t):
            return self.inner(s, t)
    plain, _ = Seq2SeqLoss(0.1, 0)(Logits(m), batch)
    assert calls == [1]
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)
