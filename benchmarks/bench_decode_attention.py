"""How much of continuous batching's decoding step a fused paged-attention kernel would save, on this CPU.

    .venv/bin/python benchmarks/bench_decode_attention.py [--clients 16] [--rounds 2] [--reps 3]
                                                          [--dtype bfloat16|float32] [--threads N]

The engine (`tformer.inference.engine.Engine`) reads each sequence's keys and values where they lie in
the block pool through `paged_decode_attention`: two `embedding_bag` calls and about eight small
operations per layer. Real engines call one fused kernel instead (vLLM's PagedAttention). This
benchmark builds such a kernel for the CPU (`benchmarks/paged_decode.cpp`, compiled on first use with
`torch.utils.cpp_extension`, so it needs a C++ compiler; vectorised with PyTorch's own `Vectorized`,
prefetching the next blocks) and measures, side by side in one process:

  1. agreement: the kernel and `paged_decode_attention`, in float32 and bf16, against float64 math on
     the same inputs (it refuses to time a kernel that disagrees);
  2. the attention alone over a pool far larger than the caches (cold reads, as in a server): bytes of
     keys and values read per second, for both, beside this machine's streaming read rate;
  3. the whole engine under bench_serve's steady load (its workload and model: 6 layers, d_model 384,
     prompts 16-512, outputs 16-256): generated tokens/s with the package's attention, with the fused
     kernel, and with attention skipped (each query returned as its own output: not a model any more,
     but the same shapes and work otherwise), a bound on what any attention kernel could give. The
     variants alternate `--reps` times; medians and ranges.

The model stays the same throughout, so the three figures of (3) are comparable only with one another.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_serve import Workload, model_for, read_bandwidth, run_continuous  # noqa: E402
from paged_decode import build_kernel, fused  # noqa: E402

from tformer.inference.engine import BLOCK_SIZE  # noqa: E402
from tformer.inference.paged_cache import DecodeIndex, paged_decode_attention  # noqa: E402

HEADS, HEAD_DIM, BLOCK = 6, 64, BLOCK_SIZE  # bench_serve's model and the engine's block size


def skipped(q, k_layer, v_layer, idx):
    """No attention at all: the query is its own output (a bound, not a model)."""
    return q


def random_pool(n_blocks, n_kv_heads, head_dim, block_size, dtype, gen):
    k = torch.randn(n_blocks, n_kv_heads, head_dim, block_size, generator=gen).to(dtype)
    v = torch.randn(n_blocks, n_kv_heads, block_size, head_dim, generator=gen).to(dtype)
    return k, v


def random_index(b, n_heads, n_kv_heads, head_dim, block_size, n_blocks, max_len, gen) -> DecodeIndex:
    lengths = torch.randint(1, max_len + 1, (b,), generator=gen)
    nb = int((-(-lengths // block_size)).max())
    table = torch.randperm(n_blocks, generator=gen)[:b * nb].view(b, nb)
    return DecodeIndex.build(table, lengths, n_heads, n_kv_heads, head_dim, block_size)


def check(attention, dtype) -> float:
    """Largest difference from float64 math over random pools, GQA included; raises past the tolerance."""
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for n_heads, n_kv in ((HEADS, HEADS), (8, 2)):
        k, v = random_pool(64, n_kv, HEAD_DIM, BLOCK, dtype, gen)
        for _ in range(5):
            idx = random_index(4, n_heads, n_kv, HEAD_DIM, BLOCK, 64, 500, gen)
            q = torch.randn(4, n_heads, 1, HEAD_DIM, generator=gen).to(dtype)
            ref = paged_decode_attention(q.double(), k.double(), v.double(), idx)
            worst = max(worst, (attention(q, k, v, idx).double() - ref).abs().max().item())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    if worst > tol:
        raise SystemExit(f"bench_decode_attention: the kernel differs from float64 math by {worst:.2e} in {dtype} "
                         f"(expected <= {tol:.0e}); not timing it")
    return worst


def cold_rate(attention, dtype, clients, reps=3) -> float:
    """Bytes of keys and values read per second, over a pool of ~300 MB (past every cache)."""
    gen = torch.Generator().manual_seed(1)
    n_blocks = 6000
    k, v = random_pool(n_blocks, HEADS, HEAD_DIM, BLOCK, dtype, gen)
    cases = []
    for _ in range(12):
        idx = random_index(clients, HEADS, HEADS, HEAD_DIM, BLOCK, n_blocks, 768, gen)
        q = torch.randn(clients, HEADS, 1, HEAD_DIM, generator=gen).to(dtype)
        cases.append((q, idx, int(idx.lengths.sum()) * HEADS * HEAD_DIM * 2 * k.element_size()))   # keys + values
    attention(cases[0][0], k, v, cases[0][1])                           # untimed
    seconds, nbytes = 0.0, 0
    for _ in range(reps):
        for q, idx, n in cases:
            t = time.perf_counter()
            attention(q, k, v, idx)
            seconds += time.perf_counter() - t
            nbytes += n
    return nbytes / seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="requests per client in each engine run")
    ap.add_argument("--reps", type=int, default=3, help="engine runs per variant, alternating")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    t = time.perf_counter()
    ext = build_kernel()
    print(f"kernel built in {time.perf_counter() - t:.1f} s; {torch.get_num_threads()} threads, {args.dtype}")
    kernel = fused(ext)
    for dt in (torch.float32, torch.bfloat16):
        print(f"agreement with float64 math, {dt}: kernel {check(kernel, dt):.1e}, "
              f"package {check(paged_decode_attention, dt):.1e} (largest difference)")

    stream = read_bandwidth()
    eager_rate, kernel_rate = cold_rate(paged_decode_attention, dtype, args.clients), cold_rate(kernel, dtype, args.clients)
    print(f"attention alone, {args.clients} sequences, cold pool: package {eager_rate / 1e9:.1f} GB/s, "
          f"kernel {kernel_rate / 1e9:.1f} GB/s ({kernel_rate / eager_rate:.2f}x); streaming read {stream / 1e9:.1f} GB/s")

    model, work = model_for(False, dtype), Workload(0)
    variants = {"package": paged_decode_attention, "fused kernel": kernel, "no attention": skipped}
    tps = {name: [] for name in variants}
    run_continuous(model, work, args.clients, 1)                        # untimed: shapes compiled, pages touched
    for rep in range(args.reps):
        for name in list(variants) if rep % 2 == 0 else list(variants)[::-1]:
            tps[name].append(run_continuous(model, work, args.clients, args.rounds, attention=variants[name])[0])
    base = statistics.median(tps["package"])
    print(f"\nengine, {args.clients} clients, {args.rounds} requests each, {args.reps} runs per variant (medians):")
    for name, xs in tps.items():
        print(f"  {name:>12}: {statistics.median(xs):7.1f} tokens/s ({min(xs):.1f}-{max(xs):.1f})  "
              f"{statistics.median(xs) / base:.2f}x the package's")


if __name__ == "__main__":
    main()
