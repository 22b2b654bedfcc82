"""What this accelerator can do (training, chapter 13, the benchmarks use it). Which device, autocast dtype
and SDPA kernel to use, and why, is the policy's: `tformer.utils.device` (`amp_dtype`, `attention_backend`,
`capability`, `flash_available`), the one place it is explained. Here, what follows from the hardware:

    grad_scaler         the gradient scaler fp16 training needs (a pass-through otherwise)
    why_no_flash        one sentence saying why flash cannot be forced here
    grouped_mm_fast     whether `F.grouped_mm` is one kernel here (sm90/sm100, or a CPU): MoE's "auto" dispatch
    dist_plan           process-group backend and device for a run under torchrun: from the run's device,
                        not from whether a GPU happens to be present
    peak_flops          the datasheet's dense bf16/fp16 peak, for MFU

Every function takes an optional `capability` (or GPU count) so the choice can be tested on a CPU by
injecting one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .device import choose, flash_available, resolve as _resolve, resolve_capability


def grad_scaler(dtype: torch.dtype | None, device: torch.device | str = "cuda") -> torch.amp.GradScaler:
    """A GradScaler, enabled only for fp16 (a disabled scaler passes everything through unchanged)."""
    return torch.amp.GradScaler(torch.device(device).type, enabled=dtype == torch.float16)


def why_no_flash(device: torch.device | str | None = None, capability: tuple[int, int] | None = None) -> str | None:
    """One sentence saying why flash cannot be forced here and what runs instead; None when it can."""
    device, cap = resolve_capability(device, capability)
    if flash_available(device, cap):
        return None
    if device.type != "cuda":
        return f"SDPA has no flash kernel on {device.type}"
    return (f"this GPU is sm{cap[0]}{cap[1]}; the flash kernel needs sm80 or newer (Ampere), so SDPA's "
            f"memory-efficient kernel runs instead: also O(T) memory, without the T x T score matrix, but slower")


# Compute capabilities (majors) where PyTorch's grouped matmul (`F.grouped_mm`, bf16) runs its CUTLASS kernel:
# Hopper (sm90) and datacenter Blackwell (sm100). Elsewhere `_grouped_mm_cuda` takes `_grouped_mm_fallback`
# (aten/src/ATen/native/cuda/GroupedBlas.cpp, as of PyTorch 2.10): the group offsets are copied to the host
# and the experts run one `mm` each, a device-to-host sync per matmul. (Builds on CUDA >= 13.3 may also route
# some shapes through cuBLASLt's grouped GEMM; this rule does not count on it.)
GROUPED_MM_KERNEL_MAJORS = (9, 10)


def grouped_mm_fast(device: torch.device | str | None = None, capability: tuple[int, int] | None = None) -> bool:
    """True where `F.grouped_mm` is a single kernel with no host sync: an sm90/sm100 GPU, or a CPU (whose
    loop over experts needs no sync). An A100 (sm80) or a T4 gets False: MoE "auto" dispatch pads instead."""
    device, cap = resolve_capability(device, capability)
    if device.type == "cpu":
        return True
    return device.type == "cuda" and cap[0] in GROUPED_MM_KERNEL_MAJORS


@dataclass
class DistPlan:
    backend: str                 # "nccl" or "gloo"
    device: torch.device         # this rank's device


def dist_plan(device: torch.device | str | None, local_rank: int, local_world: int,
              n_gpus: int | None = None) -> DistPlan:
    """Backend and device of one rank. `device` is the run's device ("cpu", "cuda"; None = cuda when a GPU
    is present). A CPU run uses gloo even on a GPU machine; a CUDA run uses NCCL, one GPU per rank, and is
    refused when this machine runs more ranks than it has GPUs (two ranks cannot share one GPU under NCCL)."""
    n_gpus = torch.cuda.device_count() if n_gpus is None else n_gpus
    dev = torch.device(device) if device is not None else _policy_device(n_gpus)
    if dev.type != "cuda":
        return DistPlan("gloo", dev)
    if local_world > n_gpus:
        raise RuntimeError(f"{local_world} ranks on this machine but {n_gpus} CUDA GPU(s): run at most {n_gpus} "
                           f"rank(s) per machine (torchrun --nproc-per-node {max(n_gpus, 1)}) or train on the CPU")
    return DistPlan("nccl", torch.device("cuda", local_rank))


def _policy_device(n_gpus: int) -> torch.device:
    """The policy's device for a distributed run: MPS is left out (no process-group backend runs on it)."""
    return choose(capstone=True, cuda=n_gpus > 0, mps=False).device


def local_world_size() -> int:
    """Ranks on this machine, as torchrun describes them (LOCAL_WORLD_SIZE, else WORLD_SIZE)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


# dense bf16/fp16 tensor-core peak FLOP/s from the vendors' datasheets (SXM parts, without sparsity),
# matched against the device name; the T4 has no bf16: its figure is fp16 (65 TFLOP/s)
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12,
              "T4": 65e12}


def peak_flops(device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16,
               name: str | None = None) -> float | None:
    """The datasheet's dense 16-bit peak FLOP/s of a known CUDA GPU (None on a CPU, in fp32, or unknown).
    `name` overrides the device name (to test the table on a CPU)."""
    if name is None:
        device = _resolve(device)
        if device.type != "cuda":
            return None
        name = torch.cuda.get_device_name(device)
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    # longest key first: "L40S" before "L4", "H100" is not inside "H200"
    return next((PEAK_FLOPS[k] for k in sorted(PEAK_FLOPS, key=len, reverse=True) if k in name), None)
