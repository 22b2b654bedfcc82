"""BERT (chapter 11) against Hugging Face transformers' BERT built from a small random config; the masked-LM
objective; a few-step pretrain + fine-tune smoke test."""
import pytest
import torch

from tformer.data.text import IGNORE
from tformer.training.losses import causal_lm_loss, masked_lm_loss
from tformer.data.text import apply_mlm_masking, mask_tokens
from tformer.models import BERT, BertClassifier, BertConfig

transformers = pytest.importorskip("transformers")


def hf_config(**kw):
    base = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=40, type_vocab_size=2, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, pad_token_id=0)
    base.update(kw)
    return transformers.BertConfig(**base)


def inputs(seed=0, b=3, t=11):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, 97, (b, t), generator=g)
    types = torch.randint(0, 2, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 7:] = 0                                          # one padded row
    idx[1, 7:] = 0
    return idx, types, mask


def test_matches_hf_bert_model():
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_config()).eval()
    ours = BERT.from_hf_bert(hf).eval()
    idx, types, mask = inputs()
    with torch.no_grad():
        ref = hf(input_ids=idx, token_type_ids=types, attention_mask=mask)
        h = ours(idx, types, mask)
    real = mask.bool()                                       # padded positions' outputs are not defined alike
    torch.testing.assert_close(h[real], ref.last_hidden_state[real], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ours.pool(h), ref.pooler_output, atol=2e-5, rtol=1e-4)


def test_matches_hf_masked_lm_and_default_padding_mask():
    torch.manual_seed(1)
    hf = transformers.BertForMaskedLM(hf_config(hidden_act="gelu")).eval()
    ours = BERT.from_hf_bert(hf).eval()
    idx, types, mask = inputs(1)
    with torch.no_grad():
        ref = hf(input_ids=idx, token_type_ids=types, attention_mask=mask).logits
        got = ours.mlm_logits(ours(idx, types))              # no mask given: derived from pad_id=0
    real = mask.bool()
    torch.testing.assert_close(got[real], ref[real], atol=5e-5, rtol=1e-4)


def test_matches_hf_sequence_classification():
    torch.manual_seed(2)
    hf = transformers.BertForSequenceClassification(hf_config(num_labels=3)).eval()
    clf = BertClassifier.from_hf_bert(hf).eval()
    idx, types, mask = inputs(2)
    with torch.no_grad():
        torch.testing.assert_close(clf(idx, types, mask), hf(input_ids=idx, token_type_ids=types,
                                                             attention_mask=mask).logits, atol=2e-5, rtol=1e-4)


def test_bidirectional_future_tokens_change_past_outputs():
    torch.manual_seed(0)
    m = BERT(BertConfig(vocab_size=50, context_length=16, d_model=32, n_layers=1, n_heads=4, d_ff=64, dropout=0.0)).eval()
    a = torch.randint(1, 50, (1, 8))
    b = a.clone()
    b[0, -1] = (a[0, -1] % 49) + 1                           # change only the last token
    with torch.no_grad():
        assert not torch.allclose(m(a)[0, 0], m(b)[0, 0])    # the first position sees it (no causal mask)


def test_bad_input_errors():
    m = BERT(BertConfig(vocab_size=50, context_length=8, d_model=16, n_layers=1, n_heads=2, d_ff=32))
    with pytest.raises(ValueError, match="context_length"):
        m(torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        m(torch.ones(1, 4))
    with pytest.raises(ValueError, match="attention_mask"):
        m(torch.ones(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 5))


def test_mlm_masking_rates_and_rule():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (64, 256), generator=g)
    ids[:, 0] = 1                                            # a special token at the start of each row
    inp, labels = mask_tokens(ids, vocab_size=1000, mask_id=4, special_ids=(1,), generator=g)
    chosen = labels != IGNORE
    assert not chosen[:, 0].any()                            # specials never chosen
    assert abs(chosen.float().mean().item() - 0.15) < 0.01
    torch.testing.assert_close(labels[chosen], ids[chosen])
    n = chosen.sum().item()
    frac_mask = (inp[chosen] == 4).sum().item() / n
    frac_same = (inp[chosen] == ids[chosen]).sum().item() / n
    assert abs(frac_mask - 0.8) < 0.02 and abs(frac_same - 0.1) < 0.02
    assert torch.equal(inp[~chosen], ids[~chosen])           # unchosen positions untouched


def test_apply_mlm_masking_exact():
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    u_sel = torch.tensor([[0.0, 0.1, 0.2, 0.05, 0.01]])      # positions 0, 1, 3, 4 chosen (< 0.15)
    u_act = torch.tensor([[0.5, 0.85, 0.0, 0.95, 0.1]])      # mask, random, -, keep, mask
    rnd = torch.tensor([[7, 8, 9, 6, 5]])
    special = torch.tensor([[False, False, False, False, True]])
    inp, lab = apply_mlm_masking(ids, u_sel, u_act, rnd, mask_id=3, special=special)
    assert inp.tolist() == [[3, 8, 12, 13, 14]]
    assert lab.tolist() == [[10, 11, IGNORE, 13, IGNORE]]


def test_causal_lm_loss_matches_hf_gpt2_loss():
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=60, n_positions=16, n_embd=32, n_layer=1,
                                                               n_head=2)).eval()
    idx = torch.randint(0, 60, (2, 9))
    with torch.no_grad():
        out = hf(input_ids=idx, labels=idx)
        torch.testing.assert_close(causal_lm_loss(out.logits, idx), out.loss)


def test_pretrain_then_finetune_smoke():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, context_length=12, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0)
    bert = BERT(cfg)
    g = torch.Generator().manual_seed(0)
    base = torch.arange(5, 17).repeat(16, 1)                 # a learnable pattern: consecutive ids
    base = (base + torch.randint(0, 20, (16, 1), generator=g)) % 35 + 5
    opt = torch.optim.AdamW(bert.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        inp, lab = mask_tokens(base, cfg.vocab_size, mask_id=4, p=0.3, generator=g)
        loss = masked_lm_loss(bert.mlm_logits(bert(inp)), lab)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5
    clf = BertClassifier(bert, 2)
    y = (base[:, 0] > 20).long()
    opt = torch.optim.AdamW(clf.parameters(), lr=1e-3)
    first = None
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(clf(base), y)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first
