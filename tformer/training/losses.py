"""Losses: label-smoothed cross-entropy (chapter 10) and the language-model objectives (chapter 11)."""
from __future__ import annotations


import torch
import torch.nn.functional as F

from ..utils.checks import check_rank, check_tokens



def label_smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.1,
                                 ignore_index: int | None = None, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy against a smoothed target: (1 - eps) on the true class + eps / V on every class.

    logits (..., V), target (...) class ids. loss = (1 - eps) * (-log p_y) + eps * mean_v(-log p_v),
    the definition of `F.cross_entropy(label_smoothing=eps)`. Positions whose target is `ignore_index`
    count nothing. reduction: "mean" (over counted positions), "sum" or "none" (shape of `target`).
    Computed in float32 even for bf16/fp16 logits (autocast), else in the logits' dtype.
    """
    if not logits.is_floating_point():
        raise TypeError(f"label_smoothed_cross_entropy: logits must be floating point, got {logits.dtype}")
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"label_smoothed_cross_entropy: expected logits (..., V) and target (...) with the same "
                         f"leading shape, got logits {tuple(logits.shape)} and target {tuple(target.shape)}")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label_smoothed_cross_entropy: expected 0 <= smoothing < 1, got {smoothing}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"label_smoothed_cross_entropy: reduction must be mean, sum or none, got {reduction!r}")
    low = logits.dtype in (torch.float16, torch.bfloat16)
    lprobs = F.log_softmax(logits.float() if low else logits, dim=-1)          # (..., V)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    safe = target.masked_fill(~keep, 0)
    nll = -lprobs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)                  # (...)
    smooth = -lprobs.mean(dim=-1)                                             # (...)
    loss = ((1.0 - smoothing) * nll + smoothing * smooth) * keep
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / keep.sum().clamp(min=1)


IGNORE = -100  # label of positions that carry no loss (F.cross_entropy's ignore_index)


def causal_lm_loss(logits: torch.Tensor, idx: torch.Tensor | None = None, *, targets: torch.Tensor | None = None,
                   ignore_index: int = IGNORE, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: the one LM loss of the package (training loops, timing, Trainer losses).

    logits (B, T, V) from the model on idx (B, T): position t predicts idx[:, t+1], so the last position has
    no target and the first token is never predicted. Or pass `targets` (B, T) already shifted
    (targets[:, t] = the token after position t, as `lm_data.LMBatches` yields them): every position counts.
    Positions whose target is `ignore_index` carry no loss. reduction: "mean" or "sum" (as F.cross_entropy).
    """
    check_rank(logits, 3, "causal_lm_loss(logits)", "(B, T, V)")
    if (idx is None) == (targets is None):
        raise ValueError("causal_lm_loss: pass exactly one of idx (the model's input) or targets= (already shifted)")
    if idx is not None:
        check_tokens(idx, "causal_lm_loss(idx)")
        if logits.shape[:2] != idx.shape:
            raise ValueError(f"causal_lm_loss: logits {tuple(logits.shape)} and idx {tuple(idx.shape)} need the same (B, T)")
        logits, targets = logits[:, :-1], idx[:, 1:]
    elif logits.shape[:2] != targets.shape:
        raise ValueError(f"causal_lm_loss: logits {tuple(logits.shape)} and targets {tuple(targets.shape)} need the same (B, T)")
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), ignore_index=ignore_index, reduction=reduction)


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy at the masked positions only. logits (B, T, V); labels (B, T), IGNORE elsewhere."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
