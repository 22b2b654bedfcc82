"""Scaled dot-product attention and multi-head attention (chapters 1-3, 14).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

`scaled_dot_product_attention` is the teaching reference: every step is visible and it returns the
attention weights. `MultiHeadAttention` runs the same function through PyTorch's fused
`F.scaled_dot_product_attention` (the fast path: flash / memory-efficient kernels where available)
unless you ask for the weights; `tformer.kernels` holds the fused path and the rule that picks between
the two. Tests prove the two paths agree.

Mask convention: bool, True = may attend, broadcastable to (..., T_q, T_k). A query whose keys are
*all* masked gets zero weights and a zero output (not NaN): "attend to nothing" contributes nothing.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from .dropout import dropout
from .utils.checks import check_dim, check_float, check_mask, check_rank
from .cache import KVCache
from .kernels import fast_attention, use_fused
from .masks import causal_mask, combine_masks

def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_rank(x, (2, 3, 4, 5), name, "(..., T, d)")
        check_float(x, name)
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"attention: q, k, v must share leading dims (..., T, d); got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention: q and k need the same feature size d_k; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention: k and v need the same length T_k; got k {tuple(k.shape)}, v {tuple(v.shape)}")


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, dropout_p: float = 0.0
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference attention. q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v).

    Returns (out (..., T_q, d_v), weights (..., T_q, T_k)). `mask`: bool, True = may attend.
    Fully masked rows give weights 0 and output 0. `dropout_p` drops attention weights (training only:
    pass 0 at evaluation).
    """
    _check_qkv(q, k, v)
    t_q, t_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])       # (..., T_q, T_k)
    if mask is not None:
        check_mask(mask, t_q, t_k)
        row_ok = mask.any(dim=-1, keepdim=True)                    # (..., T_q, 1): any key visible?
        scores = scores.masked_fill(~(mask | ~row_ok), float("-inf"))  # fully masked rows stay finite
        weights = torch.softmax(scores, dim=-1).masked_fill(~row_ok, 0.0)
    else:
        weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return weights @ v, weights


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, n_heads * d_head) -> (B, n_heads, T, d_head): feature blocks become heads.

    The transpose matters: a bare `reshape(B, n_heads, T, d_head)` mixes positions into heads.
    """
    check_rank(x, 3, "split_heads(x)", "(B, T, n_heads * d_head)")
    b, t, d = x.shape
    if d % n_heads:
        raise ValueError(f"split_heads: n_heads={n_heads} must divide the feature size {d}")
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, n_heads, T, d_head) -> (B, T, n_heads * d_head): the concatenation of the heads."""
    check_rank(x, 4, "merge_heads(x)", "(B, n_heads, T, d_head)")
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: h heads of size d_model / h (or an explicit `head_dim`), self- or cross-attention.

    n_kv_heads < n_heads shares each key/value head among n_heads / n_kv_heads query heads:
    grouped-query attention (GQA); n_kv_heads = 1 is multi-query attention (MQA). The KV cache then
    holds n_kv_heads heads, which is the point.

    The query, key and value projections live in one matrix `qkv` (one matmul for self-attention; the
    rows are sliced for cross-attention), the layout of `torch.nn.MultiheadAttention` and GPT-2.
    qk_norm=True normalizes each query and key head with its own RMSNorm before RoPE (Qwen3).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, dropout: float = 0.0,
                 bias: bool = True, fast: bool = True, head_dim: int | None = None, qk_norm: bool = False,
                 eps: float = 1e-6):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"MultiHeadAttention: n_heads={n_heads} must divide d_model={d_model} "
                             "(or give head_dim)")
        if n_heads % n_kv_heads:
            raise ValueError(f"MultiHeadAttention: n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads if head_dim is None else head_dim
        self.dropout = dropout
        self.fast = fast  # False: always use the reference path (it also returns the weights)
        self._captured: list | None = None  # set by `capture_attention`: append each call's weights here
        q_dim, kv_dim = n_heads * self.head_dim, n_kv_heads * self.head_dim
        self.qkv = nn.Linear(d_model, q_dim + 2 * kv_dim, bias=bias)    # [W_q; W_k; W_v]
        self.out = nn.Linear(q_dim, d_model, bias=bias)                 # W_o
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else None

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                *, is_causal: bool = False, rope=None, cache=None, positions: torch.Tensor | None = None,
                need_weights: bool = False):
        """x (B, T_q, d_model); context (B, T_k, d_model) for cross-attention, else None.

        mask: bool, True = may attend, broadcastable to (B, n_heads, T_q, T_k).
        is_causal: add the causal mask (bottom-right aligned when a cache holds earlier tokens).
        rope: a `RotaryEmbedding` applied to queries and keys (self-attention).
        positions: (B, T_q) each token's position, each row its own (a serving step); None = the tokens
            follow what the cache holds.
        cache: a `KVCache`; self-attention appends to it, cross-attention fills it once and reuses it. A
            cache with an `attend(q, k, v)` method (the serving engine's paged step) stores the new keys
            and values and attends over its own storage itself.
        Returns out (B, T_q, d_model), or (out, weights (B, n_heads, T_q, T_k)) if need_weights.
        """
        self._check(x, context)
        past = cache.length if cache is not None and context is None and positions is None else 0
        if context is None:                                            # self-attention
            q, k, v = self.qkv(x).split(self.qkv_sizes, dim=-1)        # project: (B, T, d), (B, T, d_kv) x 2
            q = split_heads(q, self.n_heads)                           # split heads: (B, H, T, hd)
            k, v = split_heads(k, self.n_kv_heads), split_heads(v, self.n_kv_heads)  # (B, H_kv, T, hd)
            if self.q_norm is not None:                                # QK-norm: each head to unit RMS
                q, k = self.q_norm(q), self.k_norm(k)
            if rope is not None:                                       # RoPE: rotate by absolute position
                q, k = rope(q, past, positions), rope(k, past, positions)
            if hasattr(cache, "attend"):                               # a paged cache reads its blocks in place
                return self.out(merge_heads(cache.attend(q, k, v)))
            if cache is not None:                                      # KV cache: prepend the earlier tokens
                k, v = cache.append(k, v)
        else:                                                          # cross-attention: keys from context
            q, k, v = self.cross_qkv(x, context, cache)
        causal = is_causal and not (q.shape[2] == 1 and past > 0)      # one new token sees all the past
        y, weights = self.attend(q, k, v, mask, causal, need_weights)  # (B, H, T_q, hd)
        y = self.out(merge_heads(y))                                   # merge heads, project: (B, T_q, d_model)
        return (y, weights) if need_weights else y

    # -- the steps of forward -------------------------------------------------------------------------

    def _check(self, x: torch.Tensor, context: torch.Tensor | None) -> None:
        check_rank(x, 3, "MultiHeadAttention(x)", "(B, T, d_model)")
        check_dim(x, -1, self.d_model, "MultiHeadAttention(x)", "d_model")
        if context is not None:
            check_rank(context, 3, "MultiHeadAttention(context)", "(B, T_k, d_model)")
            check_dim(context, -1, self.d_model, "MultiHeadAttention(context)", "d_model")
            if context.shape[0] != x.shape[0]:
                raise ValueError(f"MultiHeadAttention: x has batch {x.shape[0]} but context has batch {context.shape[0]}")

    @property
    def qkv_sizes(self) -> list[int]:
        kv_dim = self.n_kv_heads * self.head_dim
        return [self.n_heads * self.head_dim, kv_dim, kv_dim]          # rows of qkv: [W_q; W_k; W_v]

    def cross_qkv(self, x: torch.Tensor, context: torch.Tensor, cache: KVCache | None):
        """Queries from x with the W_q rows of `qkv`; keys and values from context with the W_k, W_v rows,
        computed once and then reused from `cache` (the encoder output does not change while decoding)."""
        d, w, b = self.qkv_sizes[0], self.qkv.weight, self.qkv.bias
        q = split_heads(F.linear(x, w[:d], None if b is None else b[:d]), self.n_heads)
        if cache is not None and cache.length:
            return (q, *cache.get())
        k, v = F.linear(context, w[d:], None if b is None else b[d:]).split(self.qkv_sizes[1:], dim=-1)
        k, v = split_heads(k, self.n_kv_heads), split_heads(v, self.n_kv_heads)
        if cache is not None:
            cache.store(k, v)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
               causal: bool = False, need_weights: bool = False):
        """softmax(q k^T / sqrt(d_head)) v in every head: (B, H, T_q, hd) -> (out (B, H, T_q, hd), weights or None).

        The reference path (it returns the weights) when they are wanted, inside `capture_attention`, with
        fast=False, for dropout on a CPU (where the fused kernel falls back to the same math and draws
        its mask element by element: `tformer.dropout`), or for a short bf16/fp16 training step on a CPU
        (`tformer.kernels.use_fused` decides); otherwise the fused kernel (`fast_attention`, GQA included).
        """
        t_q, t_k = q.shape[2], k.shape[2]
        if mask is not None:
            check_mask(mask, t_q, t_k)
        dropout_p = self.dropout if self.training else 0.0
        if use_fused(q, t_k, dropout_p, need_weights or self._captured is not None or not self.fast):
            if causal and mask is None and t_q == t_k:                 # lets PyTorch pick the flash kernel
                return fast_attention(q, k, v, None, is_causal=True, dropout_p=dropout_p), None
            return fast_attention(q, k, v, self._full_mask(mask, causal, t_q, t_k, q.device), dropout_p=dropout_p), None
        k, v = repeat_kv(k, self.n_heads // self.n_kv_heads), repeat_kv(v, self.n_heads // self.n_kv_heads)
        y, weights = scaled_dot_product_attention(q, k, v, self._full_mask(mask, causal, t_q, t_k, q.device), dropout_p)
        if self._captured is not None:
            self._captured.append(weights.detach())
        return y, weights

    @staticmethod
    def _full_mask(mask, causal: bool, t_q: int, t_k: int, device) -> torch.Tensor | None:
        return combine_masks(mask, causal_mask(t_q, t_k, device=device) if causal else None)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """GQA: (B, H_kv, T, hd) -> (B, H_kv * n_rep, T, hd), each key/value head serving n_rep query heads."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


@contextlib.contextmanager
def capture_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect the attention weights of every `MultiHeadAttention` in `model` (or `model` itself).

        with capture_attention(model) as weights:
            model(x)
        weights[i]    # (B, n_heads, T_q, T_k) of the i-th attention call, in call order (detached)

    Inside the block attention runs the reference path (it computes the weights); outside, the fast one.
    """
    mods = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not mods:
        raise ValueError(f"capture_attention: {type(model).__name__} contains no MultiHeadAttention")
    weights: list[torch.Tensor] = []
    before = [m._captured for m in mods]
    for m in mods:
        m._captured = weights
    try:
        yield weights
    finally:
        for m, b in zip(mods, before):
            m._captured = b
