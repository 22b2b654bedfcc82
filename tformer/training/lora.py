"""LoRA: low-rank adapters (Hu et al. 2021) on a model's linear projections (chapter 11).

A frozen weight W (out, in) gets a trainable update of rank r, scaled by alpha / r:

    y = x W^T + b + (alpha / r) * x A^T B^T          A (r, in) random, B (out, r) zeros at the start

so at the start the adapted model is the pretrained one, and training touches r * (in + out) numbers per
projection instead of in * out. After training the update folds into W (W + (alpha / r) B A): the merged
model has the original shape and costs nothing extra at inference.

    add_lora(gpt, r=8, alpha=16)         # every attention/FFN projection (qkv, out, fc1, fc2) adapted,
                                         # everything else frozen
    trainable, total = trainable_params(gpt)
    merge_lora(gpt)                      # back to plain nn.Linear layers with W + (alpha / r) B A
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_TARGETS = ("qkv", "out", "fc1", "fc2")   # GPT's attention and FFN projections (tformer.blocks)


def lora_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, A: torch.Tensor, B: torch.Tensor,
                 alpha: float) -> torch.Tensor:
    """x (..., in) -> x W^T + b + (alpha / r) x A^T B^T (..., out); A (r, in), B (out, r)."""
    r = A.shape[0]
    if A.shape[1] != x.shape[-1] or B.shape != (weight.shape[0], r):
        raise ValueError(f"lora_forward: expected A (r, in={x.shape[-1]}) and B (out={weight.shape[0]}, r), "
                         f"got A {tuple(A.shape)}, B {tuple(B.shape)}")
    return F.linear(x, weight, bias) + (alpha / r) * F.linear(F.linear(x, A), B)


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable rank-r update."""

    def __init__(self, base: nn.Linear, r: int = 8, alpha: float = 16.0):
        super().__init__()
        if r < 1:
            raise ValueError(f"LoRALinear: rank r must be >= 1, got {r}")
        self.base, self.r, self.alpha = base, r, alpha
        base.requires_grad_(False)
        self.A = nn.Parameter(torch.empty(r, base.in_features, device=base.weight.device, dtype=base.weight.dtype))
        self.B = nn.Parameter(torch.zeros(base.out_features, r, device=base.weight.device, dtype=base.weight.dtype))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))     # as nn.Linear (and peft) initialise A

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lora_forward(x, self.base.weight, self.base.bias, self.A, self.B, self.alpha)

    def merged(self) -> nn.Linear:
        """A plain nn.Linear with W + (alpha / r) B A (and the same bias)."""
        lin = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None,
                        device=self.base.weight.device, dtype=self.base.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(self.base.weight + (self.alpha / self.r) * self.B @ self.A)
            if self.base.bias is not None:
                lin.bias.copy_(self.base.bias)
        return lin


def _replace(model: nn.Module, pick, make) -> int:
    n = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if pick(child_name, child):
                setattr(module, child_name, make(child))
                n += 1
    return n


def add_lora(model: nn.Module, r: int = 8, alpha: float = 16.0, targets: tuple[str, ...] = DEFAULT_TARGETS) -> nn.Module:
    """Freeze every parameter of `model` and wrap each nn.Linear named in `targets` in a LoRALinear (in place)."""
    model.requires_grad_(False)
    n = _replace(model, lambda name, m: name in targets and isinstance(m, nn.Linear), lambda m: LoRALinear(m, r, alpha))
    if n == 0:
        raise ValueError(f"add_lora: no nn.Linear named one of {targets} in {type(model).__name__}")
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its weight: each LoRALinear becomes a plain nn.Linear (in place)."""
    _replace(model, lambda name, m: isinstance(m, LoRALinear), lambda m: m.merged())
    return model


def trainable_params(model: nn.Module) -> tuple[int, int]:
    """(parameters that require grad, all parameters), shared tensors counted once."""
    seen, trainable, total = set(), 0, 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
            trainable += p.numel() if p.requires_grad else 0
    return trainable, total


__all__ = ["lora_forward", "LoRALinear", "add_lora", "merge_lora", "trainable_params", "DEFAULT_TARGETS"]
