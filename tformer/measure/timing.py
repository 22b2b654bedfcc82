"""Timing and peak memory, CPU and CUDA alike (chapters 7-9, 15; benchmarks).

    time_fn(fn)                  median wall time of fn() after warm-up (synchronizes CUDA)
    peak_memory(fn)              bytes allocated at the peak of fn() above what was live before
    training_step(...)           one training step as a function (what the timers below and `flash` time,
                                 and the chapters' own loops train with): autocast, scaler, clipping
    train_step_time(model, idx)  median time of one training step (forward, loss, backward, update)
    step_time_vs_length(...)     the same for each sequence length, as table rows
    count_ops(fn)                how many matrix products (or other named aten ops) fn() runs

Peak memory on CUDA is `torch.cuda.max_memory_allocated`. A CPU has no such counter, so on CPU the
function runs under `torch.profiler` with `profile_memory=True`, which records every allocation and
free of PyTorch's CPU allocator; the running sum of those events, in time order, peaks at the answer.
This counts tensors (including temporaries inside fused kernels), not Python objects, and it slows the
function down while it runs: never time and measure memory in the same call.

Timings on a shared machine vary: report medians of several runs and compare within one process.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn

from ..utils.device import amp_dtype
from ..utils.gpu import grad_scaler
from ..training.losses import causal_lm_loss
from ..training.trainer import fusable


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued CUDA work (a no-op on CPU), so a wall clock measures the work itself."""
    device = torch.device(device) if device is not None else None
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], warmup: int = 1, repeat: int = 5,
            device: torch.device | str | None = None) -> float:
    """Median seconds of `fn()` over `repeat` runs after `warmup` runs."""
    if repeat < 1:
        raise ValueError(f"time_fn: repeat must be >= 1, got {repeat}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_interleaved(fns: dict[str, Callable[[], object]], repeat: int = 5, warmup: int = 1,
                     device: torch.device | str | None = None) -> dict[str, float]:
    """Median seconds of each function, run in turns (a, b, a, b, ...) after `warmup` rounds.

    Benchmarks compare a peer with tformer this way so both see the same machine load.
    """
    if repeat < 1:
        raise ValueError(f"time_interleaved: repeat must be >= 1, got {repeat}")
    for _ in range(warmup):
        for f in fns.values():
            f()
    synchronize(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            synchronize(device)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


@contextlib.contextmanager
def _quiet_fd2():
    """Silence C-level stderr (the profiler library prints a line when it starts and stops)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def profiled(fn: Callable[[], object], profile_memory: bool = False):
    """Run fn() under `torch.profiler` (CPU activity: aten calls are recorded on the CPU side, also for CUDA
    ops); return (fn's result, the profiler). The profiler library's start/stop lines are kept out of the
    output (and out of notebooks)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=profile_memory)
    with _quiet_fd2():
        prof.start()
    try:
        out = fn()
    finally:
        with _quiet_fd2():
            prof.stop()
    return out, prof


def _cpu_peak(fn: Callable[[], object]) -> int:
    _, prof = profiled(fn, profile_memory=True)
    cpu = torch._C._autograd.DeviceType.CPU           # a CUDA build may also report device allocations
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == cpu]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:                     # + bytes on allocation, - bytes on free, in time order
        current += e.nbytes()
        peak = max(peak, current)
    return peak


def peak_memory(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Bytes allocated at the peak of `fn()` on `device`, above what was allocated before the call.

    The result `fn` returns counts too (it is alive at the end). Run fn once before measuring if it
    allocates lazily (caches, workspaces) and you want the steady state.
    """
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    if device.type != "cpu":
        raise ValueError(f"peak_memory: supports 'cpu' and 'cuda' devices, got {device}")
    return _cpu_peak(fn)


MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
              "aten::_scaled_dot_product_cudnn_attention")


def count_ops(fn: Callable[[], object], names: Sequence[str] = MATMUL_OPS) -> int:
    """How many times fn() calls the named aten operators (by default: matrix products and fused attention)."""
    _, prof = profiled(fn)
    wanted = set(names)
    return sum(1 for e in prof.events() if e.name in wanted)


def training_step(loss_of: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer,
                  device: torch.device | str, dtype: torch.dtype | None = None,
                  clip: float | None = None) -> Callable[..., torch.Tensor]:
    """One training step as a function, the body every timer here shares (and `flash.lm_throughput`, and
    the chapters' own loops: chapter 8's GPT, chapter 11's GPT and BERT).

    step(*batch) runs loss_of(*batch) (the forward pass and the loss) under autocast to `dtype` (None or
    float32: no autocast; pass the policy's, `tformer.utils.device.amp_dtype(device)`: None on a CPU, fp16 on
    a T4, bf16 on sm80+), backward (through a gradient scaler when dtype is fp16:
    `tformer.utils.gpu.grad_scaler`), clips the gradients' norm at `clip` (after unscaling; None: no
    clipping), takes the optimizer's step, and clears the gradients; it returns the loss. With dtype None it
    is the plain fp32 step, operation for operation. The `Trainer`'s step is this plus what training needs
    and timing does not: (sum, count) losses, accumulation, DDP.
    """
    device = torch.device(device)
    scaler = grad_scaler(dtype, device)
    cast = dtype not in (None, torch.float32)
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def step(*batch) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype if cast else torch.bfloat16, enabled=cast):
            loss = loss_of(*batch)
        scaler.scale(loss).backward()
        if clip is not None:
            scaler.unscale_(optimizer)                  # fp16: the true gradients, before clipping them
            torch.nn.utils.clip_grad_norm_(params, clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def train_step_time(model: nn.Module, idx: torch.Tensor, warmup: int = 1, repeat: int = 3,
                    lr: float = 1e-3, amp: bool | None = None,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = causal_lm_loss) -> float:
    """Median seconds of one training step of `model` (logits = model(idx)) on the batch idx (B, T).

    A step (`training_step`) is forward, loss, backward and an AdamW update, as in training. The model's
    parameters do change; pass a copy if that matters. amp=None: autocast on CUDA (bf16 on sm80+, fp16
    with a gradient scaler before: `tformer.utils.device.amp_dtype`), off on CPU.
    """
    device = idx.device
    amp = amp_dtype(device) is not None if amp is None else amp     # the policy's dtype (tformer.utils.device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=fusable(model.parameters()))
    model.train()
    step = training_step(lambda: loss_fn(model(idx), idx), opt, device,
                         (amp_dtype(device) or torch.bfloat16) if amp else None)
    return time_fn(step, warmup, repeat, device)


@dataclass
class StepTiming:
    name: str                # which model
    seq_len: int             # T
    batch_size: int          # B
    seconds: float           # median time per training step
    tokens_per_s: float      # B * T / seconds


def step_time_vs_length(models: dict[str, Callable[[], nn.Module]], lengths: Sequence[int], batch_size: int,
                        vocab_size: int, device: torch.device | str = "cpu", warmup: int = 1, repeat: int = 3,
                        seed: int = 0, progress: bool = True) -> list[StepTiming]:
    """Time a training step of each model at each sequence length.

    `models` maps a name to a function building a fresh model (built once, moved to `device`).
    Returns one `StepTiming` per (model, length).
    """
    from tqdm import tqdm

    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    rows = []
    jobs = [(name, t) for name in models for t in lengths]
    built: dict[str, nn.Module] = {}
    for name, t in tqdm(jobs, desc="train-step timing", **({} if progress else {"disable": True})):  # env TQDM_DISABLE
        if name not in built:
            torch.manual_seed(seed)
            built[name] = models[name]().to(device)
        idx = torch.randint(0, vocab_size, (batch_size, t), generator=g).to(device)
        sec = train_step_time(built[name], idx, warmup, repeat)
        rows.append(StepTiming(name, t, batch_size, sec, batch_size * t / sec))
    return rows


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None, floatfmt: str = ".3g") -> str:
    """Rows of dicts -> a plain-text table (what the benchmarks and notebooks print)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())

    def cell(v):
        return format(v, floatfmt) if isinstance(v, float) else str(v)

    body = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(b) for b in body])


def training_flops(days: float, n_gpus: int, flops_per_gpu: float) -> float:
    """A training run's cost the way the Transformer paper's Table 2 counts it (chapter 7): wall-clock
    time x number of GPUs x each GPU's sustained FLOP/s (9.5e12 for a P100). Returns FLOPs."""
    seconds = days * 24 * 3600
    return seconds * n_gpus * flops_per_gpu
