"""Sparse attention patterns (chapters 8-9): which (query, key) pairs are scored at all.

Every pattern is a bool mask, True = may attend, the convention of `tformer.masks`:

    sliding_window_mask   (T, T)     each token sees its `window` nearest predecessors  -> O(n w)
    strided_pattern       (2, T, T)  Sparse Transformer, strided: head 1 local, head 2 every stride-th
    fixed_pattern         (2, T, T)  Sparse Transformer, fixed: head 1 own block, head 2 "summary" columns
    longformer_mask       (T, T)     sliding window + global tokens (see all, seen by all)
    bigbird_mask          (T, T)     BigBird, block level: window + global + random blocks

With stride ~ sqrt(n) the two Sparse Transformer heads score O(n sqrt n) pairs instead of n^2;
`count_pairs` counts them. A mask only *describes* the savings: attention through a dense kernel with
a mask still does n^2 work. `sliding_window_attention` is a real banded kernel (blocks of `window`
queries against 2 blocks of keys: O(n w) time and memory), and `PatternAttention` runs any pattern
inside a model with the call shape of `MultiHeadAttention`.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from .utils.checks import check_float, check_rank
from .attention import MultiHeadAttention, merge_heads, split_heads
from .masks import causal_mask, combine_masks, sliding_window_mask

__all__ = ["sliding_window_mask", "strided_pattern", "fixed_pattern", "longformer_mask", "bigbird_mask",
           "count_pairs", "sliding_window_attention", "PatternAttention"]


def _check_len(t: int, name: str) -> None:
    if not isinstance(t, int) or t < 1:
        raise ValueError(f"{name}: sequence length must be a positive int, got {t!r}")


def _ij(t: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.arange(t, device=device).unsqueeze(1)                   # (T, 1) queries
    j = torch.arange(t, device=device).unsqueeze(0)                   # (1, T) keys
    return i, j


def strided_pattern(t: int, stride: int, causal: bool = True, device=None) -> torch.Tensor:
    """Sparse Transformer (Child et al., 2019), strided. (2, T, T): one mask per factorized head.

    head 0: the previous `stride` tokens (i - j < stride); head 1: every stride-th token back
    ((i - j) % stride == 0). Together (`.any(0)`) any token reaches any earlier one in two hops.
    """
    _check_len(t, "strided_pattern")
    if stride < 1:
        raise ValueError(f"strided_pattern: expected stride >= 1, got {stride}")
    i, j = _ij(t, device)
    d = i - j
    allowed = (d >= 0) if causal else torch.ones(t, t, dtype=torch.bool, device=device)
    local = (d.abs() < stride) & allowed
    strided = (d.remainder(stride) == 0) & allowed
    return torch.stack([local, strided])


def fixed_pattern(t: int, stride: int, c: int = 1, causal: bool = True, device=None) -> torch.Tensor:
    """Sparse Transformer, fixed. (2, T, T): head 0 = own block of `stride` tokens; head 1 = the last `c`
    positions of every block ("summary" tokens that carry the block's information forward)."""
    _check_len(t, "fixed_pattern")
    if stride < 1 or not 1 <= c <= stride:
        raise ValueError(f"fixed_pattern: expected stride >= 1 and 1 <= c <= stride, got stride={stride}, c={c}")
    i, j = _ij(t, device)
    allowed = (j <= i) if causal else torch.ones(t, t, dtype=torch.bool, device=device)
    block = (i // stride == j // stride) & allowed
    summary = (j.remainder(stride) >= stride - c) & allowed
    return torch.stack([block, summary])


def longformer_mask(t: int, window: int, global_tokens=(0,), causal: bool = False, device=None) -> torch.Tensor:
    """Longformer (Beltagy et al., 2020). (T, T): a sliding window (keys at distance < window) plus global
    tokens: each index in `global_tokens` attends to every key and every query attends to it."""
    _check_len(t, "longformer_mask")
    m = sliding_window_mask(t, window, causal=causal, device=device)
    g = torch.zeros(t, dtype=torch.bool, device=device)
    glob = torch.as_tensor(list(global_tokens), dtype=torch.long, device=device)
    if glob.numel() and (glob.min() < 0 or glob.max() >= t):
        raise ValueError(f"longformer_mask: global token indices must be in [0, {t}), got {list(global_tokens)}")
    g[glob] = True
    m = m | g.unsqueeze(0) | g.unsqueeze(1)                            # column: seen by all; row: sees all
    return m & causal_mask(t, device=device) if causal else m


def bigbird_mask(t: int, block: int, n_random: int = 1, n_global: int = 1, window_blocks: int = 3,
                 seed: int = 0, device=None) -> torch.Tensor:
    """BigBird (Zaheer et al., 2020), as in its block-sparse implementation. (T, T), T a multiple of `block`.

    Working on blocks of `block` tokens: every query block sees the `window_blocks` blocks centred on it,
    the first `n_global` blocks (which themselves see everything), and `n_random` other blocks drawn
    with `seed`. Bidirectional (an encoder pattern).
    """
    _check_len(t, "bigbird_mask")
    if block < 1 or t % block:
        raise ValueError(f"bigbird_mask: T={t} must be a positive multiple of block={block}")
    if window_blocks < 1 or window_blocks % 2 == 0:
        raise ValueError(f"bigbird_mask: window_blocks must be odd and >= 1, got {window_blocks}")
    nb = t // block
    bi, bj = _ij(nb, device)
    m = (bi - bj).abs() <= window_blocks // 2                          # (nb, nb) window
    m |= (bj < n_global) | (bi < n_global)                             # global blocks
    if n_random > 0:
        g = torch.Generator().manual_seed(seed)
        scores = torch.rand(nb, nb, generator=g).to(device)
        scores = scores.masked_fill(m, -1.0)                           # draw among blocks not yet seen
        k = min(n_random, nb)
        pick = scores.topk(k, dim=-1).indices                          # (nb, k)
        rand = torch.zeros(nb, nb, dtype=torch.bool, device=device).scatter_(1, pick, True)
        m |= rand & (scores >= 0)
    return m.repeat_interleave(block, 0).repeat_interleave(block, 1)


def count_pairs(mask: torch.Tensor) -> int:
    """Number of (query, key) pairs a pattern scores; for a (heads, T, T) stack, the union's."""
    check_rank(mask, (2, 3), "count_pairs(mask)", "(T, T) or (heads, T, T)")
    return int((mask.any(0) if mask.dim() == 3 else mask).sum())


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                             causal: bool = True) -> torch.Tensor:
    """Banded attention: each query attends keys at distance < `window` (only earlier ones if causal).

    q, k, v (..., T, d) -> (..., T, d). Queries are cut into blocks of `window`; block b needs keys
    from blocks b-1, b (and b+1 if not causal), so the scores are (..., T/w, w, 2w or 3w): O(T w) time
    and memory instead of O(T^2). Equals dense attention with `sliding_window_mask` (tests check).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_rank(x, (3, 4), f"sliding_window_attention({name})", "(..., T, d)")
        check_float(x, f"sliding_window_attention({name})")
    if not (q.shape == k.shape and k.shape[:-1] == v.shape[:-1]):
        raise ValueError(f"sliding_window_attention: self-attention needs q and k of one shape and v of "
                         f"the same length; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if window < 1:
        raise ValueError(f"sliding_window_attention: expected window >= 1, got {window}")
    *lead, t, d = q.shape
    w = min(window, t)
    nb = math.ceil(t / w)
    pad = nb * w - t
    qp, kp, vp = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))         # (..., nb*w, d)
    before, after = 1, (0 if causal else 1)                            # neighbour blocks each side
    kp, vp = (F.pad(x, (0, 0, before * w, after * w)) for x in (kp, vp))

    def windows(x):                                                    # (..., nb, (1+before+after)*w, d)
        span = (1 + before + after) * w
        return x.unfold(-2, span, w).transpose(-1, -2)

    qb = qp.reshape(*lead, nb, w, d)                                   # (..., nb, w, d)
    kb, vb = windows(kp), windows(vp)                                  # (..., nb, span, d)
    scores = qb @ kb.transpose(-1, -2) / math.sqrt(d)                  # (..., nb, w, span)
    qi = torch.arange(nb * w, device=q.device).view(nb, w, 1)          # absolute query index
    kj = (torch.arange(nb, device=q.device).view(nb, 1, 1) - before) * w \
        + torch.arange((1 + before + after) * w, device=q.device).view(1, 1, -1)  # absolute key index
    ok = ((qi - kj).abs() < window) & (kj >= 0) & (kj < t)
    if causal:
        ok &= kj <= qi
    scores = scores.masked_fill(~ok, float("-inf"))
    out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ vb           # padded query rows -> 0
    return out.reshape(*lead, nb * w, d)[..., :t, :]


class PatternAttention(MultiHeadAttention):
    """`MultiHeadAttention` restricted to a sparse pattern; a drop-in replacement (same parameters).

    `pattern(T, device)` returns a (T, T) or (n_heads, T, T) bool mask; a (h, T, T) stack with h <
    n_heads is repeated over the heads (Sparse Transformer's factorized heads). The pattern is ANDed
    with `mask` and the causal mask. `window=` instead of a pattern uses the banded kernel
    (`sliding_window_attention`): O(T w) memory.
    """

    def __init__(self, d_model: int, n_heads: int, pattern: Callable[[int, torch.device], torch.Tensor] | None = None,
                 window: int | None = None, **kw):
        super().__init__(d_model, n_heads, **kw)
        if (pattern is None) == (window is None):
            raise ValueError("PatternAttention: pass exactly one of pattern= (a mask function) or window=")
        self.pattern, self.window = pattern, window

    def _pattern_mask(self, t: int, device) -> torch.Tensor:
        m = self.pattern(t, device)
        if m.dim() == 3:                                               # (h, T, T) -> (n_heads, T, T)
            if self.n_heads % m.shape[0]:
                raise ValueError(f"PatternAttention: {m.shape[0]} pattern heads do not divide n_heads={self.n_heads}")
            m = m.repeat(self.n_heads // m.shape[0], 1, 1)
        return m

    def forward(self, x, context=None, mask=None, *, is_causal=False, rope=None, cache=None, positions=None,
                need_weights=False):
        """x (B, T, d_model) -> (B, T, d_model); self-attention only, no KV cache."""
        if context is not None or cache is not None:
            raise ValueError("PatternAttention: self-attention over a whole sequence only (no context, no cache)")
        t = x.shape[1]
        if self.window is None:
            m = combine_masks(mask, self._pattern_mask(t, x.device))
            return super().forward(x, mask=m, is_causal=is_causal, rope=rope, positions=positions,
                                   need_weights=need_weights)
        if mask is not None or need_weights:
            raise ValueError("PatternAttention(window=): the banded kernel takes no extra mask and returns no weights")
        b, _, d = x.shape
        q, k, v = self.qkv(x).split([d, d, d], dim=-1)
        q, k, v = (split_heads(z, self.n_heads) for z in (q, k, v))    # (B, H, T, hd)
        if rope is not None:
            q, k = rope(q, 0, positions), rope(k, 0, positions)
        y = sliding_window_attention(q, k, v, self.window, causal=is_causal)
        return self.out(merge_heads(y))                                # (B, H, T, hd) -> (B, T, d)
