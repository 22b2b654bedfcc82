"""Efficient attention (chapter 9): exact but memory-light, and approximate but linear.

    tiled_attention        exact softmax attention, key/value blocks streamed through an online softmax:
                           the FlashAttention algorithm in plain PyTorch. Memory O(T * block) instead
                           of O(T^2); the backward pass recomputes the blocks (also O(T * block)).
    online_softmax_step    one block of that online softmax (the exercise of the chapter)
    LinformerAttention     keys and values projected from T rows to k rows: O(T k) (Wang et al., 2020)
    PerformerAttention     FAVOR+: softmax kernel exp(q.k) approximated by positive orthogonal random
                           features, phi(q).phi(k); O(T m d), causal by prefix sums (Choromanski et al., 2021)

The modules subclass `MultiHeadAttention` (same `qkv`/`out` parameters, same call
`forward(x, mask=None, *, is_causal=False, ...)`), so a model can swap them in and even keep its weights.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .utils.checks import check_float, check_mask, check_rank
from .attention import MultiHeadAttention, merge_heads, split_heads

__all__ = ["online_softmax_step", "tiled_attention", "TiledAttention", "LinformerAttention",
           "PerformerAttention", "orthogonal_gaussian", "favor_features", "performer_attention"]

NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------------
# Tiled attention with an online softmax (FlashAttention's algorithm)
# ---------------------------------------------------------------------------------------------------

def online_softmax_step(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                        v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block of keys into running softmax statistics.

    m (..., T_q, 1)   running max of the scores seen so far (-inf before the first block)
    l (..., T_q, 1)   running sum of exp(score - m)
    acc (..., T_q, d) running sum of exp(score - m) * v
    scores (..., T_q, B_k) this block's scores (-inf where masked); v (..., B_k, d) its values.

    When the max grows from m to m_new, everything accumulated so far is rescaled by exp(m - m_new).
    After the last block, softmax(scores) @ V = acc / l (0 where l = 0: no visible key).
    """
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))       # (..., T_q, 1)
    m_safe = m_new.masked_fill(m_new == NEG_INF, 0.0)                  # rows with nothing seen yet
    p = torch.exp(scores - m_safe)                                     # (..., T_q, B_k), exp(-inf) = 0
    alpha = torch.exp(m - m_safe)                                      # rescales the old statistics
    return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v


def _block_scores(q, k_blk, scale, r0, js, je, t_q, t_k, causal, mask):
    """Scores of queries r0: against keys js:je, with -inf where masked. q is already sliced."""
    s = (q @ k_blk.transpose(-2, -1)) * scale                          # (..., T_q - r0, B_k)
    if causal:
        qi = torch.arange(r0, t_q, device=q.device).unsqueeze(1) + (t_k - t_q)
        kj = torch.arange(js, je, device=q.device).unsqueeze(0)
        s = s.masked_fill(kj > qi, NEG_INF)
    if mask is not None:
        s = s.masked_fill(~mask[..., r0:, js:je], NEG_INF)
    return s


def _first_row(js: int, t_q: int, t_k: int, causal: bool) -> int:
    """First query row that sees any key at or after js (causal, bottom-right aligned)."""
    return min(max(0, js - (t_k - t_q)), t_q) if causal else 0


class _TiledAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, causal, block, scale):
        t_q, t_k = q.shape[-2], k.shape[-2]
        m = q.new_full((*q.shape[:-1], 1), NEG_INF)                    # (..., T_q, 1)
        l = q.new_zeros((*q.shape[:-1], 1))                            # (..., T_q, 1)
        acc = q.new_zeros((*q.shape[:-1], v.shape[-1]))                # (..., T_q, d_v)
        for js in range(0, t_k, block):                                # stream key/value blocks
            je = min(js + block, t_k)
            r0 = _first_row(js, t_q, t_k, causal)
            if r0 >= t_q:
                break                                                  # causal: no query sees these keys
            s = _block_scores(q[..., r0:, :], k[..., js:je, :], scale, r0, js, je, t_q, t_k, causal, mask)
            if r0 == 0:                                                # every query row takes part
                m, l, acc = online_softmax_step(m, l, acc, s, v[..., js:je, :])
            else:                                                      # causal: rows before r0 see none of it
                m[..., r0:, :], l[..., r0:, :], acc[..., r0:, :] = online_softmax_step(
                    m[..., r0:, :], l[..., r0:, :], acc[..., r0:, :], s, v[..., js:je, :])
        empty = l == 0                                                 # no visible key: output 0
        out = acc / l.masked_fill(empty, 1.0)
        lse = (m + torch.log(l)).masked_fill(empty, NEG_INF)           # log-sum-exp of each row
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.causal, ctx.block, ctx.scale = causal, block, scale
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse, mask = ctx.saved_tensors
        causal, block, scale = ctx.causal, ctx.block, ctx.scale
        t_q, t_k = q.shape[-2], k.shape[-2]
        lse_safe = lse.masked_fill(lse == NEG_INF, 0.0)
        big_d = (d_out * out).sum(dim=-1, keepdim=True)                # (..., T_q, 1) = rowsum(dO * O)
        dq = torch.zeros_like(q)
        dk = torch.zeros(torch.broadcast_shapes(k.shape[:-2], q.shape[:-2]) + k.shape[-2:], dtype=k.dtype, device=k.device)
        dv = torch.zeros(dk.shape[:-1] + v.shape[-1:], dtype=v.dtype, device=v.device)
        for js in range(0, t_k, block):                                # recompute each block: O(T * block)
            je = min(js + block, t_k)
            r0 = _first_row(js, t_q, t_k, causal)
            if r0 >= t_q:
                break
            qs = q[..., r0:, :]
            s = _block_scores(qs, k[..., js:je, :], scale, r0, js, je, t_q, t_k, causal, mask)
            p = torch.exp(s - lse_safe[..., r0:, :])                   # the softmax weights of this block
            do = d_out[..., r0:, :]
            dv[..., js:je, :] += p.transpose(-2, -1) @ do
            ds = p * (do @ v[..., js:je, :].transpose(-2, -1) - big_d[..., r0:, :])
            dq[..., r0:, :] += (ds @ k[..., js:je, :]) * scale
            dk[..., js:je, :] += (ds.transpose(-2, -1) @ qs) * scale
        return dq, dk.sum_to_size(k.shape), dv.sum_to_size(v.shape), None, None, None, None


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                    is_causal: bool = False, block: int = 128, return_lse: bool = False):
    """Exact softmax(q k^T / sqrt(d)) v without ever holding the (T_q, T_k) score matrix.

    q (..., T_q, d), k (..., T_k, d), v (..., T_k, d_v) -> (..., T_q, d_v) [and the log-sum-exp
    (..., T_q, 1) of each row if return_lse]. `mask`: bool, True = may attend, broadcastable to
    (..., T_q, T_k) (expanded, never copied). `is_causal`: bottom-right aligned like `causal_mask`.
    Keys are processed `block` at a time; peak memory is O(T_q * block). A row with no visible key
    gives 0, as `scaled_dot_product_attention` does. Differentiable (the backward recomputes blocks).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_rank(x, (2, 3, 4, 5), f"tiled_attention({name})", "(..., T, d)")
        check_float(x, f"tiled_attention({name})")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"tiled_attention: expected q (..., T_q, d), k (..., T_k, d), v (..., T_k, d_v); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if block < 1:
        raise ValueError(f"tiled_attention: expected block >= 1, got {block}")
    t_q, t_k = q.shape[-2], k.shape[-2]
    if is_causal and t_k < t_q:
        raise ValueError(f"tiled_attention: causal attention needs T_k >= T_q, got T_q={t_q}, T_k={t_k}")
    if mask is not None:
        check_mask(mask, t_q, t_k)
        mask = mask.expand(*mask.shape[:-2], t_q, t_k)
    out, lse = _TiledAttentionFn.apply(q, k, v, mask, is_causal, block, 1.0 / math.sqrt(q.shape[-1]))
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------------
# Modules with MultiHeadAttention's call shape
# ---------------------------------------------------------------------------------------------------

class _SelfAttentionVariant(MultiHeadAttention):
    """Shared plumbing: the parameters and call of `MultiHeadAttention`, self-attention only."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, n_heads, None, dropout=dropout, bias=bias)

    def _heads(self, x, context, cache, need_weights, rope, positions=None):
        name = type(self).__name__
        check_rank(x, 3, f"{name}(x)", "(B, T, d_model)")
        if context is not None or cache is not None or need_weights:
            raise ValueError(f"{name}: self-attention over a whole sequence only (no context, cache or weights)")
        d = self.d_model
        q, k, v = self.qkv(x).split([d, d, d], dim=-1)
        q, k, v = (split_heads(z, self.n_heads) for z in (q, k, v))    # (B, H, T, hd)
        if rope is not None:
            q, k = rope(q, 0, positions), rope(k, 0, positions)
        return q, k, v

    def _merge(self, y):
        return self.out(merge_heads(y))                                # (B, H, T, hd) -> (B, T, d)


def _key_padding(mask: torch.Tensor | None, b: int, t: int, name: str) -> torch.Tensor | None:
    """A key-only mask (B or 1, 1, 1, T) -> (B, 1, T, 1) multiplier; anything else is an error."""
    if mask is None:
        return None
    check_mask(mask, t, t)
    if mask.dim() != 4 or mask.shape[-2] != 1 or mask.shape[1] != 1:
        raise ValueError(f"{name}: only key padding masks of shape (B, 1, 1, T) are supported "
                         f"(a low-rank or kernel method has no (T_q, T_k) score matrix to mask), got {tuple(mask.shape)}")
    return mask.expand(b, 1, 1, t).transpose(-1, -2)


class TiledAttention(_SelfAttentionVariant):
    """`MultiHeadAttention` computed with `tiled_attention`: the same outputs, O(T * block) memory."""

    def __init__(self, d_model: int, n_heads: int, block: int = 128, dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, n_heads, dropout, bias)
        self.block = block

    def forward(self, x, context=None, mask=None, *, is_causal=False, rope=None, cache=None, positions=None,
                need_weights=False):
        """x (B, T, d_model) -> (B, T, d_model). Attention dropout is not applied."""
        q, k, v = self._heads(x, context, cache, need_weights, rope, positions)
        return self._merge(tiled_attention(q, k, v, mask, is_causal, self.block))


class LinformerAttention(_SelfAttentionVariant):
    """Linformer: keys and values projected along the sequence, T rows -> k rows.

        head = softmax(Q (E K)^T / sqrt(d)) (F V),   E, F: (k, T) learned

    Cost O(T k) instead of O(T^2). E and F are defined up to `max_len`; a shorter input uses their first
    T columns. Not causal: each of the k projected rows mixes all positions, future ones included.
    """

    def __init__(self, d_model: int, n_heads: int, max_len: int, k: int = 64, share_kv: bool = False,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, n_heads, dropout, bias)
        self.max_len, self.k = max_len, k
        self.E = nn.Parameter(torch.randn(k, max_len) / math.sqrt(k))  # (k, max_len)
        self.F = self.E if share_kv else nn.Parameter(torch.randn(k, max_len) / math.sqrt(k))

    def forward(self, x, context=None, mask=None, *, is_causal=False, rope=None, cache=None, positions=None,
                need_weights=False):
        """x (B, T, d_model) -> (B, T, d_model); mask: key padding (B, 1, 1, T) only."""
        if is_causal:
            raise ValueError("LinformerAttention: cannot be causal (each projected key mixes all positions, "
                             "future ones too); use PerformerAttention or a sliding window for a decoder")
        t = x.shape[1]
        if t > self.max_len:
            raise ValueError(f"LinformerAttention: sequence of {t} exceeds max_len={self.max_len} of the projections")
        q, k, v = self._heads(x, context, cache, need_weights, rope, positions)
        keep = _key_padding(mask, x.shape[0], t, "LinformerAttention")
        if keep is not None:                                           # padded keys contribute nothing
            k, v = k * keep, v * keep
        k = self.E[:, :t] @ k                                          # (k, T) @ (B, H, T, hd) -> (B, H, k, hd)
        v = self.F[:, :t] @ v
        p = self.dropout if self.training else 0.0
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self._merge(y)


def orthogonal_gaussian(m: int, d: int, generator: torch.Generator | None = None,
                        dtype=torch.float32) -> torch.Tensor:
    """(m, d) random features: blocks of d orthogonal rows (QR of a Gaussian), each row rescaled to the
    norm of a d-dimensional Gaussian vector, so each row is still marginally N(0, I) (FAVOR+'s ORF)."""
    g = torch.randn(math.ceil(m / d), d, d, generator=generator, dtype=torch.float64)
    qm, r = torch.linalg.qr(g)                                         # a batch of (d, d) QRs
    qm = qm * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # uniformly random rotations
    w = qm.transpose(-2, -1).reshape(-1, d)[:m]                        # rows orthonormal within each block
    norms = torch.randn(m, d, generator=generator, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (w * norms).to(dtype)


def favor_features(x: torch.Tensor, w: torch.Tensor, is_query: bool) -> torch.Tensor:
    """Positive random features phi(x) = exp(w.x - |x|^2 / 2 - c) / sqrt(m), x (..., T, d) -> (..., T, m).

    E[phi(q).phi(k)] = exp(q.k) exp(-c_q - c_k). The stabilizer c (a max, as in the official code) cancels
    in attention's normalization: per query row for queries, one constant over all keys for keys.
    """
    proj = x @ w.T                                                     # (..., T, m)
    sq = (x * x).sum(dim=-1, keepdim=True) / 2
    if is_query:
        c = proj.amax(dim=-1, keepdim=True)
    else:
        c = proj.amax(dim=(-1, -2), keepdim=True)
    return torch.exp(proj - sq - c.detach()) / math.sqrt(w.shape[0]) + 1e-6


def performer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                        is_causal: bool = False, key_keep: torch.Tensor | None = None,
                        chunk: int = 64) -> torch.Tensor:
    """FAVOR+ attention. q, k (..., T, d), v (..., T, d_v), w (m, d) random features -> (..., T, d_v).

    softmax(q k^T / sqrt(d)) v ~ D^-1 phi(Q) (phi(K)^T V), D = diag(phi(Q) phi(K)^T 1), with q and k
    scaled by d^-1/4. Causal: the prefix sums sum_{s<=t} phi(k_s) v_s^T, computed per chunk of `chunk`
    rows (an exclusive cumsum over chunks plus a small masked product inside each chunk): O(T m d).
    key_keep (..., T, 1): 0 for padded keys.
    """
    d = q.shape[-1]
    qf = favor_features(q * d ** -0.25, w, True)                       # (..., T, m)
    kf = favor_features(k * d ** -0.25, w, False)                      # (..., T, m)
    if key_keep is not None:
        kf = kf * key_keep
    if not is_causal:
        kv = kf.transpose(-2, -1) @ v                                  # (..., m, d_v)
        z = kf.sum(dim=-2, keepdim=True)                               # (..., 1, m)
        return (qf @ kv) / (qf * z).sum(dim=-1, keepdim=True)
    *lead, t, m = qf.shape
    c = min(chunk, t)
    nc = math.ceil(t / c)
    pad = nc * c - t
    qf, kf, vp = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (qf, kf, v))
    qc, kc, vc = (x.reshape(*lead, nc, c, x.shape[-1]) for x in (qf, kf, vp))   # (..., nc, c, .)
    kv = kc.transpose(-2, -1) @ vc                                     # (..., nc, m, d_v) per chunk
    kv_before = kv.cumsum(dim=-3) - kv                                 # exclusive prefix over chunks
    z_before = kc.sum(dim=-2).cumsum(dim=-2) - kc.sum(dim=-2)          # (..., nc, m)
    inner = (qc @ kc.transpose(-2, -1)).tril()                         # (..., nc, c, c) causal in-chunk
    num = qc @ kv_before + inner @ vc                                  # (..., nc, c, d_v)
    den = (qc * z_before.unsqueeze(-2)).sum(-1, keepdim=True) + inner.sum(-1, keepdim=True)
    return (num / den).reshape(*lead, nc * c, -1)[..., :t, :]


class PerformerAttention(_SelfAttentionVariant):
    """Performer (FAVOR+): softmax attention through m positive orthogonal random features per head.

    The features are a buffer drawn from `seed`; `redraw_features()` draws new ones (the paper redraws
    during training). Causal via prefix sums. Cost O(T m d) time, O(T m) memory.
    """

    def __init__(self, d_model: int, n_heads: int, n_features: int | None = None, seed: int = 0,
                 chunk: int = 64, dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, n_heads, dropout, bias)
        hd = d_model // n_heads
        self.n_features = n_features or max(hd, int(hd * math.log(hd)))  # the paper's m = d log d
        self.chunk = chunk
        self.generator = torch.Generator().manual_seed(seed)
        self.register_buffer("w", orthogonal_gaussian(self.n_features, hd, self.generator), persistent=True)

    @torch.no_grad()
    def redraw_features(self) -> None:
        self.w.copy_(orthogonal_gaussian(self.n_features, self.head_dim, self.generator).to(self.w))

    def forward(self, x, context=None, mask=None, *, is_causal=False, rope=None, cache=None, positions=None,
                need_weights=False):
        """x (B, T, d_model) -> (B, T, d_model); mask: key padding (B, 1, 1, T) only."""
        q, k, v = self._heads(x, context, cache, need_weights, rope, positions)
        keep = _key_padding(mask, x.shape[0], x.shape[1], "PerformerAttention")
        y = performer_attention(q, k, v, self.w.to(q.dtype), is_causal, keep, self.chunk)
        return self._merge(y)
