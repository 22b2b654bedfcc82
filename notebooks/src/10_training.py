# %% [markdown]
# # Chapter 10: Training the Transformer, and the translation capstone
#
# **What you will learn.** The recipe that made the 2017 paper train: Adam with
# $\beta = (0.9, 0.98)$, $\epsilon = 10^{-9}$ and a learning rate that *warms up* then decays,
#
# $$\mathrm{lr}(s) = d_{model}^{-1/2}\cdot\min\!\left(s^{-1/2},\; s\cdot \mathrm{warmup}^{-3/2}\right),$$
#
# label smoothing $\epsilon_{ls}=0.1$, dropout 0.1, batches built by token count. Then how a translation
# model is trained with `tformer`'s `Trainer` (progress bar, validation, atomic checkpoints, exact
# resume, checkpoint averaging), decoded with beam search and scored with BLEU. Greedy decoding writes the
# most probable token at each step; beam search keeps the few most probable partial translations at each
# step and extends all of them (section 5 gives its rule). BLEU counts the word
# n-grams (runs of 1 to 4 words) a translation shares with a reference, from 0 to 100; sacreBLEU computes
# it in a standard way and prints a signature, so the number compares with published ones.
#
# **What you will do.** Write the schedule and the label-smoothed loss yourself (two exercises). Watch
# warmup keep a post-LN model training, and label smoothing lower a model's confidence. Teach the
# translation pipeline to reverse rows of digits, and check its output at a glance. Then train and
# score a translation model, and check that beam search finds translations at least as probable as
# greedy decoding's.
#
# **How long it runs.** Small mode (`TFORMER_SMALL=1`) runs the whole chapter on a 2-core CPU in about
# a minute and a half, with the built-in English-German corpus and tiny models. Full mode (a CUDA GPU)
# trains the `gpu` preset on Multi30k German -> English for 5 minutes. The capstone, one command,
# trains for 30 minutes on a CPU.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in an exercise cell with your code,
# run it, then run the `check(...)` cell below it: PASS, or the smallest failing input with a hint.
#
# **Where the code lives** (each piece is printed once you have written your own):
# * `tformer/training/schedules.py: noam_lr, InverseSqrtSchedule, LinearDecaySchedule`, `tformer/training/losses.py: label_smoothed_cross_entropy`,
#   `tformer/training/trainer.py: Trainer, TrainConfig`
# * `tformer/models/transformer.py: Transformer, TransformerConfig` (`norm_first=True` is pre-LN),
#   `tformer/dropout.py: dropout`
# * `tformer/data/tokenizer.py: SharedBPE`, `tformer/data/batching.py: TokenBatcher`,
#   `tformer/data/corpus.py: generate_pairs`, `tformer/data/sources.py: read_parallel`
# * `tformer/inference/decode.py: greedy_decode, beam_search, length_penalty, translate`
# * `tformer/translate/pipeline.py: train_run, load_run, score_lines, Seq2SeqLoss`
# * `tformer/training/metrics.py: sacrebleu_score, tokenized_bleu`

# %%
import inspect
import math
import random
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import tformer
from tformer.data import SharedBPE, TokenBatcher, generate_pairs
from tformer.dropout import dropout
from tformer.inference.decode import beam_search, greedy_decode
from tformer.grading import check
from tformer.models import Transformer, TransformerConfig
from tformer.utils.plot import curves
from tformer.training import Trainer, TrainConfig, label_smoothed_cross_entropy, linear_cross_entropy, noam_lr
from tformer.translate import load_run, score_lines, train_run
from tformer.translate.pipeline import Seq2SeqLoss
from tformer.utils.device import amp_dtype
from tformer.measure.timing import time_interleaved

tformer.seed_everything(0)
device = tformer.device()
print("small mode:", tformer.SMALL, "| device:", device)

# %% [markdown]
# ## 1. The schedule: warm up, then decay as $1/\sqrt{s}$
#
# The rate grows linearly for `warmup` steps and peaks at $(d_{model}\cdot\mathrm{warmup})^{-1/2}$
# ($7\times10^{-4}$ for the base model), then falls as $1/\sqrt{s}$. A wider model gets a smaller rate.

# %%
# Figure: The paper's learning-rate schedule: a linear warmup, then 1/sqrt(step) decay.
steps = list(range(1, 100_001, 250))
fig, ax = plt.subplots(figsize=(6, 3.2))
for d, w in [(512, 4000), (512, 8000), (1024, 4000)]:
    ax.plot(steps, [noam_lr(s, d, w) for s in steps], label=f"d_model={d}, warmup={w}")
ax.set_xlabel("step"), ax.set_ylabel("learning rate"), ax.legend(), ax.set_title("the paper's schedule")
plt.show()
peak = max(range(1, 20_000), key=lambda s: noam_lr(s, 512, 4000))
print(f"base: peak at step {peak}, lr {noam_lr(peak, 512, 4000):.2e} = (512*4000)^-0.5 = {(512 * 4000) ** -0.5:.2e}")
assert peak == 4000

# %% [markdown]
# **A run with a fixed budget should anneal.** At the paper's last step, $1/\sqrt{s}$ is still at a fifth
# of its peak: that schedule never settles the weights, it only slows down. When the budget is known
# (the capstone at the end of the chapter trains for 30 CPU minutes on Multi30k, English descriptions of
# Flickr photos with their German translations), the `linear` schedule warms up the same way. Then it falls
# on a straight line to zero exactly when the budget runs out: its progress is the larger of
# steps / `max_steps` and minutes / `time_budget`. The last updates are small ones that settle the
# weights, where most of the loss drop of a short run happens. The `small` preset uses it.

# %%
# Figure: A fixed step budget: the paper's 1/sqrt(step) decay against a linear decay to 0.
from tformer.training import InverseSqrtSchedule, LinearDecaySchedule

budget_steps, w, peak_lr = 1200, 300, 1.5e-3
lin, rsqrt = LinearDecaySchedule(w), InverseSqrtSchedule(w)
lin_lr = []
for i in range(budget_steps):
    lin.set_progress(i / budget_steps)                 # the Trainer calls this before every step
    lin_lr.append(peak_lr * lin(i))
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot([peak_lr * rsqrt(i) for i in range(budget_steps)], label="noam: 1/sqrt(step)")
ax.plot(lin_lr, label="linear: to 0 at the end of the budget")
ax.set_xlabel("step"), ax.set_ylabel("learning rate"), ax.legend(), ax.set_title(f"{budget_steps} steps, warmup {w}")
plt.show()
assert lin_lr[-1] < 0.01 * peak_lr < peak_lr * rsqrt(budget_steps - 1)

# %% [markdown]
# ## Exercise: the schedule
# `steps` is a LongTensor of step numbers (counted from 1, any shape); return the learning rate for each,
# as float64, same shape.

# %%
def my_noam(steps, d_model, warmup):
    ### BEGIN SOLUTION
    s = steps.double()
    return d_model ** -0.5 * torch.minimum(s ** -0.5, s * warmup ** -1.5)
    ### END SOLUTION


# %%
check("ch10.noam", my_noam)

# %% [markdown]
# The package's version (one step at a time; the `Trainer`'s `noam` schedule calls it):

# %%
print(inspect.getsource(noam_lr))

# %% [markdown]
# ## 2. Warmup keeps a post-LN model training
#
# In the paper's post-LN layers, $x \leftarrow \mathrm{LN}(x + \mathrm{Sublayer}(x))$, every residual
# branch passes through a LayerNorm, and at initialization the gradients of the last layers are large
# (Xiong et al. 2020). Adam's first steps, with no history to scale them, then move those weights by
# the full learning rate. Warmup keeps the first steps small. We train the same 4+4-layer model
# three ways at the same constant rate on the built-in corpus: post-LN with a linear warmup, post-LN
# without, and pre-LN without (pre-LN keeps an identity path, so it does not need warmup). The only
# difference between the two post-LN runs is the warmup.
#
# The text is cut into tokens by a byte-pair encoding (BPE) shared by both languages: starting from
# single bytes, it merges the most frequent adjacent pair into a new token, again and again, until the
# vocabulary has the size asked for. `11_llms` builds one from scratch.

# %%
en, de = generate_pairs(3000, seed=0)
bpe = SharedBPE.train(en + de, vocab_size=600)
batches = TokenBatcher(bpe.encode(en), bpe.encode(de), max_tokens=800, seed=0)
PEAK_LR, LAYERS = 3e-3, 4
WARM_STEPS, WARMUP = (100, 30) if tformer.SMALL else (400, 100)


def train_curve(norm_first: bool, warmup: int) -> list[float]:
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=bpe.vocab_size, d_model=64, n_heads=4, d_ff=256, n_encoder_layers=LAYERS,
                            n_decoder_layers=LAYERS, dropout=0.1, norm_first=norm_first, context_length=128)
    tc = TrainConfig(max_steps=WARM_STEPS, lr=PEAK_LR, schedule="constant",   # lr ramps 0 -> PEAK_LR over `warmup`
                     warmup=warmup, grad_clip=None, log_every=10, progress=False)
    trainer = Trainer(Transformer(cfg), Seq2SeqLoss(0.1, bpe.pad_id), batches, tc, device=device)
    trainer.fit()
    return [r["loss"] for r in trainer.state.history if "loss" in r]

# %% [markdown]
# Three runs of the same model and batches, differing only in the LayerNorm's place and the warmup:

# %%
# Figure: Training loss at a constant learning rate: post-LN with and without warmup, pre-LN without.
runs = {f"post-LN, warmup {WARMUP}": train_curve(False, WARMUP), "post-LN, no warmup": train_curve(False, 0),
        "pre-LN, no warmup": train_curve(True, 0)}
x = [10 * (i + 1) for i in range(len(next(iter(runs.values()))))]
curves(x, runs, xlabel="step", ylabel="training loss (10-step mean)",
       title=f"constant lr {PEAK_LR:g}, {LAYERS}+{LAYERS} layers")
plt.show()
for name, losses in runs.items():
    print(f"{name:>20}: loss at step {x[-1]}: {losses[-1]:.3f}   (logs: {[round(v, 2) for v in losses]})")
warm, cold, pre = (runs[k][-1] for k in runs)
print(f"post-LN at step {x[-1]}: warmup {warm:.2f} vs no warmup {cold:.2f} nats; pre-LN without warmup {pre:.2f}")
assert warm < cold - 0.2, "warmup should take post-LN off the plateau"
assert pre < cold, "pre-LN trains without warmup"

# %% [markdown]
# **What this shows.** Without warmup, post-LN drops fast for a few steps, then sits on a plateau: the
# loss of a model that has learned which words are frequent and nothing about the source. Its first
# full-size Adam steps pushed it where every LayerNorm'd residual branch amplifies each update (Liu et
# al. 2020), and it needs many steps to find its way out. With the rate ramped up over the first
# steps, the same model, batches and peak rate leave that plateau early (the line above, and the
# assertion under it). Pre-LN, whose residual path skips every LayerNorm, needs no warmup at all.
#
# GPT-2 and later models put the LayerNorm there. The GPT-2 paper gives no reason for the move; Xiong et
# al. (2020) later showed that pre-LN trains without warmup, and that the trouble grows with depth. The
# paper's 4,000 warmup steps protect 6+6-layer, width-512 models over 100,000 steps. At this size a
# 30-step ramp is enough to see the same mechanism.

# %% [markdown]
# ## The loop inside the `Trainer`
#
# Everything the `Trainer` adds (progress bar, validation, checkpoints, exact resume, time budget,
# accumulation, mixed precision, several GPUs) sits around one loop. Here it is bare, with the
# `Trainer`'s defaults: the paper's Adam, the `noam` schedule (`noam_lr` divided by its peak, times the
# peak rate), a loss function that returns (sum of token losses, token count), gradient clipping at 1.
# The loop divides the gradient by the count after the backward pass, as the `Trainer` does: with
# several micro-batches or GPUs, their sums and counts are added first, so every token weighs the same.
#
# The Adam is torch's fused kernel, which updates every parameter in one pass through memory. The
# package's optimizers all take it where it runs (`tformer.training.fusable`). Measured elsewhere:
# `python benchmarks/bench_optim.py --threads 2` times it against torch's default for the `small`
# preset's model (its figures are in `benchmarks/RESULTS.md`).

# %%
def bare_training_loop(model, loss_fn, batches, steps, lr, warmup, grad_clip=1.0, seed=0):
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=True)
    peak = noam_lr(warmup, 1, warmup)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: noam_lr(i + 1, 1, warmup) / peak)
    torch.manual_seed(seed)                              # dropout masks (the Trainer seeds here too)
    model.train()
    batches.set_epoch(0)                                 # the epoch alone fixes the batch order
    for _, batch in zip(range(steps), batches):          # (the Trainer goes on to epochs 1, 2, ...)
        loss_sum, count = loss_fn(model, batch)          # summed over tokens, and how many
        loss_sum.backward()                              # the gradient of the sum ...
        for p in model.parameters():
            p.grad.mul_(1 / float(count))                # ... divided by the count: of the mean
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()                                     # the rate for the next step
    return model

# %% [markdown]
# The same model, initialisation, batches and settings through the loop and through the `Trainer`:
# the weights agree bit for bit. (Dividing the loss by the count *before* `backward` is the same
# mathematics but rounds differently; the loop keeps the `Trainer`'s order so the check can be exact.)

# %%
def small_transformer():
    torch.manual_seed(0)
    return Transformer(TransformerConfig(src_vocab_size=bpe.vocab_size, d_model=32, n_heads=4, d_ff=64,
                                         n_encoder_layers=1, n_decoder_layers=1, dropout=0.1, context_length=128))


LOOP_STEPS, LOOP_LR, LOOP_WARMUP = 12, 3e-3, 4
bare = bare_training_loop(small_transformer(), Seq2SeqLoss(0.1, bpe.pad_id), batches, LOOP_STEPS, LOOP_LR, LOOP_WARMUP)
trainer = Trainer(small_transformer(), Seq2SeqLoss(0.1, bpe.pad_id), batches, device="cpu",
                  config=TrainConfig(max_steps=LOOP_STEPS, lr=LOOP_LR, warmup=LOOP_WARMUP, schedule="noam",
                                     log_every=LOOP_STEPS, progress=False))
trainer.fit()
moved = 0.0
for (name, a), b, c in zip(bare.state_dict().items(), trainer.module.state_dict().values(),
                           small_transformer().state_dict().values()):
    assert torch.equal(a, b), name
    moved = max(moved, (a - c).abs().max().item())
print(f"{LOOP_STEPS} steps: bare loop == Trainer, every weight (training moved some by up to {moved:.3f})")

# %% [markdown]
# ### Where a CPU step's time goes: dropout's masks
#
# Dropout zeroes each activation with probability $p$ and scales the rest by $1/(1-p)$, so its
# expected output is its input. Cheap as that sounds, on a CPU `F.dropout` draws one Mersenne-Twister
# number per element, in each of the capstone's 32 dropout sites at every step. Measured elsewhere:
# `torch.profiler` around `python benchmarks/bench_translate.py --batch 100 --len 16 --bf16 --threads 1`
# gives those draws' share of the capstone's training step in bf16 (bfloat16, a 16-bit float with
# float32's range and 8 bits of precision); `benchmarks/RESULTS.md` has the figure.
#
# `tformer/dropout.py: dropout` computes the same function from one 64-bit draw per four elements: each
# draw is cut into four 15-bit words, and an element is kept when its word is at least
# $\mathrm{round}(p\cdot 2^{15})$. Every `tformer` model uses it (on a GPU it is `F.dropout`, whose fused
# kernel is fast). Below, both on one FFN activation of that size, on the CPU: the same keep rate, and
# the time per call.

# %%
act = torch.randn(100, 16, 1024)                         # (sentences, tokens, d_ff): one FFN activation
drops = {"F.dropout": lambda: F.dropout(act, 0.1), "tformer.dropout": lambda: dropout(act, 0.1)}
for name, fn in drops.items():
    print(f"{name:16s} keeps {(fn() != 0).float().mean().item():.4f} of the elements (1 - p = 0.9)")
ms = {k: 1e3 * v for k, v in time_interleaved(drops, repeat=9).items()}
print(f"per call on the CPU: F.dropout {ms['F.dropout']:.1f} ms, tformer.dropout {ms['tformer.dropout']:.1f} ms "
      f"(time ratio {ms['F.dropout'] / ms['tformer.dropout']:.1f})")

# %% [markdown]
# ## 3. Label smoothing
#
# The target puts $1-\epsilon$ on the right token and spreads $\epsilon$ over the whole vocabulary:
#
# $$\mathcal{L} = (1-\epsilon)\,(-\log p_y) + \epsilon \cdot \frac{1}{V}\sum_v (-\log p_v).$$
#
# The second term is smallest when the distribution is flat, so the model is pushed away from putting
# all its mass on one token. Perplexity, $e^{\text{loss}}$, is the number of equally likely tokens the
# model's uncertainty amounts to. "This hurts perplexity, as the model learns to be more unsure, but
# improves accuracy and BLEU score" (the paper, section 5.4). Below we measure the first half (lower
# confidence, asserted); the BLEU of both models is printed in the capstone, where small mode is too
# small to assert the paper's gain.

# %% [markdown]
# ## Exercise: the label-smoothed loss
# `logits (B, T, V)`, `target (B, T)`; positions whose target is `ignore_index` (padding) count nothing.
# Return the mean loss over the other positions (a 0-dim tensor).

# %%
def my_label_smoothed_ce(logits, target, smoothing, ignore_index):
    ### BEGIN SOLUTION
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    loss = (1 - smoothing) * nll + smoothing * (-logp.mean(dim=-1))
    keep = target != ignore_index
    return (loss * keep).sum() / keep.sum()
    ### END SOLUTION


# %%
check("ch10.label_smoothing", my_label_smoothed_ce)

# %% [markdown]
# The package's version:

# %%
print(inspect.getsource(label_smoothed_cross_entropy))

# %% [markdown]
# The capstone's model never builds the (B, T, V) logits this function takes. With the targets,
# `Transformer(src, tgt_in, tgt_out, label_smoothing=0.1)` runs the output projection and the loss
# together, 256 target positions at a time (`tformer/training/losses.py: linear_cross_entropy`).
# The gradient of a chunk's logits is known in closed form,
#
# $$\frac{\partial\mathcal{L}}{\partial z_v} = \mathrm{softmax}(z)_v - (1-\epsilon)\,[v = y] - \frac{\epsilon}{V},$$
#
# so each chunk is turned at once into its share of the gradients of the hidden states and of the
# output matrix, and then dropped; positions whose target is `<pad>` are removed before the projection.
# `Seq2SeqLoss`, the loss the `Trainer` calls here, takes that path for the course's `Transformer`.
# Both ways on a small model in float64: the same loss and the same gradients.

# %%
torch.manual_seed(0)
m64 = Transformer(TransformerConfig(src_vocab_size=50, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
                                    n_decoder_layers=1, dropout=0.0, context_length=32)).double()
src, tgt = torch.randint(3, 50, (4, 10)), torch.randint(3, 50, (4, 9))
tgt_out = torch.roll(tgt, -1, 1)
tgt_out[:, -2:] = 0                                      # <pad> at the end of every target
plain = label_smoothed_cross_entropy(m64(src, tgt), tgt_out, 0.1, ignore_index=0, reduction="sum")
fused = m64(src, tgt, tgt_out, label_smoothing=0.1)
grads = [torch.autograd.grad(x, list(m64.parameters())) for x in (plain, fused)]
gap = max((a - b).abs().max().item() for a, b in zip(*grads))
print(f"summed loss: logits then loss {plain.item():.12f}, fused {fused.item():.12f}")
print(f"largest difference between their gradients: {gap:.1e}")

# %% [markdown]
# Take the capstone's size: a batch of about 1,400 target tokens, d = 256, V = 8,000. The logits path
# writes a 1,400 x 8,000 float32 tensor, reads it back for the softmax, and writes and reads its
# gradient; the fused path holds 256 x 8,000 at a time. The time of the head and the loss, forward and
# backward, both ways (on the CPU, under the bf16 autocast the capstone uses where the CPU has bf16
# units, float32 elsewhere; `torch.autocast` runs each operation in bf16 where that is safe and keeps
# float32 weights):

# %%
h = torch.randn(1400, 256, requires_grad=True)
W = (torch.randn(8000, 256) / 16).requires_grad_()
y = torch.randint(3, 8000, (1400,))
amp = amp_dtype("cpu", cpu_bf16=True)           # bf16 where the CPU has bf16 units, else None (float32)


def head_and_loss(fused: bool):
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        loss = (linear_cross_entropy(h, W, y, smoothing=0.1, reduction="sum") if fused else
                label_smoothed_cross_entropy(h @ W.t(), y, 0.1, reduction="sum"))
    loss.backward()
    h.grad = W.grad = None


ms = {k: 1e3 * v for k, v in time_interleaved({"logits, then loss": lambda: head_and_loss(False),
                                                "fused": lambda: head_and_loss(True)}, repeat=5).items()}
print(f"in {amp or torch.float32}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items())
      + f" (time ratio {ms['logits, then loss'] / ms['fused']:.1f})")

# %% [markdown]
# Smoothing penalises confidence itself: a correct prediction with logit margin 30 costs *more* than
# one with margin 4 once $\epsilon > 0$, while plain cross-entropy keeps rewarding the larger margin.
# Four tokens, the right one ahead of the other three by the margin; the cell prints the probability
# the softmax then gives the right token beside both losses.

# %%
target = torch.tensor([0])
for margin in (2.0, 4.0, 8.0, 30.0):
    logits = torch.tensor([[margin, 0.0, 0.0, 0.0]])
    print(f"margin {margin:4.0f}: p(right) {logits.softmax(-1)[0, 0]:.3f}   "
          f"CE {label_smoothed_cross_entropy(logits, target, 0.0).item():.3f}   "
          f"label-smoothed CE {label_smoothed_cross_entropy(logits, target, 0.1).item():.3f}")

# %% [markdown]
# **Measured.** Two tiny translation models (`tformer.translate.train_run`, the library form of
# `tformer translate train --preset tiny`) train on the built-in English -> German corpus. They are
# identical except for $\epsilon_{ls}$. On held-out sentences: the mean probability each gives its own
# top choice, and the probability it gives the right token.

# %%
from tformer.data import DataUnavailableError, read_parallel  # noqa: E402

root = Path(tempfile.mkdtemp(prefix="ch10_"))
TINY = dict(max_steps=120 if tformer.SMALL else 1500, offline_pairs=4000 if tformer.SMALL else 20000, progress=False)
for eps in (0.0, 0.1):
    train_run(root / f"ls{eps}", "tiny", label_smoothing=eps, **TINY)


@torch.no_grad()
def confidence(run):
    model, bpe_run, info = load_run(run)
    src, tgt = read_parallel(info["data"], info["src"], info["tgt"], "val")
    val = TokenBatcher(bpe_run.encode(src), bpe_run.encode(tgt), 4000, shuffle=False)
    top, right, n = 0.0, 0.0, 0
    for b in val:
        b = [t.to(next(model.parameters()).device) for t in b]
        p = torch.softmax(model(b[0], b[1]).float(), -1)
        keep = b[2] != bpe_run.pad_id
        top += p.max(-1).values[keep].sum().item()
        right += p.gather(-1, b[2].unsqueeze(-1)).squeeze(-1)[keep].sum().item()
        n += int(keep.sum())
    return top / n, right / n


conf = {eps: confidence(root / f"ls{eps}") for eps in (0.0, 0.1)}
for eps, (top, right) in conf.items():
    print(f"label smoothing {eps}: mean top probability {top:.3f}, probability of the right token {right:.3f}")
assert conf[0.1][0] < conf[0.0][0], "label smoothing should make the model less confident"

# %% [markdown]
# ## 4. A task you can check at a glance: reversing digits
#
# A translation of the built-in corpus is hard to judge unless you read German. So before the real
# corpus, the same pipeline (`train_run`: BPE, token batches, the `Trainer`, the `tiny` preset's
# Transformer) learns a task whose answer you can see: write a row of digits backwards. The data goes in
# the same layout as Multi30k, line-aligned files `train.digits` and `train.reversed`, so `train_run`
# reads it like any language pair. Two settings differ from the preset: batches of 600 tokens instead
# of 1,200, so that 200 steps take seconds, and no dropout, since a task without noise needs no
# regulariser.

# %%
def reversal_pairs(n: int, seed: int, unseen=()) -> tuple[list[str], list[str]]:
    """n rows of 3 to 6 digits (none of them in `unseen`), and each row reversed."""
    rng, rows = random.Random(seed), []
    while len(rows) < n:
        row = " ".join(rng.choice("0123456789") for _ in range(rng.randint(3, 6)))
        if row not in unseen:
            rows.append(row)
    return rows, [" ".join(row.split()[::-1]) for row in rows]


digits = root / "digits"
digits.mkdir()
train_rows = reversal_pairs(4000, seed=0)[0]
for split, (fwd, rev) in {"train": reversal_pairs(4000, seed=0), "val": reversal_pairs(200, 1, set(train_rows)),
                          "test": reversal_pairs(200, 2, set(train_rows))}.items():
    (digits / f"{split}.digits").write_text("\n".join(fwd) + "\n")
    (digits / f"{split}.reversed").write_text("\n".join(rev) + "\n")
REV_STEPS = 200
last = train_run(root / "reverse", "tiny", data=digits, src="digits", tgt="reversed", max_steps=REV_STEPS,
                 max_tokens=600, dropout=0.0, progress=False)
print(f"{REV_STEPS} steps in {60 * last['minutes']:.0f} s, validation loss {last['val_loss']:.2f}")

# %% [markdown]
# Greedy decoding of 200 test rows, none of them in the training data. Below: the first five beside
# their references, then the first rows the model got wrong, the share reversed exactly, and sacreBLEU.

# %%
rev_model, rev_bpe, _ = load_run(root / "reverse")
rev_src, rev_ref = read_parallel(digits, "digits", "reversed", "test")
rev = score_lines(rev_model, rev_bpe, rev_src, rev_ref, beam=1)
rows = list(zip(rev_src, rev_ref, rev["hypotheses"]))
wrong = [row for row in rows if row[2] != row[1]]
print(f"{'source':<14}{'reference':<14}model")
for s_, r_, h_ in rows[:5] + wrong[:2]:
    print(f"{s_:<14}{r_:<14}{h_:<14}{'ok' if h_ == r_ else 'wrong'}")
exact = 1 - len(wrong) / len(rows)
print(f"exact match: {exact:.1%} of {len(rows)} test rows; sacreBLEU {rev['bleu']:.1f}")


def edits(a: str, b: str) -> int:
    """Levenshtein distance between two rows of digits: digits dropped, added or changed."""
    d = list(range(len(b.split()) + 1))
    for i, x in enumerate(a.split(), 1):
        prev, d = d, [i] + [0] * len(b.split())
        for j, y in enumerate(b.split(), 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (x != y))
    return d[-1]


print("edits from the reference, per wrong row:", sorted(edits(h_, r_) for _, r_, h_ in wrong))
assert exact > 0.8, "the tiny model should reverse most rows exactly"

# %% [markdown]
# **What this shows.** The tiny Transformer reverses most rows it has never seen, after 200 steps that
# take seconds on a CPU. To write the $i$-th output digit, the decoder's cross-attention must find the
# $i$-th digit from the end of the source, so the model has learned to read positions, not only words.
# Its mistakes are near misses: the cell prints how many edits (a digit dropped, added or changed) each
# wrong row is from its reference, which is why sacreBLEU stays high where the exact match falls short. The same code now trains on sentences.

# %% [markdown]
# ## 5. Capstone: train a translation model and score it with sacreBLEU
#
# `train_run` builds a shared byte-level BPE on the training text, batches by token count, trains with
# the `Trainer` (Adam, warmup, label smoothing 0.1, atomic checkpoints: re-running the same run folder
# resumes it), and at the end averages the last weight snapshots.
#
# Small mode scores section 3's tiny model with label smoothing (English -> German on the built-in
# corpus: articles and adjective endings that agree, verb-final subordinate clauses, participles moved
# to the end).
# Full mode trains the `gpu` preset (transformer-base's width with 3+3 layers, an 8k vocabulary) on
# Multi30k German -> English for `FULL_MINUTES` = 5 minutes, then scores test_2016_flickr. Offline
# without a cached Multi30k, it says so and trains the `small` preset on the built-in corpus instead.
# Transformer-base on WMT14 EN-DE stays a command (the paper's 100k steps took 12 hours on 8 P100
# GPUs): from a shell, resumable, on N GPUs,
# `torchrun --nproc-per-node N -m tformer translate train --dataset wmt14 --pair en-de --preset base --out runs/base`.

# %%
FULL_MINUTES = 5
if tformer.SMALL:
    run = root / "ls0.1"
else:
    run = Path("runs") / "ch10_gpu_multi30k"
    try:
        train_run(run, "gpu", dataset="multi30k", src="de", tgt="en", time_budget=FULL_MINUTES)
    except DataUnavailableError as e:
        print("Multi30k is not available:", e, "\n-> training the small preset on the built-in corpus instead")
        run = Path("runs") / "ch10_small_offline"
        train_run(run, "small", max_steps=3000)
print(Path(run, "log.jsonl").read_text().splitlines()[-1])

# %% [markdown]
# **BLEU.** Beam search with a beam of 4 keeps the 4 most probable partial translations at each step,
# extends each by every token and keeps the best 4 of those. A finished translation $y$ of $|y|$ tokens
# scores $\log P(y \mid x) / \mathrm{lp}(y)$, with GNMT's length penalty
# $\mathrm{lp}(y) = ((5 + |y|)/6)^{\alpha}$ (`length_penalty`): $\alpha = 0$ ranks by log-probability
# alone, which favours short outputs since every token adds a negative term; the paper's $\alpha = 0.6$
# offsets part of that. Greedy and beam search (at most source + 50 tokens) both decode
# in batches and use the decoder's KV cache. sacreBLEU scores detokenized text and prints its
# signature. The paper's *tokenized* BLEU splits punctuation and German compounds ("Rechts-Staat" ->
# "Rechts ##AT##-##AT## Staat"), so it reads higher on the same output.

# %%
model, bpe_run, info = load_run(run)
split = next(name for name in ("test", "test_2016_flickr", "val")       # the built-in corpus, Multi30k
             if (Path(info["data"]) / f"{name}.{info['src']}").exists())
src, ref = read_parallel(info["data"], info["src"], info["tgt"], split)
n_eval = 100 if tformer.SMALL else len(src)
scores = {}
for beam in (1, 4):
    res = score_lines(model, bpe_run, src[:n_eval], ref[:n_eval], beam=beam)
    scores[beam] = res
    print(f"beam {beam}: sacreBLEU {res['bleu']:.1f} ({res['signature']}), tokenized BLEU "
          f"{res['tokenized_bleu']:.1f}, {n_eval} sentences in {res['seconds']:.1f} s")
if tformer.SMALL:   # the same tiny model trained without label smoothing: measured, not asserted
    plain_model, _, _ = load_run(root / "ls0.0")
    plain = score_lines(plain_model, bpe_run, src[:n_eval], ref[:n_eval], beam=1)
    print(f"greedy sacreBLEU with label smoothing {scores[1]['bleu']:.1f}, without {plain['bleu']:.1f} "
          f"({n_eval} sentences, {TINY['max_steps']} training steps: too few to settle the paper's claim)")
for s, r, h in list(zip(src, ref, scores[4]["hypotheses"]))[:4]:
    print(f"\nsource:    {s}\nreference: {r}\nmodel:     {h}")

# %% [markdown]
# In small mode the translations above come from the one-minute model: German words and articles of the
# corpus, but rarely the sentence's meaning (its sacreBLEU is printed above). Full mode's 5 minutes on a
# GPU, or the 30-minute capstone shown at the end of the chapter, give translations.
#
# **Beam search finds more probable translations.** With no length penalty ($\alpha = 0$) beam search
# ranks hypotheses by their total log-probability $\log P(y \mid x)$, the quantity greedy decoding
# approximates one token at a time. Summed over the same sentences, the beam's translations should be
# the more probable ones (asserted). Sentence by sentence it is not a theorem: a beam of 4 can prune the
# greedy path early for prefixes that end up worse, so the cell also counts the sentences where that
# happened.

# %%
n_check = 50 if tformer.SMALL else min(n_eval, 200)           # a batch the decoder holds at once
ids = [s_[: model.cfg.context_length - 2] + [bpe_run.eos_id] for s_ in bpe_run.encode(src[:n_check])]
src_ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(i) for i in ids], batch_first=True,
                                          padding_value=bpe_run.pad_id).to(next(model.parameters()).device)
kw = dict(pad_id=bpe_run.pad_id, bos_id=bpe_run.bos_id, eos_id=bpe_run.eos_id)
greedy = greedy_decode(model, src_ids, **kw)                                   # (B, L): ids, </s>, <pad>
_, beam_logp = beam_search(model, src_ids, beam=4, alpha=0.0, return_scores=True, **kw)
with torch.no_grad():                                                          # greedy's log P(y|x), teacher-forced
    tgt_in = torch.cat([torch.full_like(greedy[:, :1], bpe_run.bos_id), greedy[:, :-1]], 1)
    logp = torch.log_softmax(model(src_ids, tgt_in).float(), -1).gather(-1, greedy[..., None])[..., 0]
    greedy_logp = logp.masked_fill(greedy == bpe_run.pad_id, 0.0).sum(1)
worse = int((beam_logp < greedy_logp - 1e-3).sum())
print(f"total log-probability over {n_check} sentences: beam-4 (alpha 0) {beam_logp.sum():.2f}, "
      f"greedy {greedy_logp.sum():.2f}; sentences where the beam scored lower: {worse}")
assert beam_logp.sum() >= greedy_logp.sum()

# %% [markdown]
# **Why BLEU need not rank beam-4 above greedy here.** Beam search finds more probable translations (asserted
# above), but BLEU does not score probability: it multiplies n-gram precision by a brevity penalty for
# output shorter than the references. A model trained for a minute still has a length bias (its
# probability of `</s>` is poorly calibrated), and the beam, with length penalty $\alpha = 0.6$,
# amplifies whichever way that bias leans. The cell prints each decoding's output length against the
# references and sacreBLEU's breakdown (its `BP` and `ratio`): where beam-4 does not lead greedy, look at
# the ratio. A trained model has no such excuse: the capstone's reference, printed at the end of the
# chapter, scores beam-4 above greedy.

# %%
n_ref = sum(len(r.split()) for r in ref[:n_eval])
for beam, res in scores.items():
    n_hyp = sum(len(h.split()) for h in res["hypotheses"])
    print(f"beam {beam}: output/reference length {n_hyp / n_ref:.2f}, sacreBLEU {res['bleu']:.1f}; {res['detail']}")

# %% [markdown]
# **The capstone: the real run.** Everything above is the one-minute version (small mode: the tiny
# preset on the built-in corpus). The capstone is one command, `tformer capstone translate` (add
# `--data DIR` for a local Multi30k folder). It trains on Multi30k de->en for 30 minutes (the `small`
# preset on a CPU with bf16 matrix units; elsewhere `small-avx2`, the same model tuned for float32: no
# dropout on attention weights or FFN units, a higher learning rate, length penalty 1.0), then prints
# greedy and beam-4 sacreBLEU on test_2016_flickr and ten test translations beside
# their sources and references. It also draws the cross-attention of the first one (which source tokens
# each output token reads). Everything lands in `runs/capstone-translate/` (`result.json`, `report.md`; it resumes
# after a kill).
#
# The cell shows that run when this machine has one, else the committed reference with its command,
# machine and date. The reference ships the model's translations and attention weights, not
# Multi30k's sentences: it prints the translations alone, and its figure numbers the source tokens by
# position instead of writing them.

# %%
# Figure: The translation capstone's training loss, and one test sentence's cross-attention (output tokens down; source tokens across, numbered by position in the committed reference).
from tformer.capstones import show

translate_capstone = show("translate")

# %% [markdown]
# **What to expect.** The command is `tformer capstone translate --data DIR`: 30 minutes of training on
# any CPU, then a minute of scoring. On a CPU with bf16 matrix units (Intel AMX, AVX512-BF16) it trains
# under bf16 autocast, elsewhere in float32. BLEU follows the steps made, and the steps 30 minutes hold
# depend on the CPU more than on the precision (2 cores of a recent AMD EPYC in float32 made about as many
# as 2 cores of a Xeon with AMX in bf16), so the cell above prints the run's steps, tokens/s and precision
# beside its greedy and beam-4 sacreBLEU on test_2016_flickr.
#
# Measured elsewhere: `python benchmarks/translate_vs_peer.py --data DIR --recipe cpu-avx2` trains the
# capstone's float32 recipe and a plain `nn.Transformer` of the same size side by side, one thread each, by
# the same pipeline for the same 30 minutes. In that one run the capstone's model scored 40.50 beam-4 and
# the peer 38.74 (the README's Results, `benchmarks/RESULTS.md`).
# For scale, the paper's transformer-base scores 27.3 tokenized BLEU on WMT14 EN-DE and the big model
# 28.4: news text with a 37k vocabulary, a harder task than image captions. On one GPU, use
# `--preset gpu --time-budget 5` instead.

# %% [markdown]
# ### A published WMT model in the course's Transformer
#
# Helsinki-NLP's opus-mt models are Transformers of the paper's base shape (6+6 layers, $d = 512$) trained
# on WMT-scale data with Marian. `Transformer.from_hf_marian` loads one into `tformer.models.Transformer`.
# What differs is small: Marian writes every sine of the positional table before every cosine (the same
# table, chapter 4), scales embeddings only when its config says so, uses swish where the paper has ReLU,
# adds a bias to the logits, and starts decoding from the pad token. The cell loads a small randomly
# initialised Marian model and checks that both implementations give the same logits.

# %%
from transformers import MarianConfig, MarianMTModel

torch.manual_seed(0)
cfg = MarianConfig(vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=59,
                   decoder_start_token_id=59, eos_token_id=0, activation_function="swish", scale_embedding=True)
marian = MarianMTModel(cfg).eval()
with torch.no_grad():
    marian.final_logits_bias.normal_()                        # it starts at zero: make it count
ours = Transformer.from_hf_marian(marian)
src, tgt = torch.randint(1, 59, (2, 7)), torch.randint(1, 59, (2, 5))
tgt[:, 0] = 59                                                # decoding starts from the pad token
with torch.no_grad():
    theirs = marian(input_ids=src, decoder_input_ids=tgt).logits
    mine = ours(src, tgt)
print(f"largest logit difference: {(mine - theirs).abs().max().item():.1e}")
torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)

# %% [markdown]
# With an internet connection, the same conversion scores the published model with the course's beam
# search: `tformer translate score --hf Helsinki-NLP/opus-mt-de-en --src newstest2014.de --ref
# newstest2014.en --testset newstest2014` (the 3,003 sentences of `sacrebleu -t wmt14 -l de-en --echo src`,
# and `ref` for the references). It prints sacreBLEU beside the model card's figure (34.0). tformer's beam
# search (length penalty 0.6) is not Marian's decoder, so a score within 0.5 BLEU of the card's counts as a
# reproduction.
#
# **Why the paper's 27.3 is not a sacreBLEU figure.** The paper reports tokenized BLEU: the output and the
# references are split by the Moses tokenizer, hyphenated compounds are split too (tensor2tensor's
# `get_ende_bleu.sh`), and `multi-bleu.perl` counts n-grams over those tokens. sacreBLEU scores detokenized
# text with its own fixed tokenizer and prints a signature that says so. The same translations get different
# numbers under the two, so `tformer translate score` prints both, and only like is compared with like.

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** The paper's rate is $d_{model}^{-1/2}\,\min(s^{-1/2},\ s\,w^{-3/2})$ with $w$ warmup steps,
# and it peaks at $s = w$. What is the peak rate? Answer with a formula in `d` ($d_{model}$) and `w`, as a
# string. The cell under *1. The schedule* prints it for the base model.

# %%
answer = "(d * w)**-0.5"  ### ANSWER
check("ch10.q_peak_lr", answer)

# %% [markdown]
# **Question 2.** Section 2 trains the same 4+4-layer model at one constant rate, three ways. Which run
# stays on the plateau?
# - **A.** Post-LN with warmup.
# - **B.** Post-LN without warmup.
# - **C.** Pre-LN without warmup.
# - **D.** None: the three runs end at about the same loss; warmup only changes the first steps.
#
# The losses printed under the figure of *2. Warmup keeps a post-LN model training* show it.

# %%
answer = "B"  ### ANSWER
check("ch10.q_warmup", answer)

# %% [markdown]
# **Question 3.** With label smoothing $\epsilon = 0.1$ and a vocabulary of $V = 4$ tokens, which
# probability of the right token makes the label-smoothed loss smallest? Answer with a number. The formula
# of *3. Label smoothing* gives the target; the margin cell prints the right token's probability beside
# each loss, and the smallest loss it prints is at the probability nearest the answer.

# %%
answer = 0.925  ### ANSWER
check("ch10.q_smoothed_target", answer)

# %% [markdown]
# ## Summary
# * The paper's schedule warms up linearly, peaks at step 4000 at $(512 \cdot 4000)^{-1/2}$ = 6.99e-04 for
#   the base model, then decays as $1/\sqrt{s}$; a run with a fixed budget decays linearly to 0 instead.
# * At one constant rate, post-LN without warmup stalls on a plateau, post-LN with a warmup leaves it
#   (ahead by more than 0.2 nats, asserted), and pre-LN trains without any warmup.
# * The bare loop and the `Trainer` give the same weights bit for bit; `tformer.dropout` keeps the same
#   share of elements as `F.dropout`, and the fused head-and-loss gives the same loss and gradients.
# * Label smoothing penalises confidence itself (a margin of 30 costs 2.250 against 0.000 without it) and
#   lowers a trained model's mean top probability (asserted).
# * The pipeline learns to reverse unseen rows of digits (over 80% exact, asserted), and beam search
#   finds translations more probable in total than greedy decoding's (asserted); BLEU also weighs
#   length, so it can rank them the other way.
