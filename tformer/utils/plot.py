"""Small matplotlib helpers for the notebooks: attention heat maps and curves.

    heatmap(w)                  one (T_q, T_k) attention matrix
    heads_grid(w)               every head of a (H, T_q, T_k) (or (L, H, T_q, T_k)) stack, one panel each
    curves(x, {"a": ya, ...})   several y-series over the same x, optionally on log axes

Each returns the matplotlib Axes (or Figure) so a notebook can add titles, limits or asserts.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch


def _plt():
    import matplotlib.pyplot as plt
    return plt


def _to_2d(w) -> "torch.Tensor":
    w = torch.as_tensor(w).detach().float().cpu()
    if w.dim() != 2:
        raise ValueError(f"heatmap: expected a (T_q, T_k) matrix, got shape {tuple(w.shape)}")
    return w


def heatmap(weights, ax=None, x_labels: Sequence[str] | None = None, y_labels: Sequence[str] | None = None,
            title: str | None = None, vmin: float | None = 0.0, vmax: float | None = None, cmap: str = "viridis",
            colorbar: bool = True):
    """Plot attention weights (T_q, T_k): rows are queries, columns keys. Returns the Axes."""
    plt = _plt()
    w = _to_2d(weights)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.3 * w.shape[1] + 2, 0.3 * w.shape[0] + 1.5))
    im = ax.imshow(w.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    for labels, setter, rot in ((x_labels, ax.set_xticks, 90), (y_labels, ax.set_yticks, 0)):
        if labels is not None:
            setter(range(len(labels)), labels=list(labels), rotation=rot, fontsize=7)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    if title:
        ax.set_title(title, fontsize=9)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def heads_grid(weights, titles: Sequence[str] | None = None, labels: Sequence[str] | None = None,
               suptitle: str | None = None, ncols: int | None = None, size: float = 2.4):
    """One heat map per head. weights (H, T_q, T_k), or (L, H, T_q, T_k) for a row per layer. Returns the Figure."""
    plt = _plt()
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() == 3:
        w = w.unsqueeze(0)
    if w.dim() != 4:
        raise ValueError(f"heads_grid: expected (H, T_q, T_k) or (L, H, T_q, T_k), got shape {tuple(w.shape)}")
    n_layers, n_heads = w.shape[:2]
    ncols = ncols or n_heads
    nrows = n_layers * -(-n_heads // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows), squeeze=False)
    for idx, ax in enumerate(axes.flat):
        layer, head = divmod(idx, n_heads)
        if layer >= n_layers:
            ax.axis("off")
            continue
        t = titles[idx] if titles is not None else (f"layer {layer} head {head}" if n_layers > 1 else f"head {head}")
        heatmap(w[layer, head], ax=ax, title=t, x_labels=labels, y_labels=labels, colorbar=False)
        if labels is None:
            ax.set_xticks([]), ax.set_yticks([])
        ax.set_xlabel(""), ax.set_ylabel("")
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def curves(x, ys: Mapping[str, Sequence[float]], xlabel: str = "", ylabel: str = "", title: str | None = None,
           logx: bool = False, logy: bool = False, ax=None, marker: str = "o"):
    """Several series over the same x (a dict label -> values). Returns the Axes."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    x = list(x)
    for label, y in ys.items():
        y = [float(v) for v in y]
        if len(y) != len(x):
            raise ValueError(f"curves: series {label!r} has {len(y)} values for {len(x)} x values")
        ax.plot(x, y, marker=marker, ms=3, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    if len(ys) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax
