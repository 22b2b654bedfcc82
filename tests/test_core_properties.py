"""Properties every chapter relies on: causality, padding invariance, permutation equivariance."""
import torch

from tformer.models import GPT, GPTConfig, Transformer, TransformerConfig
from tformer.models.transformer import Encoder


def small_transformer(**kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
                            n_decoder_layers=2, dropout=0.0, **kw)
    return Transformer(cfg).eval()


def test_changing_future_tokens_never_changes_earlier_outputs():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=50, context_length=16, n_layers=2, n_heads=4, d_model=32)).eval()
    a = torch.randint(0, 50, (2, 12))
    b = a.clone()
    b[:, 7:] = torch.randint(0, 50, (2, 5))
    la, lb = gpt(a), gpt(b)
    torch.testing.assert_close(la[:, :7], lb[:, :7])
    assert not torch.allclose(la[:, 7:], lb[:, 7:])                 # the test can fail: the future did change
    model = small_transformer()                                      # and in the decoder
    src = torch.randint(1, 40, (2, 6))
    ta, tb = torch.randint(1, 40, (2, 8)), None
    tb = ta.clone()
    tb[:, 5:] = (tb[:, 5:] + 1) % 39 + 1
    torch.testing.assert_close(model(src, ta)[:, :5], model(src, tb)[:, :5])


def test_padding_does_not_change_outputs():
    """A padded batch gives each sequence the same logits as running it alone."""
    for norm_first in (False, True):
        model = small_transformer(norm_first=norm_first)
        src_a, src_b = torch.randint(1, 40, (1, 7)), torch.randint(1, 40, (1, 4))
        tgt_a, tgt_b = torch.randint(1, 40, (1, 5)), torch.randint(1, 40, (1, 3))
        src = torch.zeros(2, 7, dtype=torch.long)
        tgt = torch.zeros(2, 5, dtype=torch.long)
        src[0], src[1, :4], tgt[0], tgt[1, :3] = src_a[0], src_b[0], tgt_a[0], tgt_b[0]
        batch = model(src, tgt)
        torch.testing.assert_close(batch[0:1], model(src_a, tgt_a), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batch[1:2, :3], model(src_b, tgt_b), atol=1e-5, rtol=1e-5)


def test_without_positions_permuting_the_input_permutes_the_output():
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=10, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, dropout=0.0)
    enc = Encoder(cfg).eval()
    x = torch.randn(2, 9, 32)
    perm = torch.randperm(9)
    torch.testing.assert_close(enc(x)[:, perm], enc(x[:, perm]), atol=1e-5, rtol=1e-5)
    # with positions it is no longer equivariant
    model = small_transformer()
    src = torch.randint(1, 40, (1, 9))
    mem, _ = model.encode(src)
    mem_p, _ = model.encode(src[:, perm])
    assert not torch.allclose(mem[:, perm], mem_p, atol=1e-3)


def test_dropout_sites_follow_the_config():
    """dropout: sub-layer outputs and embeddings; attn_dropout / ffn_dropout: attention weights and FFN
    hidden units, defaulting to dropout (nn.Transformer) and 0 in the paper's presets."""
    from tformer.models.transformer import Transformer
    from tformer.translate.presets import get_preset

    def sites(model):
        attn = {m.dropout for n, m in model.named_modules() if n.endswith("attn")}
        ffn = {m.dropout.p for n, m in model.named_modules() if n.endswith("ffn")}
        resid = {m.p for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in ("drop", "drop1", "drop2", "drop3")}
        return attn, ffn, resid
    base = dict(src_vocab_size=10, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1)
    assert sites(Transformer(TransformerConfig(dropout=0.2, **base))) == ({0.2}, {0.2}, {0.2})
    assert sites(Transformer(TransformerConfig(dropout=0.2, attn_dropout=0.0, ffn_dropout=0.05, **base))) == (
        {0.0}, {0.05}, {0.2})
    assert (get_preset("base").attn_dropout, get_preset("base").ffn_dropout) == (0.0, 0.0)
