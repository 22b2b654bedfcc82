"""The course's GPU check: one script, one table of JSON rows, under 10 minutes on one H200.

    python benchmarks/gpu_check.py --data DIR --json out.json   # on a CUDA GPU; DIR holds Multi30k
    python benchmarks/gpu_check.py --only moe gpt2-vs-hf        # rerun some parts
    python benchmarks/gpu_check.py --smoke                      # every part on the CPU at tiny sizes (< 1 min)

Each row is {part, what, value, unit, extra}; parts:
  tests               pytest on the CUDA-marked (`-m gpu`) and the distributed/device tests, with the
                      project's notebook options switched off (no jupytext, nbval or datasets needed)
  attention           `F.scaled_dot_product_attention` TFLOP/s, flash (or, below sm80, memory-efficient)
                      forced vs the math backend, B x 16 heads x T x 128, T = 1k, 4k, 16k (B*T fixed).
                      FLOPs: 4 B H T^2 d forward; backward counted as 2.5x forward (FlashAttention-2's convention)
  transformer-base    `TransformerConfig.base` training, B384 x 64+64 tokens: target tokens/s (the paper:
                      100k steps in 12 h on 8 P100, 0.43 s per step)
  moe                 MoE GPT 8 experts top-2 vs the dense GPT of equal active parameters, at d768/L12/T1024/B16
                      and d2048/L8/T2048/B8: tokens/s, MFU, MoE/dense (targets: >= 0.7 and >= 0.8)
  gpt2-vs-hf          GPT-2 124M train step (B16, T1024) vs `GPT2LMHeadModel` (sdpa) with the same weights,
                      and tformer's MFU with `torch.compile` (target >= 35%)
  seq2seq-vs-torch    encoder-decoder base vs `nn.Transformer` (same embeddings and generator), B256 x T64, padding
  rnn-vs-transformer  LSTM LM vs GPT train step time against length (chapters 7 and 15)
  translate           the translation capstone's GPU tier: `--preset gpu`, 5 minutes on Multi30k de->en from --data DIR, greedy sacreBLEU on
                      test_2016_flickr, target >= 42 (skipped with one line without --data)
  vit                 ViT-B/16 training at 224 x 224: images/s

MFU everywhere: (6 N + 12 L d T) FLOPs per token, N the active non-embedding parameters, against the
datasheet's dense 16-bit peak (`tformer.utils.gpu.peak_flops`: 989 TFLOP/s for H100/H200 SXM). Precision and
attention kernel follow the GPU (`tformer.utils.gpu`: bf16 + flash on sm80+, fp16 + memory-efficient before).
Everything but `translate` runs on random inputs: nothing is downloaded. Timings are medians after warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))                          # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))           # the peers of bench_core

from tformer.utils import gpu  # noqa: E402
from tformer.utils import device as policy  # noqa: E402
from tformer.models import GPT, GPTConfig, Transformer, TransformerConfig  # noqa: E402
from tformer.measure.timing import synchronize, time_interleaved  # noqa: E402

PARTS = ("tests", "attention", "transformer-base", "moe", "gpt2-vs-hf", "seq2seq-vs-torch", "rnn-vs-transformer",
         "translate", "vit")


def row(part: str, what: str, value, unit: str, extra: str = "") -> dict:
    return {"part": part, "what": what, "value": value, "unit": unit, "extra": extra}


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


def free(dev):
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------------
# tests: the CUDA-marked and the distributed/device tests, without the notebook machinery

DEVICE_TESTS = ("tests/test_gpu.py", "tests/test_ddp.py", "tests/test_moe_ddp.py", "tests/test_timing.py")


def tests_rows(smoke: bool) -> list[dict]:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "pytest.mark.gpu" in p.read_text(encoding="utf-8"))
    runs = {"CUDA-marked (-m gpu)": ["-m", "gpu", *(["tests/test_gpu.py"] if smoke else files)],
            "distributed and device": ["tests/test_gpu.py"] if smoke else list(DEVICE_TESTS)}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TFORMER_SMALL": "1", "TQDM_DISABLE": "1", "MPLBACKEND": "Agg",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    rows = []
    for what, args in runs.items():
        with tempfile.TemporaryDirectory() as tmp:
            xml = Path(tmp) / "junit.xml"
            # -o addopts= and --noconftest: no nbval options, no notebook building (no jupytext needed)
            cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "--noconftest", "-p", "no:cacheprovider",
                   f"--junitxml={xml}", *args]
            t0 = time.perf_counter()
            out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            secs = time.perf_counter() - t0
            counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
            if xml.exists():
                for suite in ET.parse(xml).getroot().iter("testsuite"):
                    for k in counts:
                        counts[k] += int(suite.get(k, 0))
            passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
            failed = [ln for ln in out.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
            extra = (f"failed {counts['failures']}, errors {counts['errors']}, skipped {counts['skipped']} "
                     f"({secs:.0f} s){'; ' + '; '.join(failed)[:300] if failed else ''}")
            if out.returncode not in (0, 5):         # 5: nothing collected (no CUDA-marked test selected)
                extra += f"; pytest exit {out.returncode}: {(out.stdout + out.stderr).strip().splitlines()[-1][:120]}"
            rows.append(row("tests", what, passed, "tests passed", extra))
    return rows


# ----------------------------------------------------------------------------------------------------
# attention


def attention_rows(dev, dtype, lengths, tokens, heads=16, head_dim=128, repeat=10) -> list[dict]:
    rows = []
    fast = policy.attention_backend(dev)                  # flash on sm80+ and the CPU, memory-efficient before
    fast_name = "flash" if fast == SDPBackend.FLASH_ATTENTION else "memory-efficient"
    for t in lengths:
        b = max(1, tokens // t)
        q, k, v = (torch.randn(b, heads, t, head_dim, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        g = torch.randn_like(q)
        fwd_flops = 4 * b * heads * t * t * head_dim
        for name, backend in ((fast_name, fast), ("math", SDPBackend.MATH)):
            r = row("attention", f"{name} T={t} B={b}", None, "TFLOP/s fwd")
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
                r.update(value=fwd_flops / t_f / 1e12,
                         extra=f"fwd+bwd {3.5 * fwd_flops / t_fb / 1e12:.3g} TFLOP/s, fwd {t_f * 1e3:.3g} ms")
            except RuntimeError as e:                # e.g. out of memory for math at long T, or no kernel
                r.update(extra=f"failed: {str(e).splitlines()[0][:60]}")
                free(dev)
            rows.append(r)
        del q, k, v, g
    return rows


# ----------------------------------------------------------------------------------------------------
# transformer-base training


def transformer_rows(dev, dtype, vocab, batch, src_len, tgt_len, steps, **cfg_kw) -> list[dict]:
    from tformer.training import label_smoothed_cross_entropy

    torch.manual_seed(0)
    cfg = TransformerConfig.base(vocab, context_length=max(src_len, tgt_len) + 1, **cfg_kw)
    model = Transformer(cfg).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=dev.type == "cuda")
    scaler = gpu.grad_scaler(dtype, dev)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(1, vocab, (batch, src_len), generator=g).to(dev)    # no padding: 0 is pad_id
    tgt = torch.randint(1, vocab, (batch, tgt_len + 1), generator=g).to(dev)

    def step():
        with autocast(dev, dtype):
            logits = model(src, tgt[:, :-1])
        loss = label_smoothed_cross_entropy(logits.float(), tgt[:, 1:], 0.1, ignore_index=0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    t = median_time(step, 3, steps)
    n_tgt = batch * tgt_len
    return [row("transformer-base", f"train B={batch} S={src_len} T={tgt_len} ({model.num_params() / 1e6:.1f}M params)",
                n_tgt / t, "target tokens/s",
                f"{t * 1000:.0f} s per 1,000 steps ({t * 1e3:.0f} ms/step; paper: 430 ms/step on 8 P100)")]


# ----------------------------------------------------------------------------------------------------
# MoE LM (chapter 13) vs dense at equal active parameters


def moe_rows(dev, dtype, sizes, vocab, steps) -> list[dict]:
    from tformer.moe import MoEConfig
    from tformer.measure.flash import lm_throughput

    rows = []
    for width, layers, heads, block, batch in sizes:
        base = dict(vocab_size=vocab, context_length=block, n_layers=layers, n_heads=heads, d_model=width)
        cfgs = {"dense (FFN 4d)": GPTConfig(**base, d_ff=4 * width)}
        for dispatch in ("auto", "padded"):
            cfgs[f"MoE 8x top-2 {dispatch}"] = GPTConfig(**base, moe=MoEConfig(n_experts=8, top_k=2, d_ff=2 * width,
                                                                                   dispatch=dispatch))
        dense_tps = None
        for name, cfg in cfgs.items():
            torch.manual_seed(0)
            model = GPT(cfg).to(dev)
            chosen = ""
            if "auto" in name:
                from tformer.moe import MoE
                layer = next(m for m in model.modules() if isinstance(m, MoE))
                with autocast(dev, dtype):
                    chosen = f", auto picks {layer.choose_dispatch(torch.zeros(1, width, device=dev))!r}"
            r = lm_throughput(model, batch_size=batch, seq_len=block, steps=steps, warmup=2, dtype=dtype)
            dense_tps = dense_tps or r["tokens_per_s"]
            mfu = f"MFU {r['mfu']:.1%}" if r["mfu"] is not None else "MFU n/a (no known peak)"
            rows.append(row("moe", f"{name} d={width} L={layers} T={block} B={batch} "
                            f"({model.num_params(active=True) / 1e6:.1f}M active / {model.num_params() / 1e6:.1f}M)",
                            r["tokens_per_s"], "tokens/s",
                            f"{mfu}, x{r['tokens_per_s'] / dense_tps:.2f} dense{chosen}, kernels {r['backends']}"))
            del model
            free(dev)
    return rows


# ----------------------------------------------------------------------------------------------------
# GPT-2 124M vs Hugging Face, same weights; and the torch.compile path


def gpt2_rows(dev, dtype, hf_kw, batch, block, steps, compile: bool) -> list[dict]:
    from transformers import GPT2Config, GPT2LMHeadModel

    from tformer.measure.flash import lm_flops_per_token, lm_throughput
    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=block, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **hf_kw)
    cfg._attn_implementation = "sdpa"                           # F.scaled_dot_product_attention, as tformer
    hf = GPT2LMHeadModel(cfg).to(dev)
    ours = GPT.from_hf_gpt2(hf).to(dev)
    idx = torch.randint(0, hf.config.vocab_size, (batch, block + 1), generator=torch.Generator().manual_seed(0)).to(dev)
    x, y = idx[:, :-1], idx[:, 1:]
    with torch.no_grad():
        diff = (hf(x[:1, :32]).logits.float() - ours(x[:1, :32]).float()).abs().max().item()   # same weights
    opts = {"hf": torch.optim.AdamW(hf.parameters(), lr=1e-4), "ours": torch.optim.AdamW(ours.parameters(), lr=1e-4)}
    scaler = gpu.grad_scaler(dtype, dev)

    def step(name, logits_of):
        def run():
            with autocast(dev, dtype):
                logits = logits_of(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            scaler.scale(loss).backward()
            scaler.step(opts[name])
            scaler.update()
            opts[name].zero_grad(set_to_none=True)
        return run
    t = time_interleaved({"tformer": step("ours", ours), "GPT2LMHeadModel": step("hf", lambda i: hf(i).logits)},
                         steps, warmup=2, device=dev)
    fpt = lm_flops_per_token(ours, block)
    peak = gpu.peak_flops(dev, dtype)
    rows = []
    for name, sec in t.items():
        tps = batch * block / sec
        mfu = f"MFU {tps * fpt / peak:.1%}" if peak else "MFU n/a"
        rows.append(row("gpt2-vs-hf", f"{name} train step B={batch} T={block} ({ours.num_params() / 1e6:.0f}M)",
                        sec * 1e3, "ms/step", f"{tps:,.0f} tokens/s, {mfu}, same weights (max |logit diff| {diff:.1e})"))
    rows.append(row("gpt2-vs-hf", "ratio HF / tformer step time", t["GPT2LMHeadModel"] / t["tformer"], "x", ""))
    del hf
    free(dev)
    if compile:
        r = lm_throughput(ours, batch_size=batch, seq_len=block, steps=steps, warmup=3, dtype=dtype, compile=True)
        mfu = f"MFU {r['mfu']:.1%}" if r["mfu"] is not None else "MFU n/a"
        rows.append(row("gpt2-vs-hf", f"tformer + torch.compile B={batch} T={block}", r["tokens_per_s"], "tokens/s",
                        f"{mfu} (target >= 35%), kernels {r['backends']}"))
    else:
        rows.append(row("gpt2-vs-hf", "tformer + torch.compile", None, "tokens/s", "skipped (--smoke: compiling is slow on a CPU)"))
    del ours
    free(dev)
    return rows


# ----------------------------------------------------------------------------------------------------
# encoder-decoder vs nn.Transformer


def seq2seq_rows(dev, dtype, vocab, batch, length, steps, **cfg_kw) -> list[dict]:
    from bench_core import TorchSeq2Seq

    torch.manual_seed(0)
    cfg = TransformerConfig.base(vocab, **cfg_kw)
    ours = Transformer(cfg).to(dev)
    theirs = TorchSeq2Seq(vocab, d=cfg.d_model, h=cfg.n_heads, n=cfg.n_encoder_layers, ff=cfg.d_ff).to(dev)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(1, vocab, (batch, length), generator=g)
    src[: batch // 2, length - length // 6:] = 0                  # padding, as in real batches
    tgt = torch.randint(1, vocab, (batch, length + 1), generator=g)
    src, tgt = src.to(dev), tgt.to(dev)
    opts = {m: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9) for m in (theirs, ours)}
    scaler = gpu.grad_scaler(dtype, dev)

    def step(model):
        def run():
            with autocast(dev, dtype):
                logits = model(src, tgt[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), tgt[:, 1:].reshape(-1), label_smoothing=0.1)
            scaler.scale(loss).backward()
            scaler.step(opts[model])
            scaler.update()
            opts[model].zero_grad(set_to_none=True)
        return run
    t = time_interleaved({"tformer": step(ours), "nn.Transformer": step(theirs)}, steps, warmup=2, device=dev)
    rows = [row("seq2seq-vs-torch", f"{name} train step B={batch} T={length} (padding)", sec * 1e3, "ms/step",
                f"{batch * length / sec:,.0f} target tokens/s") for name, sec in t.items()]
    rows.append(row("seq2seq-vs-torch", "ratio nn.Transformer / tformer step time", t["nn.Transformer"] / t["tformer"],
                    "x", ""))
    del ours, theirs
    free(dev)
    return rows


# ----------------------------------------------------------------------------------------------------
# LSTM vs Transformer: step time against length (chapters 7 and 15)


def rnn_rows(dev, width, layers, lengths, batch, vocab, steps) -> list[dict]:
    from tformer.models import LSTMConfig, LSTMLM
    from tformer.measure.timing import step_time_vs_length

    models = {"LSTM": lambda: LSTMLM(LSTMConfig(vocab_size=vocab, d_model=width, n_layers=layers)),
              "GPT": lambda: GPT(GPTConfig(vocab_size=vocab, context_length=max(lengths), n_layers=layers,
                                           n_heads=max(1, width // 64), d_model=width))}
    res = step_time_vs_length(models, lengths, batch_size=batch, vocab_size=vocab, device=dev, warmup=2,
                              repeat=steps, progress=False)
    free(dev)
    return [row("rnn-vs-transformer", f"{r.name} d={width} L={layers} T={r.seq_len} B={r.batch_size}",
                r.seconds * 1e3, "ms/step", f"{r.tokens_per_s:,.0f} tokens/s") for r in res]


# ----------------------------------------------------------------------------------------------------
# translation: the GPU preset, 2.5 minutes, scored on test_2016_flickr


def translate_rows(dev, data: Path, minutes: float, preset: str, src: str = "de", tgt: str = "en",
                   split: str = "test_2016_flickr", **overrides) -> list[dict]:
    from tformer.translate.pipeline import score_files, train_run

    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        last = train_run(out, preset, data=data, src=src, tgt=tgt, time_budget=minutes, device=str(dev),
                         progress=False, **overrides)
        secs = time.perf_counter() - t0
        res = score_files(out, Path(data) / f"{split}.{src}", Path(data) / f"{split}.{tgt}", beam=1)
    src_lang, tgt_lang = src, tgt
    what = f"--preset {preset} {minutes:g} min, {src_lang}->{tgt_lang}, greedy on {split}"
    return [row("translate", what, res["bleu"], "sacreBLEU",
                f"{last.get('step', '?')} steps, {last.get('tokens_per_s', 0):,.0f} tokens/s, {secs:.0f} s with "
                f"BPE and data; {res['signature']}")]


# ----------------------------------------------------------------------------------------------------
# ViT


def vit_rows(dev, dtype, batch, steps, **cfg_kw) -> list[dict]:
    from tformer.models.vit import ViT, ViTConfig

    torch.manual_seed(0)
    cfg = ViTConfig(**cfg_kw)
    model = ViT(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    scaler = gpu.grad_scaler(dtype, dev)
    x = torch.randn(batch, cfg.in_channels, cfg.image_size, cfg.image_size, device=dev)
    y = torch.randint(0, cfg.n_classes, (batch,), device=dev)

    def step():
        with autocast(dev, dtype):
            loss = F.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    with sdpa_kernel([policy.attention_backend(dev)]) if dev.type == "cuda" else nullcontext():
        t = median_time(step, 3, steps)
    return [row("vit", f"train ViT d={cfg.d_model} L={cfg.n_layers} {cfg.image_size}px/p{cfg.patch_size} B={batch}",
                batch / t, "images/s", f"{t * 1e3:.0f} ms/step")]


# ----------------------------------------------------------------------------------------------------


def fmt(rows: list[dict]) -> str:
    lines = [f"{'part':19s} {'what':62s} {'value':>12s}  {'unit':16s} notes", "-" * 134]
    for r in rows:
        v = "-" if r["value"] is None else (f"{r['value']:.3g}" if abs(r["value"]) < 100 else f"{r['value']:,.0f}")
        lines.append(f"{r['part']:19s} {r['what'][:62]:62s} {v:>12s}  {r['unit']:16s} {r['extra']}")
    return "\n".join(lines)


def smoke_corpus() -> Path:
    """A few hundred sentence pairs of the built-in corpus in a temporary folder (for --smoke)."""
    from tformer.data.corpus import write_offline_corpus
    return write_offline_corpus(Path(tempfile.mkdtemp(prefix="gpu_check_")), n_train=600, n_val=8, n_test=8)


def plan_for(smoke: bool, data: Path | None):
    """{part: function returning rows}: the GPU sizes, or tiny CPU ones with --smoke."""
    if smoke:
        dev, dtype = torch.device("cpu"), torch.float32
        return dev, {
            "tests": lambda: tests_rows(smoke=True),
            "attention": lambda: attention_rows(dev, dtype, [64, 128], 256, heads=2, head_dim=16, repeat=2),
            "transformer-base": lambda: transformer_rows(dev, dtype, 300, 4, 12, 12, 2, d_model=32, n_heads=2,
                                                         d_ff=64, n_encoder_layers=1, n_decoder_layers=1),
            "moe": lambda: moe_rows(dev, dtype, [(32, 1, 2, 16, 2)], 128, 2),
            "gpt2-vs-hf": lambda: gpt2_rows(dev, dtype, dict(vocab_size=128, n_embd=32, n_layer=1, n_head=2), 2, 16, 2,
                                            compile=False),
            "seq2seq-vs-torch": lambda: seq2seq_rows(dev, dtype, 128, 4, 12, 2, d_model=32, n_heads=2, d_ff=64,
                                                     n_encoder_layers=1, n_decoder_layers=1),
            "rnn-vs-transformer": lambda: rnn_rows(dev, 32, 1, [8, 16], 2, 64, 2),
            "translate": lambda: translate_rows(dev, smoke_corpus(), 0.1, "tiny", "en", "de", "test", max_steps=10),
            "vit": lambda: vit_rows(dev, dtype, 2, 2, image_size=32, patch_size=8, d_model=32, n_layers=1, n_heads=2,
                                    d_ff=64, n_classes=10),
        }
    dev = torch.device("cuda")
    dtype = policy.amp_dtype(dev) if torch.cuda.is_available() else None   # bf16 on sm80+, fp16 (+ scaler) before
    return dev, {
        "tests": lambda: tests_rows(smoke=False),
        "attention": lambda: attention_rows(dev, dtype, [1024, 4096, 16384], 32768),
        "transformer-base": lambda: transformer_rows(dev, dtype, 37000, 384, 64, 64, 20),
        "moe": lambda: moe_rows(dev, dtype, [(768, 12, 6, 1024, 16), (2048, 8, 16, 2048, 8)], 32768, 8),
        "gpt2-vs-hf": lambda: gpt2_rows(dev, dtype, {}, 16, 1024, 10, compile=True),
        "seq2seq-vs-torch": lambda: seq2seq_rows(dev, dtype, 37000, 256, 64, 10),
        "rnn-vs-transformer": lambda: rnn_rows(dev, 512, 4, [256, 1024, 4096], 8, 8000, 5),
        "translate": (lambda: translate_rows(dev, data, 5.0, "gpu")) if data else None,   # the GPU tier: >= 42
        "vit": lambda: vit_rows(dev, dtype, 256, 10),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (tests the script, not the GPU)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    p.add_argument("--only", nargs="+", default=None, choices=PARTS, metavar="PART", help=f"run only these: {PARTS}")
    p.add_argument("--data", type=Path, default=None, help="Multi30k folder (train/val/test_2016_flickr.{de,en}) "
                   "for the translate part; without it the part is skipped (--smoke: the built-in corpus)")
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check needs a CUDA GPU; run with --smoke to test the script on a CPU.")
        return 2
    dev, plan = plan_for(args.smoke, args.data)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        cap = policy.capability(dev)
        print(f"{torch.cuda.get_device_name(dev)} (sm{cap[0]}{cap[1]}), torch {torch.__version__}, CUDA "
              f"{torch.version.cuda}, {policy.amp_dtype(dev)}, attention {policy.attention_backend(dev).name}")
    rows = []
    t_all = time.perf_counter()
    for name in args.only or PARTS:
        fn = plan[name]
        t0 = time.perf_counter()
        if fn is None:
            part = [row(name, "skipped: no --data DIR (a Multi30k folder with test_2016_flickr.de/.en)", None, "")]
        else:
            try:
                part = fn()
            except Exception as e:                   # one failing part must not hide the others' figures
                part = [row(name, "FAILED", None, "", f"{type(e).__name__}: {str(e).splitlines()[0][:90]}")]
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        rows += part
        print(fmt(part).split("\n", 2)[2], f"   [{time.perf_counter() - t0:.0f} s]", flush=True)
        if args.json:                                # after every part: a run cut off by a time limit keeps them
            args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(fmt(rows))
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    bad_tests = any(r["part"] == "tests" and not r["extra"].startswith("failed 0, errors 0") for r in rows)
    return 1 if bad_tests or any(r["what"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
