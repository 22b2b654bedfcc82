"""Which attention kernel runs: PyTorch's fused `F.scaled_dot_product_attention`, or the visible math of
`tformer.attention.scaled_dot_product_attention` (chapters 1, 9, 14).

    fast_attention     the reference's function through the fused kernels (flash / memory-efficient /
                       CPU flash), GQA included, fully masked rows giving zeros like the reference
    use_fused          the rule `MultiHeadAttention` follows to pick the fused kernel or the math
    cpu_prefers_math   the CPU half of that rule (dropout; short bf16/fp16 training steps)

The rule lives here, apart from the reference, so that `tformer/attention.py` reads as the idea.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
SDPA_HAS_GQA = TORCH_VERSION >= (2, 5)  # F.scaled_dot_product_attention(enable_gqa=...)
# On a CPU in bf16/fp16, the fused kernel's backward is slower than the plain math for short sequences:
# forward + backward on one thread, fused / math = 4.4 at 16 x 16 positions, 3.1 at 32 x 32, 1.8 at
# 128 x 128, 1.0 at 192 x 192, 0.76 at 256 x 256 (its forward alone is always the faster; in float32 it
# always wins). `python benchmarks/bench_cpu_attention.py` measures the crossover on your CPU.
CPU_LOWP_MATH_MAX = 160 * 160             # T_q * T_k up to which training in bf16 on a CPU takes the math


def fast_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                   is_causal: bool = False, dropout_p: float = 0.0) -> torch.Tensor:
    """Same function as the reference through `F.scaled_dot_product_attention` (fused kernels).

    q (B, H, T_q, d), k/v (B, H_kv, T_k, d) with H a multiple of H_kv (grouped-query attention).
    `is_causal` (with no explicit mask) lets PyTorch pick the flash kernel.
    """
    h, h_kv = q.shape[1], k.shape[1]
    kw = {}
    if h != h_kv:
        if SDPA_HAS_GQA:
            kw["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(h // h_kv, 1), v.repeat_interleave(h // h_kv, 1)
    row_ok = None
    if mask is not None:
        row_ok = mask.any(dim=-1, keepdim=True)
        if bool(row_ok.all()):
            row_ok = None
        else:
            mask = mask | ~row_ok          # give empty rows something finite to attend, zeroed below
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                         is_causal=is_causal and mask is None, **kw)
    return out if row_ok is None else out.masked_fill(~row_ok, 0.0)


def use_fused(q: torch.Tensor, t_k: int, dropout_p: float = 0.0, need_reference: bool = False) -> bool:
    """Whether attention on q (B, H, T_q, d) over t_k keys should run fused: not when the caller needs the
    reference (it wants the weights, captures them, or asked for the math), and not where the math is
    faster on a CPU (`cpu_prefers_math`)."""
    return not need_reference and not cpu_prefers_math(q, t_k, dropout_p)


def cpu_prefers_math(q: torch.Tensor, t_k: int, dropout_p: float = 0.0) -> bool:
    """Whether attention on q (B, H, T_q, d) over t_k keys runs faster as the math than fused, on a CPU:
    with dropout, or in a bf16/fp16 step whose backward will run over at most CPU_LOWP_MATH_MAX pairs."""
    if q.device.type != "cpu":
        return False
    return dropout_p > 0.0 or (q.dtype in (torch.bfloat16, torch.float16) and q.shape[-2] * t_k <= CPU_LOWP_MATH_MAX
                               and torch.is_grad_enabled() and q.requires_grad)
