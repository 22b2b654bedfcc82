"""Serving many requests at once: one at a time vs static batching vs continuous batching, side by side.

    .venv/bin/python benchmarks/bench_serve.py [--rounds 2] [--clients 1 4 16 64] [--trials 1] [--quick]
                                               [--threads N] [--dtype float32|bfloat16] [--json F]

Closed-loop clients: each sends its next request when its last one finishes. Prompt lengths are uniform
in 16-512 tokens, output lengths uniform in 16-256 (the same seeded draws for every scheme). Model: GPT
with 6 layers, d_model 384, 6 heads, context 1024, random weights, the byte-level vocabulary (257), in
float32, or with `--dtype bfloat16` weights and cache in bf16 (every scheme alike: a server keeps no fp32
master weights; fast where the CPU has bf16 matrix units, Intel AMX or AVX512-BF16).
Each client sends `--rounds` requests (the same seeded draws for every scheme); schemes run in one
process, one after another (one-at-a-time runs at most `--one-cap` of them: its rate does not depend on
the number of clients):

    one      one request at a time, first come first served: prefill, then decode with a contiguous KVCache
    static   wait for a full batch (one request per client), left-pad the prompts, run to the longest output
             (the padding positions compute too; a short request's slot idles until the longest is done)
    continuous  tformer.inference.engine.Engine: admission at every step, one batched decode step

Reported: generated tokens/s (only each request's own tokens), time to first token p50/p99 (from the
moment the client sent the request), and the ratios continuous/one and continuous/static. Then the
cache memory at the same load (paged blocks in use vs a contiguous cache reserving the longest request,
512 + 256 tokens, per running sequence) and prefix sharing (TTFT with a shared 256-token system prompt,
sharing on vs off). On a shared machine the absolute figures move, and a slow spell during one scheme
moves a ratio too: `--trials 3` runs the three schemes three times in rotated orders and reports the
median ratio with the range over trials.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from tformer.inference.cache import make_caches
from tformer.inference.engine import Engine, SamplingParams
from tformer.models.gpt import GPT, GPTConfig


def model_for(quick: bool, dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=257, context_length=1024, n_layers=2 if quick else 6, n_heads=6,
                    d_model=192 if quick else 384)
    return GPT(cfg).eval().to(dtype)


class Workload:
    """Seeded request draws shared by every scheme: client c's k-th request is the same everywhere."""

    def __init__(self, seed: int, prompt=(16, 512), out=(16, 256)):
        self.seed, self.prompt, self.out = seed, prompt, out

    def request(self, client: int, k: int) -> tuple[list[int], int]:
        rng = random.Random(self.seed * 1_000_003 + client * 10_007 + k)
        n = rng.randint(*self.prompt)
        return [rng.randrange(1, 257) for _ in range(n)], rng.randint(*self.out)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


@torch.no_grad()
def run_one(model, work, clients, rounds, cap=None):
    """One request at a time, first come first served; at most `cap` requests are run (its throughput does
    not depend on the number of clients, only its waiting times do)."""
    order = [(k, c) for k in range(rounds) for c in range(clients)][:cap]
    t0 = time.perf_counter()
    sent = {c: t0 for c in range(clients)}
    tokens, ttft = 0, []
    for k, c in order:
        prompt, n = work.request(c, k)
        cache = make_caches(model.cfg.n_layers, len(prompt) + n)
        tok = model(torch.tensor([prompt]), cache)[:, -1].argmax(-1, keepdim=True)
        ttft.append(time.perf_counter() - sent[c])
        for _ in range(n - 1):
            tok = model(tok, cache)[:, -1].argmax(-1, keepdim=True)
        tokens += n
        sent[c] = time.perf_counter()
    return tokens / (time.perf_counter() - t0), ttft, None


@torch.no_grad()
def run_static(model, work, clients, rounds):
    """Static batches of one request per client, left-padded, run to the longest output."""
    t0 = time.perf_counter()
    tokens, ttft = 0, []
    for rnd in range(rounds):
        sent = time.perf_counter()
        reqs = [work.request(c, rnd) for c in range(clients)]
        t_p, t_o = max(len(p) for p, _ in reqs), max(n for _, n in reqs)
        idx = torch.tensor([[0] * (t_p - len(p)) + p for p, _ in reqs])
        cache = make_caches(model.cfg.n_layers, t_p + t_o)
        tok = model(idx, cache)[:, -1].argmax(-1, keepdim=True)
        ttft += [time.perf_counter() - sent] * clients
        for _ in range(t_o - 1):
            tok = model(tok, cache)[:, -1].argmax(-1, keepdim=True)
        tokens += sum(n for _, n in reqs)
    return tokens / (time.perf_counter() - t0), ttft, None


@torch.no_grad()
def run_continuous(model, work, clients, rounds, prefix_sharing=True, block_size=16):
    """Continuous batching; each client sends `rounds` requests, the next when its last one is done."""
    eng = Engine(model, n_blocks=max(clients, 4) * (768 // block_size + 1), block_size=block_size,
                 max_running=clients, max_waiting=clients + 1, prefix_sharing=prefix_sharing)
    k = {c: 0 for c in range(clients)}
    owner, every = {}, []

    def submit(c):
        prompt, n = work.request(c, k[c])
        every.append(eng.add_request(prompt, SamplingParams(max_tokens=n)))
        owner[every[-1].id] = c
        k[c] += 1
    t0 = time.perf_counter()
    for c in range(clients):
        submit(c)
    used = []
    while eng.has_work():
        for r in eng.step():
            c = owner.pop(r.id)
            if k[c] < rounds:
                submit(c)
        used.append(eng.pool.cfg.n_blocks - eng.blocks.n_free)
    tps = eng.generated_tokens / (time.perf_counter() - t0)
    ttft = [r.first_token_at - r.arrival for r in every]
    return tps, ttft, {"mean_blocks": statistics.mean(used), "peak_blocks": max(used), "block_size": block_size,
                       "running": clients}


def bench_prefix(model, rounds, clients=4):
    rng = random.Random(1)
    system = [rng.randrange(1, 257) for _ in range(256)]
    work = Workload(2, prompt=(16, 64), out=(16, 64))
    shared_work = type("W", (), {"request": lambda self, c, k: (system + work.request(c, k)[0], work.request(c, k)[1])})()
    out = {}
    for on in (True, False):
        _, ttft, _ = run_continuous(model, shared_work, clients, rounds, prefix_sharing=on)
        out["shared" if on else "not shared"] = (statistics.median(ttft), len(ttft))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="requests each client sends, one after the other")
    ap.add_argument("--one-cap", type=int, default=16, help="at most this many requests for one-at-a-time")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--trials", type=int, default=1,
                    help="run the three schemes this many times (rotating their order); ratios: the median")
    ap.add_argument("--quick", action="store_true", help="a 2-layer, d=192 model, for a smoke run")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="weights and KV cache of every scheme")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's; on a machine shared with other jobs 1 is far steadier)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = model_for(args.quick, getattr(torch, args.dtype))
    work = Workload(0)
    rows, mem, summary = [], [], []
    print(f"model: {model.cfg.n_layers} layers, d_model {model.cfg.d_model}, context {model.cfg.context_length}; "
          f"{args.rounds} requests per client; prompts 16-512, outputs 16-256 tokens; {torch.get_num_threads()} threads, {args.dtype}")
    print(f"{'clients':>7} {'scheme':>10} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'requests':>8}")
    schemes = (("one", run_one), ("static", run_static), ("continuous", run_continuous))
    for c in args.clients:
        res = {name: [] for name, _ in schemes}
        for trial in range(args.trials):
            # each trial runs the three schemes back to back, in a rotated order: a slow spell of a shared
            # machine then lands on a different scheme each time, and the per-trial ratios show it
            for name, fn in schemes[trial % 3:] + schemes[:trial % 3]:
                kw = {"cap": args.one_cap} if name == "one" else {}
                tps, ttft, extra = fn(model, work, c, args.rounds, **kw)
                res[name].append(tps)
                print(f"{c:>7} {name:>10} {tps:>8.1f} {pct(ttft, 0.5):>8.2f}s {pct(ttft, 0.99):>8.2f}s {len(ttft):>8}",
                      flush=True)
                rows.append({"clients": c, "scheme": name, "trial": trial, "tokens_per_s": tps,
                             "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99), "requests": len(ttft)})
                if extra and trial == 0:
                    mem.append({"clients": c, "paged_tokens_mean": extra["mean_blocks"] * extra["block_size"],
                                "paged_tokens_peak": extra["peak_blocks"] * extra["block_size"],
                                "contiguous_tokens": c * (512 + 256)})
        for base in ("one", "static"):
            r = [x / y for x, y in zip(res["continuous"], res[base])]
            spread = f" (trials {min(r):.2f}-{max(r):.2f})" if len(r) > 1 else ""
            print(f"{c:>7} {'ratio':>10}  continuous/{base} {statistics.median(r):.2f}x{spread}", flush=True)
            summary.append({"clients": c, "vs": base, "median": statistics.median(r), "trials": r})
    print("\nKV cache at the same load (tokens' worth of keys/values held)")
    for m in mem:
        print(f"{m['clients']:>7} clients: paged {m['paged_tokens_mean']:.0f} mean / {m['paged_tokens_peak']} peak "
              f"vs contiguous {m['contiguous_tokens']} ({m['paged_tokens_mean'] / m['contiguous_tokens']:.0%})")
    pre = bench_prefix(model, max(args.rounds, 3))
    print("\nprefix sharing, 256-token shared system prompt, 4 clients: TTFT p50 "
          + ", ".join(f"{k} {v[0] * 1000:.0f} ms ({v[1]} requests)" for k, v in pre.items())
          + f"; ratio {pre['not shared'][0] / pre['shared'][0]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"throughput": rows, "ratios": summary, "memory": mem, "prefix": pre}, f, indent=2)


if __name__ == "__main__":
    main()
