"""The machine a run is on: a probe of its speed, and the class of machines it belongs to.

    p = probe()        # ~0.6 s: float32 matrix products at the capstones' shapes, with this process's torch
                       # threads; bf16 (CPU) or fp16/bf16 (CUDA) where the device policy would train in it
    print(p.line())    # "this CPU (AMD EPYC 7B12): 68 GFLOP/s float32, 2 threads"
    c = classify(p)    # the MachineClass it falls in: c.name is "cpu-avx2", "cpu-bf16", "cpu-fast", "mps",
                       # "gpu-fp16" or "gpu"

`CLASSES` is the one table of machine classes: how a machine is recognised, and what a learner can expect
there, each row measured on such a machine (`benchmarks/RESULTS.md` has the commands) or marked an estimate
with how it was made. `tformer doctor` prints the probe and its class's row; the README's hardware table is
written from the table (`markdown_table`, checked by tests/test_machine.py).
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable


def cpu_model() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) Platinum 8488C"), from /proc/cpuinfo on Linux, else platform."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class Probe:
    """What `probe()` measured. Rates in GFLOP/s (2 n^3 per n x n product); None where not measured."""
    device: str                   # "cpu", "cuda" or "mps"
    name: str                     # the CPU's model, or the GPU's name
    threads: int                  # torch's CPU threads during the probe
    float32: float                # float32 matmul
    low: float | None = None      # the policy's low precision: bf16 on a CPU with bf16 units, fp16/bf16 on CUDA
    low_dtype: str | None = None  # "bf16" or "fp16"
    bf16_units: bool = False      # a CPU with bf16 matrix instructions (Intel AMX, AVX512-BF16)
    capability: tuple | None = None   # a CUDA GPU's compute capability
    seconds: float = 0.0          # how long the probe took

    def line(self) -> str:
        where = {"cpu": "this CPU", "cuda": "this GPU", "mps": "this Mac's GPU (MPS)"}[self.device]
        low = f", {self.low:,.0f} {self.low_dtype}" if self.low else ""
        threads = f", {self.threads} thread{'s' * (self.threads != 1)}" if self.device == "cpu" else ""
        return f"{where} ({self.name}): {self.float32:,.0f} GFLOP/s float32{low}{threads}"

    def as_dict(self) -> dict:
        return asdict(self)


def _rate(n: int, dtype, device, seconds: float, windows: int = 5) -> float:
    """GFLOP/s of an n x n matrix product in `dtype` on `device`: the best of `windows` timings that take about
    `seconds` together, after a warm-up. The best, not the mean: a machine is never faster than it is, but a
    thread pool waking up, a frequency step or a neighbour's burst makes one window slow. On 2 cores of a
    shared VM, single half-second timings ranged over 102-162 GFLOP/s, best-of-five probes mostly 165-175, yet
    one in six still read 89: no class boundary should sit near a machine's own rate."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (
        torch.mps.synchronize if device.type == "mps" else (lambda: None))
    a @ b
    sync()
    best = 0.0
    for _ in range(windows):
        reps, t0 = 0, time.perf_counter()
        while True:
            a @ b
            reps += 1
            if reps % 2 == 0:
                sync()
                if time.perf_counter() - t0 >= seconds / windows:
                    break
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9)
    return best


def probe(device=None, seconds: float = 0.5, n: int | None = None) -> Probe:
    """Measure this machine: float32 matmul at n = 1024 (a capstone's widths times its batch rows) on a CPU,
    4096 on a GPU, and the low precision where the policy would use it. About `seconds` a precision plus a
    warm-up: 0.6 s on a 2-core CPU in float32."""
    import torch

    from ..utils import device as policy
    dev = torch.device(device) if device is not None else policy.device(capstone=True)
    t0 = time.perf_counter()
    n = n or (1024 if dev.type == "cpu" else 4096)
    f32 = _rate(n, torch.float32, dev, seconds)
    low = low_dtype = cap = None
    units = False
    if dev.type == "cpu":
        name, units = cpu_model(), policy.cpu_bf16_native()
        if units:
            low, low_dtype = _rate(n, torch.bfloat16, dev, seconds), "bf16"
    elif dev.type == "cuda":
        name, cap = torch.cuda.get_device_name(dev), policy.capability(dev)
        dt = policy.amp_dtype(dev, cap)
        low, low_dtype = _rate(n, dt, dev, seconds), policy.dtype_name(dt)
    else:
        name = platform.machine()
    return Probe(dev.type, name, torch.get_num_threads(), f32, low, low_dtype, units, cap,
                 time.perf_counter() - t0)


@dataclass(frozen=True)
class MachineClass:
    """A kind of machine and what a learner can expect on it: one row of the README's hardware table."""
    name: str                       # the recipe's name too (`tformer capstone NAME --recipe NAME`)
    what: str                       # the machine, in a learner's words
    fits: Callable[[Probe], bool]   # does a probe belong here (the first class of CLASSES that fits wins)
    chapters: str                   # the chapters there
    capstones: str                  # the capstones there
    basis: str                      # measured (where, the command) or estimated (how)


FAST_CPU = 150.0        # GFLOP/s float32: a CPU of 4 threads or more above it is a "cpu-fast". 2 cores of
                        # an AVX2 EPYC measure 70-180 (by generation): whatever their rate, 2 threads keep a
                        # machine in cpu-avx2, whose recipes were tuned there

CLASSES: tuple[MachineClass, ...] = (
    MachineClass(
        "gpu", "an NVIDIA GPU of sm80 or newer (A100, H100, RTX 30xx/40xx): bf16 and the flash kernel",
        lambda p: p.device == "cuda" and (p.capability or (0, 0)) >= (8, 0),
        "full mode; small mode stays on the CPU",
        "the GPU tiers: translation's `gpu` recipe reached 40.4 greedy BLEU in 2.5 minutes",
        "one run on an H200 (benchmarks/RESULTS.md: GPU); `benchmarks/gpu_check.py` measures the rest"),
    MachineClass(
        "gpu-fp16", "an older NVIDIA GPU (a free Colab or Kaggle T4, sm75): fp16 with a gradient scaler, "
        "memory-efficient attention instead of flash",
        lambda p: p.device == "cuda",
        "full mode, each chapter estimated from its FLOPs at the T4's fp16 rate",
        "the GPU tiers, several times slower than on an sm80 GPU",
        "estimated, not measured (`python benchmarks/full_mode_t4.py`)"),
    MachineClass(
        "mps", "a Mac with Apple silicon (M1-M4) through MPS: float32 until `tformer doctor` has checked bf16",
        lambda p: p.device == "mps",
        "small mode on the CPU, as on any laptop; full mode on the GPU",
        "the CPU tiers, on the GPU",
        "estimated by `tformer doctor` on the Mac itself (no Mac in this project's CI)"),
    MachineClass(
        "cpu-bf16", "an x86 CPU with bf16 matrix units (Intel AMX, AVX512-BF16): the capstones train in bf16",
        lambda p: p.device == "cpu" and p.bf16_units,
        "small mode: each chapter in about a minute",
        "on 2 cores: translation 40.0 beam-4 BLEU in 30 min, ViT 98.1% in 3.0 min",
        "measured on 2 cores of an Intel Xeon with AMX (benchmarks/RESULTS.md, each with its command)"),
    MachineClass(
        "cpu-fast", "an x86 or ARM CPU of 4-8 modern cores, float32 matmul above 150 GFLOP/s",
        lambda p: p.device == "cpu" and p.threads >= 4 and p.float32 >= FAST_CPU,
        "small mode: each chapter in well under a minute",
        "the CPU tiers take more steps in their time budgets than on 2 cores",
        "estimated from the 2-core rows and the probe's float32 rate (not measured by this project)"),
    MachineClass(
        "cpu-avx2", "a 2-core x86 CPU without bf16 units (AVX2), in float32: most laptops, and this project's CI",
        lambda p: p.device == "cpu",
        "small mode: each chapter within 90 s",
        "translation 40.5 beam-4 BLEU in 32 min, ViT 98.3% in 2.6 min, CLIP 96.8% in 3.0 min, GRPO 20.8% -> 30.2% in 5.0 min (1 thread), MoE 3.746 vs dense 3.805 in 46 min, ahead on two corpora it was not tuned on",
        "measured on 2 cores of an AMD EPYC (the README's Results; `make test` times the chapters)"),
)
NAMES = tuple(c.name for c in CLASSES)


def classify(p: Probe) -> MachineClass:
    """The first class of CLASSES whose test the probe passes (the last, cpu-avx2, takes any CPU)."""
    for c in CLASSES:
        if c.fits(p):
            return c
    raise ValueError(f"no machine class fits a probe on {p.device!r}")


def by_name(name: str) -> MachineClass:
    """The class called `name`; a ValueError naming the classes otherwise."""
    for c in CLASSES:
        if c.name == name:
            return c
    raise ValueError(f"unknown machine class {name!r}: expected one of {', '.join(NAMES)}")


def markdown_table() -> str:
    """The README's hardware table: one row per class."""
    rows = ["| machine | recipe | the chapters | the capstones | how we know |", "|---|---|---|---|---|"]
    rows += [f"| {c.what} | `{c.name}` | {c.chapters} | {c.capstones} | {c.basis} |" for c in CLASSES]
    return "\n".join(rows)


if __name__ == "__main__":          # python -m tformer.measure.machine: this machine's probe and class
    p = probe()
    print(p.line(), f"-> {classify(p).name}", f"({p.seconds:.1f} s)", f"[{os.cpu_count()} cores]")
