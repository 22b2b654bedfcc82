"""Speculative decoding (chapter 14): a small draft model proposes, the large target model verifies.

Each round the draft model generates k tokens one by one (cheap), then the target model scores all of
them in ONE forward pass (k + 1 positions, as costly as a single step when decoding is memory-bound).
Leviathan et al. (2023) and Chen et al. (2023) give the rule that keeps the output distribution exactly
the target's: with p the target's and q the draft's next-token probabilities, draft token x is

    accepted with probability min(1, p(x) / q(x));
    at the first rejection, the next token is drawn from  norm(max(0, p - q))  and the round ends;
    if all k are accepted, one bonus token is drawn from the target's p at position k + 1.

With greedy decoding (temperature 0) p and q are one-hot, so "accept" means "the draft token is the
target's argmax", and the output is token for token the target's own greedy output.

Both models decode with KV caches; rejected draft tokens are removed from them with
`KVCache.truncate` (rollback), so no position is ever recomputed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..utils.checks import check_rank, check_tokens
from ..cache import make_caches


def speculative_accept(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The accept/reject rule for one round, given the uniform numbers u.

    p (k+1, V): target probabilities at the k draft positions and one more; q (k, V): draft
    probabilities; draft (k,): the draft tokens (each drawn from its row of q); u (k,): uniform [0, 1).
    Token i is accepted iff u[i] * q[i, x_i] < p[i, x_i] (i.e. u < p/q) and every earlier one was.

    Returns (n_accepted: 0-d long tensor, dist (V,)): the distribution of the token that follows the
    accepted prefix: norm(max(0, p[n] - q[n])) after a rejection at n, or p[k] if all were accepted.
    """
    check_rank(p, 2, "speculative_accept(p)", "(k+1, V)")
    check_rank(q, 2, "speculative_accept(q)", "(k, V)")
    k = draft.shape[0]
    if p.shape[0] != k + 1 or q.shape[0] != k or u.shape != (k,) or p.shape[1] != q.shape[1]:
        raise ValueError(f"speculative_accept: expected p (k+1, V), q (k, V), draft (k,), u (k,); got "
                         f"p {tuple(p.shape)}, q {tuple(q.shape)}, draft {tuple(draft.shape)}, u {tuple(u.shape)}")
    rows = torch.arange(k, device=p.device)
    accept = u * q[rows, draft] < p[rows, draft]                       # (k,) u < p/q without dividing
    n = accept.long().cumprod(0).sum()                                 # length of the accepted prefix
    if int(n) == k:
        return n, p[k]
    residual = (p[n] - q[n]).clamp(min=0)                              # a rejection implies p[n] != q[n]
    return n, residual / residual.sum()


@dataclass
class SpeculativeStats:
    drafted: int = 0        # draft tokens proposed
    accepted: int = 0       # of those, accepted by the target
    rounds: int = 0         # target forward passes after the prompt (one per round)
    new_tokens: int = 0     # tokens generated

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0


@torch.no_grad()
def speculative_generate(target, draft, idx: torch.Tensor, max_new_tokens: int, k: int = 4,
                         temperature: float = 0.0, generator: torch.Generator | None = None
                         ) -> tuple[torch.Tensor, SpeculativeStats]:
    """Generate with `target` (a `tformer.models.GPT`) helped by the smaller `draft` GPT.

    idx (1, T) prompt -> (1, T + max_new_tokens) tokens and the round statistics. temperature=0 is
    greedy (identical to `target.generate(idx, n, temperature=0)`); otherwise the tokens are samples of
    the target's distribution at that temperature. One sequence at a time (B = 1): rows of a batch
    would accept different numbers of tokens.
    """
    check_tokens(idx, "idx")
    if idx.shape[0] != 1:
        raise ValueError(f"speculative_generate: one sequence at a time, expected idx of shape (1, T), got {tuple(idx.shape)}")
    if idx.shape[1] < 1 or k < 1 or max_new_tokens < 0:
        raise ValueError(f"speculative_generate: need a non-empty prompt, k >= 1 and max_new_tokens >= 0; "
                         f"got T={idx.shape[1]}, k={k}, max_new_tokens={max_new_tokens}")
    if target.cfg.vocab_size != draft.cfg.vocab_size:
        raise ValueError(f"speculative_generate: target and draft must share a vocabulary, got "
                         f"{target.cfg.vocab_size} and {draft.cfg.vocab_size}")
    total = idx.shape[1] + max_new_tokens
    for name, m in (("target", target), ("draft", draft)):
        if m.cfg.positional == "learned" and total > m.cfg.context_length:
            raise ValueError(f"speculative_generate: {total} tokens exceed the {name}'s context_length={m.cfg.context_length}")
    modes = (target.training, draft.training)
    target.eval()
    draft.eval()

    def probs(logits: torch.Tensor) -> torch.Tensor:                   # (n, V) -> (n, V)
        return F.softmax(logits.double() / temperature, dim=-1) if temperature > 0 else logits

    t_cache, d_cache = make_caches(target.cfg.n_layers, total), make_caches(draft.cfg.n_layers, total)
    if idx.shape[1] > 1:                                               # prefill all but the last prompt token
        target(idx[:, :-1], t_cache)
        draft(idx[:, :-1], d_cache)
    out = idx
    d_pending = idx[:, -1:]                                            # tokens the draft cache has not seen yet
    stats = SpeculativeStats()
    while out.shape[1] < total:
        kk = min(k, total - out.shape[1] - 1)                          # a round yields at most kk + 1 tokens
        base = t_cache[0].length                                       # = out.shape[1] - 1
        # 1. the draft proposes kk tokens, one at a time
        drafts, q_rows, inp = [], [], d_pending
        for _ in range(kk):
            logit = draft(inp, d_cache)[0, -1:]                        # (1, V)
            if temperature > 0:
                q_i = probs(logit)
                tok = torch.multinomial(q_i, 1, generator=generator)   # (1, 1)
            else:
                q_i, tok = logit, logit.argmax(-1, keepdim=True)
            drafts.append(tok)
            q_rows.append(q_i)
            inp = tok
        drafted = torch.cat(drafts, 1) if kk else out.new_empty(1, 0)  # (1, kk)
        # 2. the target scores the last token and all drafts in one pass
        p = probs(target(torch.cat([out[:, -1:], drafted], 1), t_cache)[0])  # (kk + 1, V)
        # 3. accept a prefix, then one token from the target (or the residual)
        if temperature > 0:
            q = torch.cat(q_rows, 0) if kk else p.new_empty(0, p.shape[1])
            u = torch.rand(kk, generator=generator, dtype=p.dtype)
            n, dist = speculative_accept(p, q, drafted[0], u.to(p.device))
            n = int(n)
            nxt = torch.multinomial(dist[None], 1, generator=generator)
        else:
            match = (drafted[0] == p[:kk].argmax(-1)).long()
            n = int(match.cumprod(0).sum())
            nxt = p[n].argmax(-1).view(1, 1)
        out = torch.cat([out, drafted[:, :n], nxt.to(out.dtype)], 1)
        # 4. roll both caches back to the accepted prefix
        t_cache_len = base + 1 + n                                     # last token + accepted drafts
        for c in t_cache:
            c.truncate(t_cache_len)
        if n < kk:
            for c in d_cache:
                c.truncate(t_cache_len)
            d_pending = nxt
        else:                                                          # all accepted: the draft never saw the last draft
            d_pending = torch.cat([drafted[:, -1:] if kk else d_pending, nxt.to(out.dtype)], 1)
        stats.drafted += kk
        stats.accepted += n
        stats.rounds += 1
    stats.new_tokens = max_new_tokens
    target.train(modes[0])
    draft.train(modes[1])
    return out, stats
