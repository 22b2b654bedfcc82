"""The paper's encoder-decoder against Hugging Face's Marian (Helsinki-NLP's opus-mt models):
`Transformer.from_hf_marian` on random-init `MarianConfig`s gives the same logits (float64, within 1e-5),
greedy decoding through tformer's KV cache gives the tokens of Hugging Face's forward taken argmax step by
step, and beam search on the converted model scores at least greedy's (exactly the best when the beam holds
every hypothesis). The two sinusoidal layouts are one table up to a permutation of the features."""
import itertools
import math

import pytest
import torch

from tformer.inference.decode import beam_search, greedy_decode, length_penalty, special_ids
from tformer.models import Transformer
from tformer.positional import SinusoidalPositionalEncoding, sinusoidal_permutation, sinusoidal_table

transformers = pytest.importorskip("transformers")

PAD, EOS = 0, 1          # set apart from tformer's defaults (pad 0, <s> 1, </s> 2) so a mix-up shows


def hf_marian(d_model=24, heads=3, enc=2, dec=2, act="swish", scale=True, vocab=53, seed=0, **extra):
    """A random-init MarianMTModel, weights drawn wider than HF's init (std 0.02 makes every logit nearly
    the bias), `final_logits_bias` random (it starts at zero: a converter that dropped it would pass)."""
    pad = vocab - 1                                       # as opus-mt: <pad> is the last id, </s> is 0
    cfg = transformers.MarianConfig(
        vocab_size=vocab, d_model=d_model, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model - 8, decoder_ffn_dim=2 * d_model - 8, encoder_layers=enc, decoder_layers=dec,
        max_position_embeddings=48, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
        forced_eos_token_id=0, activation_function=act, scale_embedding=scale, dropout=0.1, **extra)
    model = transformers.MarianMTModel(cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:                 # the sinusoidal table (a frozen parameter)
                continue
            gain = "layer_norm" in name and name.endswith("weight")
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if gain else 0.3 * torch.randn_like(p))
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    return model.eval()


def batch(vocab, pad, seed=1):
    """A padded source batch (lengths 7, 4 and 2, each ending in </s> = 0) and decoder inputs starting at pad."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((3, 7), pad)
    for i, n in enumerate((7, 4, 2)):
        src[i, :n - 1] = torch.randint(1, pad, (n - 1,), generator=g)
        src[i, n - 1] = 0
    tgt = torch.randint(1, pad, (3, 6), generator=g)
    tgt[:, 0] = pad
    return src, tgt


def hf_logits(hf, src, tgt):
    pad = hf.config.pad_token_id
    return hf(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt,
              decoder_attention_mask=torch.ones_like(tgt)).logits


CASES = {   # widths that are not powers of two; 1-3 layers; swish with the scale, relu without
    "d24-h3-swish-scaled": dict(d_model=24, heads=3, enc=1, dec=3, act="swish", scale=True),
    "d40-h5-relu-unscaled": dict(d_model=40, heads=5, enc=3, dec=1, act="relu", scale=False),
    "d24-h3-2+2-swish": dict(d_model=24, heads=3, enc=2, dec=2, act="swish", scale=True, seed=4),
}


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_the_same_logits_as_marian(case):
    hf = hf_marian(**CASES[case])
    ours = Transformer.from_hf_marian(hf)
    c = ours.cfg
    assert (c.positional, c.logits_bias, c.pad_id, c.bos_id, c.eos_id) == ("sinusoidal_concat", True, 52, 52, 0)
    assert c.scale_embeddings == CASES[case]["scale"] and c.activation == {"swish": "silu", "relu": "relu"}[
        CASES[case]["act"]]
    assert ours.head.weight.data_ptr() == ours.src_embed.weight.data_ptr() == ours.tgt_embed.weight.data_ptr()
    assert not ours.training
    src, tgt = batch(53, 52)
    hf, ours = hf.double(), ours.double()
    theirs = hf_logits(hf, src, tgt)
    mine = ours(src, tgt)
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
    assert float(theirs.std()) > 1.0                                   # logits that differ, not all the bias
    # each option matters: without it the logits are far off
    ours.head.bias.zero_()
    assert float((ours(src, tgt) - theirs).abs().max()) > 0.1
    ours.head.bias.copy_(hf.final_logits_bias[0])
    ours.pos_embed.pe = sinusoidal_table(48, c.d_model).double()        # the paper's interleaved layout
    assert float((ours(src, tgt) - theirs).abs().max()) > 0.1
    # the loss with the bias folded into the fused head equals the cross-entropy of the logits
    ours.pos_embed.pe = SinusoidalPositionalEncoding(c.d_model, 48, "concat").pe.double()
    targets = torch.cat([tgt[:, 1:], torch.zeros(3, 1, dtype=torch.long)], 1)
    loss = ours(src, tgt, targets, label_smoothing=0.1)
    ref = torch.nn.functional.cross_entropy(theirs.flatten(0, 1), targets.flatten(), ignore_index=52,
                                            label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-9)


def test_separate_vocabularies_and_what_the_config_cannot_express():
    hf = hf_marian(share_encoder_decoder_embeddings=False, seed=2)
    ours = Transformer.from_hf_marian(hf)
    assert not ours.cfg.share_embeddings and ours.head.weight.data_ptr() != ours.src_embed.weight.data_ptr()
    src, tgt = batch(53, 52)
    with torch.no_grad():
        torch.testing.assert_close(ours.double()(src, tgt), hf_logits(hf.double(), src, tgt), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="decoder_ffn_dim"):
        cfg = hf_marian(enc=1, dec=1).config
        cfg.decoder_ffn_dim = 16
        Transformer.from_hf_marian(transformers.MarianMTModel(cfg))
    with pytest.raises(ValueError, match="activation_function='tanh'"):
        Transformer.from_hf_marian(hf_marian(enc=1, dec=1, act="tanh"))


def hf_greedy(hf, row, limit):
    """Hugging Face's forward, argmax step by step: the start token is pad, pad is never chosen, and at
    tformer's length limit the sentence ends (</s>). Not `generate`: its generation config adds rules."""
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id
    ys = torch.tensor([[hf.config.decoder_start_token_id]])
    for t in range(limit):
        logits = hf(input_ids=row[None], decoder_input_ids=ys).logits[0, -1]
        logits[pad] = -math.inf
        nxt = eos if t + 1 >= limit else int(logits.argmax())
        ys = torch.cat([ys, torch.tensor([[nxt]])], 1)
        if nxt == eos:
            break
    return ys[0, 1:].tolist()


def strip(row, eos=0):
    row = list(row)
    return row[:row.index(eos) + 1] if eos in row else row


@pytest.mark.parametrize("case", ["d24-h3-swish-scaled", "d40-h5-relu-unscaled"])
@torch.no_grad()
def test_greedy_tokens_equal_marians_argmax_and_beam_scores_at_least_greedys(case):
    hf = hf_marian(**CASES[case]).double()
    ours = Transformer.from_hf_marian(hf).double()
    src, _ = batch(53, 52, seed=5)
    max_extra = 9
    assert special_ids(ours) == (52, 52, 0)
    got = greedy_decode(ours, src, max_extra=max_extra)                 # the ids come from the model's config
    lengths = (src != 52).sum(1)
    want = [hf_greedy(hf, src[i, :lengths[i]], int(lengths[i]) + max_extra) for i in range(3)]
    assert [strip(r) for r in got.tolist()] == want
    assert len({tuple(w) for w in want}) == 3 and max(len(w) for w in want) > 10    # three different outputs
    # the KV-cached steps that chose them give Hugging Face's full-forward logits (a random model repeats
    # itself, so equal tokens alone would not see a cache that drifted)
    tgt_in = torch.cat([torch.full((3, 1), 52), got[:, :-1]], 1)
    memory, src_mask = ours.encode(src)
    cache = ours.new_cache(tgt_in.shape[1])
    steps = torch.cat([ours.decode(tgt_in[:, t:t + 1], memory, src_mask, cache) for t in range(tgt_in.shape[1])], 1)
    torch.testing.assert_close(steps, hf_logits(hf, src, tgt_in), atol=1e-5, rtol=0)

    def logprob(out):                                                   # summed log P(y|x) by HF's full forward
        total = 0.0
        for i, row in enumerate(out.tolist()):
            seq = strip(row)
            ys = torch.tensor([[52] + seq])
            lp = torch.log_softmax(hf(input_ids=src[i:i + 1, :lengths[i]], decoder_input_ids=ys[:, :-1]).logits[0], -1)
            total += float(lp.gather(1, torch.tensor(seq)[:, None]).sum())
        return total
    beam = beam_search(ours, src, beam=4, alpha=0.0, max_extra=max_extra)
    assert logprob(beam) >= logprob(got) - 1e-9


@torch.no_grad()
def test_beam_search_on_the_converted_model_is_exact_when_the_beam_holds_everything():
    """V = 6 (</s>=0, four words, <pad>=5 the start token) and at most 3 output tokens: 21 hypotheses, all in a
    beam of 32; beam search returns the best by log P / lp, found by enumeration with HF's full forward."""
    hf = hf_marian(vocab=6, enc=1, dec=2, seed=3).double()
    ours = Transformer.from_hf_marian(hf).double()
    src = torch.tensor([[3, 4, 0], [1, 1, 0]])
    alpha = 0.6
    out, score = beam_search(ours, src, beam=32, alpha=alpha, max_extra=0, return_scores=True)
    for b in range(2):
        best, best_seq = -math.inf, None
        for n in range(3):
            for body in itertools.product([1, 2, 3, 4], repeat=n):
                seq = list(body) + [0]
                ys = torch.tensor([[5] + seq])
                lp = torch.log_softmax(hf(input_ids=src[b:b + 1], decoder_input_ids=ys[:, :-1]).logits[0], -1)
                s = float(lp.gather(1, torch.tensor(seq)[:, None]).sum()) / length_penalty(len(seq), alpha)
                if s > best:
                    best, best_seq = s, seq
        assert strip(out[b].tolist()) == best_seq
        assert float(score[b]) == pytest.approx(best, abs=1e-6)


# -- the two sinusoidal layouts --------------------------------------------------------------------------
@pytest.mark.parametrize("d", [24, 40])
def test_the_two_sinusoidal_layouts_are_one_table_permuted(d):
    perm = sinusoidal_permutation(d)
    assert sorted(perm.tolist()) == list(range(d)) and perm.tolist() != list(range(d))   # a real permutation
    paper = sinusoidal_table(60, d)                                   # sin, cos, sin, cos, ...
    pos = torch.arange(60, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    concat = torch.cat([torch.sin(pos * w), torch.cos(pos * w)], 1)   # tensor2tensor: all sin, then all cos
    torch.testing.assert_close(paper[:, perm].double(), concat, atol=1e-6, rtol=0)
    assert not torch.allclose(paper.double(), concat, atol=1e-2)       # the layouts differ; the numbers do not
    torch.testing.assert_close(paper[:, perm].sum(), paper.sum())
    # Hugging Face's Marian builds exactly this table (it is not saved with the weights)
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
    theirs = MarianSinusoidalPositionalEmbedding(60, d).create_weight()
    torch.testing.assert_close(SinusoidalPositionalEncoding(d, 60, "concat").pe, theirs, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="layout"):
        SinusoidalPositionalEncoding(d, 60, "halves")
