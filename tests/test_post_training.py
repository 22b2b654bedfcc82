"""tformer.training.sft, tformer.training.dpo, tformer.inference.rag: prompt-masked labels, the SFT loss on causal_lm_loss, DPO's loss
against its formula in float64, the retriever."""
import math

import pytest
import torch
import torch.nn.functional as F

from tformer.training.dpo import dpo_loss, preference_pairs
from tformer.data.text import IGNORE
from tformer.data.text import offline_text, train_tokenizer
from tformer.models import GPT, GPTConfig
from tformer.inference.rag import TfidfRetriever
from tformer.training.sft import (END, encode_chat, encode_chats, exact_match, instruction_set, prompt_ids, sequence_logprob,
                         sft_loss)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([offline_text()[:50_000]], 400)


def test_sft_loss_is_masked_mean_cross_entropy_in_float64():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 7, (3, 5), generator=g)
    mask = torch.rand(3, 5, generator=g) < 0.5
    mask[0, 0] = True
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(sft_loss(logits, targets, mask), -(logp * mask).sum() / mask.sum())
    full = torch.ones_like(mask)
    torch.testing.assert_close(sft_loss(logits, targets, full), F.cross_entropy(logits.flatten(0, 1), targets.flatten()))


def test_chat_template_masks_the_prompt(tok):
    turns = [("My colour is red.", "OK."), ("What is my colour?", "red")]
    ids, mask = encode_chat(tok, turns)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text == "User: My colour is red.\nAssistant: OK.<|endoftext|>\nUser: What is my colour?\nAssistant: red<|endoftext|>"
    trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert trained == "OK.<|endoftext|>red<|endoftext|>"
    assert tok.decode(prompt_ids(tok, turns)).endswith("What is my colour?\nAssistant: ")


def test_encode_chats_pads_with_ignored_labels(tok):
    chats = instruction_set(8, seed=0)
    ids, labels = encode_chats(tok, chats, pad_id=tok.token_to_id(END))
    assert ids.shape == labels.shape and ids.shape[0] == 8
    keep = labels != IGNORE
    assert torch.equal(ids[keep], labels[keep])
    lengths = [len(encode_chat(tok, c)[0]) for c in chats]
    for row, n in enumerate(lengths):
        assert (labels[row, n:] == IGNORE).all()                   # padding never carries loss
    assert {k for c in instruction_set(8, 0) for k in [len(c)]} == {1, 2}   # single- and multi-turn


def test_exact_match_is_greedy_decoding(tok):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=tok.get_vocab_size(), context_length=64, n_layers=1, n_heads=2, d_model=16)).eval()
    chats = [[("What is 1 + 1?", "2")], [("What is 2 + 2?", "4")]]
    ids, labels = encode_chats(tok, chats, pad_id=0)
    greedy = [gpt.generate(torch.tensor([prompt_ids(tok, c)]), 4, temperature=0)[0].tolist() for c in chats]
    em = exact_match(gpt, ids, labels)
    for row, c in enumerate(chats):
        want = encode_chat(tok, c)[0]
        assert em[row].item() == (greedy[row][:len(want)] == want)
    lp = sequence_logprob(gpt, ids, labels)
    with torch.no_grad():
        logp = torch.log_softmax(gpt(ids[:1]), -1)[0]
    n = len(encode_chat(tok, chats[0])[0])
    ans = [t for t in range(1, n) if labels[0, t] != IGNORE]
    torch.testing.assert_close(lp[0], sum(logp[t - 1, ids[0, t]] for t in ans))


def test_dpo_loss_in_float64():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (torch.randn(6, generator=g, dtype=torch.float64) * 5 for _ in range(4))
    beta = 0.3
    expected = sum(math.log(1 + math.exp(-beta * ((a - c) - (b - d))))
                   for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist())) / 6
    assert dpo_loss(pc, pr, rc, rr, beta).item() == pytest.approx(expected, rel=1e-12)
    assert dpo_loss(pc, pr, pc, pr, beta).item() == pytest.approx(math.log(2))   # policy == reference
    with pytest.raises(ValueError, match=r"four \(B,\) tensors"):
        dpo_loss(pc, pr[:3], rc, rr)


def test_preference_pairs_share_the_prompt():
    for chosen, rejected in preference_pairs(5, seed=0):
        assert chosen[0][0] == rejected[0][0] and chosen[0][1] == f"The answer is {rejected[0][1]}."


def test_tfidf_retriever_finds_the_passage_that_names_the_entity():
    passages = ["Alice lives in Paris.", "Bob lives in Rome.", "The for statement iterates over a sequence."]
    r = TfidfRetriever(passages)
    assert r.search(["Where does Bob live?", "what does a for statement do", "Alice?"], k=1) == [[1], [2], [0]]
    assert len(r.search(["Bob"], k=3)[0]) == 3
