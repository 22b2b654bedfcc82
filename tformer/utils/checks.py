"""Input checks shared by the modules: fail early, and say what was expected.

Every public module calls these instead of letting PyTorch broadcast a wrong shape silently.
"""
from __future__ import annotations

import torch


def check_rank(x: torch.Tensor, ndim: int | tuple[int, ...], name: str, layout: str) -> None:
    """Raise if ``x`` does not have ``ndim`` dimensions; ``layout`` names them, e.g. ``"(B, T, C)"``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {layout}, got {type(x).__name__}")
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if x.dim() not in allowed:
        raise ValueError(f"{name}: expected shape {layout} ({' or '.join(map(str, allowed))} dims), "
                         f"got {tuple(x.shape)} ({x.dim()} dims)")


def check_dim(x: torch.Tensor, dim: int, size: int, name: str, what: str) -> None:
    """Raise if ``x.shape[dim] != size``."""
    if x.shape[dim] != size:
        raise ValueError(f"{name}: expected {what} = {size} in dim {dim}, got shape {tuple(x.shape)}")


def check_float(x: torch.Tensor, name: str) -> None:
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")


def check_tokens(idx: torch.Tensor, name: str = "idx") -> None:
    """Token ids: an integer tensor of shape (B, T)."""
    check_rank(idx, 2, name, "(B, T) of token ids")
    if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"{name}: expected integer token ids (torch.long), got dtype {idx.dtype}")


def check_mask(mask: torch.Tensor, t_q: int, t_k: int, name: str = "mask") -> None:
    """A boolean attention mask, True = may attend, broadcastable to (..., T_q, T_k).

    The last two dims must each be the full length or 1; a float mask (additive -inf style) is rejected
    because True/False and 0/-inf mean opposite things for the same-looking tensor.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}: expected a bool tensor broadcastable to (..., {t_q}, {t_k}), "
                        f"got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name}: expected dtype torch.bool (True = may attend) broadcastable to "
                        f"(..., {t_q}, {t_k}), got {mask.dtype}. Convert an additive float mask with "
                        f"`mask == 0`, or a 0/1 mask with `mask.bool()`.")
    if mask.dim() < 2:
        raise ValueError(f"{name}: expected a bool mask broadcastable to (..., {t_q}, {t_k}) "
                         f"(at least 2 dims), got shape {tuple(mask.shape)}")
    mq, mk = mask.shape[-2:]
    if mq not in (1, t_q) or mk not in (1, t_k):
        raise ValueError(f"{name}: expected shape broadcastable to (..., T_q={t_q}, T_k={t_k}), "
                         f"got {tuple(mask.shape)}")
