"""Mixture of experts, side by side in one run.

    .venv/bin/python benchmarks/bench_moe.py [--repeats 5] [--threads 1]
    python benchmarks/bench_moe.py --gpu          # on a CUDA GPU: bf16, flash forced, tokens/s and MFU

Rows (CPU):
  * one MoE layer, forward + backward, E=8 top-2, d=128, expert width 256, 512 tokens: tformer's
    "padded" and "grouped" dispatch vs the same dispatch as it was earlier (`OldMoE`: advanced-
    indexing gathers whose backward is an accumulating index_put_), vs the naive per-token loop (the
    reference) and vs Hugging Face's Qwen3-MoE block (a loop over experts), same weights; ratios = other's
    time / tformer's time, and what `auto` picks now against what it picked before (target: <= 1.05).
  * language-model training step (forward, loss + aux, backward, AdamW): MoE GPT (8 experts, top-2,
    expert width 2d) vs a dense GPT with the same active parameters (FFN width 4d): tokens/s.
On a GPU (--gpu): the same LM pair at a larger size through `tformer.measure.flash.lm_throughput` (bf16
autocast, flash attention forced and checked), tokens/s and MFU; grouped vs padded dispatch.

Pairs run interleaved after a warm-up so they see the same machine load; medians are reported.
"""
from __future__ import annotations

import argparse

import torch

import tformer.utils.runtime
from tformer.measure.flash import lm_throughput
from tformer.models import GPT, GPTConfig
from tformer.measure.timing import time_interleaved
from tformer.moe import MoE, MoEConfig
from tformer.moe.dispatch import GROUP_ALIGN, compute_dtype, grouped_mm_available, make_plan


class OldMoE(MoE):
    """The dispatch as it was earlier, kept to time it side by side with the current one: advanced-
    indexing gathers (`xf[token_sorted]`, `[slot]`, `[rows]`, whose backward is an accumulating
    `index_put_`) and an `index_add` combine, on `make_plan` (which then also ran `bincount`, a host sync on
    CUDA; it now shares `sort_by_expert` with the fast paths, so this row times the gathers, not the sync)."""

    def _dispatch(self, xf, gates, experts, capacity, path):
        c, d = self.cfg, self.d_model
        plan = make_plan(gates, experts, c.n_experts, capacity)
        xs = xf[plan.token_sorted]                                             # (M, d) grouped by expert
        if path == "padded":
            cap = plan.capacity if plan.capacity is not None else int(plan.counts.max())
            slot = plan.expert_sorted * cap + plan.slot_sorted
            buf = xf.new_zeros(c.n_experts * cap, d).index_copy(0, slot, xs)
            ys = self.experts.padded(buf.view(c.n_experts, cap, d)).view(-1, d)[slot]
        else:
            padded = (plan.kept_counts + GROUP_ALIGN - 1) // GROUP_ALIGN * GROUP_ALIGN
            ends = torch.cumsum(padded, 0)
            rows = (ends - padded)[plan.expert_sorted] + plan.slot_sorted
            n_rows = xs.shape[0] + c.n_experts * (GROUP_ALIGN - 1)
            dt = compute_dtype(xf)
            buf = xs.new_zeros(n_rows, d, dtype=dt).index_copy(0, rows, xs.to(dt))
            expert_of_row = torch.searchsorted(ends, torch.arange(n_rows, device=xs.device), right=True)
            ys = self.experts.grouped(buf, expert_of_row, ends.to(torch.int32))[rows]
        ys = ys * plan.gate_sorted.to(ys.dtype)[:, None]
        y = xf.new_zeros(xf.shape).index_add(0, plan.token_sorted, ys.to(xf.dtype))
        return y, plan.keep, plan.counts

    def choose_dispatch(self, x):                                              # the old rule: grouped on CUDA only
        if self.cfg.dispatch != "auto":
            return self.cfg.dispatch
        ok = x.device.type == "cuda" and grouped_mm_available(x, self.d_model, self.d_ff)
        return "grouped" if ok else "padded"


def bench_layer(repeats: int, device: str = "cpu", dtype=torch.float32, n_tokens: int = 512, naive: bool = True):
    torch.manual_seed(0)
    d, ff, e, k = 128, 256, 8, 2
    layer = MoE(d, MoEConfig(n_experts=e, top_k=k, d_ff=ff), activation="swiglu").to(device, dtype)
    x = torch.randn(n_tokens, d, device=device, dtype=dtype)
    g = torch.randn(n_tokens, d, device=device, dtype=dtype)

    def run(path):
        def f():
            xx = x.clone().requires_grad_()
            (layer(xx, dispatch=path) * g).sum().backward()
        return f

    old = OldMoE(d, layer.cfg, activation="swiglu").to(device, dtype)
    old.load_state_dict(layer.state_dict())

    def run_old(path):
        def f():
            xx = x.clone().requires_grad_()
            (old(xx, dispatch=path) * g).sum().backward()
        return f

    auto = layer.choose_dispatch(x)
    fns = {"padded": run("padded")}
    if grouped_mm_available(x, d, ff):
        fns["grouped"] = run("grouped")
    fns["old padded (earlier)"] = run_old("padded")
    if grouped_mm_available(x, d, ff):
        fns["old grouped (earlier)"] = run_old("grouped")
    for path in fns.keys() & {"padded", "grouped"}:
        torch.testing.assert_close(old(x, dispatch=path), layer(x, dispatch=path))      # same function
    if naive:
        fns["naive loop"] = run("naive")
    try:
        import transformers
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        cfg = transformers.Qwen3MoeConfig(hidden_size=d, moe_intermediate_size=ff, num_experts=e,
                                          num_experts_per_tok=k, norm_topk_prob=True)
        hf = Qwen3MoeSparseMoeBlock(cfg).to(device, dtype)
        with torch.no_grad():
            hf.gate.weight.copy_(layer.router.weight)
            hf.experts.gate_up_proj.copy_(torch.cat([layer.experts.fc1, layer.experts.gate], dim=1))
            hf.experts.down_proj.copy_(layer.experts.fc2)
        x3 = x[None]
        out = hf(x3)
        out = out[0] if isinstance(out, tuple) else out
        torch.testing.assert_close(out[0], layer(x), rtol=2e-2, atol=2e-3)      # same function, same weights

        def f_hf():
            xx = x3.clone().requires_grad_()
            out = hf(xx)
            ((out[0] if isinstance(out, tuple) else out)[0] * g).sum().backward()
        fns["HF Qwen3-MoE block (expert loop)"] = f_hf
    except ImportError:
        pass
    t = time_interleaved(fns, repeats)
    ref = min(v for kk, v in t.items() if kk in ("padded", "grouped"))
    print(f"\nMoE layer fwd+bwd, {n_tokens} tokens, d={d}, E={e}, top-{k}, SwiGLU width {ff}, {dtype}, {device}")
    for name, sec in t.items():
        print(f"  {name:>34}: {sec * 1e3:8.2f} ms   ratio vs best tformer path: {sec / ref:6.2f}x")
    old_auto = f"old {old.choose_dispatch(x)} (earlier)"
    print(f"  auto now picks {auto!r}, before it picked {old.choose_dispatch(x)!r}: now / before = "
          f"{t[auto] / t[old_auto]:.3f} (target: <= 1.05 on a CPU)")
    return t


def lm_pair(width: int, layers: int, heads: int, block: int, vocab: int, n_experts: int = 8, k: int = 2):
    base = dict(vocab_size=vocab, context_length=block, n_layers=layers, n_heads=heads, d_model=width)
    return {"dense (FFN 4d)": GPTConfig(**base, d_ff=4 * width),
            f"MoE {n_experts}x top-{k} (experts 2d)": GPTConfig(
                **base, moe=MoEConfig(n_experts=n_experts, top_k=k, d_ff=4 * width // k))}


def bench_lm_cpu(repeats: int):
    print("\nLM training step on CPU, equal active parameters (d=128, 4 layers, 4 heads, T=128, B=8, vocab 2048)")
    rows = {}
    for name, cfg in lm_pair(128, 4, 4, 128, 2048).items():
        torch.manual_seed(0)
        model = GPT(cfg)
        r = lm_throughput(model, batch_size=8, seq_len=128, steps=repeats, warmup=1, flash=True)
        rows[name] = r
        print(f"  {name:>28}: total {model.num_params():>10,d}  active {model.num_params(active=True):>10,d}  "
              f"{r['tokens_per_s']:9,.0f} tokens/s  kernels {r['backends']}")
    a, b = list(rows.values())
    print(f"  MoE / dense tokens/s: {b['tokens_per_s'] / a['tokens_per_s']:.2f}")


def bench_gpu(compile: bool):
    dev = torch.device("cuda")
    print(f"\n{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, bf16 autocast, flash attention forced")
    bench_layer(repeats=20, device="cuda", dtype=torch.bfloat16, n_tokens=16384, naive=False)
    for width, layers, heads, block, batch in ((768, 12, 6, 1024, 16), (2048, 8, 16, 2048, 8)):
        print(f"\nLM d={width} L={layers} heads={heads} T={block} B={batch}, vocab 32768")
        for name, cfg in lm_pair(width, layers, heads, block, 32768).items():
            for dispatch in (("grouped", "padded") if "MoE" in name else ("-",)):
                if dispatch != "-":
                    cfg.moe.dispatch = dispatch
                torch.manual_seed(0)
                model = GPT(cfg).to(dev)
                r = lm_throughput(model, batch_size=batch, seq_len=block, steps=10, warmup=3, compile=compile)
                mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
                print(f"  {name:>28} {dispatch:>8}: active {model.num_params(active=True) / 1e6:7.1f}M  "
                      f"{r['tokens_per_s']:11,.0f} tokens/s  MFU {mfu}  kernels {r['backends']}")
                del model
                torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is steadiest on a busy machine)")
    p.add_argument("--gpu", action="store_true", help="CUDA: bf16, flash forced, tokens/s and MFU")
    p.add_argument("--compile", action="store_true", help="with --gpu: torch.compile the models")
    args = p.parse_args()
    tformer.utils.runtime.set_threads(args.threads)   # explicit: benchmarks choose their threads (None = every core), not small mode
    if args.gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--gpu needs a CUDA GPU")
        bench_gpu(args.compile)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s)")
    bench_layer(args.repeats)
    bench_lm_cpu(args.repeats)


if __name__ == "__main__":
    main()
