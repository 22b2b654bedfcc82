"""Seeded inputs shared by the exercises: attention tensors with the edge cases every check runs."""
from __future__ import annotations

import torch

from ..masks import causal_mask
from .core import Case


def qkv(seed: int, b: int = 2, h: int = 2, t_q: int = 5, t_k: int | None = None, d: int = 8,
        dtype=torch.float32, d_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (b, h, t_q, d), k (b, h, t_k, d), v (b, h, t_k, d_v); d_v defaults to d."""
    g = torch.Generator().manual_seed(seed)
    t_k = t_q if t_k is None else t_k
    d_v = d if d_v is None else d_v
    return tuple(torch.randn(b, h, t, dd, generator=g, dtype=dtype) for t, dd in ((t_q, d), (t_k, d), (t_k, d_v)))


def attention_edge_cases() -> list[Case]:
    """Length 1, batch of 1, a fully padded row, causal + padding, non-contiguous input, d_v != d_k."""
    q1, k1, v1 = qkv(0, b=1, h=1, t_q=1, d=4)
    q, k, v = qkv(1, b=2, h=2, t_q=4, d=8)
    pad = torch.tensor([[True, True, True, False], [False, False, False, False]])[:, None, None, :]  # row 2: all padding
    causal_pad = causal_mask(4) & torch.tensor([[True, True, True, False], [True, True, True, True]])[:, None, None, :]
    qt, kt, vt = (x.transpose(-2, -1).contiguous().transpose(-2, -1) for x in qkv(2, b=2, h=2, t_q=6, d=4))
    return [
        Case("length 1", (q1, k1, v1)),
        Case("batch of 1, no mask", qkv(3, b=1, h=1, t_q=3, d=4)),
        Case("cross-attention: T_q=3, T_k=5", qkv(4, b=2, h=1, t_q=3, t_k=5, d=4)),
        Case("fully padded row (batch 2 is all padding)", (q, k, v), {"mask": pad}),
        Case("causal plus padding", (q, k, v), {"mask": causal_pad}),
        Case("non-contiguous input", (qt, kt, vt)),
        Case("values wider than keys: d_k=4, d_v=9", qkv(5, b=1, h=2, t_q=3, t_k=4, d=4, d_v=9)),
    ]


def attention_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(1000 + seed)
    b, h, t_q, t_k, d = (int(torch.randint(1, n, (1,), generator=g)) for n in (4, 4, 9, 9, 17))
    d_v = d if seed % 3 else int(torch.randint(1, 17, (1,), generator=g))      # every third: d_v != d_k
    q, k, v = qkv(1000 + seed, b, h, t_q, t_k, d, d_v=d_v)
    mask = torch.rand(b, 1, t_q, t_k, generator=g) > 0.3 if seed % 2 else None
    return Case(f"random #{seed}: B={b} H={h} T_q={t_q} T_k={t_k} d_k={d} d_v={d_v}"
                + (" with mask" if mask is not None else ""),
                (q, k, v), {"mask": mask}, seed=1000 + seed)
