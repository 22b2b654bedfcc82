"""Decoding for the encoder-decoder Transformer (chapter 10): greedy and beam search, batched, KV-cached.

The encoder runs once; each step feeds only the newest target token to the decoder, whose layers keep
their keys and values in a `KVCache` (`Transformer.new_cache`). Every sentence of a batch, and in
beam search every one of its `beam` hypotheses, advances in the same tensor operations.

The paper's settings: beam 4, length penalty alpha = 0.6 (Wu et al. 2016,
lp(y) = ((5 + |y|) / 6)^alpha, a hypothesis scores log P(y|x) / lp(y)), and at most |x| + 50 tokens.

    out = beam_search(model, src, beam=4, alpha=0.6)      # (B, L) ids, ending in </s>, then <pad>
    translate(model, bpe, ["Ein Hund läuft."], beam=4)    # -> ["A dog is running."]

Sampling from a decoder-only LM (chapter 11) is `tformer.sampling`.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..sampling import NEG_INF
from ..utils.checks import check_tokens


def length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """GNMT length penalty ((5 + length) / 6)^alpha; alpha = 0 scores by log-probability alone."""
    return ((5.0 + length) / 6.0) ** alpha


def special_ids(model, pad_id: int | None = None, bos_id: int | None = None,
                eos_id: int | None = None) -> tuple[int, int, int]:
    """(pad, start, end) ids: the ones given, else the model's config (`TransformerConfig.pad_id`, `bos_id`,
    `eos_id`; a Marian model starts with its pad id), else 0, 1, 2."""
    cfg = getattr(model, "cfg", None)
    return tuple(int(given if given is not None else getattr(cfg, name, default))
                 for given, name, default in ((pad_id, "pad_id", 0), (bos_id, "bos_id", 1), (eos_id, "eos_id", 2)))


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
def greedy_decode(model, src: torch.Tensor, *, max_extra: int = 50, pad_id: int | None = None,
                  bos_id: int | None = None, eos_id: int | None = None) -> torch.Tensor:
    """Pick the most likely token at every step. src (B, S) -> (B, L): ids, </s>, then <pad>.
    pad_id, bos_id, eos_id: None = the model's (`special_ids`)."""
    check_tokens(src, "src")
    pad_id, bos_id, eos_id = special_ids(model, pad_id, bos_id, eos_id)
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
                pad_id: int | None = None, bos_id: int | None = None, eos_id: int | None = None,
                return_scores: bool = False):
    """Batched beam search with length penalty. src (B, S) -> (B, L): ids, </s>, then <pad>.

    Each sentence keeps `beam` live hypotheses (ranked by log-probability) and the `beam` best
    finished ones (ranked by log-probability / lp(length)). A sentence stops when no live hypothesis
    can still beat its worst finished one (log-probabilities only fall and lp is bounded by the
    length limit), or at its length limit. return_scores: also return the (B,) normalised scores.
    pad_id, bos_id, eos_id: None = the model's (`special_ids`).
    """
    check_tokens(src, "src")
    pad_id, bos_id, eos_id = special_ids(model, pad_id, bos_id, eos_id)
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


__all__ = ["greedy_decode", "beam_search", "length_penalty", "special_ids", "translate"]
