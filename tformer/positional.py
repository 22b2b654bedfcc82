"""Positional information (chapters 4 and 8).

Attention alone is permutation-equivariant: shuffle the tokens and the outputs shuffle the same way.
Order enters through positions:
  * sinusoidal (the paper): PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same); tensor2tensor
    and Marian keep the same numbers concatenated (every sin, then every cos): `sinusoidal_permutation`
  * learned: a trainable table, one vector per position
  * RoPE: rotate each (q, k) feature pair by an angle proportional to the position, so q.k depends
    only on the relative offset; with position interpolation, NTK-aware and YaRN scaling for contexts
    longer than the training length.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .utils.checks import check_rank


def sinusoidal_table(max_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """(max_len, d_model): even features sin(pos * w_i), odd features cos(pos * w_i), w_i = base^(-2i/d)."""
    if d_model % 2:
        raise ValueError(f"sinusoidal_table: d_model must be even, got {d_model}")
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)                     # (L, 1)
    w = torch.exp(-math.log(base) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * w)
    pe[:, 1::2] = torch.cos(pos * w)
    return pe.float()


def sinusoidal_shift_matrix(k: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """(d_model, d_model) M_k with PE[pos + k] = M_k @ PE[pos] for every pos (the sinusoidal table).

    Block diagonal: feature pair (sin(pos w_i), cos(pos w_i)) is rotated by the angle k w_i,
        [sin((pos+k) w)]   [ cos(k w)  sin(k w)] [sin(pos w)]
        [cos((pos+k) w)] = [-sin(k w)  cos(k w)] [cos(pos w)]
    so the offset between two positions is a fixed linear map that does not depend on pos.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal_shift_matrix: d_model must be even, got {d_model}")
    w = torch.exp(-math.log(base) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    c, s = torch.cos(k * w), torch.sin(k * w)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    i = torch.arange(0, d_model, 2)
    m[i, i], m[i, i + 1], m[i + 1, i], m[i + 1, i + 1] = c, s, -s, c
    return m.float()


def sinusoidal_permutation(d_model: int) -> torch.Tensor:
    """(d_model,) feature order [0, 2, 4, ..., 1, 3, 5, ...]: `sinusoidal_table(L, d)[:, perm]` is the
    concatenated layout of tensor2tensor and Marian, every sin(pos w_i) in the first half and every
    cos(pos w_i) in the second. The same table up to this fixed permutation of the features: a model's first
    layer sees the same information either way, with its input weights permuted to match."""
    if d_model % 2:
        raise ValueError(f"sinusoidal_permutation: d_model must be even, got {d_model}")
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to (B, T, d_model) embeddings (no parameters).

    layout "interleaved" (the paper's formula, sin and cos alternating) or "concat" (every sin, then every
    cos: tensor2tensor's and Marian's; `sinusoidal_permutation`)."""

    def __init__(self, d_model: int, max_len: int = 4096, layout: str = "interleaved"):
        super().__init__()
        if layout not in ("interleaved", "concat"):
            raise ValueError(f"SinusoidalPositionalEncoding: layout must be 'interleaved' or 'concat', got {layout!r}")
        self.max_len, self.layout = max_len, layout
        pe = sinusoidal_table(max_len, d_model)
        self.register_buffer("pe", pe if layout == "interleaved" else pe[:, sinusoidal_permutation(d_model)],
                             persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        check_rank(x, 3, "SinusoidalPositionalEncoding(x)", "(B, T, d_model)")
        t = x.shape[1]
        if offset + t > self.max_len:
            raise ValueError(f"SinusoidalPositionalEncoding: positions up to {offset + t} exceed max_len={self.max_len}")
        return x + self.pe[offset:offset + t].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a trainable (max_len, d_model) table; it cannot say anything about positions >= max_len."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def forward(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model) at positions offset..offset+T-1, or at `positions` (B, T), each row its own."""
        check_rank(x, 3, "LearnedPositionalEmbedding(x)", "(B, T, d_model)")
        last = offset + x.shape[1] - 1 if positions is None else int(positions.max())
        if last >= self.max_len:
            raise ValueError(f"LearnedPositionalEmbedding: position {last} is past the {self.max_len} it was "
                             "built for")
        return x + (self.weight[offset:last + 1] if positions is None else self.weight[positions])


def rope_frequencies(head_dim: int, base: float = 10000.0, scaling: str | None = None, factor: float = 1.0,
                     original_max_len: int = 2048, beta_fast: float = 32.0, beta_slow: float = 1.0
                     ) -> tuple[torch.Tensor, float]:
    """Rotation frequencies (head_dim/2,) and the attention scale for a RoPE variant.

    scaling=None: theta_i = base^(-2i/d).
    "linear" (position interpolation): theta_i / factor, i.e. positions squeezed into the trained range.
    "ntk" (NTK-aware): keep high frequencies, stretch low ones, by raising the base to
        base * factor^(d / (d - 2)).
    "yarn": interpolate only the dimensions whose wavelength is long compared with the training
        length (a linear ramp over the dimension index, from the dimension that turns beta_fast times
        within original_max_len to the one that turns beta_slow times), and scale attention by
        0.1 ln(factor) + 1.
    """
    if head_dim % 2:
        raise ValueError(f"rope_frequencies: head_dim must be even, got {head_dim}")
    i = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim          # 2i/d
    inv = base ** (-i)
    scale = 1.0
    if scaling is None or factor == 1.0:
        pass
    elif scaling == "linear":
        inv = inv / factor
    elif scaling == "ntk":
        inv = (base * factor ** (head_dim / (head_dim - 2))) ** (-i)
    elif scaling == "yarn":
        # dimension index at which a frequency turns `rot` times within the trained length
        def dim_at(rot: float) -> float:
            return head_dim * math.log(original_max_len / (rot * 2 * math.pi)) / (2 * math.log(base))
        # a linear ramp over the dimension index between those of beta_fast and beta_slow turns, rounded
        # outwards, as in the YaRN authors' code and Hugging Face's `_compute_yarn_parameters`
        low, high = max(math.floor(dim_at(beta_fast)), 0), min(math.ceil(dim_at(beta_slow)), head_dim - 1)
        high = high + 0.001 if low == high else high
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv = inv / factor * ramp + inv * (1 - ramp)                          # ramp 0 = keep, 1 = interpolate
        scale = 0.1 * math.log(factor) + 1.0
    else:
        raise ValueError(f"rope_frequencies: scaling must be None, 'linear', 'ntk' or 'yarn', got {scaling!r}")
    return inv.float(), scale


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE for (B, H, T, head_dim) queries/keys, half-split layout (as in GPT-NeoX and Llama)."""

    def __init__(self, head_dim: int, max_len: int = 4096, base: float = 10000.0, scaling: str | None = None,
                 factor: float = 1.0, original_max_len: int | None = None):
        super().__init__()
        self.head_dim, self.base, self.scaling, self.factor = head_dim, base, scaling, factor
        self.original_max_len = original_max_len or max_len
        inv, self.attn_scale = rope_frequencies(head_dim, base, scaling, factor, self.original_max_len)
        self.register_buffer("inv_freq", inv, persistent=False)
        self._build(max_len)

    def _build(self, length: int) -> None:
        t = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
        ang = torch.outer(t, self.inv_freq)                                  # (L, hd/2)
        ang = torch.cat((ang, ang), dim=-1)                                  # (L, hd)
        self.register_buffer("cos", ang.cos() * self.attn_scale, persistent=False)
        self.register_buffer("sin", ang.sin() * self.attn_scale, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, H, T, head_dim) at positions offset..offset+T-1, or at `positions` (B, T), each row its own
        (a serving step's sequences are at different lengths)."""
        check_rank(x, 4, "RotaryEmbedding(x)", "(B, H, T, head_dim)")
        end = offset + x.shape[-2] if positions is None else int(positions.max()) + 1
        if end > self.cos.shape[0]:
            self._build(max(end, 2 * self.cos.shape[0]))
        if positions is None:
            cos, sin = self.cos[offset:end], self.sin[offset:end]                    # (T, hd)
        else:
            cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]    # (B, 1, T, hd)
        return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)
