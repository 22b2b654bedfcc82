"""Seeded inputs shared by the exercises: attention tensors with the edge cases every check runs."""
from __future__ import annotations

import torch

from ..masks import causal_mask
from .core import Case


def qkv(seed: int, b: int = 2, h: int = 2, t_q: int = 5, t_k: int | None = None, d: int = 8,
        dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t_k = t_q if t_k is None else t_k
    return tuple(torch.randn(b, h, t, d, generator=g, dtype=dtype) for t in (t_q, t_k, t_k))


def attention_edge_cases() -> list[Case]:
    """Length 1, batch of 1, a fully padded row, causal + padding, non-contiguous input."""
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
    ]


def attention_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(1000 + seed)
    b, h, t_q, t_k, d = (int(torch.randint(1, n, (1,), generator=g)) for n in (4, 4, 9, 9, 17))
    q, k, v = qkv(1000 + seed, b, h, t_q, t_k, d)
    mask = torch.rand(b, 1, t_q, t_k, generator=g) > 0.3 if seed % 2 else None
    return Case(f"random #{seed}: B={b} H={h} T_q={t_q} T_k={t_k} d={d}" + (" with mask" if mask is not None else ""),
                (q, k, v), {"mask": mask}, seed=1000 + seed)
