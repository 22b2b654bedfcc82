"""Sampling filters of tformer.sampling against transformers' logits processors, and distinct-n."""
import pytest
import torch
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from tformer.sampling import apply_repetition_penalty, sample_next, top_k_filter, top_p_filter
from tformer.training.metrics import distinct_n
from tformer.models import GPT, GPTConfig


def _logits(seed, b=4, v=50):
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3


@pytest.mark.parametrize("p", [0.05, 0.3, 0.7, 0.9, 0.99, 1.0])
def test_top_p_matches_transformers(p):
    logits = _logits(0)
    ids = torch.zeros(4, 1, dtype=torch.long)
    expected = TopPLogitsWarper(top_p=p, filter_value=float("-inf"))(ids, logits.clone())
    torch.testing.assert_close(top_p_filter(logits, p), expected)


def test_top_p_keeps_the_smallest_set_reaching_p_and_always_the_top_token():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    probs = logits.softmax(-1)[0]                                  # 0.644, 0.237, 0.087, 0.032
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()
    assert kept(0.5) == [True, False, False, False]                # the top token alone has 0.64 >= 0.5
    assert kept(float(probs[:2].sum()) + 1e-4) == [True, True, True, False]
    assert kept(0.01) == [True, False, False, False]
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        top_p_filter(logits, 0.0)


@pytest.mark.parametrize("k", [1, 5, 49, 50, 80])
def test_top_k_matches_transformers(k):
    logits = _logits(1)
    expected = TopKLogitsWarper(top_k=k, filter_value=float("-inf"))(torch.zeros(4, 1, dtype=torch.long), logits.clone())
    torch.testing.assert_close(top_k_filter(logits, k), expected)


@pytest.mark.parametrize("penalty", [0.8, 1.0, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(penalty):
    logits = _logits(2)
    idx = torch.randint(0, 50, (4, 7), generator=torch.Generator().manual_seed(3))   # repeats included
    expected = RepetitionPenaltyLogitsProcessor(penalty)(idx, logits.clone())
    torch.testing.assert_close(apply_repetition_penalty(logits, idx, penalty), expected)


def test_sample_next_greedy_filters_and_penalty():
    logits = _logits(4, b=3)
    assert torch.equal(sample_next(logits, 0.0), logits.argmax(-1, keepdim=True))
    g = torch.Generator().manual_seed(0)
    draws = torch.cat([sample_next(logits, 1.0, top_k=2, top_p=0.999, generator=g) for _ in range(200)], 1)
    top2 = logits.topk(2).indices
    assert all(set(draws[b].tolist()) <= set(top2[b].tolist()) for b in range(3))
    top = logits.argmax(-1, keepdim=True)
    big = float(logits.abs().max()) * 10                            # a penalty that demotes every seen top token
    assert not torch.equal(sample_next(logits, 0.0, repetition_penalty=big, idx=top), top)
    with pytest.raises(ValueError, match="needs the tokens so far"):
        sample_next(logits, 0.0, repetition_penalty=1.2)


def test_generate_accepts_the_new_filters():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=40, context_length=16, n_layers=1, n_heads=2, d_model=16)).eval()
    idx = torch.randint(0, 40, (2, 3))
    greedy = gpt.generate(idx, 6, temperature=0)
    assert torch.equal(gpt.generate(idx, 6, temperature=1.0, top_p=1e-6), greedy)   # top-p tiny = greedy
    out = gpt.generate(idx, 6, temperature=0, repetition_penalty=1e6)
    assert all(len(set(row[3:].tolist())) == 6 for row in out)      # a huge penalty never repeats a new token


def test_distinct_n():
    assert distinct_n([[1, 2, 3, 4]], 2) == 1.0
    assert distinct_n([[1, 1, 1, 1, 1]], 1) == 0.2
    assert distinct_n([[1, 2, 1, 2, 1]], 2) == 2 / 4
    assert distinct_n([[1, 2], [1, 2]], 2) == 0.5                  # counted over all sequences together
    with pytest.raises(ValueError, match="at least n=3"):
        distinct_n([[1, 2]], 3)
