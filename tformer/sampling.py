"""Sampling from a decoder-only LM (chapter 11): `sample_next` turns the last position's logits into the
next token: repetition penalty, then temperature, then top-k and top-p (nucleus) filtering, then a draw
(temperature 0 is greedy). Each filter is its own function, returning logits with -inf where a token
may not be drawn:

    top_k_filter(logits, 50)           # keep the 50 most likely tokens
    top_p_filter(logits, 0.9)          # keep the smallest set of most likely tokens with mass >= 0.9
    apply_repetition_penalty(logits, idx, 1.3)   # make tokens already in idx less likely (CTRL)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


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


__all__ = ["top_k_filter", "top_p_filter", "apply_repetition_penalty", "sample_next"]
