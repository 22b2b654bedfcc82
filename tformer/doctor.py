"""`tformer doctor`: the command to run first. Is this machine computing the right numbers, and how fast?

    tformer doctor            the environment, backend parity checks, what to expect here (a table each)
    tformer doctor --json     the same as one JSON object: the report to attach to a bug

1. The environment: OS, Python, torch and its build, the device the policy (tformer.utils.device) picks and
   why, the GPU, CPU cores and torch threads, RAM, free disk at the data cache, installed versions that differ
   from the tested ones (requirements/constraints.txt, torch's pin in the Makefile), whether the hub answers.
2. Backend parity: the course's kernels run on the chosen device in float32 (the policy's dtype where it
   autocasts) and on the CPU in float64, compared within each check's stated tolerance with the grader's
   comparison (tformer.grading.equality.compare). On a CPU the chosen device is the CPU: float32 against float64.
   One line each: PASS with the largest error, or FAIL naming the operation, the error and what to do.
   On MPS it also tries bf16 autocast and stores whether it passed: the policy reads that (bf16 only if so).
3. What to expect: a probe of this machine's matmul speed and its class (tformer.measure.machine: the row of
   the README's hardware table, the capstones' recipe); a GPT training step measured in tokens/s here, and
   from its FLOP rate the estimated time of each tier of the translation capstone
   (`tformer translate train --preset ...`).

Exit status 0 when every check passes, 1 otherwise. About 20-40 s on a 2-core CPU.

This module imports torch, and what it checks, inside the functions that use them: `tformer doctor` sits in the
command's parser (add_cli below), and `tformer --help` or a usage error must answer without loading torch.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import shutil
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .cli import add_debug
from .translate.presets import PRESETS
from .utils.errors import UserError

if TYPE_CHECKING:                                    # the annotations' names; each function imports what it runs
    import torch
    import torch.nn as nn
    from torch.nn.attention import SDPBackend

    from .utils import device as policy

ROOT = Path(__file__).resolve().parents[1]           # the repository checkout, when tformer runs from one
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"

# tolerances, float32 (or the autocast dtype) on the chosen device against float64 on the CPU
FP32 = dict(atol=1e-4, rtol=1e-3)                    # float32 keeps ~7 digits; sums of 100s of terms lose 1-2
HALF = {"bfloat16": dict(atol=6e-2, rtol=6e-2),     # bf16 keeps ~3 digits (eps 2^-8); keyed by the dtype's name
        "float16": dict(atol=1e-2, rtol=1e-2)}      # fp16 keeps ~4 (eps 2^-11)


# ------------------------------------------------------------------------------------------------------------
# 2. Backend parity
# ------------------------------------------------------------------------------------------------------------
@dataclass
class Check:
    """One parity check. `candidate(device, dtype)` computes the outputs (a tensor or a list of them) from
    seeded inputs; `reference()` the same in float64 on the CPU (default: candidate on the CPU in float64)."""
    name: str
    candidate: Callable[[torch.device, torch.dtype], Any]
    reference: Callable[[], Any] | None = None
    atol: float = FP32["atol"]
    rtol: float = FP32["rtol"]
    advice: str = "set TFORMER_DEVICE=cpu and report this output (tformer doctor --json) as a bug"
    dtype: torch.dtype | None = None                 # run the candidate in this dtype (None: float32)


@dataclass
class Outcome:
    name: str
    status: str                  # PASS, FAIL, SKIP
    max_error: float | None
    atol: float
    rtol: float
    message: str = ""
    advice: str = ""
    dtype: str = "float32"


def _tensors(x) -> list[torch.Tensor]:
    import torch

    from .grading.equality import flatten_tensors
    return [t.detach().to("cpu", torch.float64) if t.is_floating_point() else t.detach().cpu() for t in flatten_tensors(x)]


def run_check(check: Check, dev: torch.device) -> Outcome:
    """Run one check on `dev` and judge it against float64 on the CPU with the grader's comparison."""
    import torch

    from .grading.equality import compare, flatten_tensors
    dtype, name, atol, rtol = check.dtype or torch.float32, check.name, check.atol, check.rtol
    try:
        raw = check.candidate(dev, dtype)
        got = _tensors(raw)
    except _NotOffered as e:
        return Outcome(name, "SKIP", None, atol, rtol, str(e), dtype=_dn(dtype))
    except Exception as e:  # noqa: BLE001: a backend that crashes fails its check, it does not stop the doctor
        return Outcome(name, "FAIL", None, atol, rtol, f"raised {type(e).__name__}: "
                       f"{' '.join(str(e).split())[:160]}", check.advice, _dn(dtype))
    half = next((t.dtype for t in flatten_tensors(raw) if _dn(t.dtype) in HALF), None)
    if half is not None:          # a kernel that ran in bf16/fp16 (flash, autocast) is judged at that precision
        tol = HALF[_dn(half)]
        dtype, atol, rtol = half, max(atol, tol["atol"]), max(rtol, tol["rtol"])
    want = _tensors(check.reference() if check.reference else check.candidate(torch.device("cpu"), torch.float64))
    err = max(((g - w).abs().nan_to_num(nan=float("inf")).max().item() if w.numel() else 0.0)
              for g, w in zip(got, want)) if len(got) == len(want) else float("inf")
    problem = compare(got, want, atol, rtol)
    if problem is None:
        return Outcome(name, "PASS", err, atol, rtol, dtype=_dn(dtype))
    return Outcome(name, "FAIL", err, atol, rtol, problem, check.advice, _dn(dtype))


class _NotOffered(Exception):
    """This device has no such kernel: the check is skipped, not failed."""


def _dn(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _gen(seed: int) -> torch.Generator:
    import torch
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int) -> torch.Tensor:
    import torch
    return torch.randn(*shape, generator=_gen(seed))


def _qkv(dev, dtype, seed=0, b=2, h=4, t=33, d=16):
    return [_randn(b, h, t, d, seed=seed + i).to(dev, dtype) for i in range(3)]


def _causal_reference():
    import torch
    q, k, v = _qkv("cpu", torch.float64)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v


def attention_check(kernel: Callable | None = None, name: str = "attention (tformer reference)") -> Check:
    """Causal attention through `kernel(q, k, v, mask) -> out` (default: tformer's reference attention)
    against the formula softmax(QK^T / sqrt(d_k)) V in float64."""
    import torch

    from .attention import scaled_dot_product_attention

    def kern(q, k, v, mask):
        return scaled_dot_product_attention(q, k, v, mask)[0]
    kernel = kernel or kern

    def run(dev, dtype):
        q, k, v = _qkv(dev, dtype)
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=dev).tril()
        return kernel(q, k, v, mask)
    return Check(name, run, _causal_reference)


def sdpa_check(backend: SDPBackend, half: torch.dtype | None) -> Check:
    """F.scaled_dot_product_attention forced to one backend; kernels without float32 (flash and cuDNN on CUDA)
    run in `half`, the policy's autocast dtype."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def run(dev, dtype):
        for dt in (dtype, half) if half is not None and dtype == torch.float32 else (dtype,):
            q, k, v = _qkv(dev, dt)
            try:
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            except RuntimeError:
                pass
        raise _NotOffered(f"SDPA offers no {backend.name} kernel on {dev.type} for these inputs")
    return Check(f"attention (SDPA {backend.name})", run, _causal_reference,
                 advice=f"avoid SDPA's {backend.name} kernel here: set TFORMER_DEVICE=cpu, and report it")


def _fwd_bwd(module: nn.Module, make_input: Callable[[torch.device, torch.dtype], tuple], loss: Callable):
    """Outputs, input gradients and every parameter gradient of `loss(module(*inputs))`."""
    import torch

    def run(dev, dtype):
        m = copy.deepcopy(module).to(dev, dtype)
        inputs = make_input(dev, dtype)
        out = m(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        loss(out).backward()
        grads = [x.grad for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        return [out, *grads, *[p.grad for p in m.parameters()]]
    return run


def _leaf(*shape, seed, dev, dtype):
    return _randn(*shape, seed=seed).to(dev, dtype).requires_grad_()


def _weighted(out):      # a loss whose gradient differs per element
    import torch
    return (out * torch.linspace(-1, 1, out.numel(), device=out.device, dtype=out.dtype).view_as(out)).sum()


def mha_check() -> Check:
    import torch

    from .attention import MultiHeadAttention
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 4)
    return Check("multi-head attention fwd+bwd", _fwd_bwd(
        mha, lambda dev, dt: (_leaf(2, 17, 64, seed=1, dev=dev, dtype=dt),), _weighted))


def layernorm_check() -> Check:
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    ln = nn.LayerNorm(64)
    with torch.no_grad():
        ln.weight.normal_(1, 0.1, generator=_gen(2)), ln.bias.normal_(0, 0.1, generator=_gen(3))
    return Check("LayerNorm fwd+bwd", _fwd_bwd(ln, lambda dev, dt: (_leaf(4, 9, 64, seed=2, dev=dev, dtype=dt),),
                                               _weighted))


def cross_entropy_check() -> Check:
    import torch

    from .training.losses import label_smoothed_cross_entropy

    def run(dev, dtype):
        logits = _leaf(64, 500, seed=3, dev=dev, dtype=dtype)
        target = torch.randint(0, 500, (64,), generator=_gen(4)).to(dev)
        loss = label_smoothed_cross_entropy(logits * 4, target, smoothing=0.1)
        loss.backward()
        return [loss, logits.grad]
    return Check("softmax cross-entropy fwd+bwd", run)


def _tiny_gpt(**kw):
    import torch

    from .models.gpt import GPT, GPTConfig
    torch.manual_seed(0)
    cfg = dict(vocab_size=97, context_length=32, n_layers=2, n_heads=4, d_model=64, dropout=0.0)
    return GPT(GPTConfig(**{**cfg, **kw}))


def gpt_step_check() -> Check:
    import torch

    from .training.losses import causal_lm_loss
    gpt = _tiny_gpt()

    def run(dev, dtype):
        m = copy.deepcopy(gpt).to(dev, dtype)
        idx = torch.randint(0, 97, (4, 32), generator=_gen(5)).to(dev)
        loss = causal_lm_loss(m(idx), idx)
        loss.backward()
        return [loss, *[p.grad for p in m.parameters()]]
    return Check("GPT training step: loss and every gradient", run)


def adamw_check() -> Check:
    import torch

    from .training.trainer import fusable

    def run(dev, dtype):
        params = [_randn(33, 17, seed=6).to(dev, dtype).requires_grad_(), _randn(17, seed=7).to(dev, dtype).requires_grad_()]
        for i, p in enumerate(params):
            p.grad = _randn(*p.shape, seed=8 + i).to(dev, dtype)
        opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=fusable(params))   # as the package builds it
        opt.step()
        for i, p in enumerate(params):                  # a second step: the moments carry over
            p.grad = _randn(*p.shape, seed=10 + i).to(dev, dtype)
        opt.step()
        return [p.detach() for p in params]
    return Check("AdamW step, fused where it runs (two updates)", run)


def moe_check() -> Check:
    import torch

    from .moe import MoE, MoEConfig
    torch.manual_seed(0)
    moe = MoE(32, MoEConfig(d_ff=64, n_experts=4, top_k=2))

    def run(dev, dtype):
        m = copy.deepcopy(moe).to(dev, dtype)
        x = _leaf(40, 32, seed=9, dev=dev, dtype=dtype)
        out = m(x, dispatch=None if dtype != torch.float64 else "naive")   # None: the config's "auto"
        (_weighted(out) + m.aux_loss).backward()
        return [out, x.grad, *[p.grad for p in m.parameters()]]
    return Check("MoE dispatch fwd+bwd (auto vs the naive loop)", run)


def autocast_check(amp: torch.dtype | None) -> Check:
    """GPT forward and loss under autocast in the policy's dtype (float32 where it does not autocast)."""
    import torch

    from .training.losses import causal_lm_loss
    gpt = _tiny_gpt()

    def run(dev, dtype):
        m = copy.deepcopy(gpt).to(dev, dtype if dtype == torch.float64 else torch.float32)
        idx = torch.randint(0, 97, (4, 32), generator=_gen(5)).to(dev)
        with torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None and dtype != torch.float64):
            logits = m(idx)
            loss = causal_lm_loss(logits.float() if dtype != torch.float64 else logits, idx)
        return [loss, logits]
    advice = ("use float32 on this device (TFORMER_DEVICE=cpu if float32 fails too)" if amp is not None
              else "set TFORMER_DEVICE=cpu and report this output as a bug")
    return Check(f"autocast GPT forward in {_dn(amp or torch.float32)}", run, advice=advice)


def checks(p: policy.Policy) -> list[Check]:
    import torch
    from torch.nn.attention import SDPBackend
    half = p.amp_dtype or (torch.bfloat16 if p.device.type == "cuda" else None)
    out = [attention_check()]
    backends = [b for b in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                            SDPBackend.CUDNN_ATTENTION) if hasattr(SDPBackend, b.name)]
    out += [sdpa_check(b, half) for b in backends]
    out += [mha_check(), layernorm_check(), cross_entropy_check(), gpt_step_check(), adamw_check(), moe_check(),
            autocast_check(p.amp_dtype)]
    return out


def run_checks(p: policy.Policy) -> list[Outcome]:
    results = [run_check(c, p.device) for c in checks(p)]
    if p.device.type == "mps":            # the policy trains in bf16 on MPS only once this has passed
        results.append(try_bf16(p.device))
    return results


def try_bf16(dev: torch.device) -> Outcome:
    """bf16 autocast on `dev` against float64, stored for the policy (tformer.utils.device.mps_bf16_safe).
    A failure is information, not an error: the policy then keeps float32 there."""
    import torch

    from .utils import device as policy
    r = run_check(autocast_check(torch.bfloat16), dev)
    r.name += " (tried for the policy)"
    policy.store_mps_bf16(r.status == "PASS", r.max_error)
    if r.status == "FAIL":
        r.status, r.advice = "INFO", "the policy keeps float32 on this device (stored in the data cache)"
    return r


# ------------------------------------------------------------------------------------------------------------
# 1. The environment
# ------------------------------------------------------------------------------------------------------------
def _ram_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError, AttributeError):
        return None


def _free_disk(path: Path) -> tuple[str, float | None]:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return str(path), shutil.disk_usage(p).free / 2 ** 30
    except OSError:
        return str(path), None


def pinned() -> dict[str, str]:
    """The tested versions: requirements/constraints.txt, and torch's pin in the Makefile ({} outside a checkout)."""
    pins = {}
    if CONSTRAINTS.is_file():
        for line in CONSTRAINTS.read_text().splitlines():
            m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+)", line)
            if m:
                pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    make = ROOT / "Makefile"
    if make.is_file():
        m = re.search(r"^TORCH_VERSION\s*\?=\s*(\S+)", make.read_text(), re.M)
        if m:
            pins["torch"] = m.group(1)
    return pins


def version_differences(pins: dict[str, str] | None = None) -> list[dict[str, str | None]]:
    """[{name, tested, installed}] for every pinned package whose installed version differs (None = missing).
    torch's local label (+cpu, +cu126) is not a difference."""
    from importlib import metadata
    pins = pinned() if pins is None else pins
    out = []
    for name, want in sorted(pins.items()):
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or have.split("+")[0] != want.split("+")[0]:
            out.append({"name": name, "tested": want, "installed": have})
    return out


def hub_status(timeout: float = 2.0) -> str:
    for var in ("HF_HUB_OFFLINE", "TFORMER_OFFLINE"):
        if os.environ.get(var, "0").lower() not in ("0", "", "false", "no"):
            return f"offline ({var} is set): not checked"
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return "reachable (huggingface.co:443)"
    except OSError as e:
        return f"not reachable ({type(e).__name__}): downloads fall back to the built-in data"


def environment(p: policy.Policy) -> dict[str, Any]:
    import torch

    from .data.sources import cache_dir
    from .utils import device as policy
    build = ("CUDA " + torch.version.cuda) if torch.version.cuda else (
        "MPS" if policy.mps_available() else ("ROCm " + torch.version.hip) if getattr(torch.version, "hip", None)
        else "CPU")
    env: dict[str, Any] = {
        "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "python": platform.python_version(),
        "torch": f"{torch.__version__} ({build} build)",
        "device": str(p.device), "why": p.reason,
        "autocast dtype": p.dtype_name, "SDPA backend": p.backend.name,
    }
    if p.device.type == "cuda":
        props = torch.cuda.get_device_properties(p.device)
        env["gpu"] = f"{props.name}, sm{props.major}{props.minor}, {props.total_memory / 2 ** 30:.1f} GiB"
    elif torch.cuda.is_available():
        env["gpu"] = f"{torch.cuda.get_device_name()} (not used: {p.reason})"
    env["cpu cores"] = os.cpu_count()
    env["torch threads"] = torch.get_num_threads()
    ram = _ram_gib()
    env["ram"] = f"{ram:.1f} GiB" if ram else "unknown"
    where, free = _free_disk(cache_dir())
    env["data cache"] = f"{where} ({free:.1f} GiB free)" if free is not None else where
    diffs = version_differences()
    env["packages"] = ("as tested (requirements/constraints.txt)" if not diffs and pinned() else
                       "no constraints file here (not a checkout)" if not pinned() else
                       "; ".join(f"{d['name']} {d['installed'] or 'missing'} (tested {d['tested']})" for d in diffs))
    env["package differences"] = diffs
    env["hub"] = hub_status()
    return env


# ------------------------------------------------------------------------------------------------------------
# 3. What to expect here
# ------------------------------------------------------------------------------------------------------------
# The translation capstone's tiers: steps of a run. tiny, base and big run to their max_steps; small and gpu
# run to a time budget, so their steps are what the budget gave on the machine they were tuned on
TIER_STEPS = {"tiny": (300, "its max_steps"),
              "small": (1900, "what 30 min gave on an idle 2-core CPU (presets.py)"),
              "gpu": (4449, "what 2.5 min gave on one H200 (presets.py)"),
              "base": (100_000, "the paper's steps"), "big": (300_000, "the paper's steps")}


def translate_flops_per_step(name: str) -> float:
    """Training FLOPs of one step of a translation preset: 6 x weights touched per token x tokens, both
    sides (encoder weights for source tokens, decoder weights and the output layer for target tokens)."""
    p = PRESETS[name]
    d, ff, L = p.d_model, p.d_ff, p.n_layers
    enc = L * (4 * d * d + 2 * d * ff)
    dec = L * (8 * d * d + 2 * d * ff) + p.vocab_size * d
    return 6.0 * (enc + dec) * p.max_tokens


def measure(p: policy.Policy, seconds: float = 6.0) -> dict[str, Any]:
    """A GPT training step (forward, loss, backward, AdamW) in the policy's dtype: tokens/s and FLOP/s."""
    import torch

    from .measure.flash import lm_throughput
    from .models.gpt import GPT, GPTConfig
    big = p.device.type != "cpu"
    cfg = GPTConfig(vocab_size=8192, context_length=256, n_layers=4 if not big else 8, n_heads=4 if not big else 8,
                    d_model=256 if not big else 512, dropout=0.0)
    torch.manual_seed(0)
    model = GPT(cfg).to(p.device)
    batch, seq = (4, 128) if not big else (16, 256)
    r = lm_throughput(model, batch, seq, steps=2 if not big else 10, warmup=1 if not big else 3,
                      dtype=p.amp_dtype or torch.float32, flash=False if p.device.type != "cuda" else None)
    flops = r["tokens_per_s"] * r["flops_per_token"]
    tiers = []
    for name, (steps, source) in TIER_STEPS.items():
        tiers.append({"preset": name, "steps": steps, "steps_from": source,
                      "seconds": steps * translate_flops_per_step(name) / flops})
    return {"model": f"GPT d={cfg.d_model} L={cfg.n_layers} V={cfg.vocab_size}, batch {batch}x{seq}",
            "dtype": r["dtype"], "tokens_per_s": r["tokens_per_s"], "flop_per_s": flops, "mfu": r["mfu"],
            "tiers": tiers}


def machine_row() -> dict[str, Any]:
    """The probe of this machine's speed and the row of its class in the README's hardware table."""
    from .measure import machine
    probe = machine.probe()
    c = machine.classify(probe)
    return {"probe": probe.as_dict(), "line": probe.line(), "class": c.name, "what": c.what,
            "chapters": c.chapters, "capstones": c.capstones, "basis": c.basis}


def _duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:,.0f} days" if s < 730 * 86400 else f"{s / 86400 / 365:,.0f} years"


# ------------------------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------------------------
def report(measure_speed: bool = True) -> dict[str, Any]:
    from .utils import device as policy
    t0 = time.perf_counter()
    p = policy.choose(capstone=True)
    env = environment(p)
    results = run_checks(p)
    out = {"environment": env, "checks": [asdict(r) for r in results],
           "passed": all(r.status != "FAIL" for r in results)}
    if measure_speed:
        out["machine"] = machine_row()
        out["expect"] = measure(p)
    out["seconds"] = time.perf_counter() - t0
    return out


def _print(rep: dict[str, Any], file=sys.stdout) -> None:
    env = {k: v for k, v in rep["environment"].items() if k != "package differences"}
    w = max(map(len, env))
    print("Environment", file=file)
    for k, v in env.items():
        print(f"  {k:<{w}}  {v}", file=file)
    print(f"\nBackend parity on {rep['environment']['device']} against float64 on the CPU", file=file)
    w = max(len(c["name"]) for c in rep["checks"])
    for c in rep["checks"]:
        tol = f"tol {c['atol']:.0e} + {c['rtol']:.0e}|x|"
        if c["status"] in ("PASS", "INFO") and c["max_error"] is not None and not c["message"]:
            line = f"largest error {c['max_error']:.1e} ({c['dtype']}, {tol})"
        elif c["status"] == "SKIP":
            line = c["message"]
        else:
            err = "" if c["max_error"] is None else f"largest error {c['max_error']:.1e}, "
            line = f"{err}{c['message']} ({c['dtype']}, {tol}); what to do: {c['advice']}"
        print(f"  {c['status']:<4}  {c['name']:<{w}}  {line}", file=file)
    if "machine" in rep:
        m = rep["machine"]
        print(f"\nThis machine: {m['line']}", file=file)
        print(f"  its class (the README's hardware table, the capstones' recipe): {m['class']}, {m['what']}", file=file)
        print(f"  the chapters: {m['chapters']}\n  the capstones: {m['capstones']}\n  ({m['basis']})", file=file)
    if "expect" in rep:
        e = rep["expect"]
        mfu = f", MFU {e['mfu']:.0%}" if e["mfu"] else ""
        print(f"\nWhat to expect here (measured: {e['model']}, {e['dtype']})", file=file)
        print(f"  GPT training: {e['tokens_per_s']:,.0f} tokens/s, {e['flop_per_s'] / 1e9:,.1f} GFLOP/s{mfu}", file=file)
        print("  translation capstone, estimated from that FLOP rate (`tformer translate train --preset NAME`):",
              file=file)
        for t in e["tiers"]:
            print(f"    {t['preset']:<6} {t['steps']:>7,} steps ({t['steps_from']}): ~{_duration(t['seconds'])}", file=file)
    n_fail = sum(c["status"] == "FAIL" for c in rep["checks"])
    verdict = "every check passed" if not n_fail else f"{n_fail} check(s) FAILED: see what to do above"
    print(f"\n{verdict} ({rep['seconds']:.0f} s)", file=file)


def _handler(args) -> int:
    from .utils import device as policy
    try:
        rep = report(measure_speed=not args.no_speed)
    except policy.DeviceError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        _print(rep)
    return 0 if rep["passed"] else 1


def add_cli(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("doctor", help="check this machine: environment, backend parity, expected speed",
                       description=__doc__.split("\n\n")[0])
    d.add_argument("--json", action="store_true", help="print the report as JSON (attach it to a bug report)")
    d.add_argument("--no-speed", action="store_true", help="skip the speed measurement (section 3)")
    add_debug(d)
    d.set_defaults(func=_handler)
