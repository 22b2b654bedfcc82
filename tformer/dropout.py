"""Dropout (Srivastava et al., 2014) with a mask that is cheap to draw on a CPU (chapter 10 times it).

In training each element is zeroed with probability p and the survivors are scaled by 1 / (1 - p), so
the expected output is the input; in evaluation dropout is the identity.

Why not `F.dropout` on a CPU: it draws one Mersenne-Twister number per element (`bernoulli_`), 10-15 ns
each on this course's 2-core machine. In the translation capstone's training step that is 30% of the
time (torch profiler, 2 threads, bf16 autocast: 32 dropout calls per step), and 27% of the ViT
capstone's. Here one 64-bit draw serves four elements:

    random_() on int64    uniform on [0, 2^63): 63 random bits, the top one always 0
    view as 4 x int16     four 16-bit words; keep each word's low 15 bits: uniform on [0, 2^15)
    keep where word >= c  c = round(p * 2^15): the drop rate is c / 2^15, within 2^-16 of p

and the survivors are scaled by the exact keep rate, so the expectation is still the input. The same
generator (`torch.manual_seed` and the Trainer's saved RNG state reproduce it). About 2x faster than
`F.dropout` on a (100, 16, 1024) activation; the translation training step 1.2x faster
(benchmarks/bench_translate.py). On a GPU `F.dropout` draws with a fused Philox kernel and is used as is.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

WORD_BITS = 15                       # bits used of each 16-bit word (the draw's top bit, in the last word, is always 0)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu",
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, float]:
    """A random bool mask of `shape`, True = keep, each element dropped with probability ~p (to 2^-16),
    and the exact keep rate 1 - c / 2^15 that scales the survivors."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    n = math.prod(shape)
    cut = round(p * 2 ** WORD_BITS)
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(generator=generator)
    words = draws.view(torch.int16)[:n] & (2 ** WORD_BITS - 1)          # (n,) uniform on [0, 2^15)
    return (words >= cut).view(shape), 1.0 - cut / 2 ** WORD_BITS


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)` with the cheap CPU mask above; any shape and float dtype."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    keep, rate = keep_mask(x.shape, p, x.device)
    if rate == 0.0:                                       # p within 2^-16 of 1: every element dropped
        return x * 0.0
    return x * keep.to(x.dtype).mul_(1.0 / rate)          # one multiply forward and backward


class Dropout(nn.Dropout):
    """`nn.Dropout` (same `p`, same place in a model) drawing its mask with `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
