"""The capstone's GPU path (chapter 13): force the flash kernel, see which kernel ran, tokens/s and MFU.

`F.scaled_dot_product_attention` picks one of several kernels (flash, memory-efficient, cuDNN, math)
and silently falls back to a slower one when the fast one cannot take the input (fp32 on a GPU, an
explicit mask, a head size it does not support). Inside `force_flash()` only the flash kernel is
allowed, so such an input raises a RuntimeError instead of running slowly. `run_with_flash(fn)` also
proves that the flash kernel *did* run (a model can bypass SDPA entirely, e.g. when it records
attention weights): it runs fn under the profiler and raises unless a flash kernel shows up.

MFU (model FLOPs utilisation) = achieved model FLOP/s / the chip's peak, counted one way everywhere:
training FLOPs per token follow the PaLM / nanoGPT estimate, 6 N + 12 L d T: N the non-embedding
parameters used per token (for an MoE, the active ones), and attention scores and values over T
positions in L layers of width d; the peak is the datasheet's dense bf16 figure (989 TFLOP/s for an
H100/H200 SXM; a T4, which has no bf16, its fp16 65 TFLOP/s), from `tformer.utils.gpu.peak_flops`.

On a GPU older than sm80 (a T4 is sm75) there is no flash kernel: `lm_throughput` then uses fp16 with a
gradient scaler and SDPA's memory-efficient kernel (`tformer.utils.gpu` decides, by compute capability).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..utils.device import amp_dtype, attention_backend, flash_available
from ..utils.gpu import PEAK_FLOPS, peak_flops
from ..moe import collect_aux_loss
from ..training.losses import causal_lm_loss
from ..training.trainer import fusable
from .timing import profiled, time_fn, training_step

# the aten operator each SDPA backend runs (the profiler records it), and a short name for it
_KERNELS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}

PEAK_BF16_FLOPS = PEAK_FLOPS   # the table lives in tformer.utils.gpu (one place)


@contextlib.contextmanager
def force_flash():
    """Allow only the flash backend of `F.scaled_dot_product_attention` inside the block.

    An input the flash kernel cannot take raises RuntimeError ("No available kernel") instead of
    falling back to another kernel. On a CPU this is PyTorch's CPU flash kernel.
    """
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        yield


def sdpa_backends_used(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run fn() under `torch.profiler`; return (fn's result, the SDPA kernels it ran, e.g. ["flash"])."""
    out, prof = profiled(fn)
    names = {e.name for e in prof.events()}
    return out, sorted({short for op, short in _KERNELS.items() if op in names})


def run_with_flash(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """fn() with only the flash kernel allowed; raise RuntimeError unless a flash kernel actually ran.

    Returns (fn's result, kernels that ran). Use it once to prove the path, then `force_flash()` for speed.
    """
    with force_flash():
        out, used = sdpa_backends_used(fn)
    if not any(u.startswith("flash") for u in used):
        raise RuntimeError(f"run_with_flash: no flash-attention kernel ran (SDPA kernels seen: {used or 'none'}); "
                           "the model bypassed F.scaled_dot_product_attention (recording attention weights? "
                           "fast=False?)")
    return out, used


def lm_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of a `tformer.models.GPT`: 6 N + 12 L d T, with N its
    active non-position-embedding parameters (the tied LM head's matmul is counted through the embedding)."""
    cfg = model.cfg
    n = model.num_params(non_embedding=True, active=True)
    return 6 * n + 12 * cfg.n_layers * cfg.d_model * seq_len


def lm_throughput(model: nn.Module, batch_size: int, seq_len: int, steps: int = 10, warmup: int = 3,
                  dtype: torch.dtype | None = None, flash: bool | None = None, lr: float = 1e-4,
                  compile: bool = False) -> dict[str, Any]:
    """Train a `tformer.models.GPT` on random tokens for a few steps; measure tokens/s and MFU.

    On CUDA: bf16 autocast and (by default) the flash kernel forced, after proving once that it runs; on a
    GPU older than sm80, fp16 with a gradient scaler and the memory-efficient kernel (`tformer.utils.gpu`).
    `compile=True` runs the model through `torch.compile` (the first steps compile; warmup covers them).
    Each step: forward, cross-entropy + MoE aux loss, backward, AdamW. Returns a dict: tokens_per_s,
    step_s (median), flops_per_token, mfu (None without a known peak), backends (SDPA kernels seen),
    device, dtype.
    """
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    dtype = dtype or amp_dtype(device) or torch.float32
    flash = (cuda and flash_available(device)) if flash is None else flash
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=fusable(model.parameters()))
    step_model = torch.compile(model) if compile else model
    g = torch.Generator(device="cpu").manual_seed(0)
    idx = torch.randint(0, model.cfg.vocab_size, (batch_size, seq_len + 1), generator=g).to(device)
    x, y = idx[:, :-1], idx[:, 1:]

    def loss_of():
        loss = causal_lm_loss(step_model(x).float(), targets=y)
        return loss + collect_aux_loss(model)                          # the MoE layers' losses (0 if none)

    step = training_step(loss_of, opt, device, dtype)                    # the one step body of tformer.measure.timing

    if flash:
        _, backends = run_with_flash(step)
    else:
        _, backends = sdpa_backends_used(step)
    if flash:
        ctx = force_flash()
    elif cuda:                                   # no flash kernel here (sm < 80): the memory-efficient one
        ctx = sdpa_kernel([attention_backend(device)])
    else:
        ctx = contextlib.nullcontext()
    with ctx:
        step_s = time_fn(step, warmup=warmup, repeat=steps, device=device)   # the shared step timer
    tokens_per_s = batch_size * seq_len / step_s
    fpt = lm_flops_per_token(model, seq_len)
    peak = peak_flops(device, dtype)
    return {"tokens_per_s": tokens_per_s, "step_s": step_s, "flops_per_token": fpt,
            "mfu": tokens_per_s * fpt / peak if peak else None, "backends": backends,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu", "dtype": str(dtype).replace("torch.", "")}
