"""Full mode on a free T4: an estimate of each chapter's time from its FLOPs.

    python benchmarks/full_mode_t4.py            # the table, the chapters over 15 minutes, what would fit
    python benchmarks/full_mode_t4.py --rows     # ... and every row: compute / launch floor / host time
    python benchmarks/full_mode_t4.py --json     # all of it as JSON (--chapters A,B: only those estimated)

An ESTIMATE, not a measurement: no T4 was lent when it was written. Each chapter's full-mode work
(TFORMER_SMALL unset: the `tformer.SMALL` branches of notebooks/src/NN_slug.py) is one or more rows of
WORK below, each naming the lines it was read from. For a training row the script builds the chapter's
model on PyTorch's meta device (no memory, no arithmetic) and runs one training step under
`torch.utils.flop_counter.FlopCounterMode`, counting the FLOPs of the forward and backward passes, and the
ATen calls that launch a kernel (views excluded): one step's FLOPs times the chapter's steps. Rows that
cannot be traced that way say so ("formula"): the LSTMs (4 gates: 8 (d_in + d) d FLOPs a token and layer,
x3 for training) and the MoE models (traced as the dense model of equal active parameters, at a lower MFU:
on sm75 they pad every expert to the fullest one, tformer/moe/dispatch.py). The translation models are
traced through their logits and the label-smoothed loss (the fused head-and-loss autocasts, which the meta
device cannot): the same FLOPs. Decoding rows trace one cached step (GPT) or one decoder step (the
Transformer) and multiply by the steps. A row that trains for a time budget takes the budget as its time.

The T4 (sm75: no bf16, no flash kernel) trains under fp16 autocast with a gradient scaler and SDPA's
memory-efficient kernel: what `tformer.utils.device` chooses for sm75, and what the Trainer, the capstones,
`tformer.measure.timing` (its `training_step`, which chapters 8 and 11 train with), GRPO's updates and
`capstones/vision_training._fit` use on CUDA. The notebooks' other loops (`opt = torch.optim.AdamW(...)` ...
`loss.backward()`) do not autocast: those rows run in fp32, on the T4's CUDA cores.

Time of a row, low to high:
    compute  = FLOPs / (peak x MFU), peak 65 TFLOP/s fp16 (tensor cores), 8.1 TFLOP/s fp32 (NVIDIA T4
               datasheet), MFU 40-25% in fp16 and 55-35% in fp32 (small models; the T4's 70 W limit keeps
               its clock below the 1,590 MHz boost the peak assumes)
    launches = kernels x 10-20 us: a tiny model is launch-bound, every kernel costs the host ~10 us
               (eager PyTorch on a 2-vCPU Colab/Kaggle host; 20 us with the Python around it)
    host     = CPU work per step that the GPU waits for (the vision recipes augment each batch on the
               CPU: measured on this repository's 2-core CPU), and tokenizers, as seconds per row
    low  = max(compute, launches) + host_low      (the host launches while the GPU computes)
    high = compute + launches + host_high         (no overlap)
plus a fixed 0.3-1 min per chapter (imports, CUDA start, cuBLAS/cuDNN init, plots, grading checks, the
small demos on CPU tensors). Not included: downloads (datasets, pretrained weights) on a first run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")           # nothing here downloads; make sure of it
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch                                                          # noqa: E402
import torch.nn.functional as F                                       # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode            # noqa: E402
from torch.utils.flop_counter import FlopCounterMode                  # noqa: E402

from tformer.utils.gpu import PEAK_FLOPS                              # noqa: E402

# -- the T4 ------------------------------------------------------------------------------------------------
# NVIDIA T4 Tensor Core GPU datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/
# t4-tensor-core-datasheet-951643.pdf): single precision 8.1 TFLOPS, mixed precision (FP16/FP32) 65 TFLOPS,
# 16 GB GDDR6 at 320 GB/s, 70 W. tformer.utils.gpu.PEAK_FLOPS["T4"] holds the same fp16 figure for MFU.
PEAK = {"fp16": PEAK_FLOPS["T4"], "fp32": 8.1e12}
MFU = {"fp16": (0.40, 0.25), "fp32": (0.55, 0.35)}       # (optimistic, pessimistic) share of the peak
MFU_MOE = (0.30, 0.15)     # sm75 MoE: "padded" dispatch, one host sync per layer for the buffer (moe/dispatch.py)
LAUNCH_S = (10e-6, 20e-6)  # host cost of one kernel launch, optimistic / pessimistic
LSTM_STEP_S = (10e-6, 25e-6)   # cuDNN LSTM: one layer, one time step, one pass (forward or backward) at least
FIXED_MIN = (0.3, 1.0)     # per chapter: start-up, plots, checks, CPU demos
BUDGET_MIN = 15.0          # the target: each chapter within 15 minutes on a 16 GB T4


# -- what one training step or forward costs: FLOPs and kernel launches, traced on the meta device -----------
_NO_KERNEL = {"aten.empty.memory_format", "aten.empty_like.default", "aten.empty_strided.default",
              "aten.lift_fresh.default", "aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
              "aten.is_same_size.default"}


class _Launches(TorchDispatchMode):
    """Counts the ATen calls that launch a kernel (not views, not allocations) and answers `.item()` on a
    meta tensor with 1 (the models check masks with it: "every row has a key" is the answer that holds)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name == "aten._local_scalar_dense.default":
            self.n += 1                                              # a device-to-host copy and a sync
            return True if args[0].dtype == torch.bool else 1
        if not func.is_view and name not in _NO_KERNEL:
            self.n += 1
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class Net:
    """A model and the shape of one step's input. kind: gpt (B, T) | lora_gpt | seq2seq (B, S, T) | bert_mlm
    (B, T) | bert_cls (B, T) | vit (B,) | clip (B,) | gpt_decode (rows, context): one cached decode step |
    seq2seq_decode (rows, S): one decoder step."""
    kind: str
    cfg: tuple            # sorted (key, value) pairs of the model's config
    shape: tuple
    extra: tuple = ()

    @staticmethod
    def of(kind: str, shape: tuple, extra: dict | None = None, **cfg) -> "Net":
        return Net(kind, tuple(sorted(cfg.items())), tuple(shape), tuple(sorted((extra or {}).items())))


def _model(net: Net):
    from tformer.models import (BERT, CLIP, GPT, BertClassifier, BertConfig, CLIPConfig, GPTConfig, Transformer,
                                TransformerConfig, ViT, ViTConfig)
    cfg, extra = dict(net.cfg), dict(net.extra)
    with torch.device("meta"):
        if net.kind in ("gpt", "gpt_decode"):
            return GPT(GPTConfig(**cfg))
        if net.kind == "lora_gpt":
            from tformer.training.lora import add_lora
            m = add_lora(GPT(GPTConfig(**cfg)), r=extra["r"], alpha=2 * extra["r"])
            for name, p in m.named_parameters():               # 11_fine_tuning.py:334-336: the norms train too
                if "norm" in name:
                    p.requires_grad_(True)
            return m
        if net.kind in ("seq2seq", "seq2seq_decode"):
            return Transformer(TransformerConfig(**cfg))
        if net.kind == "bert_mlm":
            return BERT(BertConfig(**cfg))
        if net.kind == "bert_cls":
            return BertClassifier(BERT(BertConfig(**cfg)), 2)
        if net.kind == "vit":
            return ViT(ViTConfig(**cfg))
        if net.kind == "clip":
            m = CLIP(CLIPConfig(**cfg))
            if extra.get("frozen_visual"):
                m.visual.requires_grad_(False)
            return m
    raise ValueError(net.kind)


def _ids(shape, vocab):
    return torch.randint(3, vocab, shape, device="meta")


def _run(net: Net, model, train: bool):
    """One step of `net` on `model`: the forward (and the loss), then backward when training."""
    cfg = dict(net.cfg)
    k = net.kind
    with torch.set_grad_enabled(train):
        if k in ("gpt", "lora_gpt"):
            from tformer.training.losses import causal_lm_loss
            x = _ids(net.shape, cfg["vocab_size"])
            loss = causal_lm_loss(model(x), targets=x)
        elif k == "gpt_decode":
            from tformer.cache import make_caches
            rows, ctx = net.shape
            caches = make_caches(cfg["n_layers"], cfg["context_length"])
            with torch.no_grad():
                model(_ids((rows, ctx), cfg["vocab_size"]), caches)       # the prompt: not counted below
            return caches, _ids((rows, 1), cfg["vocab_size"])
        elif k == "seq2seq":
            b, s, t = net.shape
            src, tgt = _ids((b, s), cfg["src_vocab_size"]), _ids((b, t), cfg["src_vocab_size"])
            from tformer.training.losses import label_smoothed_cross_entropy
            # Seq2SeqLoss fuses the head into the loss (linear_cross_entropy, chunked; it autocasts, which the
            # meta device cannot): the logits, then the loss, are the same FLOPs
            loss = label_smoothed_cross_entropy(model(src, tgt), tgt, 0.1, 0, reduction="sum")
        elif k == "bert_mlm":
            x = _ids(net.shape, cfg["vocab_size"] - 3)
            logits = model.mlm_logits(model(x))
            loss = F.cross_entropy(logits.flatten(0, 1), x.flatten())
        elif k == "bert_cls":
            x = _ids(net.shape, cfg["vocab_size"] - 3)
            loss = F.cross_entropy(model(x), torch.zeros(net.shape[0], dtype=torch.long, device="meta"))
        elif k == "vit":
            x = torch.randn(net.shape[0], cfg["in_channels"], cfg["image_size"], cfg["image_size"], device="meta")
            loss = F.cross_entropy(model(x), torch.zeros(net.shape[0], dtype=torch.long, device="meta"))
        elif k == "clip":
            x = torch.randn(net.shape[0], cfg["in_channels"], cfg["image_size"], cfg["image_size"], device="meta")
            loss = model.loss(x, _ids((net.shape[0], cfg["context_length"]), cfg["vocab_size"]))
        else:
            raise ValueError(k)
        if train:
            loss.backward()


_CACHE: dict = {}
_is_autocast_enabled = torch.is_autocast_enabled


def _no_meta_autocast(*args):
    """torch.is_autocast_enabled("meta") raises; the fused losses ask it for their input's device."""
    return False if args and str(args[0]) == "meta" else _is_autocast_enabled(*args)


def count(net: Net, train: bool = True) -> dict:
    """{"flops", "kernels", "tensors"} of one step of `net`: forward + backward when `train`, else forward;
    for the decode kinds one generated token. Traced on the meta device, cached."""
    key = (net, train)
    if key not in _CACHE:
        torch.is_autocast_enabled = _no_meta_autocast
        try:
            _CACHE[key] = _count(net, train)
        finally:
            torch.is_autocast_enabled = _is_autocast_enabled
    return _CACHE[key]


def _count(net: Net, train: bool) -> dict:
    model = _model(net)
    model.train(train)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    if net.kind == "gpt_decode":
        with _Launches():                                           # the prompt fills the cache (also meta)
            caches, nxt = _run(net, model, False)
        fc, launches = FlopCounterMode(display=False), _Launches()
        with fc, launches, torch.no_grad():
            model(nxt, caches)
    elif net.kind == "seq2seq_decode":
        cfg = dict(net.cfg)
        rows, s = net.shape
        src = _ids((rows, s), cfg["src_vocab_size"])
        enc_fc, enc_l = FlopCounterMode(display=False), _Launches()
        with enc_fc, enc_l, torch.no_grad():
            model.encode(src)
        fc, launches = FlopCounterMode(display=False), _Launches()
        with fc, launches, torch.no_grad():
            model(src, _ids((rows, 1), cfg["src_vocab_size"]))
        return {"flops": fc.get_total_flops() - enc_fc.get_total_flops(), "kernels": launches.n - enc_l.n,
                "tensors": tensors}
    else:
        fc, launches = FlopCounterMode(display=False), _Launches()
        with fc, launches:
            _run(net, model, train)
    return {"flops": fc.get_total_flops(), "kernels": launches.n, "tensors": tensors}


def optimizer_kernels(tensors: int, opt: str, trainer: bool, fp16: bool, clip: bool) -> int:
    """Kernels a step launches beyond forward and backward (a model, not a trace: the meta device runs
    neither CUDA's multi-tensor kernels nor the fused Adam, nor autocast). foreach Adam/AdamW (torch.optim's
    default on CUDA): ~10 multi-tensor ops, each one launch per 48 tensors; fused (the Trainer): 2 per 48.
    The Trainer adds one grad.mul_ per tensor and ~8 for the loss statistics (training/trainer.py:306-334);
    fp16 autocast one cast per weight tensor and the scaler's unscale / check / update (4);
    clip_grad_norm_ ~6."""
    groups = math.ceil(tensors / 48)
    n = {"foreach": 10 * groups, "fused": 2 * groups, "none": 0}[opt]
    if trainer:
        n += tensors + 8
    if fp16:
        n += tensors + 4
    if clip:
        n += 6
    return n


# -- the chapters' full-mode work --------------------------------------------------------------------------
@dataclass
class Row:
    chapter: str                 # notebooks/src/<chapter>.py
    what: str                    # the workload, in words
    src: str                     # where it was read: file:lines
    net: Net | None = None       # traced model and step shape (None: a budget, host-only or formula row)
    steps: int = 0               # how many such steps (training steps, forward passes, decode steps)
    dtype: str = "fp16"          # "fp16": autocast on the T4; "fp32": no autocast
    train: bool = True           # training steps (forward + backward + optimizer) or forward only
    opt: str = "foreach"         # foreach | fused | none
    trainer: bool = False        # through tformer.training.Trainer
    clip: bool = False           # clip_grad_norm_ each step
    extra_kernels: int = 0       # per step, beyond the trace (sampling, beam bookkeeping, cache writes)
    flops: float | None = None   # per step, for formula rows
    kernels: int | None = None   # per step, for formula rows
    seq_floor: float = 0.0       # per step: sequential LSTM time steps x layers x passes (formula rows)
    host_step_s: tuple = (0.0, 0.0)   # CPU work per step the GPU waits for
    host_s: tuple = (0.0, 0.0)   # CPU work once (tokenizers), seconds
    budget_min: float | None = None   # a time budget: the row takes exactly this
    mfu: tuple | None = None     # override MFU (optimistic, pessimistic)
    method: str = "counted"      # counted | formula | budget | host


def gpt(shape, **cfg) -> Net:
    return Net.of("gpt", shape, **cfg)


def lstm_flops(batch: int, t: int, d: int, layers: int, vocab: int, train: bool = True) -> float:
    """FLOPs of an LSTM LM step: 4 gates, each (d_in + d) x d, per token and layer; the head; x3 to train."""
    per_token = layers * 8 * (2 * d) * d + 2 * d * vocab
    return (3 if train else 1) * per_token * batch * t


LSTM_KERNELS = 60    # embedding, cuDNN LSTM forward/backward per layer, norm, head, loss, casts (a guess)
MOE_EXTRA = 40       # per MoE layer and step: router, top-k, sort, gathers, bmm, aux losses (a guess)

CH = "notebooks/src/"
REC11 = dict(d_model=384, n_layers=6, n_heads=6, context_length=256)     # sft_start.notebook_recipe(False)

WORK: list[Row] = [
    # 01-02: no training; the demos use CPU tensors (d_k up to 4096; T_long = 256)
    Row("01_attention", "d_k sweep to 4096 on CPU tensors: fixed cost only", CH + "01_attention.py:94-127",
        method="host"),
    Row("02_self_attention", "gradient reach at T=256 on CPU tensors: fixed cost only",
        CH + "02_self_attention.py:106-123", method="host"),
    Row("03_multi_head_attention", "2 x 1000 steps, 1-layer GPT d64 (4 heads, 1 head), V 64, B64 x T16, AdamW",
        CH + "03_multi_head_attention.py:142-160,174,209",
        gpt((64, 16), vocab_size=64, context_length=16, n_layers=1, n_heads=4, d_model=64, d_ff=128),
        steps=2 * 1000, dtype="fp32"),
    Row("04_positional_encoding", "3 x 600 steps, TinyLM (1 pre-LN block d64, V 16) B64 x T32, AdamW; "
        "traced as the 1-layer GPT of that size", CH + "04_positional_encoding.py:143-192,202",
        gpt((64, 32), vocab_size=16, context_length=128, n_layers=1, n_heads=4, d_model=64),
        steps=3 * 600, dtype="fp32"),
    Row("05_residual_layernorm_ffn", "depth sweeps to 256 FFN layers / 48 blocks, d32, on CPU tensors: fixed "
        "cost only", CH + "05_residual_layernorm_ffn.py:77-130", method="host"),
    Row("06_masking", "1000 steps, Transformer d32 1+1 layers, B64 x S8, Adam",
        CH + "06_masking.py:111-138",
        Net.of("seq2seq", (64, 8, 8), src_vocab_size=12, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
               n_decoder_layers=1, dropout=0.0, context_length=32), steps=1000, dtype="fp32"),
    Row("07_parallelism", "step timing: GPT d512 x4 layers, V 8192, B16, T 64..2048, 6 steps each (fp16)",
        CH + "07_parallelism.py:143-161; tformer/measure/timing.py:187-236",
        gpt((16, 2048), vocab_size=8192, context_length=2048, n_layers=4, n_heads=8, d_model=512),
        steps=6 * 2, opt="fused", dtype="fp16"),     # T = 64..2048 doubles: the sum of the six ~ 2x T = 2048
    Row("07_parallelism", "step timing: LSTM LM d512 x4 layers, B16, T 64..2048, 6 steps each (formula, "
        "sequential over T)", CH + "07_parallelism.py:143-161",
        steps=6, flops=lstm_flops(16, 4032, 512, 4, 8192), kernels=6 * LSTM_KERNELS,
        seq_floor=4032 * 4 * 3, method="formula"),
    Row("08_long_sequences", "3 seeds x 3000 steps, GPT d384 x6 (RoPE), V 256, B32 x T256, AdamW; each step "
        "training_step under the policy's autocast (fp16 + GradScaler)",
        CH + "08_long_sequences.py:262-285,312; tformer/measure/timing.py:162-195",
        gpt((32, 256), vocab_size=256, context_length=256, n_layers=6, n_heads=6, d_model=384, positional="rope"),
        steps=3 * 3000, dtype="fp16"),
    Row("08_long_sequences", "evaluation: 3 models x 4 scalings, B32 x T 256..2048 (forward; as 3 x 4 x 2 at "
        "T 2048)", CH + "08_long_sequences.py:289-312",
        gpt((32, 2048), vocab_size=256, context_length=2048, n_layers=6, n_heads=6, d_model=384,
            positional="rope"), steps=3 * 4 * 2, dtype="fp32", train=False, opt="none"),
    Row("09_efficient_attention", "6 attentions x 2000 steps, Lookup (1 pre-LN block d32), B32 x T16, AdamW; "
        "traced as the 1-layer GPT of that size", CH + "09_efficient_attention.py:165-231",
        gpt((32, 16), vocab_size=41, context_length=16, n_layers=1, n_heads=2, d_model=32),
        steps=6 * 2000, dtype="fp32"),
    Row("10_training", "warmup curves: 3 x 400 steps, Transformer d64 4+4 layers, 800 tokens/side (Trainer)",
        CH + "10_training.py:145-168",
        Net.of("seq2seq", (40, 20, 20), src_vocab_size=600, d_model=64, n_heads=4, d_ff=256, n_encoder_layers=4,
               n_decoder_layers=4, dropout=0.1, context_length=128), steps=3 * 400, opt="fused", trainer=True),
    Row("10_training", "label smoothing: 2 x 1500 steps, preset tiny (d64 2+2), 1200 tokens/side; digits: 200 "
        "steps (Trainer)", CH + "10_training.py:392-394,447-449; tformer/translate/presets.py:91-94",
        Net.of("seq2seq", (60, 20, 20), src_vocab_size=600, d_model=64, n_heads=4, d_ff=256, n_encoder_layers=2,
               n_decoder_layers=2, dropout=0.1, context_length=320), steps=2 * 1500 + 200, opt="fused",
        trainer=True, clip=True),
    Row("10_training", "preset gpu on Multi30k de->en for FULL_MINUTES = 5 (a time budget; the capstone's GPU "
        "tier)", CH + "10_training.py:517-527; tformer/capstones/translate_multi30k.py:21-23", budget_min=5.0,
        method="budget"),
    Row("10_training", "BPE 8k on Multi30k (29k pairs) and encoding (CPU)", CH + "10_training.py:523; "
        "tformer/translate/pipeline.py:274", host_s=(5.0, 20.0), method="host"),
    Row("10_training", "BLEU on test_2016_flickr: 1000 sentences, greedy + beam 4 (~5 batches x ~45 steps, "
        "beam x2)", CH + "10_training.py:543-553,572-583",
        Net.of("seq2seq_decode", (200, 16), src_vocab_size=8000, d_model=512, n_heads=8, d_ff=2048,
               n_encoder_layers=3, n_decoder_layers=3, context_length=320), steps=(5 + 10) * 45,
        train=False, opt="none", extra_kernels=40),
    Row("11_fine_tuning", "pretrain 3000 steps, GPT d384 x6, V 8192, B16 x T255 (Trainer)",
        CH + "11_fine_tuning.py:63-68; tformer/capstones/sft_start.py:43-63",
        gpt((16, 255), vocab_size=8192, **REC11), steps=3000, opt="fused", trainer=True),
    Row("11_fine_tuning", "SFT 2000 steps, B32 x T44 (the chats pad to 44 tokens) (Trainer)",
        CH + "11_fine_tuning.py:217-245",
        gpt((32, 44), vocab_size=8192, **REC11), steps=2000, opt="fused", trainer=True),
    Row("11_fine_tuning", "LoRA r=8: 4000 steps, B32 x T44 (Trainer)", CH + "11_fine_tuning.py:303-340",
        Net.of("lora_gpt", (32, 44), {"r": 8}, vocab_size=8192, **REC11), steps=4000,
        opt="fused", trainer=True),
    Row("11_llms", "GPT 3000 steps, d384 x6, V 8192, B64 x T255, AdamW + clipping; training_step under the "
        "policy's autocast (fp16 + GradScaler)", CH + "11_llms.py:191-193,225-237",
        gpt((64, 255), vocab_size=8192, context_length=256, n_layers=6, n_heads=6, d_model=384, dropout=0.1),
        steps=3000, dtype="fp16", clip=True),
    Row("11_llms", "BERT MLM 3000 steps, d256 x4, B64 x T128, AdamW; training_step under the policy's autocast",
        CH + "11_llms.py:316-345",
        Net.of("bert_mlm", (64, 128), vocab_size=8195, context_length=128, d_model=256, n_layers=4, n_heads=4,
               d_ff=1024, dropout=0.1, pad_id=8194), steps=3000, dtype="fp16"),
    Row("11_llms", "fine-tune 2 x 300 steps, BertClassifier, B32 x T32", CH + "11_llms.py:416-443",
        Net.of("bert_cls", (32, 32), vocab_size=8195, context_length=128, d_model=256, n_layers=4, n_heads=4,
               d_ff=1024, dropout=0.1, pad_id=8194), steps=2 * 300, dtype="fp32"),
    Row("11_llms", "TinyStories 50M characters: BPE 8192 and encoding (CPU; scaled from this machine)",
        CH + "11_llms.py:148-159", host_s=(75.0, 150.0), method="host"),
    Row("11_preference_rl", "DPO 300 steps, 2 sequences (23 + 17 tokens) x B32, policy fwd+bwd (Trainer)",
        CH + "11_preference_rl.py:123-149", gpt((64, 23), vocab_size=8192, **REC11), steps=300,
        opt="fused", trainer=True),
    Row("11_preference_rl", "GRPO 3 seeds x 300 iterations: 2 updates on 512 rows x T26 (+ 2 forwards, "
        "counted as 2/3 step), under the policy's autocast (fp16 + GradScaler)",
        CH + "11_preference_rl.py:259-271; tformer/training/grpo.py:223-262",
        gpt((512, 26), vocab_size=8192, **REC11), steps=3 * 300 * 2 + 3 * 300 * 2 // 3,
        dtype="fp16", opt="fused", clip=True),
    Row("11_preference_rl", "GRPO sampling: 3 x 300 x 3 prompt lengths x 10 new tokens, 512 rows (decode "
        "steps)", CH + "11_preference_rl.py:259-271; tformer/training/grpo.py:156-184",
        Net.of("gpt_decode", (512 // 3, 16), vocab_size=8192, **REC11), steps=3 * 300 * 3 * 10,
        dtype="fp32", train=False, opt="none", extra_kernels=20, host_step_s=(0.3e-3, 1e-3)),
    Row("12_multimodal", "ViT digits: 25 epochs x 43 steps, d128 x2, 17 tokens, B32 (_fit: autocast on CUDA)",
        CH + "12_multimodal.py:141-152; tformer/capstones/vision_training.py:104-143",
        Net.of("vit", (32,), image_size=8, patch_size=2, in_channels=1, d_model=128, n_layers=2, n_heads=4,
               d_ff=256, n_classes=10, dropout=0.2, eps=1e-6), steps=25 * 43, dtype="fp16", opt="fused",
        trainer=True),
    Row("12_multimodal", "CIFAR-10 ViT: 30 epochs x 196 steps, d256 x6, 65 tokens, B256, under the policy's "
        "autocast; random_affine on the GPU batch", CH + "12_multimodal.py:216-233; "
        "tformer/capstones/vision_training.py:46-64,98-118",
        Net.of("vit", (256,), image_size=32, patch_size=4, in_channels=3, d_model=256, n_layers=6, n_heads=8,
               d_ff=512, n_classes=10, dropout=0.1, eps=1e-6), steps=30 * 196, dtype="fp16", opt="fused",
        trainer=True, extra_kernels=20, host_step_s=(0.002, 0.005)),
    Row("12_multimodal", "CLIP digits: 20 epochs x 22 steps, locked ViT + text d64 x2, B64",
        CH + "12_multimodal.py:317-353",
        Net.of("clip", (64,), {"frozen_visual": True}, image_size=8, patch_size=2, in_channels=1,
               vision_d_model=128, vision_n_layers=2, vision_n_heads=4, vision_d_ff=256, vocab_size=259,
               context_length=40, text_d_model=64, text_n_layers=2, text_n_heads=4, text_d_ff=128, eos_id=2,
               embed_dim=64, eps=1e-6), steps=20 * 22, dtype="fp32"),
    Row("12_multimodal", "Flickr8k CLIP: 60 epochs x 24 steps, ViT d256 x6 (64 px) + text d256 x4 (T96), B256, "
        "under the policy's autocast; random_affine on the GPU batch", CH + "12_multimodal.py:413-434; "
        "tformer/capstones/vision_training.py:67-118",
        Net.of("clip", (256,), image_size=64, patch_size=8, in_channels=3, vision_d_model=256, vision_n_layers=6,
               vision_n_heads=8, vision_d_ff=1024, vocab_size=259, context_length=96, text_d_model=256,
               text_n_layers=4, text_n_heads=8, text_d_ff=1024, eos_id=2, embed_dim=256, dropout=0.1),
        steps=60 * 24, dtype="fp16", opt="fused", trainer=True, extra_kernels=20, host_step_s=(0.005, 0.015)),
    Row("12_multimodal", "VLM captions: 1000 steps, GPT d96 x2 on 17 image + 40 text tokens, B32",
        CH + "12_multimodal.py:488-552",
        gpt((32, 57), vocab_size=259, context_length=64, n_layers=2, n_heads=4, d_model=96), steps=1000,
        dtype="fp32"),
    Row("13_mixture_of_experts", "dense GPT 2000 steps, d384 x6, V 8192, B32 x T256 (Trainer; the T4 size)",
        CH + "13_mixture_of_experts.py:283-285,307-327",
        gpt((32, 256), vocab_size=8192, context_length=256, n_layers=6, n_heads=6, d_model=384, dropout=0.0,
            d_ff=1536), steps=2000, opt="fused", trainer=True),
    Row("13_mixture_of_experts", "2 MoE GPTs (8 experts, top-2, d_ff 768) 2000 steps each: traced as the dense "
        "model of equal active parameters; MFU 15-30%", CH + "13_mixture_of_experts.py:291-327",
        gpt((32, 256), vocab_size=8192, context_length=256, n_layers=6, n_heads=6, d_model=384, dropout=0.0,
            d_ff=1536), steps=2 * 2000, opt="fused", trainer=True, extra_kernels=6 * MOE_EXTRA, mfu=MFU_MOE,
        method="formula"),
    Row("13_mixture_of_experts", "validation: 3 models x 6 evaluations x 50 batches (B32 x T256), expert loads "
        "2 x 50: forwards", CH + "13_mixture_of_experts.py:307-308,366-377",
        gpt((32, 256), vocab_size=8192, context_length=256, n_layers=6, n_heads=6, d_model=384, dropout=0.0,
            d_ff=1536), steps=3 * 6 * 50 + 2 * 50, train=False, opt="none"),
    Row("13_mixture_of_experts", "lm_throughput: 2 models x (1 + 5 + 20) steps, B32 x T256 (fp16, fused AdamW)",
        CH + "13_mixture_of_experts.py:535-538; tformer/measure/flash.py:88-135",
        gpt((32, 256), vocab_size=8192, context_length=256, n_layers=6, n_heads=6, d_model=384, dropout=0.0,
            d_ff=1536), steps=2 * 26, opt="fused", mfu=MFU_MOE, extra_kernels=6 * MOE_EXTRA * 2 // 3),
    Row("13_mixture_of_experts", "wikitext-103, its first 30M characters (max_chars): BPE 8192 and encoding "
        "(CPU; scaled from this machine)", CH + "13_mixture_of_experts.py:283-288", host_s=(45.0, 90.0),
        method="host"),
    Row("14_inference", "MHA, GQA, MQA: 3 x 3000 steps, GPT d384 x6, V 4096, B32 x T256 (Trainer)",
        CH + "14_inference.py:89-125",
        gpt((32, 256), vocab_size=4096, context_length=256, n_layers=6, n_heads=6, d_model=384, dropout=0.0),
        steps=3 * 3000, opt="fused", trainer=True),
    Row("14_inference", "draft: 3000 steps, GPT d192 x1 (Trainer)", CH + "14_inference.py:126",
        gpt((32, 256), vocab_size=4096, context_length=256, n_layers=1, n_heads=2, d_model=192, dropout=0.0),
        steps=3000, opt="fused", trainer=True),
    Row("14_inference", "KV-cache timing without the cache: d768 x6, fp32 forwards over the growing prefix, "
        "1896 of them (as 1896 x T 360: 0.68M token positions)", CH + "14_inference.py:140-147",
        gpt((1, 360), vocab_size=4096, context_length=1024, n_layers=6, n_heads=6, d_model=768),
        steps=1896, dtype="fp32", train=False, opt="none", extra_kernels=10),
    Row("14_inference", "KV-cache timing with the cache: 1896 decode steps of d768 x6 (fp32)",
        CH + "14_inference.py:140-147",
        Net.of("gpt_decode", (1, 500), vocab_size=4096, context_length=1024, n_layers=6, n_heads=6, d_model=768),
        steps=1896, dtype="fp32", train=False, opt="none", extra_kernels=10),
    Row("14_inference", "decoding: speculative k=1,2,4,6 (4 runs x 200 tokens), paged, serving 128 requests at "
        "1/4/16/64 clients: ~20k decode steps of d384 x6, + 1-3 ms of engine Python each",
        CH + "14_inference.py:200-224,312-321,497-504",
        Net.of("gpt_decode", (16, 64), vocab_size=4096, context_length=256, n_layers=6, n_heads=6, d_model=384),
        steps=20000, dtype="fp32", train=False, opt="none", extra_kernels=30, host_step_s=(0.5e-3, 2e-3)),
    Row("15_transformer_vs_rnn", "recall: 4 distances x 1500 steps, GPT d256 x2, B32 x T<=514 (as T 170), "
        "Adam", CH + "15_transformer_vs_rnn.py:65-125",
        gpt((32, 170), vocab_size=25, context_length=514, n_layers=2, n_heads=4, d_model=256), steps=4 * 1500,
        dtype="fp32", clip=True),
    Row("15_transformer_vs_rnn", "recall: 4 distances x 1500 steps, LSTM d320 x2, B32, T 10..514 (formula, "
        "sequential over T)", CH + "15_transformer_vs_rnn.py:65-125", steps=1500,
        flops=lstm_flops(32, 10 + 34 + 130 + 514, 320, 2, 25), kernels=4 * LSTM_KERNELS,
        seq_floor=(10 + 34 + 130 + 514) * 2 * 3, dtype="fp32", method="formula"),
    Row("15_transformer_vs_rnn", "throughput: GPT d256 x2, V 256, B16, T 256..4096, 6 steps each (fp16; as 9 "
        "steps at T 4096)", CH + "15_transformer_vs_rnn.py:210-218",
        gpt((16, 4096), vocab_size=256, context_length=4096, n_layers=2, n_heads=4, d_model=256), steps=9,
        opt="fused"),
    Row("15_transformer_vs_rnn", "throughput: LSTM d320 x2, B16, T 256..4096, 6 steps each (fp16; formula, "
        "sequential over T)", CH + "15_transformer_vs_rnn.py:210-218", steps=6,
        flops=lstm_flops(16, 7424, 320, 2, 256), kernels=4 * LSTM_KERNELS, seq_floor=7424 * 2 * 3,
        method="formula"),
    Row("15_transformer_vs_rnn", "scaling sweep: GPT width 64..512 x2 layers, 5 x 1000 steps, B32 x T256 "
        "(Trainer; as 5 x width 320, the mean of width^2)", CH + "15_transformer_vs_rnn.py:256-282",
        gpt((32, 256), vocab_size=256, context_length=256, n_layers=2, n_heads=4, d_model=320), steps=5 * 1000,
        opt="fused", trainer=True),
    Row("15_transformer_vs_rnn", "scaling sweep: LSTM width 80..640 x2 layers, 5 x 1000 steps, B32 x T256 "
        "(Trainer, fp16; as width 400; formula, sequential over T)", CH + "15_transformer_vs_rnn.py:256-282",
        steps=5 * 1000,
        flops=lstm_flops(32, 256, 400, 2, 256), kernels=LSTM_KERNELS + 40, seq_floor=256 * 2 * 3,
        method="formula"),
]

# What would fit: changes an over-budget chapter would need, estimated the same way, each naming the lines it
# would touch (REPLACES: the rows of WORK it replaces, by `what` prefix). None today: the changes the first
# estimate proposed (chapters 8, 10, 11_llms, 11_preference_rl, 12, 13 and 15) are made, and WORK holds the
# chapters as they now are; benchmarks/RESULTS.md keeps the first estimate beside this one.
PROPOSALS: dict[str, list[Row]] = {}
REPLACES: dict[str, tuple[str, ...]] = {}

# chapter lines that must change for full mode to run at all, or to run on a T4 (found while reading them).
# None open: chapter 11's n_train (12,000 distinct problems, sft_start.notebook_recipe), chapter 13's flash
# kernel (forced only where gpu.why_no_flash(dev) is None, else the policy's kernel) and chapter 12's CPU
# augmentation (on the GPU batch, vision_training.ImageBatches / CaptionBatches) were fixed.
BLOCKERS: list[tuple[str, str]] = []


# -- the estimate -----------------------------------------------------------------------------------------
def estimate(row: Row) -> dict:
    """FLOPs (total), minutes (low, high) and how they were reached, for one row."""
    if row.budget_min is not None:
        return {"gflop": None, "minutes": (row.budget_min, row.budget_min), "detail": "time budget"}
    if row.method == "host" and row.net is None and row.flops is None:
        lo, hi = row.host_s
        return {"gflop": 0.0, "minutes": (lo / 60, hi / 60), "detail": "CPU" if hi else "fixed cost only"}
    if row.net is not None:
        c = count(row.net, row.train)
        flops_step, kernels = c["flops"], c["kernels"]
        if row.train:
            kernels += optimizer_kernels(c["tensors"], row.opt, row.trainer, row.dtype == "fp16", row.clip)
    else:
        flops_step, kernels = row.flops, row.kernels
    kernels += row.extra_kernels
    mfu = row.mfu or MFU[row.dtype]
    total = flops_step * row.steps
    compute = [total / (PEAK[row.dtype] * m) for m in mfu]
    launch = [kernels * row.steps * s for s in LAUNCH_S]
    seq = [row.seq_floor * row.steps * s for s in LSTM_STEP_S]
    floor = [max(a, b) for a, b in zip(launch, seq)]
    host = [row.host_step_s[i] * row.steps + row.host_s[i] for i in (0, 1)]
    low = max(compute[0], floor[0]) + host[0]
    high = compute[1] + floor[1] + host[1]
    return {"gflop": total / 1e9, "minutes": (low / 60, high / 60), "flops_step": flops_step,
            "kernels_step": kernels, "compute_min": (compute[0] / 60, compute[1] / 60),
            "launch_min": (floor[0] / 60, floor[1] / 60), "host_min": (host[0] / 60, host[1] / 60)}


# the printed table's workload column, one short line per chapter (the rows above hold the detail)
SHORT = {
    "01_attention": "CPU demos only",
    "02_self_attention": "CPU demos only",
    "03_multi_head_attention": "2 x 1000 steps, 1-layer GPT d64 (fp32)",
    "04_positional_encoding": "3 x 600 steps, 1-block LM d64 (fp32)",
    "05_residual_layernorm_ffn": "CPU demos only",
    "06_masking": "1000 steps, Transformer d32 1+1 (fp32)",
    "07_parallelism": "step timing: GPT d512 x4 and LSTM d512 x4, T to 2048",
    "08_long_sequences": "3 x 3000 steps, GPT d384 x6, B32 x T256 (fp16); RoPE scaling evals",
    "09_efficient_attention": "6 x 2000 steps, 1-block d32 (fp32)",
    "10_training": "3 x 400 + 3,200 tiny steps; preset gpu on Multi30k for 5 min; BLEU on test_2016_flickr",
    "11_fine_tuning": "pretrain 3000 + SFT 2000 + LoRA 4000 steps, GPT d384 x6",
    "11_llms": "GPT d384 x6 3000 x B64 x T255 and BERT d256 x4 3000 x B64 x T128 (fp16); TinyStories BPE",
    "11_preference_rl": "DPO 300 steps; GRPO 3 x 300 x (512 samples, 2 updates) (fp16 updates)",
    "12_multimodal": "ViT digits; CIFAR-10 ViT 30 epochs; CLIP digits; Flickr8k CLIP 60 epochs (fp16, GPU aug.)",
    "13_mixture_of_experts": "dense + 2 MoE GPTs d384 x6, 2000 x B32 x T256; wikitext-103 (30M chars) BPE",
    "14_inference": "4 GPTs x 3000 steps (d384 x6); KV cache, speculative, serving",
    "15_transformer_vs_rnn": "recall 4 x 1500 (GPT, LSTM); throughput; 10 x 1000-step sweep",
}


def chapters() -> list[str]:
    return sorted(p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))


def summarize(rows: list[Row], only: list[str]) -> dict:
    """Per chapter of `only`: the rows' estimates, total GFLOP, minutes (low, high) with the fixed cost."""
    out = {}
    for ch in only:
        ests = [(r, estimate(r)) for r in rows if r.chapter == ch]
        lo = FIXED_MIN[0] + sum(e["minutes"][0] for _, e in ests)
        hi = FIXED_MIN[1] + sum(e["minutes"][1] for _, e in ests)
        out[ch] = {"workload": SHORT.get(ch, ""), "gflop": sum(e["gflop"] or 0.0 for _, e in ests),
                   "minutes": [lo, hi], "fits": verdict(lo, hi),
                   "rows": [{"what": r.what, "src": r.src, "method": r.method, "dtype": r.dtype, "steps": r.steps,
                             **e} for r, e in ests]}
    return out


def verdict(lo: float, hi: float) -> str:
    return "yes" if hi <= BUDGET_MIN else ("no" if lo > BUDGET_MIN else "borderline")


def with_proposal(ch: str) -> list[Row]:
    keep = [r for r in WORK if r.chapter == ch and not r.what.startswith(REPLACES.get(ch, ()))]
    return keep + PROPOSALS.get(ch, [])


def gpu_preset_steps(minutes: float = 5.0) -> tuple[int, int]:
    """Steps the `gpu` preset makes on a T4 in `minutes` (8,000 tokens a side; Multi30k: ~20 tokens a line)."""
    c = count(Net.of("seq2seq", (400, 20, 20), src_vocab_size=8000, d_model=512, n_heads=8, d_ff=2048,
                     n_encoder_layers=3, n_decoder_layers=3, dropout=0.3, context_length=320))
    kern = c["kernels"] + optimizer_kernels(c["tensors"], "fused", True, True, True)
    fast = max(c["flops"] / (PEAK["fp16"] * MFU["fp16"][0]), kern * LAUNCH_S[0])
    slow = c["flops"] / (PEAK["fp16"] * MFU["fp16"][1]) + kern * LAUNCH_S[1]
    return int(60 * minutes / slow), int(60 * minutes / fast)


def fmt_min(lo: float, hi: float) -> str:
    return f"{lo:.1f}-{hi:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the estimate as JSON")
    ap.add_argument("--rows", action="store_true", help="also print every row: compute / launches / host")
    ap.add_argument("--chapters", help="comma-separated chapters to estimate (default: all); the JSON's "
                                       "'coverage' still counts every chapter's rows")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    every = chapters()
    only = every if not args.chapters else [c.strip() for c in args.chapters.split(",") if c.strip()]
    unknown = sorted(set(only) - set(every))
    if unknown:
        ap.error(f"unknown chapters {unknown}; notebooks/src has {', '.join(every)}")
    summary = summarize(WORK, only)
    proposals = {}
    for ch in PROPOSALS:
        if ch in only:
            lo, hi = summarize(with_proposal(ch), [ch])[ch]["minutes"]
            proposals[ch] = {"changes": [{"what": r.what, "src": r.src} for r in PROPOSALS[ch]],
                             "replaces": list(REPLACES.get(ch, ())), "minutes": [lo, hi], "fits": verdict(lo, hi)}
    steps_5 = gpu_preset_steps() if "10_training" in only else None
    coverage = {ch: sum(r.chapter == ch for r in WORK) for ch in every}
    if args.json:
        print(json.dumps({
            "estimate": True, "measured": False, "device": "NVIDIA T4 16 GB (sm75), not measured",
            "assumptions": {"peak_flops": PEAK, "mfu": MFU, "mfu_moe": MFU_MOE, "launch_s": LAUNCH_S,
                            "lstm_step_s": LSTM_STEP_S, "fixed_min": FIXED_MIN, "budget_min": BUDGET_MIN,
                            "source": "NVIDIA T4 datasheet: FP32 8.1 TFLOPS, mixed precision FP16/FP32 65 TFLOPS"},
            "coverage": coverage, "chapters": summary, "proposals": proposals,
            "blockers": [{"chapter": c, "change": t} for c, t in BLOCKERS if c in only],
            "gpu_preset_steps_in_5_min_on_t4": steps_5, "seconds": round(time.perf_counter() - t0, 1)},
            indent=1, default=float))
        return 0
    print("Full mode on a 16 GB T4: an ESTIMATE from counted FLOPs and kernel launches, not a measurement\n")
    print(f"| chapter | full-mode workload | GFLOP | est. T4 minutes | fits {BUDGET_MIN:.0f} min? |")
    print("|---|---|---:|---:|---|")
    for ch, s in summary.items():
        print(f"| {ch} | {s['workload']} | {s['gflop']:,.0f} | {fmt_min(*s['minutes'])} | {s['fits']} |")
    if args.rows:
        print("\nEvery row: minutes, then compute / launch floor / host (low-high)")
        for ch, s in summary.items():
            for r in s["rows"]:
                parts = [f"{k.split('_')[0]} {fmt_min(*r[k])}" for k in ("compute_min", "launch_min", "host_min")
                         if k in r]
                print(f"  {ch:25s} {fmt_min(*r['minutes']):>11s}  {r['what'][:78]}  [{', '.join(parts)}]")
    over = [ch for ch, s in summary.items() if s["fits"] != "yes"]
    print(f"\nOver {BUDGET_MIN:.0f} minutes, or possibly (the high end): {', '.join(over) or 'none'}")
    for ch in over:
        p = proposals.get(ch)
        if p is None:
            continue
        print(f"  {ch} -> {fmt_min(*p['minutes'])} min ({p['fits']}) with:")
        for c in p["changes"]:
            print(f"      {c['what']}  [{c['src']}]")
    if steps_5:
        print(f"\nThe gpu preset on a T4 makes ~{steps_5[0]:,}-{steps_5[1]:,} steps in its 5 minutes "
              "(one H200: 4,449 in 2.5 minutes, tformer/translate/presets.py)")
    blockers = [(c, t) for c, t in BLOCKERS if c in only]
    if blockers:
        print("\nFound while reading the chapters (full mode fails, or is slow, without these):")
        for ch, text in blockers:
            print(f"  {ch}: {text}")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
