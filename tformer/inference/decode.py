"""Decoding for the encoder-decoder Transformer (chapter 10): greedy and beam search, batched, KV-cached.

The encoder runs once; each step feeds only the newest target token to the decoder, whose layers keep
their keys and values in a `KVCache` (`Transformer.new_cache`). Every sentence of a batch, and in
beam search every one of its `beam` hypotheses, advances in the same tensor operations.

The paper's settings: beam 4, length penalty alpha = 0.6 (Wu et al. 2016,
lp(y) = ((5 + |y|) / 6)^alpha, a hypothesis scores log P(y|x) / lp(y)), and at most |x| + 50 tokens.

    out = beam_search(model, src, beam=4, alpha=0.6)      # (B, L) ids, ending in </s>, then <pad>
    translate(model, bpe, ["Ein Hund läuft."], beam=4)    # -> ["A dog is running."]

Sampling from a decoder-only LM (chapter 11): `sample_next` turns the last position's logits into the
next token: repetition penalty, then temperature, then top-k and top-p (nucleus) filtering, then a draw
(temperature 0 is greedy). Each filter is its own function, returning logits with -inf where a token
may not be drawn:

    top_k_filter(logits, 50)           # keep the 50 most likely tokens
    top_p_filter(logits, 0.9)          # keep the smallest set of most likely tokens with mass >= 0.9
    apply_repetition_penalty(logits, idx, 1.3)   # make tokens already in idx less likely (CTRL)
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..utils.checks import check_tokens

NEG_INF = float("-inf")


def length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """GNMT length penalty ((5 + length) / 6)^alpha; alpha = 0 scores by log-probability alone."""
    return ((5.0 + length) / 6.0) ** alpha


def _limits(model, src: torch.Tensor, max_extra: int, pad_id: int) -> torch.Tensor:
    """Per-sentence output limit: source length + max_extra, within the model's positional table."""
    src_len = (src != pad_id).sum(1)
    return (src_len + max_extra).clamp(min=1, max=model.cfg.context_length - 1)


def _step_logprobs(model, tokens: torch.Tensor, memory, src_mask, cache, pad_id: int, bos_id: int):
    """Log-probabilities of the next token (N, V), never <pad> or <s>."""
    logits = model.decode(tokens, memory, src_mask, cache)[:, -1].float()     # (N, V)
    lprobs = F.log_softmax(logits, dim=-1)
    lprobs[:, pad_id] = NEG_INF
    lprobs[:, bos_id] = NEG_INF
    return lprobs


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, *, max_extra: int = 50, pad_id: int = 0, bos_id: int = 1,
                  eos_id: int = 2) -> torch.Tensor:
    """Pick the most likely token at every step. src (B, S) -> (B, L): ids, </s>, then <pad>."""
    check_tokens(src, "src")
    model.eval()
    b = src.shape[0]
    memory, src_mask = model.encode(src)
    limit = _limits(model, src, max_extra, pad_id)                             # (B,)
    t_max = int(limit.max())
    cache = model.new_cache(t_max + 1)
    out = torch.full((b, t_max + 1), pad_id, dtype=torch.long, device=src.device)
    out[:, 0] = bos_id
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    t = 0
    for t in range(t_max):
        nxt = _step_logprobs(model, out[:, t:t + 1], memory, src_mask, cache, pad_id, bos_id).argmax(-1)
        nxt = torch.where(t + 1 >= limit, torch.full_like(nxt, eos_id), nxt)   # out of room: end here
        nxt = nxt.masked_fill(done, pad_id)
        out[:, t + 1] = nxt
        done |= nxt == eos_id
        if bool(done.all()):
            break
    return out[:, 1:t + 2]


@torch.no_grad()
def beam_search(model, src: torch.Tensor, *, beam: int = 4, alpha: float = 0.6, max_extra: int = 50,
                pad_id: int = 0, bos_id: int = 1, eos_id: int = 2, return_scores: bool = False):
    """Batched beam search with length penalty. src (B, S) -> (B, L): ids, </s>, then <pad>.

    Each sentence keeps `beam` live hypotheses (ranked by log-probability) and the `beam` best
    finished ones (ranked by log-probability / lp(length)). A sentence stops when no live hypothesis
    can still beat its worst finished one (log-probabilities only fall and lp is bounded by the
    length limit), or at its length limit. return_scores: also return the (B,) normalised scores.
    """
    check_tokens(src, "src")
    if beam < 1:
        raise ValueError(f"beam_search: beam must be >= 1, got {beam}")
    model.eval()
    b, k, dev = src.shape[0], beam, src.device
    memory, src_mask = model.encode(src)
    memory, src_mask = memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)   # (B*K, S, d)
    limit = _limits(model, src, max_extra, pad_id)                             # (B,)
    t_max = int(limit.max())
    cache = model.new_cache(t_max + 1)
    tokens = torch.full((b * k, t_max + 1), pad_id, dtype=torch.long, device=dev)
    tokens[:, 0] = bos_id
    scores = torch.full((b, k), NEG_INF, device=dev)                           # live: sum of log-probs
    scores[:, 0] = 0.0                                                         # one live hypothesis at first
    fin_scores = torch.full((b, k), NEG_INF, device=dev)                       # finished: normalised
    fin_tokens = torch.full((b, k, t_max + 1), pad_id, dtype=torch.long, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    base = torch.arange(b, device=dev).unsqueeze(1) * k                        # (B, 1) first row of each sentence
    lp_limit = length_penalty(limit.float(), alpha)                            # (B,)
    for t in range(t_max):
        lprobs = _step_logprobs(model, tokens[:, t:t + 1], memory, src_mask, cache, pad_id, bos_id)  # (B*K, V)
        v = lprobs.shape[-1]
        at_limit = (t + 1 >= limit).repeat_interleave(k)                       # (B*K,): only </s> allowed
        forced = torch.full_like(lprobs, NEG_INF)                              # at the limit: </s> only, with
        forced[:, eos_id] = lprobs[:, eos_id]                                  # its real log-probability
        lprobs = torch.where(at_limit[:, None], forced, lprobs)
        cand = (scores.view(b * k, 1) + lprobs).view(b, k * v)                 # (B, K*V)
        top_s, top_i = cand.topk(min(2 * k, k * v), dim=1)                     # (B, 2K): >= K are not </s>
        beam_i, tok_i = top_i // v, top_i % v
        is_eos = tok_i == eos_id
        # finished: merge this step's </s> candidates into each sentence's K best
        eos_norm = (top_s / length_penalty(float(t + 1), alpha)).masked_fill(~is_eos | done[:, None], NEG_INF)
        cand_tok = tokens.view(b, k, -1).gather(1, beam_i.unsqueeze(-1).expand(-1, -1, t_max + 1)).clone()
        cand_tok[:, :, t + 1] = eos_id
        fin_scores, sel = torch.cat([fin_scores, eos_norm], 1).topk(k, dim=1)
        fin_tokens = torch.cat([fin_tokens, cand_tok], 1).gather(1, sel.unsqueeze(-1).expand(-1, -1, t_max + 1))
        # live: the K best candidates that did not end
        scores, j = top_s.masked_fill(is_eos, NEG_INF).topk(k, dim=1)          # (B, K)
        rows = (base + beam_i.gather(1, j)).view(-1)                           # (B*K,) parent rows
        tokens = tokens.index_select(0, rows)
        tokens[:, t + 1] = tok_i.gather(1, j).view(-1)
        for self_cache, _ in cache:                                            # cross caches: same per sentence
            self_cache.reorder(rows)
        worst_fin = fin_scores[:, -1]
        done |= (worst_fin > NEG_INF) & (scores[:, 0] / lp_limit <= worst_fin)
        done |= t + 1 >= limit
        if bool(done.all()):
            break
    best = fin_scores.argmax(1)                                                # (B,)
    out = fin_tokens[torch.arange(b, device=dev), best, 1:]
    length = int((out != pad_id).sum(1).max())
    out = out[:, :max(length, 1)]
    return (out, fin_scores.gather(1, best[:, None]).squeeze(1)) if return_scores else out


@torch.no_grad()
def translate(model, bpe, lines: Sequence[str], *, beam: int = 4, alpha: float = 0.6, max_extra: int = 50,
              max_tokens: int = 4000, device: torch.device | str | None = None, progress: bool = False) -> list[str]:
    """Translate sentences: BPE-encode, batch by length (about `max_tokens` source tokens a batch),
    decode (beam 1 = greedy), BPE-decode, and return them in the input order."""
    from tqdm import tqdm

    device = torch.device(device) if device is not None else next(model.parameters()).device
    ids = bpe.encode(list(lines))
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    batches, cur, width = [], [], 0
    for i in order:                                   # group sentences of similar length
        width_new = max(width, len(ids[i]) + 1)
        if cur and width_new * (len(cur) + 1) * max(beam, 1) > max_tokens * 4:
            batches.append(cur)
            cur, width_new = [], len(ids[i]) + 1
        cur.append(i)
        width = width_new
    if cur:
        batches.append(cur)
    for rows in tqdm(batches, desc="translate", disable=not progress):
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids[i][: model.cfg.context_length - 2] + [bpe.eos_id])
                                               for i in rows], batch_first=True, padding_value=bpe.pad_id)
        kw = dict(max_extra=max_extra, pad_id=bpe.pad_id, bos_id=bpe.bos_id, eos_id=bpe.eos_id)
        hyp = greedy_decode(model, src.to(device), **kw) if beam <= 1 else \
            beam_search(model, src.to(device), beam=beam, alpha=alpha, **kw)
        for i, text in zip(rows, bpe.decode(hyp.tolist())):
            out[i] = text
    return out


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits (..., V) with -inf everywhere but the k largest (ties with the k-th largest are kept)."""
    if k < 1:
        raise ValueError(f"top_k_filter: k must be >= 1, got {k}")
    kth = torch.topk(logits, min(k, logits.shape[-1])).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2020). logits (..., V) -> logits with -inf outside the smallest
    set of most likely tokens whose probability sums to >= p; the most likely token is always kept."""
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p_filter: p must be in (0, 1], got {p}")
    if p == 1.0:                                                    # every token (rounding cannot drop one)
        return logits.clone()
    probs = F.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    probs, order = probs.sort(dim=-1, descending=True)
    mass_before = probs.cumsum(-1) - probs                          # mass of the tokens ranked above
    drop_sorted = mass_before >= p                                  # the set already reached p without it
    drop = drop_sorted.scatter(-1, order, drop_sorted)              # back to vocabulary order
    return logits.masked_fill(drop, NEG_INF)


def apply_repetition_penalty(logits: torch.Tensor, idx: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty (Keskar et al. 2019; `transformers`' RepetitionPenaltyLogitsProcessor): for every
    token already in idx (B, T), divide a positive logit by `penalty`, multiply a negative one. logits (B, V)."""
    if penalty <= 0:
        raise ValueError(f"apply_repetition_penalty: penalty must be > 0, got {penalty}")
    seen = logits.gather(-1, idx)                                   # (B, T) logits of the tokens seen
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(-1, idx, seen)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None, *, top_p: float | None = None,
                repetition_penalty: float = 1.0, idx: torch.Tensor | None = None) -> torch.Tensor:
    """logits (B, V) -> next token ids (B, 1). temperature=0: argmax (greedy). `repetition_penalty` != 1
    needs the tokens so far, idx (B, T)."""
    if repetition_penalty != 1.0:
        if idx is None:
            raise ValueError("sample_next: a repetition penalty needs the tokens so far (idx=)")
        logits = apply_repetition_penalty(logits, idx, repetition_penalty)
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


__all__ = ["greedy_decode", "beam_search", "length_penalty", "translate", "top_k_filter", "top_p_filter",
           "apply_repetition_penalty", "sample_next"]
