"""Attention time and peak memory vs sequence length T, six ways (chapter 8-9 figures).

    explicit    softmax(Q K^T / sqrt(d)) V with the (T, T) matrix (tformer.scaled_dot_product_attention)
    sdpa        torch.nn.functional.scaled_dot_product_attention (fused: flash / memory-efficient kernel)
    tiled       tformer.efficient.tiled_attention: the FlashAttention algorithm in plain PyTorch
    window      tformer.sparse.sliding_window_attention, window 256 each side (banded, not exact)
    linformer   K, V projected from T rows to k = 256 rows, then SDPA (not exact)
    performer   FAVOR+ with m = 256 positive orthogonal random features (not exact)

All bidirectional (no causal mask), one batch of B=1, H heads of d=64, float32. Time: median of
`--repeat` runs after a warm-up. Peak memory: bytes allocated above what was live before the call, in
a separate run: `torch.cuda.max_memory_allocated` on a GPU; on a CPU, the allocation/free events of
PyTorch's CPU allocator recorded by `torch.profiler(profile_memory=True)` (tformer.measure.timing.peak_memory).
Inputs (q, k, v) are allocated before, so they are not counted; the output is.

    python benchmarks/bench_long_attention.py                 # T = 512 ... 8192
    python benchmarks/bench_long_attention.py --lengths 1024 4096 --heads 4

Claim checked at the largest T: tiled and SDPA use at most 1/8 of explicit attention's peak memory.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F

import tformer.utils.runtime
from tformer.attention import scaled_dot_product_attention
from tformer.efficient import orthogonal_gaussian, performer_attention, tiled_attention
from tformer.sparse import sliding_window_attention
from tformer.measure.timing import format_table, peak_memory, time_fn


def methods(t: int, d: int, k_rows: int, n_features: int, window: int, block: int, device):
    g = torch.Generator().manual_seed(0)
    e = (torch.randn(k_rows, t, generator=g) / math.sqrt(k_rows)).to(device)        # Linformer's E (= F)
    w = orthogonal_gaussian(n_features, d, g).to(device)
    return {
        "explicit": lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "tiled": lambda q, k, v: tiled_attention(q, k, v, block=block),
        "window": lambda q, k, v: sliding_window_attention(q, k, v, window, causal=False),
        "linformer": lambda q, k, v: F.scaled_dot_product_attention(q, e @ k, e @ v),
        "performer": lambda q, k, v: performer_attention(q, k, v, w),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--block", type=int, default=256, help="tiled attention key block")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    tformer.utils.runtime.set_threads(None)   # explicit: every core, whatever small mode chose
    device = torch.device(args.device)
    torch.manual_seed(0)
    rows = []
    for t in args.lengths:
        q, k, v = torch.randn(3, 1, args.heads, t, args.head_dim, device=device)
        ref = None
        for name, fn in methods(t, args.head_dim, 256, 256, 256, args.block, device).items():
            with torch.no_grad():
                sec = time_fn(lambda: fn(q, k, v), warmup=1, repeat=args.repeat, device=device)
                mem = peak_memory(lambda: fn(q, k, v), device)
                out = fn(q, k, v)
            if name == "explicit":
                ref = out
            err = (out - ref).abs().max().item()
            rows.append({"T": t, "method": name, "ms": 1e3 * sec, "MiB": mem / 2 ** 20, "max |out - exact|": err})
            print(f"T={t:5d} {name:10s} {1e3 * sec:9.1f} ms {mem / 2 ** 20:9.1f} MiB  err {err:.1e}",
                  file=sys.stderr, flush=True)
        del q, k, v, ref, out
    base = {r["T"]: r for r in rows if r["method"] == "explicit"}
    for r in rows:
        r["time / explicit"] = r["ms"] / base[r["T"]]["ms"]
        r["memory / explicit"] = r["MiB"] / base[r["T"]]["MiB"]
    print(f"device: {device}, torch {torch.__version__}, B=1, H={args.heads}, d={args.head_dim}, float32, "
          f"threads={torch.get_num_threads()}")
    print(format_table(rows, ["T", "method", "ms", "MiB", "time / explicit", "memory / explicit",
                              "max |out - exact|"]))
    t_max = max(args.lengths)
    ok = True
    for name in ("tiled", "sdpa"):
        ratio = next(r["memory / explicit"] for r in rows if r["T"] == t_max and r["method"] == name)
        verdict = "OK" if ratio <= 1 / 8 else "FAILS"
        ok &= ratio <= 1 / 8
        print(f"T={t_max}: {name} peak memory = {ratio:.4f} x explicit (claim: <= 1/8): {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
