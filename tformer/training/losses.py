"""Losses: label-smoothed cross-entropy (chapter 10) and the language-model objectives (chapter 11)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data.text import IGNORE
from ..moe import collect_aux_loss
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


def lm_loss(model: nn.Module, batch, fused: bool = False) -> tuple[torch.Tensor, int]:
    """The Trainer's loss_fn for (x, y) batches: (sum of `causal_lm_loss` over the tokens, token count);
    in training mode plus the model's auxiliary loss (MoE load balancing, z-loss) weighted per token.
    Validation reports pure cross-entropy. fused=True (a GPT; `fused_lm_loss`): the same sum through
    `model.loss`, the LM head fused into the loss, so the (B*T, V) logits are never materialised."""
    x, y = batch
    if fused:
        loss = model.loss(x, y, reduction="sum")
    else:
        logits = model(x)                                              # (B, T, V)
        loss = causal_lm_loss(logits.float(), targets=y, reduction="sum")
    n = y.numel()
    if model.training:
        loss = loss + collect_aux_loss(model) * n
    return loss, n


def fused_lm_loss(model: nn.Module, batch) -> tuple[torch.Tensor, int]:
    """`lm_loss` with the head fused into the loss (`GPT.loss`): the MoE capstone's loss_fn. At its 4,096
    tokens a batch and a vocabulary of 4,096, the logits, their log-softmax and its backward were about an
    eighth of a CPU training step (benchmarks/RESULTS.md, the capstones against the matmul peak)."""
    return lm_loss(model, batch, fused=True)


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy at the masked positions only. logits (B, T, V); labels (B, T), IGNORE elsewhere."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


class _LinearCrossEntropy(torch.autograd.Function):
    """LM head and cross-entropy in one pass over chunks of tokens, the gradients made during the forward.

    The plain path materialises the (N, V) logits, keeps them for the backward, writes an (N, V) gradient
    and reads both again: at V = 50,257 and N = 2,048 that is 400 MB per pass, most of a small model's
    step on a CPU. Here each chunk's logits live only while the chunk is processed: softmax minus the
    smoothed target is the chunk's logit gradient, turned at once into its share of dh (= g W) and dW
    (+= g^T h). The backward only scales the two stored gradients by the incoming one (the loss is a
    scalar). Without a gradient to make (evaluation, `torch.no_grad`) only the loss is computed. The idea
    of Liger-Kernel's fused linear cross-entropy and of Wijmans et al. (2024), "Cut Your Losses in
    Large-Vocabulary Language Models", in plain PyTorch. Every row counts (the caller drops ignored ones).

    With smoothing eps, row i's loss is lse_i - (1 - eps) z_iy - eps mean_v(z_iv) (F.cross_entropy's
    label_smoothing), and its logit gradient softmax(z_i) - (1 - eps) onehot(y_i) - eps / V.
    """

    @staticmethod
    def forward(ctx, h, weight, target, smoothing, chunk, scale):
        dev = h.device.type
        cast = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        v = weight.shape[0]
        with torch.autocast(dev, enabled=False):
            w = weight.to(cast)
            acc = torch.promote_types(weight.dtype, torch.float32)                 # float32, or float64
            grad_h = torch.empty_like(h) if need_grad else None
            grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_grad else None
            total = torch.zeros((), dtype=acc, device=h.device)
            for i in range(0, h.shape[0], chunk):
                hc, tc = h[i:i + chunk].to(cast), target[i:i + chunk]
                logits = (hc @ w.t()).to(acc)                                      # (c, V), only this chunk
                lse = torch.logsumexp(logits, -1)
                row = lse - (1.0 - smoothing) * logits.gather(1, tc[:, None])[:, 0]
                if smoothing:
                    row = row - smoothing * logits.mean(-1)
                total += row.sum()
                if not need_grad:
                    continue
                g = logits.sub_(lse[:, None]).exp_()                               # softmax, in place
                if smoothing:
                    g.sub_(smoothing / v)
                g[torch.arange(g.shape[0], device=g.device), tc] -= 1.0 - smoothing
                if scale != 1.0:
                    g.mul_(scale)
                gc = g.to(cast)
                grad_h[i:i + chunk] = (gc @ w).to(h.dtype)
                grad_w += (gc.t() @ hc).to(acc)
        if need_grad:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return (total * scale).to(torch.promote_types(h.dtype, torch.float32))

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *, ignore_index: int = IGNORE,
                         smoothing: float = 0.0, chunk: int = 256, reduction: str = "mean") -> torch.Tensor:
    """F.cross_entropy(h @ weight.T, target, label_smoothing=smoothing) without materialising the logits:
    the LM head and the loss fused.

    h (N, d) final hidden states, weight (V, d) the LM head (for a tied model, the embedding table),
    target (N,) class ids; rows whose target is `ignore_index` are dropped before the head (they would
    count nothing: padding costs no FLOPs here). reduction "mean" (over counted rows) or "sum". Memory
    O(chunk x V) instead of O(N x V); the same FLOPs. `chunk` rows at a time: 256 was the fastest of 64 to
    4,096 on one CPU thread under bf16 autocast, forward and backward (137 ms against 254 unfused for
    1,400 rows of 256 at V = 8,000; 2.10 s against 2.57 at 2,048 rows of 384 and V = 50,257). The loss is a
    scalar leaf of the graph: its backward multiplies gradients computed during the forward (so it cannot
    be differentiated twice). Under autocast the matmuls run in the autocast dtype, the softmax in float32.
    """
    check_rank(h, 2, "linear_cross_entropy(h)", "(N, d)")
    check_rank(weight, 2, "linear_cross_entropy(weight)", "(V, d)")
    if h.shape[1] != weight.shape[1] or target.shape != h.shape[:1]:
        raise ValueError(f"linear_cross_entropy: expected h (N, d), weight (V, d), target (N,), got h "
                         f"{tuple(h.shape)}, weight {tuple(weight.shape)}, target {tuple(target.shape)}")
    if reduction not in ("mean", "sum") or chunk < 1:
        raise ValueError(f"linear_cross_entropy: reduction must be mean or sum and chunk >= 1, got "
                         f"{reduction!r}, {chunk}")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"linear_cross_entropy: expected 0 <= smoothing < 1, got {smoothing}")
    keep = target != ignore_index
    if not bool(keep.all()):
        h, target = h[keep], target[keep]                 # (n, d), (n,): the counted rows only
    n = target.shape[0]
    lo, hi = (int(x) for x in target.aminmax()) if n else (0, 0)
    if lo < 0 or hi >= weight.shape[0]:
        raise ValueError(f"linear_cross_entropy: target ids must be in [0, {weight.shape[0]}) or ignore_index "
                         f"({ignore_index}), got {lo}..{hi}")
    scale = 1.0 / max(n, 1) if reduction == "mean" else 1.0
    return _LinearCrossEntropy.apply(h, weight, target, float(smoothing), chunk, scale)
