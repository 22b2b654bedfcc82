"""The course's GPU check: one script, one table, under 8 minutes on one H200 (issue 8).

    python benchmarks/gpu_check.py                 # on a CUDA GPU: bf16, the sizes below
    python benchmarks/gpu_check.py --smoke         # tiny sizes on the CPU, to test the script itself
    python benchmarks/gpu_check.py --json out.json # also write the rows as JSON

Rows:
  * attention forward (and forward + backward) TFLOP/s of `F.scaled_dot_product_attention`, the flash
    backend forced vs the math backend (softmax(QK^T)V materialised), B x 16 heads x T x 128, bf16,
    non-causal, at a few lengths T (B*T fixed). FLOPs: 4 B H T^2 d forward; backward counted as 2.5x
    forward (the FlashAttention-2 paper's convention).
  * transformer-base (`tformer.models.Transformer`, `TransformerConfig.base`, 37k shared vocabulary)
    training: Adam + label smoothing 0.1, bf16 autocast, about 25k source + 25k target tokens per step
    (the paper's batch): target tokens/s and time per 1,000 steps (the paper: 100k steps in 12 hours on
    8 P100s, i.e. 0.43 s per step).
  * the MoE LM of chapter 13 (`tformer.moe` through `GPTConfig.n_experts`, 8 experts top-2) and the dense
    GPT of equal active parameters: tokens/s and MFU with flash attention forced (`tformer.flash`).
  * ViT-B/16 (`tformer.models.ViT`) training at 224 x 224: images/s.

Everything runs on random inputs: nothing is downloaded. Timings are medians after warm-up.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout without installing

from tformer.models import GPT, GPTConfig, Transformer, TransformerConfig  # noqa: E402
from tformer.timing import synchronize  # noqa: E402


def median_time(fn, warmup: int, repeat: int) -> float:
    """Median seconds of fn() (CUDA synchronised) after `warmup` calls."""
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def autocast(dev: torch.device, dtype: torch.dtype):
    return torch.autocast(dev.type, dtype=dtype) if dtype != torch.float32 else nullcontext()


# ----------------------------------------------------------------------------------------------------
# attention


def attention_rows(dev, dtype, lengths, tokens, heads=16, head_dim=128, repeat=10) -> list[dict]:
    rows = []
    for t in lengths:
        b = max(1, tokens // t)
        q, k, v = (torch.randn(b, heads, t, head_dim, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        g = torch.randn_like(q)
        fwd_flops = 4 * b * heads * t * t * head_dim
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)):
            row = {"part": "attention", "what": f"{name} T={t} B={b}"}
            try:
                with sdpa_kernel([backend]):
                    def fwd():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v)

                    def fwd_bwd():
                        F.scaled_dot_product_attention(q, k, v).backward(g)
                        q.grad = k.grad = v.grad = None
                    t_f = median_time(fwd, 2, repeat)
                    t_fb = median_time(fwd_bwd, 2, repeat)
                row.update(value=fwd_flops / t_f / 1e12, unit="TFLOP/s fwd",
                           extra=f"fwd+bwd {3.5 * fwd_flops / t_fb / 1e12:.3g} TFLOP/s, fwd {t_f * 1e3:.3g} ms")
            except RuntimeError as e:                # e.g. out of memory for math at long T, or no kernel
                row.update(value=None, unit="TFLOP/s fwd", extra=f"failed: {str(e).splitlines()[0][:60]}")
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
        del q, k, v, g
    return rows


# ----------------------------------------------------------------------------------------------------
# transformer-base training


def transformer_rows(dev, dtype, vocab, batch, src_len, tgt_len, steps, **cfg_kw) -> list[dict]:
    from tformer.train import label_smoothed_cross_entropy

    torch.manual_seed(0)
    cfg = TransformerConfig.base(vocab, max_len=max(src_len, tgt_len) + 1, **cfg_kw)
    model = Transformer(cfg).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                           fused=dev.type == "cuda")
    g = torch.Generator().manual_seed(0)
    src = torch.randint(1, vocab, (batch, src_len), generator=g).to(dev)    # no padding: 0 is pad_id
    tgt = torch.randint(1, vocab, (batch, tgt_len + 1), generator=g).to(dev)

    def step():
        with autocast(dev, dtype):
            logits = model(src, tgt[:, :-1])
        loss = label_smoothed_cross_entropy(logits.float(), tgt[:, 1:], 0.1, ignore_index=0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = median_time(step, 3, steps)
    n_tgt = batch * tgt_len
    return [{"part": "transformer-base", "what": f"train B={batch} S={src_len} T={tgt_len} "
             f"({model.num_params() / 1e6:.1f}M params)", "value": n_tgt / t, "unit": "target tokens/s",
             "extra": f"{t * 1000:.0f} s per 1,000 steps ({t * 1e3:.0f} ms/step; paper: 430 ms/step on 8 P100)"}]


# ----------------------------------------------------------------------------------------------------
# MoE LM (chapter 13) vs dense at equal active parameters


def moe_rows(dev, dtype, width, layers, heads, block, batch, vocab, steps) -> list[dict]:
    try:
        from tformer.flash import lm_throughput
    except ImportError as e:                                     # the MoE/flash module is not in this checkout
        return [{"part": "MoE LM", "what": "not available", "value": None, "unit": "", "extra": str(e)}]
    base = dict(vocab_size=vocab, block_size=block, n_layers=layers, n_heads=heads, d_model=width)
    cfgs = {"MoE 8x top-2": GPTConfig(**base, n_experts=8, moe_top_k=2, moe_d_ff=2 * width),
            "dense (equal active)": GPTConfig(**base, d_ff=4 * width)}
    rows = []
    for name, cfg in cfgs.items():
        torch.manual_seed(0)
        model = GPT(cfg).to(dev)
        r = lm_throughput(model, batch_size=batch, seq_len=block, steps=steps, warmup=2, dtype=dtype,
                          flash=dev.type == "cuda")
        mfu = f"MFU {r['mfu']:.1%}" if r["mfu"] is not None else "MFU n/a (no known peak)"
        rows.append({"part": "MoE LM", "what": f"{name} d={width} L={layers} T={block} B={batch} "
                     f"({model.num_params(active=True) / 1e6:.1f}M active / {model.num_params() / 1e6:.1f}M)",
                     "value": r["tokens_per_s"], "unit": "tokens/s", "extra": f"{mfu}, kernels {r['backends']}"})
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------------------------------
# ViT


def vit_rows(dev, dtype, batch, steps, **cfg_kw) -> list[dict]:
    try:
        from tformer.models.vit import ViT, ViTConfig
    except ImportError as e:
        return [{"part": "ViT", "what": "not available", "value": None, "unit": "", "extra": str(e)}]
    from tformer.flash import force_flash

    torch.manual_seed(0)
    cfg = ViTConfig(**cfg_kw)
    model = ViT(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    x = torch.randn(batch, cfg.in_channels, cfg.image_size, cfg.image_size, device=dev)
    y = torch.randint(0, cfg.n_classes, (batch,), device=dev)

    def step():
        with autocast(dev, dtype):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with force_flash() if dev.type == "cuda" else nullcontext():
        t = median_time(step, 3, steps)
    return [{"part": "ViT", "what": f"train ViT d={cfg.d_model} L={cfg.n_layers} {cfg.image_size}px/"
             f"p{cfg.patch_size} B={batch}", "value": batch / t, "unit": "images/s",
             "extra": f"{t * 1e3:.0f} ms/step"}]


# ----------------------------------------------------------------------------------------------------


def fmt(rows: list[dict]) -> str:
    lines = [f"{'part':17s} {'what':58s} {'value':>12s}  {'unit':16s} notes", "-" * 130]
    for r in rows:
        v = "-" if r["value"] is None else (f"{r['value']:.3g}" if r["value"] < 100 else f"{r['value']:,.0f}")
        lines.append(f"{r['part']:17s} {r['what']:58s} {v:>12s}  {r['unit']:16s} {r['extra']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (tests the script, not the GPU)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    p.add_argument("--skip", nargs="*", default=[], choices=["attention", "transformer", "moe", "vit"])
    args = p.parse_args(argv)
    if args.smoke:
        dev, dtype = torch.device("cpu"), torch.float32
        plan = {"attention": lambda: attention_rows(dev, dtype, [64, 128], 256, heads=2, head_dim=16, repeat=2),
                "transformer": lambda: transformer_rows(dev, dtype, 300, 4, 12, 12, 2, d_model=32, n_heads=2,
                                                        d_ff=64, n_encoder_layers=1, n_decoder_layers=1),
                "moe": lambda: moe_rows(dev, dtype, 32, 1, 2, 16, 2, 128, 2),
                "vit": lambda: vit_rows(dev, dtype, 2, 2, image_size=32, patch_size=8, d_model=32, n_layers=1,
                                        n_heads=2, d_ff=64, n_classes=10)}
    else:
        if not torch.cuda.is_available():
            print("gpu_check needs a CUDA GPU; run with --smoke to test the script on a CPU.")
            return 2
        dev, dtype = torch.device("cuda"), torch.bfloat16
        torch.backends.cuda.matmul.allow_tf32 = True
        plan = {"attention": lambda: attention_rows(dev, dtype, [1024, 4096, 16384], 32768),
                "transformer": lambda: transformer_rows(dev, dtype, 37000, 384, 64, 64, 20),
                "moe": lambda: moe_rows(dev, dtype, 768, 12, 6, 1024, 16, 32768, 10),
                "vit": lambda: vit_rows(dev, dtype, 256, 10)}
        print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, CUDA {torch.version.cuda}, bf16")
    rows = []
    t_all = time.perf_counter()
    for name, fn in plan.items():
        if name in args.skip:
            continue
        t0 = time.perf_counter()
        try:
            part = fn()
        except Exception as e:                       # one failing part must not hide the others' figures
            part = [{"part": name, "what": "FAILED", "value": None, "unit": "",
                     "extra": f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"}]
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows += part
        print(fmt(part).split("\n", 2)[2], f"   [{time.perf_counter() - t0:.0f} s]", flush=True)
    print()
    print(fmt(rows))
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if any(r["what"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
