"""Each capstone's training step on this machine: tokens/s and the fraction of the measured matmul peak.

    python benchmarks/capstone_peak.py [--threads N] [--steps N] [--json FILE] [--tiny]
    python benchmarks/capstone_peak.py --only grpo --profile grpo-rollout     # torch.profiler's top ops of a row

One row per training step a capstone runs, at its RECIPE's CPU-tier size (`--tiny`: each capstone's TINY
sizes, for the test), on synthetic batches of the recipe's shape (random token ids and images: no data
files, no download):

  translate      `Trainer.train_step` of the `small` preset's Transformer (8k vocabulary) on 100 x 16
                 target tokens, the 1,600 padded tokens a side of its batches (Multi30k's ~16 BPE tokens a
                 sentence), label-smoothed loss with the head fused in (`Seq2SeqLoss`), Adam, clipping at 1
  vit            `Trainer.train_step` of the digits ViT on 32 images of 8 x 8 (17 tokens each), AdamW
  clip           `Trainer.train_step` of the LiT aligner: 64 (image, caption) pairs, the ViT tower frozen,
                 the text tower on 40 byte tokens a caption
  moe-dense      `Trainer.train_step` of the dense GPT on 32 x 128 tokens, vocabulary 4,096, `fused_lm_loss`
  moe-moe        the same for the MoE GPT (8 experts, top-2, equal active parameters)
  grpo-rollout   what a GRPO iteration does before its updates: `sample_answers` (16 prompts x 8 answers,
                 10 new tokens, KV cache), then the sampling policy's and the reference's log-probs
  grpo-update    one of the iteration's 2 gradient steps: log-probs, `grpo_loss`, backward, clipping, AdamW
  grpo-iter      `grpo.grpo_step` whole: one rollout and 2 updates (what the capstone runs 150 times a seed)

The step is the capstone's own: the Trainer the capstone builds (its TrainConfig: precision, clipping; its
optimizer), called through `Trainer.train_step`, the function `Trainer.fit` calls for each step (without
the progress bar, the logging and the checkpoints); GRPO through `tformer.training.grpo`'s functions.
Each row: the median of `--steps` steps after `--warmup` (`tformer.measure.timing.time_fn`).

FLOPs: one step under `torch.utils.flop_counter.FlopCounterMode` (matrix products, convolutions and fused
attention, forward and backward; causal attention counted in full, as FlopCounterMode and the PaLM MFU
formula count it). Two CPU kernels FlopCounterMode does not know are counted here: PyTorch's CPU flash
attention (with its formula for the other SDPA kernels) and `torch._grouped_mm`, the MoE experts' matmul
on a CPU (2 m n k per group). Element-wise work, softmax and the optimizer count nothing. Columns:

  tok/s        the row's tokens a second (which tokens: the `unit` column); items/s: sentences, images,
               pairs, sequences or answers
  GFLOP/s      the step's counted FLOPs / the step's time
  %peak        GFLOP/s / the machine's matmul peak: `tformer.measure.machine.probe()` (float32 n = 1024
               products with this process's threads; the bf16 rate for a row that trains in bf16), the
               better of a probe before and one after the rows
  %shape       the rate of the step's own matrix products run alone, shape by shape (each distinct call
               replayed on random tensors of the same shapes and strides), over the same peak: what the
               sizes of the matrices allow ("small matrices" when it is low)
  mm share     the time of those products alone / the step's time: the rest is everything that is not
               a matrix product (Python, element-wise kernels, softmax, routing, the optimizer)
  probe        a short float32 probe (GFLOP/s) just before the row: on a busy machine it shows the load moving

so %peak = %shape x mm share, each row split into "the matrices are small" and "the time goes elsewhere".
The probe's 1024 x 1024 product is a reference, not a ceiling: a step's own shapes can run a little faster
(%shape above 100%), and on a busy machine every figure moves with the load (compare rows of one run).
`--profile ROW` prints torch.profiler's top operators for a few steps of that row, to see where.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import tformer.utils.runtime
from tformer.measure.machine import probe
from tformer.measure.timing import format_table, profiled, time_fn
from tformer.utils.device import dtype_name, resolve as resolve_device

CAPSTONES = ("translate", "vit", "clip", "moe", "grpo")


# -- FLOPs: FlopCounterMode, and the CPU kernels it lacks -------------------------------------------------
def _cpu_flash_fwd(query, key, value, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query, key, value)


def _cpu_flash_bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _grouped_mm_flops(a, b, *args, out_shape=None, **kwargs):
    """torch._grouped_mm (the MoE experts' grouped matmul): 2 x the output's elements x the shared dimension;
    for a 2-D x 2-D call (a weight gradient, the groups along the shared dimension) each group's (m, n)
    block takes only its own slice of it, 2 m n K in all."""
    if len(a) == 2 and len(b) == 2:
        return 2 * out_shape[-2] * out_shape[-1] * a[1]
    return 2 * math.prod(out_shape) * a[-1]


def _custom_flops() -> dict:
    """FlopCounterMode's custom_mapping: PyTorch's CPU flash attention (forward, backward) and grouped matmul,
    where this torch has them (FlopCounterMode hands each formula the shapes)."""
    aten, out = torch.ops.aten, {}
    for name, fn in (("_scaled_dot_product_flash_attention_for_cpu", _cpu_flash_fwd),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_flash_bwd),
                     ("_grouped_mm", _grouped_mm_flops)):
        if hasattr(aten, name):
            out[getattr(aten, name)] = fn
    return out


@dataclass(frozen=True)
class _Rand:
    """A floating-point argument, recorded by shape, stride and dtype: random values stand in for it."""
    shape: tuple
    stride: tuple
    dtype: torch.dtype

    def make(self, device, g) -> torch.Tensor:
        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)
        return t.copy_(torch.randn(t.shape, generator=g).to(self.dtype))


def _key(tree):
    """A hashable stand-in for a call's arguments: every tensor as (shape, stride, dtype)."""
    leaves, spec = tree_flatten(tree)
    return str(spec), tuple((tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor)
                            else x if isinstance(x, (int, float, bool, str, type(None), torch.dtype)) else repr(x)
                            for x in leaves)


def _template(tree):
    """The arguments to replay: floating-point tensors as _Rand, integer ones (group offsets, indices) kept."""
    return tree_map(lambda x: (_Rand(tuple(x.shape), tuple(x.stride()), x.dtype) if x.is_floating_point()
                               else x.detach().clone()) if isinstance(x, torch.Tensor) else x, tree)


class _Recorder(TorchDispatchMode):
    """Records every call of an operator FlopCounterMode counts, with its FLOPs, by distinct (operator,
    shapes, strides, dtypes, other arguments), to replay each alone."""

    def __init__(self, registry: dict):
        super().__init__()
        self.registry, self.calls = registry, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        fn = self.registry.get(func._overloadpacket)
        if fn is not None:
            key = (func, _key((args, kwargs)))
            rec = self.calls.get(key)
            if rec is None:
                dev = next((a.device for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)), torch.device("cpu"))
                rec = self.calls[key] = {"func": func, "args": _template((args, kwargs)), "count": 0, "device": dev,
                                         "flops": int(fn(*args, **kwargs, out_val=out))}
            rec["count"] += 1
        return out


def shape_replay(calls: dict, budget_s: float = 0.02) -> tuple[float, int, int]:
    """Seconds the recorded calls take run alone (each distinct call timed on random tensors of its shapes,
    times how often the step made it), and the FLOPs covered and not covered (a call that cannot be replayed)."""
    g = torch.Generator().manual_seed(0)
    total_s, covered, missed = 0.0, 0, 0
    for rec in calls.values():
        try:
            args, kwargs = tree_map(lambda x: x.make(rec["device"], g) if isinstance(x, _Rand) else x, rec["args"])
            func = rec["func"]
            with torch.no_grad():
                t0 = time.perf_counter()
                func(*args, **kwargs)
                once = max(time.perf_counter() - t0, 1e-7)
                reps = max(1, min(200, int(budget_s / 3 / once)))
                sec = time_fn(lambda: [func(*args, **kwargs) for _ in range(reps)], warmup=1, repeat=3,
                              device=rec["device"]) / reps
        except Exception:                            # an operator whose arguments random tensors cannot stand in for
            missed += rec["flops"] * rec["count"]
            continue
        total_s += sec * rec["count"]
        covered += rec["flops"] * rec["count"]
    return total_s, covered, missed


# -- the rows ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One row's step, and what a step processes."""
    name: str
    step: Callable[[], object]
    tokens: int                 # tokens per step (of the kind `unit` says)
    unit: str
    items: int                  # sentences, images, pairs, sequences or answers per step
    dtype: str                  # the precision the capstone trains in here
    shape: str                  # the batch, in words
    params: int = 0


@dataclass
class Row:
    row: str
    dtype: str
    batch: str
    unit: str
    tokens_per_step: int
    step_ms: float
    tok_s: float
    items_s: float
    gflop_step: float
    gflop_s: float
    peak_gflop_s: float
    frac_peak: float
    shape_gflop_s: float | None
    frac_shape: float | None
    mm_ms: float | None
    mm_share: float | None
    params: int = 0
    probe_near: float | None = None     # a short float32 probe just before the row (the machine's state then)
    notes: list = field(default_factory=list)


def _recipe(cls, tiny: bool) -> dict:
    from tformer.capstones.base import overlay
    recipe = copy.deepcopy(cls.RECIPE)
    return overlay(recipe, cls.TINY) if tiny else recipe


def _trainer_case(name, model, loss_fn, batch, cfg, optimizer, device, tokens, unit, items, shape) -> Case:
    from tformer.training.trainer import Trainer
    trainer = Trainer(model, loss_fn, [batch], cfg, optimizer=optimizer, device=device)
    params = sum(p.numel() for p in trainer.module.parameters())
    trainer.module.train()
    return Case(name, lambda: trainer.train_step([batch]), tokens, unit, items, dtype_name(trainer.amp_dtype),
                shape, params)


def translate_cases(tiny: bool, device) -> list[Case]:
    from tformer.capstones.translate_multi30k import TranslateMulti30k
    from tformer.data import Seq2SeqBatch
    from tformer.training.trainer import TrainConfig
    from tformer.translate.pipeline import Seq2SeqLoss, build_model
    from tformer.translate.presets import get_preset
    p = get_preset(_recipe(TranslateMulti30k, tiny)["preset"])
    vocab = p.vocab_size
    t = 8 if tiny else 16                          # Multi30k: ~16 BPE tokens a sentence (bench_translate.py)
    b = p.max_tokens // t if not tiny else 8       # max_tokens padded tokens a side
    torch.manual_seed(0)
    model = build_model(p, vocab, 0)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (b, t), generator=g)
    tgt = torch.randint(4, vocab, (b, t + 1), generator=g)
    batch = Seq2SeqBatch(src, tgt[:, :-1], tgt[:, 1:])
    cfg = TrainConfig(max_steps=10**6, lr=p.lr, warmup=p.warmup, schedule=p.schedule, grad_clip=p.grad_clip,
                      cpu_bf16=p.cpu_bf16, progress=False)             # the preset's TrainConfig (pipeline._train)
    return [_trainer_case("translate", model, Seq2SeqLoss(p.label_smoothing, 0), batch, cfg, None, device,
                          b * t, "target tok", b, f"{b}x{t} + {b}x{t}")]


def vit_cases(tiny: bool, device) -> list[Case]:
    import torch.nn.functional as F
    from tformer.capstones.vit_digits import VitDigits, trainer_config
    from tformer.models.vit import ViT, ViTConfig
    from tformer.training.trainer import adamw
    r = _recipe(VitDigits, tiny)
    m, tc = r["model"], r["train"]
    torch.manual_seed(0)
    model = ViT(ViTConfig(**m))
    g = torch.Generator().manual_seed(0)
    b = tc["batch_size"]
    batch = (torch.randn(b, m["in_channels"], m["image_size"], m["image_size"], generator=g),
             torch.randint(0, m["n_classes"], (b,), generator=g))
    ls = tc["label_smoothing"]

    def loss_fn(mod, bt):                                 # vit_digits.train_vit's
        return F.cross_entropy(mod(bt[0]), bt[1], label_smoothing=ls), 1
    cfg = trainer_config(10**6, tc["warmup_frac"], tc["lr"], None, False, 0)
    n_tok = (m["image_size"] // m["patch_size"]) ** 2 + 1
    return [_trainer_case("vit", model, loss_fn, batch, cfg, adamw(model, tc["lr"], tc["weight_decay"]), device,
                          b * n_tok, "image tok", b, f"{b} images x {n_tok} tok")]


def clip_cases(tiny: bool, device) -> list[Case]:
    from tformer.capstones.clip_digits import ClipDigits, clip_model
    from tformer.capstones.vit_digits import trainer_config
    from tformer.data.captions import caption_ids, digit_captions
    from tformer.models.vit import ViT, ViTConfig
    from tformer.training.trainer import adamw
    r = _recipe(ClipDigits, tiny)
    v, tc, ctx = r["tower"]["model"], r["train"], r["text"]["context_length"]
    torch.manual_seed(0)
    model = clip_model(r, ViT(ViTConfig(**v)).eval())
    g = torch.Generator().manual_seed(0)
    b = tc["batch_size"]
    y = torch.randint(0, 10, (b,), generator=g)
    batch = (torch.randn(b, v["in_channels"], v["image_size"], v["image_size"], generator=g),
             caption_ids(digit_captions(y, generator=g, word_dropout=tc.get("word_dropout", 0.0)), ctx))
    cfg = trainer_config(10**6, tc["warmup_frac"], tc["lr"], None, False, 0)
    return [_trainer_case("clip", model, lambda mod, bt: (mod.loss(*bt), 1), batch, cfg,
                          adamw(model, tc["lr"], tc["weight_decay"], (0.9, 0.98), 1e-6), device,
                          b * ctx, "caption tok", b, f"{b} pairs, captions x {ctx}")]


def moe_cases(tiny: bool, device) -> list[Case]:
    from tformer.capstones.moe_stdlib import MoEStdlib, gpt_config
    from tformer.models.gpt import GPT
    from tformer.training.losses import fused_lm_loss
    from tformer.training.trainer import TrainConfig, adamw
    r = _recipe(MoEStdlib, tiny)
    tc, t = r["train"], r["model"]["context_length"]
    b, vocab = tc["batch_size"], r["vocab_size"]
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab, (b, t + 1), generator=g)
    batch = (idx[:, :-1], idx[:, 1:])
    out = []
    for kind in ("dense", "moe"):
        torch.manual_seed(0)
        model = GPT(gpt_config(r["model"], vocab, r["d_ff"], r["moe"] if kind == "moe" else None))
        cfg = TrainConfig(max_steps=10**6, lr=tc["lr"], schedule=tc["schedule"], warmup=tc["warmup"], grad_clip=1.0,
                          amp=True, progress=False)           # moe_stdlib.run_moe's
        out.append(_trainer_case(f"moe-{kind}", model, fused_lm_loss, batch, cfg,
                                 adamw(model, tc["lr"], tc["weight_decay"], (0.9, 0.95)), device,
                                 b * t, "tok", b, f"{b}x{t}"))
    return out


def grpo_cases(tiny: bool, device) -> list[Case]:
    from tformer.capstones.grpo_tasks import GRPOTasks
    from tformer.data.text import offline_text, train_tokenizer
    from tformer.models.gpt import GPT, GPTConfig
    from tformer.training import grpo
    r = _recipe(GRPOTasks, tiny)
    gr = r["grpo"]
    g_full = {**GRPOTasks.RECIPE["grpo"], **gr}
    text = offline_text()[:r.get("corpus_chars")]
    tok = train_tokenizer([text], vocab_size=r["vocab_size"])     # the capstone's tokenizer: its prompt lengths
    end_id = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    sft = GPT(GPTConfig(vocab_size=tok.get_vocab_size(), **r["model"])).to(device)
    policy, ref, opt = grpo.start_from(sft, g_full["lr"])
    rng, gen = random.Random(0), torch.Generator(device=device).manual_seed(0)
    train = grpo.problems(200 if tiny else r["sft"]["n_train"], seed=0)
    kw = dict(group=g_full["group"], max_new=g_full["max_new"], end_id=end_id, temperature=g_full["temperature"],
              generator=gen)
    prompts, group, max_new = g_full["prompts"], g_full["group"], g_full["max_new"]
    n = prompts * group

    def rollout():                                # grpo_step's part before the updates
        batch = rng.sample(train, prompts)
        policy.eval()
        roll = grpo.sample_answers(policy, tok, [q for _, q, _ in batch], [a for _, _, a in batch], **kw)
        with torch.no_grad():
            old = grpo.token_logprobs(policy, roll.ids)
            ref_lp = grpo.token_logprobs(ref, roll.ids)
        return batch, roll, old, ref_lp

    batch, roll, old, ref_lp = rollout()
    adv = grpo.group_advantages(torch.randn(prompts, group, generator=torch.Generator().manual_seed(1)).to(device))
    shape = (prompts, group, -1)

    def update():                                 # one of grpo_step's `updates` gradient steps
        policy.train()
        logp = grpo.token_logprobs(policy, roll.ids)
        loss = grpo.grpo_loss(logp.view(shape), old.view(shape), ref_lp.view(shape), adv, roll.mask.view(shape),
                              g_full["eps"], g_full["beta"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()

    def iteration():
        grpo.grpo_step(policy, ref, opt, tok, rng.sample(train, prompts), updates=g_full["updates"],
                       eps=g_full["eps"], beta=g_full["beta"], **kw)

    seq = roll.ids.shape[1]
    params = sum(p.numel() for p in policy.parameters())
    return [Case("grpo-rollout", rollout, n * max_new, "answer tok", n,
                 "float32", f"{prompts}x{group} answers x {max_new} new", params),
            Case("grpo-update", update, n * seq, "seq tok", n, "float32", f"{n}x{seq}", params),
            Case("grpo-iter", iteration, n * max_new, "answer tok", n, "float32",
                 f"rollout + {g_full['updates']} updates", params)]


BUILDERS = {"translate": translate_cases, "vit": vit_cases, "clip": clip_cases, "moe": moe_cases, "grpo": grpo_cases}


def measure(case: Case, peaks: dict, steps: int, warmup: int, device, shapes: bool = True,
            replay_s: float = 0.02) -> Row:
    step = case.step
    step()                                                     # the first step allocates the optimizer's state
    with FlopCounterMode(display=False, custom_mapping=_custom_flops()) as fc:
        if shapes:
            rec = _Recorder({**fc.flop_registry})
            with rec:
                step()
        else:
            step()
    flops = fc.get_total_flops()
    sec = time_fn(step, warmup=warmup, repeat=steps, device=device)
    peak = peaks.get(case.dtype, peaks["float32"])
    notes = []
    mm_s = covered = None
    if shapes:
        mm_s, covered, missed = shape_replay(rec.calls, replay_s)
        if missed:
            notes.append(f"{missed / max(flops, 1):.0%} of the FLOPs not replayed")
    gflops = flops / 1e9
    rate = gflops / sec
    shape_rate = covered / 1e9 / mm_s if mm_s else None
    return Row(case.name, case.dtype, case.shape, case.unit, case.tokens, sec * 1e3, case.tokens / sec,
               case.items / sec, gflops, rate, peak, rate / peak, shape_rate,
               shape_rate / peak if shape_rate else None, mm_s * 1e3 if mm_s is not None else None,
               mm_s / sec if mm_s is not None else None, case.params, notes)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: every core)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per row (the median is reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per row before them")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the table and the probe to FILE")
    ap.add_argument("--tiny", action="store_true", help="each capstone's TINY sizes and a short probe (seconds)")
    ap.add_argument("--only", default=None, help=f"comma-separated capstones (of {', '.join(CAPSTONES)})")
    ap.add_argument("--no-shapes", action="store_true", help="skip replaying the step's matrix products alone")
    ap.add_argument("--profile", default=None, metavar="ROW", help="print torch.profiler's top operators for ROW")
    ap.add_argument("--device", default=None, help="default: the package's device policy (CUDA, else MPS, else CPU)")
    args = ap.parse_args(argv)
    tformer.utils.runtime.set_threads(args.threads)        # explicit: benchmarks choose their threads
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    started = time.time()
    device = resolve_device(args.device)
    only = [c.strip() for c in args.only.split(",")] if args.only else list(CAPSTONES)
    bad = set(only) - set(CAPSTONES)
    if bad:
        ap.error(f"--only: unknown capstones {sorted(bad)}; choose from {', '.join(CAPSTONES)}")
    pkw = dict(seconds=0.02, n=256) if args.tiny else dict(seconds=0.5)
    before = probe(device, **pkw)
    print(f"{before.line()}  [load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}]" if load else before.line(),
          flush=True)
    cases = [c for name in only for c in BUILDERS[name](args.tiny, device)]
    rows_at: dict[str, Case] = {c.name: c for c in cases}
    if args.profile:
        if args.profile not in rows_at:
            ap.error(f"--profile: no row {args.profile!r}; rows: {', '.join(rows_at)}")
        case = rows_at[args.profile]
        case.step()
        _, prof = profiled(lambda: [case.step() for _ in range(max(1, min(args.steps, 5)))])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        return
    peaks = {"float32": before.float32, **({before.low_dtype: before.low} if before.low else {})}
    rows = []
    for c in cases:
        near = probe(device, seconds=0.01 if args.tiny else 0.1, n=pkw.get("n")).float32
        rows.append(measure(c, peaks, args.steps, args.warmup, device, shapes=not args.no_shapes,
                            replay_s=0.002 if args.tiny else 0.02))
        rows[-1].probe_near = near
        print(f"  {c.name}: {rows[-1].step_ms:.1f} ms/step", file=sys.stderr, flush=True)
    after = probe(device, **pkw)                           # again after the rows: the better figure is the peak
    best = {"float32": max(before.float32, after.float32)}
    if before.low and after.low:
        best[before.low_dtype] = max(before.low, after.low)
    for r in rows:
        peak = best.get(r.dtype, best["float32"])
        r.peak_gflop_s, r.frac_peak = peak, r.gflop_s / peak
        r.frac_shape = r.shape_gflop_s / peak if r.shape_gflop_s else None
    print(f"probe after the rows: {after.float32:,.0f} GFLOP/s float32"
          + (f", {after.low:,.0f} {after.low_dtype}" if after.low else "")
          + f"; peak used: {best['float32']:,.0f} float32" + (f", {best[before.low_dtype]:,.0f} {before.low_dtype}"
                                                             if before.low_dtype in best else ""))
    table = [{"row": r.row, "dtype": r.dtype, "batch": r.batch, "step ms": r.step_ms, "tok/s": round(r.tok_s),
              "unit": r.unit, "items/s": round(r.items_s), "GFLOP/step": r.gflop_step, "GFLOP/s": r.gflop_s,
              "%peak": f"{r.frac_peak:.1%}",
              "%shape": f"{r.frac_shape:.1%}" if r.frac_shape is not None else "-",
              "mm share": f"{r.mm_share:.0%}" if r.mm_share is not None else "-",
              "probe": round(r.probe_near)} for r in rows]
    print(format_table(table))
    for r in rows:
        for note in r.notes:
            print(f"  {r.row}: {note}")
    if args.json:
        out = {"command": " ".join(["python", "benchmarks/capstone_peak.py", *(argv if argv is not None else sys.argv[1:])]),
               "load_average_at_start": load, "threads": torch.get_num_threads(), "device": str(device),
               "torch": torch.__version__, "tiny": args.tiny, "steps": args.steps, "warmup": args.warmup,
               "probe_before": before.as_dict(), "probe_after": after.as_dict(), "peak": best,
               "seconds": round(time.time() - started, 1), "rows": [asdict(r) for r in rows]}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2, default=str)


if __name__ == "__main__":
    main()
