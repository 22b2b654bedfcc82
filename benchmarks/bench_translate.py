"""Training throughput of tformer's Transformer vs a `torch.nn.Transformer` of the same size.

Same width, depth, heads, FFN, vocabulary (tied embeddings on both sides), same batch, same
label-smoothed loss (ours through `Seq2SeqLoss`, its head fused into the loss as the capstone trains it;
the peer's `F.cross_entropy` on its logits, as a user writes it) and Adam; one training step = forward +
backward + optimizer step. The two models
alternate step by step (so a change in machine load hits both), and each reports the median over
`--steps` steps after `--warmup` steps. Prints target tokens/s for each and the ratio tformer / peer.

    python benchmarks/bench_translate.py                       # the `small` preset size (Multi30k)
    python benchmarks/bench_translate.py --preset base --batch 64 --len 32 --device cuda
"""
from __future__ import annotations

import argparse
import copy
from dataclasses import replace

import torch
import torch.nn.functional as F

import tformer.utils.runtime
from tformer.measure.timing import time_interleaved
from tformer.translate.pipeline import Seq2SeqLoss, build_model
from tformer.translate.presets import get_preset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64, help="sentences per batch")
    ap.add_argument("--len", type=int, default=16, help="tokens per sentence (Multi30k averages about 15)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(tformer) (compile time excluded)")
    ap.add_argument("--bf16", action="store_true", help="on a CPU, also time both models under bf16 autocast "
                    "(fast where the CPU has bf16 matrix units: AMX or AVX512-BF16)")
    args = ap.parse_args()
    tformer.utils.runtime.set_threads(args.threads)   # explicit: benchmarks choose their threads (None = every core), not small mode
    dev = torch.device(args.device)
    # nn.Transformer has one dropout for everything: both models drop attention weights and FFN units at the
    # preset's dropout here (small-avx2 leaves them, which makes its step cheaper), so that the ratio compares the
    # implementations, not the recipes
    p = replace(get_preset(args.preset), attn_dropout=None, ffn_dropout=None)
    torch.manual_seed(0)
    ours = build_model(p, args.vocab).to(dev)
    peer = build_model(replace(p, arch="torch"), args.vocab).to(dev)     # tformer.translate.peer: nn.Transformer
    n_ours = sum(q.numel() for q in ours.parameters())
    n_peer = sum(q.numel() for q in peer.parameters())
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, args.vocab, (args.batch, args.len), generator=g).to(dev)
    tgt = torch.randint(4, args.vocab, (args.batch, args.len + 1), generator=g).to(dev)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    from tformer.data import Seq2SeqBatch
    batch = Seq2SeqBatch(src, tgt_in, tgt_out)
    loss_ours = Seq2SeqLoss(0.1, 0)

    def loss_peer(model, b):
        logits = model(b.src, b.tgt_in)
        return F.cross_entropy(logits.flatten(0, 1).float(), b.tgt_out.flatten(), ignore_index=0,
                               label_smoothing=0.1, reduction="sum"), (b.tgt_out != 0).sum()

    runs = {"tformer": (ours, loss_ours), "nn.Transformer": (peer, loss_peer)}
    bf16 = {k: dev.type == "cuda" for k in runs}        # on CUDA both always run under bf16 autocast
    if args.bf16 and dev.type == "cpu":
        for k in list(runs):
            runs[k + " bf16"] = (copy.deepcopy(runs[k][0]), runs[k][1])
            bf16[k + " bf16"] = True
    if args.compile:                                  # same weights, inductor's fused kernels; warm-up compiles
        runs["tformer compiled"] = (torch.compile(copy.deepcopy(ours)), loss_ours)
        bf16["tformer compiled"] = dev.type == "cuda"
    opts = {k: torch.optim.Adam(m.parameters(), 1e-4, betas=(0.9, 0.98), eps=1e-9) for k, (m, _) in runs.items()}

    def step(name):
        model, loss_fn = runs[name]

        def run():
            model.train()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16[name]):
                loss, n = loss_fn(model, batch)
            (loss / n).backward()
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
        return run

    med = time_interleaved({k: step(k) for k in runs}, args.steps, warmup=args.warmup, device=dev)
    tokens = int((tgt_out != 0).sum())
    print(f"preset {args.preset}: d={p.d_model} layers={p.n_layers}+{p.n_layers} heads={p.n_heads} ffn={p.d_ff} "
          f"vocab={args.vocab}; batch {args.batch}x{args.len}; device {dev}, torch threads {torch.get_num_threads()}")
    print(f"parameters: tformer {n_ours / 1e6:.2f}M, nn.Transformer {n_peer / 1e6:.2f}M")
    tps = {}
    for name, sec in med.items():
        tps[name] = tokens / sec
        print(f"{name:>19}: median step {sec * 1000:8.1f} ms  {tps[name]:9.0f} target tokens/s")
    for name in [k for k in tps if k != "nn.Transformer"]:
        print(f"ratio {name} / nn.Transformer: {tps[name] / tps['nn.Transformer']:.2f}")
    if "tformer bf16" in tps:
        print(f"ratio tformer bf16 / nn.Transformer bf16 (same precision): "
              f"{tps['tformer bf16'] / tps['nn.Transformer bf16']:.2f}")


if __name__ == "__main__":
    main()
