"""Batched image augmentation (chapter 12): each image of a batch gets its own random transform.

`random_affine` shifts, rotates, zooms (and optionally flips) through `F.affine_grid`; `random_shift`
moves whole pixels, with no interpolation and so no blur. Both take an optional `torch.Generator`, a CPU one:
the random draws are made on the CPU and moved to the images' device, so a GPU batch is transformed on the
GPU with the same draws a CPU batch would get.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..utils.checks import check_rank


def random_affine(images: torch.Tensor, shift: float = 1.0, degrees: float = 10.0, scale: float = 0.1,
                  flip: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    """Batched random augmentation: each image gets its own shift (+-`shift` pixels), rotation
    (+-`degrees`), zoom (1 +- `scale`) and, with `flip`, a horizontal flip half of the time.
    images (B, C, H, W) -> (B, C, H, W); the background fills with the image minimum."""
    check_rank(images, 4, "random_affine(images)", "(B, C, H, W)")
    b, _, h, w = images.shape
    dev = images.device

    def u(lo, hi):
        return torch.rand(b, generator=generator, device="cpu").to(dev) * (hi - lo) + lo
    ang = u(-degrees, degrees) * math.pi / 180
    s = 1.0 + u(-scale, scale)
    sx = torch.where(u(0, 1) < 0.5, -1.0, 1.0) if flip else torch.ones(b, device=dev)
    tx, ty = u(-shift, shift) * 2 / w, u(-shift, shift) * 2 / h        # pixels -> [-1, 1] coordinates
    cos, sin = torch.cos(ang) / s, torch.sin(ang) / s
    theta = torch.stack([torch.stack([cos * sx, -sin, tx], -1), torch.stack([sin * sx, cos, ty], -1)], 1)  # (B, 2, 3)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    return F.grid_sample(images - low, grid, align_corners=False, padding_mode="zeros") + low


def random_shift(images: torch.Tensor, max_shift: int = 1, generator: torch.Generator | None = None) -> torch.Tensor:
    """Move each image by a random whole number of pixels in [-max_shift, max_shift] along each axis (no
    interpolation, so no blur); the uncovered border takes the image minimum. (B, C, H, W) -> same shape."""
    check_rank(images, 4, "random_shift(images)", "(B, C, H, W)")
    b, _, h, w = images.shape
    s = max_shift
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    padded = F.pad(images - low, (s, s, s, s)) + low                      # (B, C, H+2s, W+2s)
    d = torch.randint(0, 2 * s + 1, (2, b), generator=generator).to(images.device)
    rows = torch.arange(h, device=images.device) + d[0, :, None]          # (B, H)
    cols = torch.arange(w, device=images.device) + d[1, :, None]          # (B, W)
    out = padded[torch.arange(b, device=images.device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2)                                         # (B, H, W, C) -> (B, C, H, W)
