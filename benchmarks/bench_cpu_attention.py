"""On a CPU: PyTorch's fused attention against the plain math, in bf16 and float32, training and inference.

`MultiHeadAttention.attend` takes `F.scaled_dot_product_attention` by default. On a CPU in bf16 its
backward is slower than the math for short sequences (the translation capstone's sentences, a ViT's
patches), so a bf16 training step with at most `tformer.kernels.CPU_LOWP_MATH_MAX` query-key pairs
takes the math (`scaled_dot_product_attention`, the teaching reference). This script measures both on
your CPU, interleaved in one process, and prints which one `attend` picks, so the constant can be checked.

    fused   F.scaled_dot_product_attention(q, k, v, attn_mask)
    math    softmax(q k^T / sqrt(d) + mask) v with the (T_q, T_k) weights (tformer.scaled_dot_product_attention)

Each row: B sequences, H heads of 64, T_q x T_k positions, a padding mask as the capstones give;
"train" times forward + backward, "infer" the forward under no_grad.

    python benchmarks/bench_cpu_attention.py [--threads 1] [--repeats 7]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import tformer.utils.runtime
from tformer.attention import scaled_dot_product_attention
from tformer.kernels import CPU_LOWP_MATH_MAX, cpu_prefers_math
from tformer.measure.timing import format_table, time_interleaved

SHAPES = [(100, 4, 16, 16), (64, 4, 32, 32), (16, 4, 128, 128), (8, 6, 192, 192), (8, 6, 256, 256),
          (6, 6, 384, 384), (16, 6, 1, 512)]          # (B, H, T_q, T_k): sentences ... a decoding step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    tformer.utils.runtime.set_threads(args.threads)
    cpu, rows = torch.device("cpu"), []
    for dtype in (torch.bfloat16, torch.float32):
        for train in (True, False):
            for b, h, t_q, t_k in SHAPES:
                g = torch.Generator().manual_seed(0)
                q = torch.randn(b, h, t_q, 64, generator=g).to(dtype).requires_grad_(train)
                k, v = (torch.randn(b, h, t_k, 64, generator=g).to(dtype).requires_grad_(train) for _ in range(2))
                mask = torch.ones(b, 1, 1, t_k, dtype=torch.bool)
                mask[0, ..., t_k // 2:] = False                              # one padded sequence

                def fused():
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    if train:
                        out.float().sum().backward()

                def math():
                    out, _ = scaled_dot_product_attention(q, k, v, mask)
                    if train:
                        out.float().sum().backward()

                with torch.set_grad_enabled(train):
                    med = time_interleaved({"fused": fused, "math": math}, args.repeats, warmup=2, device=cpu)
                    picks = "math" if cpu_prefers_math(q, t_k) else "fused"
                rows.append({"dtype": str(dtype).removeprefix("torch."), "step": "train" if train else "infer",
                             "B H Tq Tk": f"{b} {h} {t_q} {t_k}", "fused ms": med["fused"] * 1e3,
                             "math ms": med["math"] * 1e3, "fused/math": med["fused"] / med["math"],
                             "attend picks": picks})
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); CPU_LOWP_MATH_MAX = {CPU_LOWP_MATH_MAX} "
          f"query-key pairs (bf16 training steps up to it take the math)")
    print(format_table(rows))


if __name__ == "__main__":
    main()
