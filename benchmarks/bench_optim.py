"""The optimizer step alone: torch's default Adam/AdamW against its fused kernel, on the course's models.

Every optimizer the package builds passes `fused=tformer.training.fusable(params)`: on a CPU or a CUDA
GPU the fused kernel reads each parameter, its gradient and its two moments once and writes them once.
The default (`foreach`, "peer" below) runs the update as a chain of whole-list operations, each one a
pass through memory; `foreach=False` loops over the parameters one at a time. Hugging Face's Trainer
defaults to the fused AdamW since torch 2.8, so bench_core's GPT step uses it on both sides.

Gradients are random (the update's cost does not depend on their values); the optimizer steps in turns,
interleaved in one process, after two warm-up steps.

    python benchmarks/bench_optim.py [--threads 2] [--repeats 9]
"""
from __future__ import annotations

import argparse

import torch

import tformer.utils.runtime
from tformer.models import GPT, GPTConfig, Transformer, TransformerConfig
from tformer.training import fusable
from tformer.measure.timing import format_table, time_interleaved


def models():
    """(name, model, optimizer class, its keyword arguments) for the course's three training recipes."""
    gpt = GPT(GPTConfig(vocab_size=50257, context_length=256, n_layers=6, n_heads=6, d_model=384))
    small = Transformer(TransformerConfig(src_vocab_size=8000, d_model=256, n_heads=4, d_ff=1024,
                                          n_encoder_layers=3, n_decoder_layers=3, context_length=128))
    moe_dense = GPT(GPTConfig(vocab_size=4096, context_length=256, n_layers=4, n_heads=4, d_model=128))
    return [("GPT 6L/384d, vocab 50,257 (bench_core)", gpt, torch.optim.AdamW, {"lr": 1e-4}),
            ("translate small, 3+3 d256, vocab 8,000", small, torch.optim.Adam, {"lr": 1e-4, "betas": (0.9, 0.98)}),
            ("GPT 4L/128d, vocab 4,096", moe_dense, torch.optim.AdamW, {"lr": 1e-4})]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: every core)")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    tformer.utils.runtime.set_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for name, model, cls, kw in models():
        params = list(model.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        opts = {"peer": cls(params, **kw), "foreach=False": cls(params, foreach=False, **kw),
                "fused": cls(params, fused=fusable(params), **kw)}
        med = time_interleaved({k: o.step for k, o in opts.items()}, args.repeats, warmup=2)
        rows.append({"model": name, "params (M)": sum(p.numel() for p in params) / 1e6,
                     "default ms": med["peer"] * 1e3, "foreach=False ms": med["foreach=False"] * 1e3,
                     "fused ms": med["fused"] * 1e3, "default/fused": med["peer"] / med["fused"]})
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), median of {args.repeats} steps; "
          f"default = foreach (torch's choice), fused = what the package builds")
    print(format_table(rows))


if __name__ == "__main__":
    main()
