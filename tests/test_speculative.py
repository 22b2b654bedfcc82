"""Speculative decoding: greedy output equals the target's; sampling keeps the target's distribution."""
import itertools

import pytest
import torch
from scipy.stats import chisquare

from tformer.models import GPT, GPTConfig
from tformer.inference.speculative import speculative_accept, speculative_generate


def _models(vocab=20, seed=0, n_layers=3):
    """A random target with large weights (so its greedy path is not one repeated token) and a 1-layer
    draft sharing its embeddings (so it agrees with the target part of the time)."""
    torch.manual_seed(seed)
    target = GPT(GPTConfig(vocab_size=vocab, context_length=64, n_layers=n_layers, n_heads=4, d_model=32)).double().eval()
    draft = GPT(GPTConfig(vocab_size=vocab, context_length=64, n_layers=1, n_heads=2, n_kv_heads=1, d_model=32)).double().eval()
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(4.0)
        draft.tok_embed.weight.copy_(target.tok_embed.weight)
        draft.pos_embed.weight.copy_(target.pos_embed.weight)
    return target, draft


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_output_identical_to_target_greedy(k):
    target, draft = _models()
    idx = torch.randint(0, 20, (1, 4), generator=torch.Generator().manual_seed(k))
    out, stats = speculative_generate(target, draft, idx, 20, k=k)
    assert torch.equal(out, target.generate(idx, 20, temperature=0))
    assert 0 < stats.accepted < stats.drafted                    # some drafts were rejected and rolled back
    assert stats.rounds < 20                                     # fewer target passes than tokens


def test_perfect_draft_accepts_everything_and_one_token_prompt():
    target, _ = _models()
    idx = torch.tensor([[7]])
    out, stats = speculative_generate(target, target, idx, 12, k=4)
    assert torch.equal(out, target.generate(idx, 12, temperature=0))
    assert stats.acceptance_rate == 1.0 and stats.rounds == 3    # rounds of 5 tokens (4 drafts + 1): 5 + 5 + 2


def test_accept_rule_cases():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]], dtype=torch.float64)
    q = torch.tensor([[0.25, 0.25, 0.5], [0.6, 0.2, 0.2]], dtype=torch.float64)
    draft = torch.tensor([0, 0])
    n, dist = speculative_accept(p, q, draft, torch.tensor([0.9, 0.5], dtype=torch.float64))
    assert int(n) == 1                                            # step 1: p/q = 1/3 < 0.5, rejected
    torch.testing.assert_close(dist, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))  # norm(max(0, p - q))
    n, dist = speculative_accept(p, q, draft, torch.tensor([0.9, 0.2], dtype=torch.float64))
    assert int(n) == 2                                            # all accepted: the bonus comes from p[k]
    torch.testing.assert_close(dist, p[2])
    n, dist = speculative_accept(p, q, torch.tensor([2, 0]), torch.tensor([0.0, 0.0], dtype=torch.float64))
    assert int(n) == 0                                            # p(x) = 0: always rejected
    torch.testing.assert_close(dist, torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"p \(k\+1, V\)"):
        speculative_accept(p[:2], q, draft, torch.zeros(2))


def test_accept_rule_preserves_the_target_distribution():
    """Draw x ~ q, apply the rule with k = 1, and record the first emitted token: it must follow p."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    n_trials, counts = 4000, torch.zeros(4)
    xs = torch.multinomial(q[0], n_trials, replacement=True, generator=g)
    us = torch.rand(n_trials, generator=g, dtype=torch.float64)
    for x, u in zip(xs, us):
        n, dist = speculative_accept(p, q, x.view(1), u.view(1))
        first = x if int(n) == 1 else torch.multinomial(dist, 1, generator=g)[0]
        counts[first] += 1
    assert chisquare(counts.numpy(), (p[0] * n_trials).numpy()).pvalue > 1e-3
    assert chisquare(counts.numpy(), (q[0] * n_trials).numpy()).pvalue < 1e-6   # the test can tell q from p


def test_sampling_output_follows_the_target_distribution():
    """Exact joint distribution of 2 new tokens under the target vs speculative samples (V = 4)."""
    target, draft = _models(vocab=4, seed=1, n_layers=1)
    idx = torch.tensor([[1, 2]])
    pairs = list(itertools.product(range(4), repeat=2))

    def joint(model):
        with torch.no_grad():
            p1 = torch.softmax(model(idx)[0, -1], -1)
            return torch.tensor([p1[a] * torch.softmax(model(torch.cat([idx, torch.tensor([[a]])], 1))[0, -1], -1)[b]
                                 for a, b in pairs])
    exact, draft_joint = joint(target), joint(draft)
    assert (exact - draft_joint).abs().sum() > 0.5                # the draft alone would be visibly wrong
    g = torch.Generator().manual_seed(0)
    n, counts, accepted, drafted = 300, torch.zeros(16), 0, 0
    for _ in range(n):
        out, st = speculative_generate(target, draft, idx, 2, k=2, temperature=1.0, generator=g)
        counts[pairs.index(tuple(out[0, 2:].tolist()))] += 1
        accepted, drafted = accepted + st.accepted, drafted + st.drafted
    keep = exact * n >= 5                                         # chi-square needs expected counts >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([exact[keep], exact[~keep].sum().view(1)]) * n
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3
    exp_draft = torch.cat([draft_joint[keep], draft_joint[~keep].sum().view(1)]) * n
    assert chisquare(obs.numpy(), exp_draft.numpy()).pvalue < 1e-4   # the test can tell the draft's distribution
    assert 0 < accepted < drafted                                 # both branches of the rule were exercised


def test_bad_input():
    target, draft = _models()
    with pytest.raises(ValueError, match=r"\(1, T\)"):
        speculative_generate(target, draft, torch.zeros(2, 3, dtype=torch.long), 4)
    other = GPT(GPTConfig(vocab_size=21, context_length=64, n_layers=1, n_heads=2, d_model=16))
    with pytest.raises(ValueError, match="share a vocabulary"):
        speculative_generate(target, other, torch.zeros(1, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="context_length=64"):
        speculative_generate(target, draft, torch.zeros(1, 60, dtype=torch.long), 10)
