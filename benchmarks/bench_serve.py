"""Serving many requests at once: one at a time vs static batching vs continuous batching, side by side.

    .venv/bin/python benchmarks/bench_serve.py [--rounds 2] [--clients 1 4 16 64] [--trials 1] [--quick]
                                               [--threads N] [--dtype float32|bfloat16] [--drain] [--json F]
                                               [--attention package|fused]

Closed-loop clients: each sends its next request when its last one finishes. Prompt lengths are uniform
in 16-512 tokens, output lengths uniform in 16-256 (the same seeded draws for every scheme). Model: GPT
with 6 layers, d_model 384, 6 heads, context 1024, random weights, the byte-level vocabulary (257), in
float32, or with `--dtype bfloat16` weights and cache in bf16 (every scheme alike: a server keeps no fp32
master weights; fast where the CPU has bf16 matrix units, Intel AMX or AVX512-BF16). In bf16 one request
at a time also runs in float32 (`one-fp32`, the same weights), since a one-row matrix product in bf16 can
be slower than in float32 on a CPU: continuous batching is compared with both, the faster being the fair
baseline.
Each client sends `--rounds` requests (the same seeded draws for every scheme); schemes run in one
process, one after another (one-at-a-time runs at most `--one-cap` of them: its rate does not depend on
the number of clients):

    one      one request at a time, first come first served: prefill, then decode with a contiguous KVCache
    static   wait for a full batch (one request per client), left-pad the prompts, run to the longest output
             (the padding positions compute too; a short request's slot idles until the longest is done)
    continuous  tformer.inference.engine.Engine: admission at every step, one batched decode step; its
             clients keep sending and the clock stops when clients x rounds requests are done (a steady
             load; `--drain` instead lets each client stop after `--rounds` and times the drained end,
             where fewer clients are left and the batch runs part empty); `--attention fused` reads the
             blocks through the fused C++ kernel of benchmarks/paged_decode.cpp (paged_decode.py)

Reported: generated tokens/s (only each request's own tokens), time to first token p50/p99 (from the
moment the client sent the request), and the ratios continuous/one and continuous/static. Beside them a
ceiling: the largest continuous/one ratio that any batching of these requests could reach in eager
PyTorch, from one-at-a-time's own prefill time, the weight work of a full batched step and the keys and
values read at this machine's streaming bandwidth (see `ceiling`; in bf16 also against one-fp32), with the
sequences per step. Then the cache memory at the same load (paged blocks in use vs a contiguous cache
reserving the longest request, 512 + 256 tokens, per running sequence) and prefix sharing (TTFT with a
shared 256-token system prompt, sharing on vs off). On a shared machine the absolute figures move, and a
slow spell during one scheme moves a ratio too: `--trials 3` runs the schemes three times in rotated
orders and reports the median ratio with the range over trials. One-time costs: in bf16 oneDNN compiles a kernel for each new
matrix shape; the engine pads prefills to multiples of 32 tokens (few shapes), one at a time and static
batching run each prompt at its own length, and every trial draws the same requests, so from the second
trial on every scheme finds its shapes compiled.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from tformer.cache import make_caches
from tformer.inference.engine import BLOCK_SIZE, Engine, SamplingParams
from tformer.inference.paged_cache import PagedConfig, PagedStep
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
    not depend on the number of clients, only its waiting times do). Extra: its time split into prefill and
    decoding, and the bytes of keys/values its decoding steps read (for `ceiling`)."""
    order = [(k, c) for k in range(rounds) for c in range(clients)][:cap]
    t0 = time.perf_counter()
    sent = {c: t0 for c in range(clients)}
    tokens, ttft, prefill_s, kv_tokens = 0, [], 0.0, 0
    for k, c in order:
        prompt, n = work.request(c, k)
        cache = make_caches(model.cfg.n_layers, len(prompt) + n)
        t = time.perf_counter()
        tok = model(torch.tensor([prompt]), cache)[:, -1].argmax(-1, keepdim=True)
        prefill_s += time.perf_counter() - t
        ttft.append(time.perf_counter() - sent[c])
        for _ in range(n - 1):
            tok = model(tok, cache)[:, -1].argmax(-1, keepdim=True)
        tokens += n
        kv_tokens += (n - 1) * len(prompt) + n * (n - 1) // 2        # step i reads len(prompt) + i positions
        sent[c] = time.perf_counter()
    wall = time.perf_counter() - t0
    return tokens / wall, ttft, {"wall_s": wall, "prefill_s": prefill_s, "tokens": tokens, "kv_tokens": kv_tokens}


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
def run_continuous(model, work, clients, rounds, prefix_sharing=True, block_size=BLOCK_SIZE, sustained=True,
                   step_cache=PagedStep):
    """Continuous batching; each client sends its next request when its last one is done.

    sustained: the clients never stop sending, and the clock stops when clients * rounds requests have
    finished; tokens/s counts every token generated until then, the unfinished requests' too. This is the
    rate under a steady load of `clients`. Otherwise (sustained=False) each client sends `rounds` requests
    and the run drains: at its end fewer and fewer clients are left, and a batch engine runs part empty.
    step_cache: the class of the engine's step cache (`Engine(step_cache=)`): how a decoding step reads the blocks."""
    eng = Engine(model, n_blocks=max(clients, 4) * (768 // block_size + 1), block_size=block_size,
                 max_running=clients, max_waiting=clients + 1, prefix_sharing=prefix_sharing,
                 step_cache=step_cache)
    k = {c: 0 for c in range(clients)}
    owner, every, done = {}, [], 0

    def submit(c):
        prompt, n = work.request(c, k[c])
        every.append(eng.add_request(prompt, SamplingParams(max_tokens=n)))
        owner[every[-1].id] = c
        k[c] += 1
    t0 = time.perf_counter()
    for c in range(clients):
        submit(c)
    used, running = [], []
    while eng.has_work() and not (sustained and done >= clients * rounds):
        finished = eng.step()
        running.append(len(eng.running) + len(finished))          # sequences this step computed for
        for r in finished:
            c = owner.pop(r.id)
            done += 1
            if sustained or k[c] < rounds:
                submit(c)
        used.append(eng.pool.cfg.n_blocks - eng.blocks.n_free)
    tps = eng.generated_tokens / (time.perf_counter() - t0)
    ttft = [r.first_token_at - r.arrival for r in every if r.first_token_at is not None]
    return tps, ttft, {"mean_blocks": statistics.mean(used), "peak_blocks": max(used), "block_size": block_size,
                       "running": clients, "mean_running": statistics.mean(running)}


@torch.no_grad()
def rows_time(model, rows: int, repeats: int = 20) -> float:
    """Seconds for the weight work of one decoding step of `rows` sequences: every layer's linear layers
    and feed-forward, and the output head, on (rows, 1, d_model) inputs (the fastest of `repeats`)."""
    x = torch.randn(rows, 1, model.cfg.d_model, dtype=next(model.parameters()).dtype)

    def once():
        for blk in model.blocks:
            blk.attn.qkv(x), blk.attn.out(x), blk.ffn(x)
        model.head(x)
    return _best_time(once, repeats)


def read_bandwidth(mib: int = 512, repeats: int = 5) -> float:
    """Bytes/s at which this process reads a large array from memory once (a sum: streaming, the
    prefetchers' best case, and faster than any gather of scattered blocks)."""
    big = torch.ones(mib * 2**20 // 4)
    return big.numel() * 4 / _best_time(big.sum, repeats)


def _best_time(fn, repeats: int) -> float:
    """The fastest of `repeats` timed calls (after one untimed): a bound wants each part at its best."""
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def ceiling(one: dict, step_s: float, clients: int, token_bytes: int, bandwidth: float) -> dict:
    """The largest continuous/one ratio that eager PyTorch could reach on these requests at `clients`.

    One request at a time spent one["wall_s"]. Any batching scheme must still (a) prefill every prompt,
    work that batching does not shrink (each prefill is already a matrix product of hundreds of rows):
    one["prefill_s"]; (b) do each new token's weight work, at best `step_s` (a full step of `clients`
    rows, `rows_time`) shared by `clients` tokens; (c) read each token's keys and values (`token_bytes`
    per cached position), the same bytes as one at a time, at best at the streaming `bandwidth`. Eager
    PyTorch runs the linear layers and the attention as separate operations, so (b) and (c) add up;
    attention's arithmetic and every other operation count as free, which makes this an upper bound on
    the ratio. "overlap" is the roofline bound beyond eager PyTorch: a fused kernel that hid all the
    weight work under the reads (or the reverse) would pay only the larger of (b) and (c)."""
    weights = one["tokens"] * step_s / clients
    kv = one["kv_tokens"] * token_bytes / bandwidth
    return {"ratio": one["wall_s"] / (one["prefill_s"] + weights + kv),
            "overlap": one["wall_s"] / (one["prefill_s"] + max(weights, kv)),
            "prefill_s": one["prefill_s"], "weights_s": weights, "kv_s": kv, "one_s": one["wall_s"]}


def bench_prefix(model, rounds, clients=4, step_cache=PagedStep):
    rng = random.Random(1)
    system = [rng.randrange(1, 257) for _ in range(256)]
    work = Workload(2, prompt=(16, 64), out=(16, 64))
    shared_work = type("W", (), {"request": lambda self, c, k: (system + work.request(c, k)[0], work.request(c, k)[1])})()
    out = {}
    for on in (True, False):
        _, ttft, _ = run_continuous(model, shared_work, clients, rounds, prefix_sharing=on, sustained=False,
                                    step_cache=step_cache)
        out["shared" if on else "not shared"] = (statistics.median(ttft), len(ttft))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="requests each client sends, one after the other")
    ap.add_argument("--one-cap", type=int, default=16, help="at most this many requests for one-at-a-time")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--trials", type=int, default=1,
                    help="run the schemes this many times (rotating their order); ratios: the median")
    ap.add_argument("--drain", action="store_true",
                    help="continuous: each client sends --rounds requests and the run drains (default: a steady load, "
                         "timed until clients x rounds requests are done)")
    ap.add_argument("--block-size", type=int, default=BLOCK_SIZE, help="continuous: tokens per cache block")
    ap.add_argument("--quick", action="store_true", help="a 2-layer, d=192 model, for a smoke run")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="weights and KV cache of every scheme")
    ap.add_argument("--attention", choices=["package", "fused"], default="package",
                    help="continuous batching's decode attention: the package's (embedding_bag) or the fused C++ "
                         "kernel of benchmarks/paged_decode.cpp (built on first use: needs a C++ compiler)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's; on a machine shared with other jobs 1 is far steadier)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    step_cache = PagedStep
    if args.attention == "fused":                 # the engine reads the blocks through the kernel instead
        from paged_decode import build_kernel, fused_step
        step_cache = fused_step(build_kernel())
    model = model_for(args.quick, getattr(torch, args.dtype))
    work = Workload(0)
    rows, mem, summary = [], [], []
    print(f"model: {model.cfg.n_layers} layers, d_model {model.cfg.d_model}, context {model.cfg.context_length}; "
          f"{args.rounds} requests per client; prompts 16-512, outputs 16-256 tokens; {torch.get_num_threads()} threads, {args.dtype}; "
          f"decode attention: {args.attention}")
    print(f"{'clients':>7} {'scheme':>10} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'requests':>8}")
    f32 = model_for(args.quick) if args.dtype != "float32" else None        # the same weights, in float32
    schemes = [("one", run_one)] + ([("one-fp32", run_one)] if f32 else []) + [("static", run_static),
                                                                                ("continuous", run_continuous)]
    bandwidth = read_bandwidth()
    token_bytes = PagedConfig.for_model(model, dtype=next(model.parameters()).dtype).token_bytes
    warm = Workload(99, prompt=(16, 64), out=(4, 8))
    for name, fn in schemes:       # an untimed warm-up of each scheme: the first trial pays no one-time costs
        fn(f32 if name == "one-fp32" else model, warm, 2, 1)
    for c in args.clients:
        res = {name: [] for name, _ in schemes}
        ones, occupancy = [], []
        for trial in range(args.trials):
            # each trial runs the schemes back to back, in a rotated order: a slow spell of a shared
            # machine then lands on a different scheme each time, and the per-trial ratios show it
            turn = trial % len(schemes)
            for name, fn in schemes[turn:] + schemes[:turn]:
                kw = {"one": {"cap": args.one_cap}, "one-fp32": {"cap": args.one_cap},
                      "continuous": {"sustained": not args.drain, "block_size": args.block_size,
                                     "step_cache": step_cache}}.get(name, {})
                tps, ttft, extra = fn(f32 if name == "one-fp32" else model, work, c, args.rounds, **kw)
                res[name].append(tps)
                if name == "one":
                    ones.append(extra)
                if name == "continuous":
                    occupancy.append(extra["mean_running"])
                print(f"{c:>7} {name:>10} {tps:>8.1f} {pct(ttft, 0.5):>8.2f}s {pct(ttft, 0.99):>8.2f}s {len(ttft):>8}",
                      flush=True)
                rows.append({"clients": c, "scheme": name, "trial": trial, "tokens_per_s": tps,
                             "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99), "requests": len(ttft)})
                if name == "continuous" and trial == 0:
                    mem.append({"clients": c, "paged_tokens_mean": extra["mean_blocks"] * extra["block_size"],
                                "paged_tokens_peak": extra["peak_blocks"] * extra["block_size"],
                                "contiguous_tokens": c * (512 + 256)})
        for base in [n for n, _ in schemes if n != "continuous"]:
            r = [x / y for x, y in zip(res["continuous"], res[base])]
            spread = f" (trials {min(r):.2f}-{max(r):.2f})" if len(r) > 1 else ""
            print(f"{c:>7} {'ratio':>10}  continuous/{base} {statistics.median(r):.2f}x{spread}", flush=True)
            summary.append({"clients": c, "vs": base, "median": statistics.median(r), "trials": r})
        step_s = rows_time(model, c)
        cap = [ceiling(o, step_s, c, token_bytes, bandwidth) for o in ones]
        mid = sorted(cap, key=lambda x: x["ratio"])[len(cap) // 2]
        top = statistics.median(x["ratio"] for x in cap)
        top_f32 = top * statistics.median(res["one"]) / statistics.median(res["one-fp32"]) if f32 else None
        vs_f32 = f", {top_f32:.2f}x over one-fp32" if top_f32 else ""   # the same bound, the faster baseline
        print(f"{c:>7} {'ceiling':>10}  continuous/one {top:.2f}x at most{vs_f32} "
              f"(one at a time {mid['one_s']:.2f} s: prefill alone {mid['prefill_s']:.2f} s; batched, the weight work "
              f"{mid['weights_s']:.2f} s and the keys/values read at {bandwidth / 1e9:.0f} GB/s {mid['kv_s']:.2f} s; "
              f"{statistics.median(x['overlap'] for x in cap):.2f}x if a fused kernel overlapped the two); "
              f"sequences per step {statistics.mean(occupancy):.1f} of {c}", flush=True)
        summary.append({"clients": c, "ceiling": [x["ratio"] for x in cap],
                        "ceiling_overlap": [x["overlap"] for x in cap], "ceiling_vs_one_fp32": top_f32,
                        "mean_running": occupancy,
                        "read_bandwidth": bandwidth})
    print("\nKV cache at the same load (tokens' worth of keys/values held)")
    for m in mem:
        print(f"{m['clients']:>7} clients: paged {m['paged_tokens_mean']:.0f} mean / {m['paged_tokens_peak']} peak "
              f"vs contiguous {m['contiguous_tokens']} ({m['paged_tokens_mean'] / m['contiguous_tokens']:.0%})")
    pre = bench_prefix(model, max(args.rounds, 3), step_cache=step_cache)
    print("\nprefix sharing, 256-token shared system prompt, 4 clients: TTFT p50 "
          + ", ".join(f"{k} {v[0] * 1000:.0f} ms ({v[1]} requests)" for k, v in pre.items())
          + f"; ratio {pre['not shared'][0] / pre['shared'][0]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"throughput": rows, "ratios": summary, "memory": mem, "prefix": pre}, f, indent=2)


if __name__ == "__main__":
    main()
