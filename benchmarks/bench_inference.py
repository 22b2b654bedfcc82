"""Chapter 14 side by side with peers, in one process run (CPU by default).

    .venv/bin/python benchmarks/bench_inference.py [--repeats 5] [--threads 1]

Rows:
  * greedy decoding with a KV cache: tformer's GPT vs Hugging Face's GPT2LMHeadModel.generate (random
    GPT-2 config, same weights loaded with `GPT.from_hf_gpt2`): same tokens, tokens/s, ratio.
  * paged vs contiguous KV cache: the same decoding through `tformer.inference.paged_cache` (gathering the blocks
    each step) vs `KVCache`: same tokens, tokens/s, ratio.
  * int8 weights: `tformer.inference.quantize.QuantLinear` (weight-only) vs PyTorch's dynamic int8 Linear
    (`torch.ao.quantization.quantize_dynamic`, int8 activations too) vs float nn.Linear: time of a
    (tokens x d) @ (d x 4d) layer and the error against the float layer.

Pairs run interleaved after a warm-up so they see the same machine load; medians are reported.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tformer.utils.runtime  # noqa: E402
from tformer.models import GPT  # noqa: E402
from tformer.inference.paged_cache import BlockPool, PagedConfig, generate_paged  # noqa: E402
from tformer.inference.quantize import QuantLinear  # noqa: E402
from tformer.measure.timing import time_interleaved  # noqa: E402




def bench_decoding(repeats: int, n_new: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=2048, n_positions=256, n_embd=256, n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0)).eval()
    ours = GPT.from_hf_gpt2(hf).eval()
    prompt = torch.randint(0, 2048, (1, 16))
    with torch.no_grad():
        a = ours.generate(prompt, n_new, temperature=0)
        b = hf.generate(prompt, max_new_tokens=n_new, do_sample=False, min_new_tokens=n_new,
                        attention_mask=torch.ones_like(prompt), pad_token_id=0)
        pool = BlockPool(PagedConfig.for_model(ours, block_size=16, n_blocks=64))
        c, _ = generate_paged(ours, [prompt[0]], n_new, pool)
    same = bool(torch.equal(a, b)) and bool(torch.equal(a[0], c[0]))

    def run_paged():
        generate_paged(ours, [prompt[0]], n_new, BlockPool(PagedConfig.for_model(ours, block_size=16, n_blocks=64)))
    with torch.no_grad():
        t = time_interleaved({"tformer": lambda: ours.generate(prompt, n_new, temperature=0),
                         "hf": lambda: hf.generate(prompt, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                                                   attention_mask=torch.ones_like(prompt), pad_token_id=0),
                         "paged": run_paged}, repeats)
    print(f"greedy decoding, GPT-2 config d=256 L=4, 16-token prompt + {n_new} tokens (same tokens: {same})")
    print(f"  tformer GPT + KVCache     {n_new / t['tformer']:8.0f} tokens/s")
    print(f"  HF GPT2LMHeadModel        {n_new / t['hf']:8.0f} tokens/s   tformer / HF = {t['hf'] / t['tformer']:.2f}")
    print(f"  tformer + paged cache     {n_new / t['paged']:8.0f} tokens/s   paged / contiguous = "
          f"{t['tformer'] / t['paged']:.2f}")


def bench_int8(repeats: int, tokens: int = 256, d: int = 512):
    torch.manual_seed(0)
    lin = nn.Linear(d, 4 * d).eval()
    ql = QuantLinear.from_linear(lin, bits=8)
    q4 = QuantLinear.from_linear(lin, bits=4, group_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dyn = torch.ao.quantization.quantize_dynamic(nn.Sequential(lin), {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(tokens, d)
    with torch.no_grad():
        ref = lin(x)
        err = {name: ((m(x) - ref).norm() / ref.norm()).item() for name, m in
               (("QuantLinear int8", ql), ("QuantLinear int4", q4), ("torch dynamic int8", dyn))}
        t = time_interleaved({"float": lambda: lin(x), "QuantLinear int8": lambda: ql(x), "QuantLinear int4": lambda: q4(x),
                         "torch dynamic int8": lambda: dyn(x)}, repeats * 4)
    wbytes = {"float": lin.weight.numel() * 4, "QuantLinear int8": ql.qweight.numel() + ql.scale.numel() * 4,
              "QuantLinear int4": q4.qweight.numel() + q4.scale.numel() * 4,
              "torch dynamic int8": lin.weight.numel() + 4 * d * 4}
    print(f"\nLinear {d} -> {4 * d} on {tokens} tokens")
    for k in t:
        e = f"rel. error {err[k]:.4f}" if k in err else ""
        print(f"  {k:20s} {t[k] * 1e3:7.3f} ms  (float / this = {t['float'] / t[k]:.2f})  weights {wbytes[k] / 1e6:.2f} MB  {e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (1 on a shared machine)")
    args = p.parse_args()
    tformer.utils.runtime.set_threads(args.threads)   # explicit: benchmarks choose their threads (None = every core), not small mode
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    bench_decoding(args.repeats)
    bench_int8(args.repeats)


if __name__ == "__main__":
    main()
