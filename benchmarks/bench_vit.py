"""tformer's ViT against transformers' ViTForImageClassification, same config and weights.

    .venv/bin/python benchmarks/bench_vit.py [--repeats 7] [--config digits|small|base] [--batch 64]

One training step each (forward, cross-entropy, backward, AdamW step), run interleaved (peer, tformer,
peer, ...) after a warm-up so both see the same machine load. Prints medians, images/s and the ratio
peer_time / tformer_time (>= 1.0: tformer is at least as fast). On a CUDA GPU it runs in bf16 autocast.
Configs: "digits" = the chapter 12 capstone (8x8 grey, patch 2, d=64, 2 layers); "small" = 32x32 RGB,
patch 4, d=192, 6 layers (a CIFAR ViT); "base" = ViT-B/16 at 224x224.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import tformer.utils.runtime
from tformer.models import ViT
from tformer.measure.timing import time_interleaved

CONFIGS = {
    "digits": dict(image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, intermediate_size=128),
    "small": dict(image_size=32, patch_size=4, num_channels=3, hidden_size=192, num_hidden_layers=6,
                  num_attention_heads=3, intermediate_size=768),
    "base": dict(image_size=224, patch_size=16, num_channels=3, hidden_size=768, num_hidden_layers=12,
                 num_attention_heads=12, intermediate_size=3072),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="small")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    tformer.utils.runtime.set_threads(None)   # explicit: every core, whatever small mode chose
    import transformers

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    kw = CONFIGS[args.config]
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(
        **kw, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa")).to(dev).train()
    ours = ViT.from_hf_vit(hf).to(dev).train()
    x = torch.randn(args.batch, kw["num_channels"], kw["image_size"], kw["image_size"], device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    opts = {"transformers": torch.optim.AdamW(hf.parameters(), lr=1e-4),
            "tformer": torch.optim.AdamW(ours.parameters(), lr=1e-4)}
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)

    def step(name):
        def run():
            with amp:
                logits = hf(pixel_values=x).logits if name == "transformers" else ours(x)
                loss = F.cross_entropy(logits.float(), y)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            opts[name].step()
        return run

    med = time_interleaved({k: step(k) for k in ("transformers", "tformer")}, args.repeats, warmup=2, device=dev)
    print(f"ViT training step, config {args.config!r} ({kw['image_size']}px, patch {kw['patch_size']}, "
          f"d={kw['hidden_size']}, {kw['num_hidden_layers']} layers), batch {args.batch}, {dev}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, median of {args.repeats}")
    for k, t in med.items():
        print(f"  {k:13s} {t * 1e3:8.1f} ms/step  {args.batch / t:8.0f} images/s")
    print(f"  ratio transformers / tformer = {med['transformers'] / med['tformer']:.2f} (>= 1.0: tformer as fast or faster)")


if __name__ == "__main__":
    main()
