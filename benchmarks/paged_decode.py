"""The fused CPU kernel of paged decode attention (benchmarks/paged_decode.cpp): built on first use, and
wrapped two ways: with `paged_decode_attention`'s signature (`fused`, for bench_decode_attention.py), and
as the engine's step cache (`Engine(step_cache=fused_step(build_kernel()))`, for bench_serve.py), which
reads the block tables the step carries and builds no index lists at all.
"""
from __future__ import annotations

import pathlib

import torch

from tformer.inference.paged_cache import DecodeIndex, PagedStep

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


def fused_step(ext) -> type[PagedStep]:
    """A `PagedStep` whose decoding attention is the kernel, reading the step's block tables and lengths."""
    class FusedStep(PagedStep):
        def decode(self, layer, q):
            b, h, _, hd = q.shape
            out = ext.paged_decode(q.reshape(b, h, hd), self.pool.k[layer], self.pool.v[layer], self.table, self.lengths)
            return out.view(b, h, 1, hd)
    return FusedStep
