"""Attention masks. Convention everywhere in tformer: a bool tensor, True = may attend.

Shapes broadcast against attention scores of shape (B, H, T_q, T_k):
    causal_mask       (T_q, T_k)
    padding_mask      (B, 1, 1, T_k)
    sliding_window    (T_q, T_k)
and `combine_masks` ANDs any number of them after checking they broadcast.
"""
from __future__ import annotations

import torch

from .utils.checks import check_rank


def causal_mask(t_q: int, t_k: int | None = None, device=None) -> torch.Tensor:
    """(T_q, T_k) bool: query i may attend key j iff j <= i + (T_k - T_q).

    With T_k > T_q (decoding with a KV cache holding T_k - T_q earlier tokens) the queries are the
    *last* T_q positions, so the mask is aligned bottom-right.
    """
    t_k = t_q if t_k is None else t_k
    if t_k < t_q:
        raise ValueError(f"causal_mask: expected T_k >= T_q (keys include the queries), got T_q={t_q}, T_k={t_k}")
    q = torch.arange(t_q, device=device).unsqueeze(1) + (t_k - t_q)
    k = torch.arange(t_k, device=device).unsqueeze(0)
    return k <= q


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, T) token ids -> (B, 1, 1, T) bool, True where the key is a real token (not padding)."""
    check_rank(tokens, 2, "padding_mask(tokens)", "(B, T) of token ids")
    return (tokens != pad_id)[:, None, None, :]


def lengths_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """(B,) sequence lengths -> (B, 1, 1, T) bool, True for the first `length` keys of each row."""
    check_rank(lengths, 1, "lengths_mask(lengths)", "(B,)")
    return (torch.arange(t, device=lengths.device)[None, :] < lengths[:, None])[:, None, None, :]


def sliding_window_mask(t_q: int, window: int, t_k: int | None = None, causal: bool = True,
                        device=None) -> torch.Tensor:
    """(T_q, T_k) bool: each query sees keys at distance < `window` (only the past if `causal`)."""
    t_k = t_q if t_k is None else t_k
    if window < 1:
        raise ValueError(f"sliding_window_mask: expected window >= 1, got {window}")
    q = torch.arange(t_q, device=device).unsqueeze(1) + (t_k - t_q)
    k = torch.arange(t_k, device=device).unsqueeze(0)
    near = (q - k).abs() < window
    return near & (k <= q) if causal else near


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """AND together bool masks (None entries are skipped); raises if they do not broadcast."""
    out = None
    for i, m in enumerate(masks):
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise TypeError(f"combine_masks: mask {i} has dtype {m.dtype}; expected torch.bool (True = may attend)")
        if out is None:
            out = m
            continue
        try:
            torch.broadcast_shapes(out.shape, m.shape)
        except RuntimeError:
            raise ValueError(f"combine_masks: mask {i} of shape {tuple(m.shape)} does not broadcast with "
                             f"{tuple(out.shape)}") from None
        out = out & m
    return out
