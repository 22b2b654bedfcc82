"""The fused CPU kernel of paged decode attention (benchmarks/paged_decode.cpp): built on first use, and
wrapped with `paged_decode_attention`'s signature so that the engine can read its blocks through it
(`Engine(decode_attention=fused(build_kernel()))`; bench_serve.py and bench_decode_attention.py use it).
"""
from __future__ import annotations

import pathlib

import torch

from tformer.inference.paged_cache import DecodeIndex

HERE = pathlib.Path(__file__).resolve().parent


def build_kernel():
    """Compile benchmarks/paged_decode.cpp for this CPU's vector width (PyTorch's AVX2/AVX512 builds)."""
    from torch.utils.cpp_extension import load
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512"):
        raise SystemExit(f"paged_decode: the kernel is written for x86 AVX2 or AVX512; this CPU has {cap}")
    flags = ["-O3", "-march=native", "-fopenmp", f"-DCPU_CAPABILITY_{cap}", f"-DCPU_CAPABILITY={cap}"]
    try:
        return load(f"tformer_paged_decode_{cap.lower()}", [str(HERE / "paged_decode.cpp")], extra_cflags=flags,
                    extra_ldflags=["-fopenmp"])
    except (RuntimeError, OSError) as e:      # no compiler, no ninja, or a compile error: one line, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(f"paged_decode: could not build benchmarks/paged_decode.cpp (it needs a C++ "
                         f"compiler with OpenMP and ninja): {first}")


def fused(ext):
    """The kernel with `paged_decode_attention`'s signature: q (B, H, 1, hd) -> (B, H, 1, hd)."""
    def attention(q, k_layer, v_layer, idx: DecodeIndex):
        b, h, _, hd = q.shape
        return ext.paged_decode(q.reshape(b, h, hd), k_layer, v_layer, idx.table, idx.lengths).view(b, h, 1, hd)
    return attention
