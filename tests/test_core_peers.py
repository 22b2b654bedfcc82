"""Same weights in, same numbers out: tformer against torch.nn and Hugging Face transformers."""
import pytest
import torch
import torch.nn as nn

from tformer import MultiHeadAttention, causal_mask
from tformer.models import GPT, GPTConfig, Transformer, TransformerConfig

D, H = 32, 4


def copy_mha(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    ours.qkv.weight.data.copy_(theirs.in_proj_weight)
    ours.qkv.bias.data.copy_(theirs.in_proj_bias)
    ours.out.load_state_dict(theirs.out_proj.state_dict())


@pytest.mark.parametrize("kind", ["self", "self+padding", "self+causal", "cross+padding"])
def test_mha_equals_torch_multihead_attention(kind):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
    ours = MultiHeadAttention(D, H).eval()
    copy_mha(ours, theirs)
    x, mem = torch.randn(3, 6, D), torch.randn(3, 8, D)
    kv = mem if kind.startswith("cross") else x
    t_k = kv.shape[1]
    lengths = torch.tensor([t_k, t_k - 2, 1])
    key_pad = torch.arange(t_k)[None, :] >= lengths[:, None]           # torch: True = padding
    torch_kw, our_kw = {}, {}
    if "padding" in kind:
        torch_kw["key_padding_mask"] = key_pad
        our_kw["mask"] = ~key_pad[:, None, None, :]                     # tformer: True = may attend
    if "causal" in kind:
        torch_kw["attn_mask"] = ~causal_mask(6)
        our_kw["is_causal"] = True
    expected, w_expected = theirs(x, kv, kv, average_attn_weights=False, **torch_kw)
    got = ours(x, None if kv is x else kv, **our_kw)
    got_ref, w = ours(x, None if kv is x else kv, need_weights=True, **our_kw)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_ref, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, w_expected, atol=1e-6, rtol=1e-5)


def copy_layers(ours: Transformer, theirs: nn.Transformer) -> None:
    for mine, ref in zip(ours.encoder.layers, theirs.encoder.layers):
        copy_mha(mine.attn, ref.self_attn)
        mine.ffn.fc1.load_state_dict(ref.linear1.state_dict())
        mine.ffn.fc2.load_state_dict(ref.linear2.state_dict())
        mine.norm1.load_state_dict(ref.norm1.state_dict())
        mine.norm2.load_state_dict(ref.norm2.state_dict())
    for mine, ref in zip(ours.decoder.layers, theirs.decoder.layers):
        copy_mha(mine.self_attn, ref.self_attn)
        copy_mha(mine.cross_attn, ref.multihead_attn)
        mine.ffn.fc1.load_state_dict(ref.linear1.state_dict())
        mine.ffn.fc2.load_state_dict(ref.linear2.state_dict())
        for i in (1, 2, 3):
            getattr(mine, f"norm{i}").load_state_dict(getattr(ref, f"norm{i}").state_dict())
    ours.encoder.final_norm.load_state_dict(theirs.encoder.norm.state_dict())
    ours.decoder.final_norm.load_state_dict(theirs.decoder.norm.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True:UserWarning")   # torch's own, for norm_first
def test_encoder_decoder_equals_torch_transformer(norm_first):
    """Post-LN (the paper) and pre-LN stacks vs torch.nn.Transformer, with source padding."""
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=50, d_model=D, n_heads=H, d_ff=64, n_encoder_layers=2,
                            n_decoder_layers=2, dropout=0.0, norm_first=norm_first, final_norm=True)
    ours = Transformer(cfg).eval()
    theirs = nn.Transformer(D, H, 2, 2, 64, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    copy_layers(ours, theirs)
    src = torch.randint(1, 50, (3, 7))
    src[1, 5:] = 0
    src[2, 2:] = 0
    tgt = torch.randint(1, 50, (3, 5))
    src_e, tgt_e = ours.embed(src, ours.src_embed), ours.embed(tgt, ours.tgt_embed)
    expected = theirs(src_e, tgt_e, tgt_mask=~causal_mask(5), src_key_padding_mask=src == 0,
                      memory_key_padding_mask=src == 0)
    memory, src_mask = ours.encode(src)
    got = ours.decoder(ours.embed(tgt, ours.tgt_embed), memory, src_mask)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def tiny_hf_gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=40, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_from_hf_gpt2_same_logits():
    hf = tiny_hf_gpt2()
    ours = GPT.from_hf_gpt2(hf).eval()
    idx = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, atol=1e-5, rtol=1e-5)
    from_sd = GPT.from_hf_gpt2(hf.state_dict(), n_heads=4).eval()
    with torch.no_grad():
        torch.testing.assert_close(from_sd(idx), hf(idx).logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="n_heads"):
        GPT.from_hf_gpt2(hf.state_dict())


def test_greedy_generate_matches_hf_and_cache():
    hf = tiny_hf_gpt2()
    ours = GPT.from_hf_gpt2(hf)
    idx = torch.randint(0, 97, (2, 5))
    cached = ours.generate(idx, 20, temperature=0.0, use_cache=True)
    uncached = ours.generate(idx, 20, temperature=0.0, use_cache=False)
    expected = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=20, do_sample=False,
                           pad_token_id=0)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, expected)


def test_generate_past_context_slides_window():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=20, context_length=8, n_layers=1, n_heads=2, d_model=16))
    idx = torch.randint(0, 20, (1, 6))
    a = m.generate(idx, 10, temperature=0.0, use_cache=True)
    b = m.generate(idx, 10, temperature=0.0, use_cache=False)
    assert a.shape == (1, 16) and torch.equal(a, b)
    with pytest.raises(ValueError, match="context_length=8"):
        m(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        m(torch.zeros(1, 4))


def test_rope_gpt_cache_matches_full_pass():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=30, context_length=16, n_layers=2, n_heads=4, n_kv_heads=2, d_model=32,
                      positional="rope", activation="swiglu", bias=False)).eval()
    idx = torch.randint(0, 30, (2, 10))
    a = m.generate(idx, 6, temperature=0.0, use_cache=True)
    b = m.generate(idx, 6, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("preset, paper", [("base", 65e6), ("big", 213e6)])
def test_paper_parameter_counts(preset, paper):
    """Table 3 of the paper, with a shared 37,000-token vocabulary: within 3%."""
    cfg = getattr(TransformerConfig, preset)(37000)
    with torch.device("meta"):
        n = Transformer(cfg).num_params()
    assert abs(n - paper) / paper < 0.03, n
