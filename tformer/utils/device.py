"""The device and dtype policy: where tformer runs, in which autocast dtype, with which SDPA kernel. One place.

    device      CUDA, else Apple's MPS, else the CPU: in full mode, and for the capstone commands
                (`tformer translate`, the Trainer) in any mode. Small mode (TFORMER_SMALL=1) stays on the
                CPU: its numbers are the ones the chapters quote. TFORMER_DEVICE=cpu|cuda|mps overrides
                all of it; a value that is unknown, or names a device this machine lacks, is one clear error.
    amp_dtype   the autocast dtype for training (None = float32, no autocast):
                  CUDA  bf16 on sm80+ (Ampere: bf16 tensor cores); fp16 with a gradient scaler before
                  MPS   float32, unless `tformer doctor` has run its bf16 check on this torch version and
                        found it within tolerance: it stores that in the data cache (`mps_bf16_path`)
                  CPU   float32; bf16 only when a caller asks for it (`cpu_bf16=True`: the capstone recipes
                        that say so) and the CPU multiplies bf16 natively (Intel AMX or AVX512-BF16:
                        `cpu_bf16_native`); small mode's numbers stay float32 on every CPU
    backend     the SDPA kernel to force for training: FlashAttention-2 on sm80+ and the CPU's flash kernel;
                the memory-efficient kernel on older GPUs (flash needs sm80; memory-efficient also never
                builds the T x T score matrix, it is just slower); MATH on MPS (its own kernel runs there)

`torch.cuda.is_bf16_supported()` is not the test for bf16: it also says yes where bf16 is only emulated
(sm75 runs bf16 matmuls through fp32, several times slower than its fp16 tensor cores).

Every decision can be tested on a CPU by injecting the machine: `choose(cuda=True, capability=(7, 5))`,
`choose(cuda=False, mps=True, mps_bf16=True)`, `choose(env="mps", mps=False)` (raises DeviceError).
Callers ask; none decides alone:

    dev = tformer.utils.device.device()                  # the notebooks' device (CPU in small mode)
    dev = tformer.utils.device.resolve(args.device)      # a command's: explicit --device, else the policy
    p = tformer.utils.device.choose(); p.amp_dtype, p.backend, p.reason
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

from . import runtime

ENV = "TFORMER_DEVICE"
KINDS = ("cpu", "cuda", "mps")
SM80 = (8, 0)   # Ampere: bf16 tensor cores and FlashAttention-2


class DeviceError(ValueError):
    """TFORMER_DEVICE (or a --device) names a device that does not exist or is not on this machine."""


@dataclass(frozen=True)
class Policy:
    device: torch.device
    amp_dtype: torch.dtype | None          # autocast dtype; None = train in float32
    backend: SDPBackend                    # SDPA kernel to force for training
    capability: tuple[int, int] | None     # CUDA compute capability, else None
    reason: str                            # why this device, in words

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.amp_dtype)


def dtype_name(amp: torch.dtype | None) -> str:
    """The name a run records for its training precision: "bfloat16", "float16", or "float32" for None."""
    return str(amp or torch.float32).replace("torch.", "")


# -- what this machine has (the only place tformer asks torch which accelerators exist) -------------------
def cuda_available() -> bool:
    return torch.cuda.is_available()


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def capability(device: torch.device | str | None = None) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA device (sm75 = (7, 5) a T4, sm80 an A100, sm90 an H100/H200);
    None for any other device. device=None: the policy's device."""
    device = _device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


# -- bf16 on MPS: what `tformer doctor` found, per torch version --------------------------------------------
def mps_bf16_path() -> Path:
    from ..data.sources import cache_dir          # lazily: importing tformer does not load the data loaders
    return cache_dir() / "doctor" / f"mps-bf16-torch-{torch.__version__}.json"


def mps_bf16_safe() -> bool:
    """True when `tformer doctor` stored, for this torch version, that bf16 autocast on MPS passed its check."""
    try:
        return bool(json.loads(mps_bf16_path().read_text()).get("safe"))
    except (OSError, ValueError, AttributeError):
        return False


def store_mps_bf16(safe: bool, error: float | None) -> Path:
    path = mps_bf16_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"torch": torch.__version__, "safe": bool(safe), "max_error": error}) + "\n")
    return path


def cpu_bf16_native() -> bool:
    """True when this CPU has bf16 matrix instructions (Intel AMX, or AVX512-BF16 on Intel and AMD Zen 4+),
    where oneDNN runs a bf16 matmul several times faster than fp32 (8x on one core of an AMX Xeon). Elsewhere
    bf16 is emulated through fp32 and gains nothing."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()           # private in torch 2.x
                or getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


# -- dtype and kernel per device ----------------------------------------------------------------------------
def amp_dtype(device: torch.device | str | None = None, capability: tuple[int, int] | None = None,
              mps_bf16: bool | None = None, cpu_bf16: bool = False,
              cpu_native: bool | None = None) -> torch.dtype | None:
    """The autocast dtype for training on `device`: bf16 on sm80+, fp16 on older CUDA GPUs (it needs a
    gradient scaler: its range ends at 65,504 and small gradients underflow to 0; bf16 has fp32's range);
    on MPS bf16 only where `tformer doctor` found it safe, else None; on a CPU None (train in fp32) unless
    `cpu_bf16` asks for bf16 and the CPU has bf16 matrix units (`cpu_native`, None = ask this CPU)."""
    device, cap = resolve_capability(device, capability)
    if device.type == "cpu":
        native = cpu_bf16_native() if cpu_native is None else cpu_native
        return torch.bfloat16 if cpu_bf16 and native else None
    if device.type == "mps":
        return torch.bfloat16 if (mps_bf16_safe() if mps_bf16 is None else mps_bf16) else None
    if device.type != "cuda":
        return None
    return torch.bfloat16 if cap >= SM80 else torch.float16


def flash_available(device: torch.device | str | None = None, capability: tuple[int, int] | None = None) -> bool:
    """True when SDPA's flash kernel can run here: a CPU (PyTorch's CPU flash kernel) or a CUDA GPU of sm80+."""
    device, cap = resolve_capability(device, capability)
    return device.type == "cpu" or (device.type == "cuda" and cap >= SM80)


def attention_backend(device: torch.device | str | None = None,
                      capability: tuple[int, int] | None = None) -> SDPBackend:
    """The SDPA kernel to force for training: flash where it exists, MATH on MPS, else the memory-efficient one."""
    device, cap = resolve_capability(device, capability)
    if flash_available(device, cap):
        return SDPBackend.FLASH_ATTENTION
    if device.type == "mps":
        return SDPBackend.MATH
    return SDPBackend.EFFICIENT_ATTENTION


# -- the device -------------------------------------------------------------------------------------------
def choose(*, capstone: bool = False, small: bool | None = None, env: str | None = None, cuda: bool | None = None,
           mps: bool | None = None, capability: tuple[int, int] | None = None,
           mps_bf16: bool | None = None) -> Policy:
    """The policy for this machine. Every keyword injects a fact (None = ask this machine): `capstone` for the
    commands that train for real (they ignore small mode), `small` (TFORMER_SMALL), `env` (TFORMER_DEVICE),
    `cuda`/`mps` (which accelerators exist), `capability` (the CUDA GPU's), `mps_bf16` (doctor's finding)."""
    if small is None:
        small = runtime.SMALL
    env = os.environ.get(ENV, "") if env is None else env
    has_cuda = cuda_available() if cuda is None else cuda
    has_mps = mps_available() if mps is None else mps
    kind = env.strip().lower()
    if kind:
        if kind not in KINDS:
            raise DeviceError(f"{ENV} must be one of {', '.join(KINDS)}, got {env!r}; unset it to let tformer "
                              f"choose (CUDA, else MPS, else the CPU)")
        if kind == "cuda" and not has_cuda:
            raise DeviceError(f"{ENV}=cuda but torch {torch.__version__} sees no CUDA GPU "
                              f"({'no driver or GPU found' if torch.version.cuda else 'this torch is a CPU build'}); "
                              f"set {ENV}=cpu or unset it")
        if kind == "mps" and not has_mps:
            raise DeviceError(f"{ENV}=mps but torch {torch.__version__} has no usable Apple MPS device here "
                              f"(it needs an Apple-silicon Mac and macOS 12.3+); set {ENV}=cpu or unset it")
        reason = f"{ENV}={kind}"
    elif small and not capstone:
        kind, reason = "cpu", "small mode (TFORMER_SMALL=1) runs on the CPU"
    elif has_cuda:
        kind, reason = "cuda", "a CUDA GPU is present"
    elif has_mps:
        kind, reason = "mps", "no CUDA GPU; Apple's MPS is present"
    else:
        kind, reason = "cpu", "no CUDA GPU and no MPS device"
    dev = torch.device(kind)
    cap = None
    if kind == "cuda":
        cap = capability if capability is not None else (torch.cuda.get_device_capability() if cuda is None else SM80)
    return Policy(dev, amp_dtype(dev, cap, mps_bf16), attention_backend(dev, cap), cap, reason)


def device(capstone: bool = False) -> torch.device:
    """The policy's device: CUDA, else MPS, else CPU; the CPU in small mode unless `capstone`."""
    return choose(capstone=capstone).device


def resolve(device: torch.device | str | None = None, *, capstone: bool = True,
            local_rank: int | None = None) -> torch.device:
    """A run's device: `device` if given (a --device option), else the policy's (capstone: small mode does not
    apply). A CUDA device gets its index: `local_rank` (one GPU per rank), else torch's current device."""
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise DeviceError(f"device must be one of {', '.join(KINDS)} (cuda:1: a GPU by index), got "
                              f"{str(device)!r}") from None
        if dev.type not in KINDS:
            raise DeviceError(f"device must be one of {', '.join(KINDS)}, got {str(device)!r}")
        if (dev.type == "cuda" and not cuda_available()) or (dev.type == "mps" and not mps_available()):
            raise DeviceError(f"device {str(device)!r} asked for, but torch {torch.__version__} has no "
                              f"{'CUDA GPU' if dev.type == 'cuda' else 'MPS device'} here; use cpu")
    else:
        dev = choose(capstone=capstone).device
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank if local_rank is not None else torch.cuda.current_device())
    return dev


def _device(device) -> torch.device:
    return torch.device(device) if device is not None else choose(capstone=True).device


def resolve_capability(device, cap: tuple[int, int] | None = None) -> tuple[torch.device, tuple[int, int] | None]:
    """(device, its compute capability): `cap` when given (a test injects one), else the GPU's; None off CUDA."""
    device = _device(device)
    if device.type != "cuda":
        return device, None
    return device, cap if cap is not None else capability(device)
