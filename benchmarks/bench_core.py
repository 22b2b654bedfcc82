"""tformer's core against its peers, side by side in one run.

    .venv/bin/python benchmarks/bench_core.py [--repeats 7] [--threads N] [--bf16] [--only gpt,blocks] [--compile]

Each pair runs interleaved (peer, tformer, peer, tformer, ...) after a warm-up, so both see the same
machine load; the table reports medians and the ratio peer_time / tformer_time (>= 1.0: tformer is
at least as fast). Rows:
  * MultiHeadAttention vs nn.MultiheadAttention, forward + backward (B=16, T=128, d=512, 8 heads)
  * GPT training step vs transformers' GPT2LMHeadModel, same config (6 layers, d=384, 6 heads, T=256), each
    with its library's loss path: `GPT.loss` fuses the LM head into the cross-entropy (no (B*T, 50257)
    logits kept); the peer computes the logits, then F.cross_entropy (what its `labels=` path does); both
    update with the fused AdamW (Hugging Face Trainer's default since torch 2.8, and what the package
    builds: benchmarks/bench_optim.py times it against torch's default)
  * the same GPT's six blocks alone, forward + backward (no embedding, LM head, loss or optimizer, which
    are the same operations on both sides and most of the step at vocabulary 50,257); beside it, the
    blocks' matrix products and attention kernel alone, with nothing between them: a floor for any
    implementation of these blocks, so peer / floor is the largest ratio one can reach
  * encoder-decoder training step vs nn.Transformer with the same embeddings/generator (6+6, d=512, B16xT64)
  * greedy generation of 128 tokens with the KV cache vs without it (GPT 6L/384d)

`--bf16` repeats the training rows with both sides under CPU bf16 autocast (fast where the CPU has bf16
matrix units: Intel AMX, AVX512-BF16) and prints, beside the same-precision ratio, tformer in bf16 against
the peer in float32 (the peer as a user writes it).
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import tformer.utils.runtime
from tformer import MultiHeadAttention, causal_mask
from tformer.models import GPT, GPTConfig, Transformer, TransformerConfig
from tformer.positional import sinusoidal_table
from tformer.training import fusable
from tformer.measure.timing import time_interleaved




def bench_mha(repeats):
    torch.manual_seed(0)
    b, t, d, h = 16, 128, 512, 8
    theirs = nn.MultiheadAttention(d, h, batch_first=True)
    ours = MultiHeadAttention(d, h)
    x = torch.randn(b, t, d, requires_grad=True)

    def peer():
        theirs(x, x, x, need_weights=False)[0].sum().backward()

    def mine():
        ours(x).sum().backward()
    return time_interleaved({"peer": peer, "tformer": mine}, repeats), b * t


def _gpt_pair(t):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=t, n_embd=384, n_layer=6, n_head=6,
                                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    ours = GPT(GPTConfig(vocab_size=50257, context_length=t, n_layers=6, n_heads=6, d_model=384))
    return hf, ours


def bench_blocks(repeats):
    b, t = 8, 256
    hf, ours = _gpt_pair(t)
    x = torch.randn(b, t, 384, requires_grad=True)

    def peer():
        h = x
        for blk in hf.transformer.h:
            out = blk(h)
            h = out[0] if isinstance(out, tuple) else out
        h.sum().backward()

    def stack(h):
        for blk in ours.blocks:
            h = blk(h, is_causal=True)
        return h

    fns = {"peer": peer, "tformer": lambda: stack(x).sum().backward(), "floor": _matmuls_alone(ours, x)}
    if COMPILE:
        compiled = torch.compile(stack)                 # the first call (in the warm-up) compiles
        fns["compiled"] = lambda: compiled(x).sum().backward()
    return time_interleaved(fns, repeats), b * t


COMPILE = False                                         # --compile: also the blocks through torch.compile


def _matmuls_alone(gpt, x):
    """The blocks' matrix products and attention kernel alone, forward + backward, each on random
    inputs of its shape (no LayerNorm, GELU, residual adds, bias gradients or head reshapes between
    them): what any implementation of the same blocks in the same precision must at least spend, so
    peer_time / this time bounds the ratio any of them can reach."""
    bsz, t, d = x.shape
    m, g = bsz * t, torch.Generator().manual_seed(0)
    dt = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dt)          # noqa: E731
    gemms = [(rnd(m, lin.in_features), rnd(lin.out_features, lin.in_features), rnd(lin.out_features),
              rnd(m, lin.out_features)) for lin in gpt.blocks[0].modules() if isinstance(lin, nn.Linear)]
    qkv = [rnd(bsz, gpt.cfg.n_heads, t, gpt.cfg.head_dim).requires_grad_() for _ in range(3)]
    grad_out = rnd(bsz, gpt.cfg.n_heads, t, gpt.cfg.head_dim)

    def run():
        with torch.autocast("cpu", enabled=False):
            for _ in gpt.blocks:
                for inp, w, b, grad in gemms:
                    torch.addmm(b, inp, w.t())          # forward: x W^T + b
                    torch.mm(grad, w)                   # backward: dL/dx
                    torch.mm(grad.t(), inp)             # backward: dL/dW
                F.scaled_dot_product_attention(*qkv, is_causal=True).backward(grad_out)
    return run


def bench_gpt(repeats):
    b, t = 8, 256
    hf, ours = _gpt_pair(t)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4, fused=True)     # Trainer's default since torch 2.8
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=fusable(ours.parameters()))   # the package's
    idx = torch.randint(0, 50257, (b, t + 1))
    x, y = idx[:, :-1], idx[:, 1:]

    def step(model, opt, loss_of):
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def hf_loss(i, tgt):                      # what GPT2LMHeadModel(labels=...) computes: logits, then F.cross_entropy
        logits = hf(i).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1))
    return time_interleaved({"peer": lambda: step(hf, opt_hf, hf_loss),
                        "tformer": lambda: step(ours, opt_ours, ours.loss)}, repeats), b * t   # GPT.loss: head fused


class TorchSeq2Seq(nn.Module):
    """nn.Transformer with the same embedding, positions and tied generator as tformer's model."""

    def __init__(self, vocab, d=512, h=8, n=6, ff=2048):
        super().__init__()
        self.d = d
        self.embed = nn.Embedding(vocab, d)
        self.register_buffer("pe", sinusoidal_table(512, d))
        self.core = nn.Transformer(d, h, n, n, ff, dropout=0.1, batch_first=True)
        self.gen = nn.Linear(d, vocab, bias=False)
        self.gen.weight = self.embed.weight

    def forward(self, src, tgt):
        e = lambda z: self.embed(z) * math.sqrt(self.d) + self.pe[: z.shape[1]]
        out = self.core(e(src), e(tgt), tgt_mask=~causal_mask(tgt.shape[1]), src_key_padding_mask=src == 0,
                        memory_key_padding_mask=src == 0, tgt_is_causal=True)
        return self.gen(out)


def bench_seq2seq(repeats):
    torch.manual_seed(0)
    vocab, b, t = 8000, 16, 64
    theirs = TorchSeq2Seq(vocab)
    ours = Transformer(TransformerConfig.base(vocab))
    src = torch.randint(1, vocab, (b, t))
    src[: b // 2, t - 10:] = 0                                   # some padding, as in real batches
    tgt = torch.randint(1, vocab, (b, t + 1))
    opts = {m: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9) for m in (theirs, ours)}

    def step(model):
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), tgt[:, 1:].reshape(-1), label_smoothing=0.1)
        opts[model].zero_grad(set_to_none=True)
        loss.backward()
        opts[model].step()
    return time_interleaved({"peer": lambda: step(theirs), "tformer": lambda: step(ours)}, repeats), b * t


def bench_generate(repeats):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50257, context_length=512, n_layers=6, n_heads=6, d_model=384)).eval()
    idx = torch.randint(0, 50257, (1, 16))
    n = 128
    return time_interleaved({"peer": lambda: model.generate(idx, n, temperature=0.0, use_cache=False),
                        "tformer": lambda: model.generate(idx, n, temperature=0.0, use_cache=True)},
                       max(3, repeats // 2), warmup=1), n


ROWS = {"mha": ("MultiHeadAttention fwd+bwd", "nn.MultiheadAttention", bench_mha, "tokens/s"),
        "gpt": ("GPT train step 6L/384d T=256", "transformers GPT2LMHeadModel", bench_gpt, "tokens/s"),
        "blocks": ("GPT blocks alone fwd+bwd", "GPT2LMHeadModel's blocks", bench_blocks, "tokens/s"),
        "encdec": ("enc-dec train step 6+6 d512", "nn.Transformer", bench_seq2seq, "tgt tokens/s"),
        "generate": ("generate 128 tokens, KV cache", "same model, no cache", bench_generate, "tokens/s")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: every core)")
    p.add_argument("--bf16", action="store_true", help="also the training rows under CPU bf16 autocast")
    p.add_argument("--only", default=None, help=f"comma-separated rows to run, of {','.join(ROWS)} (default: all)")
    p.add_argument("--compile", action="store_true", help="also time tformer's blocks through torch.compile")
    args = p.parse_args()
    global COMPILE
    COMPILE = args.compile
    only = ROWS if args.only is None else args.only.split(",")
    unknown = sorted(set(only) - set(ROWS))
    if unknown:
        p.error(f"--only: unknown rows {unknown}; choose from {','.join(ROWS)}")
    tformer.utils.runtime.set_threads(args.threads)   # explicit: benchmarks choose their threads (None = every core), not small mode
    rows = [row for key, row in ROWS.items() if key in only]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"| {'what':32} | {'peer':30} | {'peer ms':>9} | {'tformer ms':>10} | {'tformer ' + 'rate':>16} | {'ratio':>6} |")
    print(f"|{'-' * 34}|{'-' * 32}|{'-' * 11}|{'-' * 12}|{'-' * 18}|{'-' * 8}|")
    fp32 = {}

    def show(what, peer, times, work, unit):
        ratio = times["peer"] / times["tformer"]
        rate = f"{work / times['tformer']:,.0f} {unit}"
        print(f"| {what:32} | {peer:30} | {times['peer'] * 1e3:9.1f} | {times['tformer'] * 1e3:10.1f} | "
              f"{rate:>16} | {ratio:6.2f} |", flush=True)
    def floor(times):
        if "floor" in times:
            print(f"|   their matmuls + attention alone: {times['floor'] * 1e3:.1f} ms; tformer spends "
                  f"{times['tformer'] / times['floor']:.2f}x that, the peer {times['peer'] / times['floor']:.2f}x "
                  f"(the most any implementation can reach over the peer here)", flush=True)
        if "compiled" in times:
            print(f"|   tformer's blocks through torch.compile: {times['compiled'] * 1e3:.1f} ms "
                  f"({times['tformer'] / times['compiled']:.2f}x eager)", flush=True)
    for what, peer, fn, unit in rows:
        times, work = fn(args.repeats)
        fp32[what] = times
        show(what, peer, times, work, unit)
        floor(times)
    if args.bf16:
        for what, peer, fn, unit in [r for r in rows if r[2] is not bench_generate]:   # the training rows
            with torch.autocast("cpu", dtype=torch.bfloat16):
                times, work = fn(args.repeats)
            show(what + ", bf16", peer + ", bf16", times, work, unit)
            floor(times)
            print(f"|   tformer bf16 vs the peer in float32: {fp32[what]['peer'] / times['tformer']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
