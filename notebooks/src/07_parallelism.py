# %% [markdown]
# # Chapter 7: Why the Transformer trains in parallel
#
# **What this chapter covers.** A recurrent network computes $h_t = f(h_{t-1}, x_t)$: step $t$ cannot
# start before step $t-1$ has finished, so a sequence of $T$ tokens is $T$ dependent steps however many
# cores the machine has. A Transformer layer replaces the recurrent state by attention: every position
# is computed from the layer below at the same time, so a whole sequence is a handful of large matrix
# products, exactly what GPUs are built for. We
#
# 1. count the dependent steps of an LSTM and of a Transformer layer as the sequence grows;
# 2. show that a Transformer's outputs for all positions, computed at once, equal the outputs computed
#    one position at a time (nothing waits for anything);
# 3. time a training step of an LSTM language model and of a Transformer (GPT) of the same width and
#    depth as the sequence grows (`tformer.measure.timing`), on a GPU when there is one;
# 4. put the paper's training cost (41.8 BLEU on WMT14 EN-FR, 3.5 days on 8 P100) in FLOPs and GPU-days
#    and compare it with the recurrent and convolutional models of its Table 2. BLEU scores a translation
#    from 0 to 100 by the word sequences it shares with a human one; chapter 10 computes it.
#
# 5. say how today's models spread that cost over thousands of GPUs (distributed training), with
#    Tencent's Hunyuan-Large as an example.
#
# **The tformer code it uses**: `tformer/models/rnn.py: LSTMLM, lstm_reference`,
# `tformer/models/gpt.py: GPT`, `tformer/blocks.py: TransformerBlock`,
# `tformer/measure/timing.py: count_ops, step_time_vs_length, training_flops`.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in the exercise cell with your code,
# run it, then run the `check(...)` cell below it: it prints PASS, or the smallest failing input with a
# hint. Exercises: one LSTM layer written as the loop over time it is, and the paper's training cost in
# FLOPs.

# %%
import inspect

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

import tformer
from tformer.grading import check
from tformer.models import GPT, GPTConfig, LSTMConfig, LSTMLM
from tformer.models.rnn import lstm_reference
from tformer.measure.timing import count_ops, format_table, step_time_vs_length, training_flops

tformer.seed_everything(0)
device = tformer.device()
print("small mode:", tformer.SMALL, "| device:", device)

# %% [markdown]
# ## 1. An RNN is a chain of $T$ dependent steps
#
# `lstm_reference` writes the LSTM equations out, one loop iteration per time step, with the weights
# of an `nn.LSTM`. First we check that it *is* the LSTM, then we count the matrix products each model
# runs (`tformer.measure.timing.count_ops` runs a function under `torch.profiler` and counts them) and how many
# of them must wait for the previous one.

# %%
lstm = nn.LSTM(32, 32, num_layers=2, batch_first=True)
x = torch.randn(4, 20, 32)
with torch.no_grad():
    torch.testing.assert_close(lstm_reference(lstm, x), lstm(x)[0], rtol=1e-5, atol=1e-6)
print("lstm_reference (a Python loop over time) == nn.LSTM")

layer = tformer.TransformerBlock(tformer.BlockConfig(d_model=32, n_heads=4, d_ff=128, dropout=0.0,
                                                     norm_first=True)).eval()


rows, lstm_col = [], "LSTM matmuls (each recurrent one waits for the last)"
for t in (8, 16, 32, 64):
    xt = torch.randn(2, t, 32)
    with torch.no_grad():
        rows.append({"T": t, lstm_col: count_ops(lambda: lstm_reference(lstm, xt)),
                     "Transformer layer matmuls (all positions at once)": count_ops(lambda: layer(xt, is_causal=True))})
print(format_table(rows))
assert rows[-1][lstm_col] > rows[0][lstm_col] * 7
assert len({r["Transformer layer matmuls (all positions at once)"] for r in rows}) == 1

# %% [markdown]
# The LSTM's count grows with $T$: two layers times $T$ recurrent steps of $h_{t-1} W_{hh}$, each needing
# the one before. The other two products, one per layer, are the input products $x_t W_{ih}$: they *can*
# be batched over time, and `lstm_reference` runs each as one product for all $T$ steps; the recurrence
# cannot be batched. The Transformer layer runs the same few products for any $T$; only their size
# grows, and a GPU spreads a larger product over more cores.
#
# ## 2. All positions at once equals one position at a time
#
# With a causal mask, position $t$ of a Transformer layer depends only on positions $\le t$ *of the
# layer below*, never on the same layer's output at $t-1$. So we may compute position $t$ alone from
# the prefix, for each $t$, and get the same numbers as the single parallel pass:

# %%
xt = torch.randn(2, 12, 32)
with torch.no_grad():
    parallel = layer(xt, is_causal=True)                                           # one pass, all positions
    one_by_one = torch.stack([layer(xt[:, :t + 1], is_causal=True)[:, -1] for t in range(12)], dim=1)
torch.testing.assert_close(parallel, one_by_one, rtol=1e-5, atol=1e-5)
print("Transformer layer: all 12 positions in one pass == each position computed on its own")

# %% [markdown]
# An LSTM cannot be cut that way: $h_t$ needs $h_{t-1}$ of the *same* layer. Training with teacher
# forcing therefore processes a whole target sentence in one parallel pass in a Transformer, but in
# $T$ steps in an RNN.
#
# ## Exercise 1: one LSTM layer, step by step
# Write the layer whose matrix products section 1 counted. Given `x (B, T, d_in)` and the weights of one
# `nn.LSTM` layer, `w_ih (4H, d_in)`, `w_hh (4H, H)`, `b_ih (4H,)`, `b_hh (4H,)` (rows stacked in
# PyTorch's gate order $i, f, g, o$), start from $h_0 = c_0 = 0$ and return $h_1 \dots h_T$ as
# `(B, T, H)`:
#
# $$i, f, g, o = \mathrm{split}(W_{ih} x_t + b_{ih} + W_{hh} h_{t-1} + b_{hh}),\quad
# c_t = \sigma(f) \odot c_{t-1} + \sigma(i) \odot \tanh(g),\quad h_t = \sigma(o) \odot \tanh(c_t).$$
#
# The products $W_{ih} x_t$ may be done for all $t$ at once; the loop over $t$ may not (try it: the
# checker names that mistake). `nn.LSTM`, `torch.lstm` and `lstm_reference` are off limits.

# %%
def my_lstm_layer(x, w_ih, w_hh, b_ih, b_hh):
    ### BEGIN SOLUTION
    h = x.new_zeros(x.shape[0], w_hh.shape[1])
    c = torch.zeros_like(h)
    xw = x @ w_ih.T + b_ih + b_hh                         # every step's input product at once
    outs = []
    for t in range(x.shape[1]):                           # the recurrence: one step after another
        i, f, g, o = (xw[:, t] + h @ w_hh.T).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs, dim=1)
    ### END SOLUTION


# %%
check("ch07.lstm_layer", my_lstm_layer)

# %% [markdown]
#
# ## 3. Time per training step vs sequence length
#
# Two language models of the same width and depth: an `LSTMLM` and a GPT (pre-LN Transformer decoder;
# it has the more parameters, printed below), trained on random tokens (the content does not matter for
# the time). `step_time_vs_length` times forward + loss + backward + AdamW update, the median of a few
# steps after a warm-up, synchronizing the GPU when there is one. On a shared CPU the numbers are noisy: compare within one run.

# %%
if tformer.SMALL:
    d, n_layers, batch, lengths, vocab = 64, 2, 8, [32, 64, 128, 256], 256
else:
    d, n_layers, batch, lengths, vocab = 512, 4, 16, [64, 128, 256, 512, 1024, 2048], 8192

models = {
    "LSTM": lambda: LSTMLM(LSTMConfig(vocab_size=vocab, d_model=d, n_layers=n_layers)),
    "Transformer": lambda: GPT(GPTConfig(vocab_size=vocab, context_length=max(lengths), n_layers=n_layers,
                                         n_heads=max(1, d // 64) if d >= 64 else 1, d_model=d)),
}
n_params_of = {name: sum(p.numel() for p in make().parameters()) for name, make in models.items()}
for name, count in n_params_of.items():
    print(f"{name}: {count:,} parameters")
assert n_params_of["Transformer"] > n_params_of["LSTM"]
# threads, set explicitly: every core in full mode; one in small mode, where two threads on tiny models
# thrash as soon as another program shares the cores (a busy laptop), and the chapter must stay quick
n_threads = tformer.utils.runtime.SMALL_THREADS if tformer.SMALL else tformer.utils.runtime.ALL_THREADS
with tformer.utils.runtime.threads(n_threads):
    timings = step_time_vs_length(models, lengths, batch, vocab, device=device, warmup=1,
                                  repeat=2 if tformer.SMALL else 5, progress=not tformer.SMALL)   # a bar in full mode only
print(format_table([{"model": r.name, "T": r.seq_len, "ms / step": 1e3 * r.seconds, "tokens/s": r.tokens_per_s}
                    for r in timings]))

# %%
# Figure: Training-step time and tokens per second against sequence length, LSTM and Transformer.
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
for name in models:
    rs = [r for r in timings if r.name == name]
    axes[0].plot([r.seq_len for r in rs], [1e3 * r.seconds for r in rs], "o-", label=name)
    axes[1].plot([r.seq_len for r in rs], [r.tokens_per_s for r in rs], "o-", label=name)
for ax, ylabel in zip(axes, ["ms per training step", "tokens per second"]):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
axes[0].set_yscale("log")
fig.suptitle(f"Training step, batch {batch}, on {device.type.upper()}")
fig.tight_layout()
plt.show()
ratio = {r.seq_len: r.seconds for r in timings if r.name == "LSTM"}
for r in timings:
    if r.name == "Transformer":
        print(f"T={r.seq_len:5d}: LSTM step / Transformer step = {ratio[r.seq_len] / r.seconds:.1f}x")

# %% [markdown]
# What the CPU shows, and why. Read the ratios above: below 1, the LSTM's step is the shorter one. On a
# CPU the Transformer has almost no parallel hardware to fill: small mode runs tiny models (about 0.1 M
# parameters) on one thread, and full mode has only the machine's few cores. What counts there is the
# arithmetic per token, and the Transformer does more of it: it has more parameters than the LSTM of
# the same width (printed above), and attention's work per token grows with $T$. `nn.LSTM` runs its
# $T$ dependent steps in a compiled C++ loop whose per-step cost is small at these sizes.
#
# Parallelism pays where there are thousands of cores to fill: a GPU runs the Transformer's step as a
# few large matrix products that grow with $T$, while each of the LSTM's $T$ dependent steps stays
# small and leaves most of the chip idle. This notebook in full mode measures that difference on a GPU,
# and so does `python benchmarks/gpu_check.py --only rnn-vs-transformer`.
#
# ## 4. The paper's training cost, in FLOPs and GPU-days
#
# The paper (Vaswani et al., 2017, Table 2) estimates training cost as
# *training time x number of GPUs x sustained single-precision FLOP/s per GPU*, with 9.5 TFLOP/s for
# a P100. The big model reached **41.8 BLEU on WMT14 EN-FR after 3.5 days on 8 P100 GPUs**; the base
# model trains in 12 hours.
#
# ## Exercise 2: the paper's training cost in FLOPs
# Return the cost of a run of `days` days on `n_gpus` GPUs that each sustain `flops_per_gpu` FLOP/s,
# as a float. The checker compares it by relative error (0.1%).

# %%
def my_training_flops(days, n_gpus, flops_per_gpu):
    ### BEGIN SOLUTION
    return days * 24 * 3600 * n_gpus * flops_per_gpu
    ### END SOLUTION


# %%
check("ch07.training_flops", my_training_flops)

# %% [markdown]
# The paper's two models, with the package's version of the same function (shown at the end of the
# chapter):

# %%
P100 = 9.5e12                                          # FLOP/s, the paper's figure for a P100
big, base = training_flops(3.5, 8, P100), training_flops(0.5, 8, P100)
print(f"Transformer (big):  3.5 days x 8 P100 = {3.5 * 8:.0f} GPU-days = {big:.2e} FLOPs   (paper: 2.3e19)")
print(f"Transformer (base): 0.5 days x 8 P100 = {0.5 * 8:.0f} GPU-days = {base:.2e} FLOPs   (paper: 3.3e18)")
assert abs(big / 2.3e19 - 1) < 0.05 and abs(base / 3.3e18 - 1) < 0.05

# Table 2 of the paper: BLEU and training cost (FLOPs) on newstest2014.
table2 = [  # model, EN-DE BLEU, EN-FR BLEU, EN-DE cost, EN-FR cost
    ("Deep-Att + PosUnk", None, 39.2, None, 1.0e20),
    ("GNMT + RL", 24.6, 39.92, 2.3e19, 1.4e20),
    ("ConvS2S", 25.16, 40.46, 9.6e18, 1.5e20),
    ("MoE", 26.03, 40.56, 2.0e19, 1.2e20),
    ("Deep-Att + PosUnk Ensemble", None, 40.4, None, 8.0e20),
    ("GNMT + RL Ensemble", 26.30, 41.16, 1.8e20, 1.1e21),
    ("ConvS2S Ensemble", 26.36, 41.29, 7.7e19, 1.2e21),
    ("Transformer (base)", 27.3, 38.1, 3.3e18, 3.3e18),
    ("Transformer (big)", 28.4, 41.8, 2.3e19, 2.3e19),
]
print(format_table([{"model": m, "BLEU EN-FR": str(fr),
                     "cost EN-FR (FLOPs)": f"{cf:.1e}", "x Transformer big": f"{cf / big:.1f}"}
                    for m, _, fr, _, cf in table2]))

# %% [markdown]
# The big Transformer scores above every model of Table 2 on EN-FR, the ensembles included (41.8 BLEU
# against at most 41.29), and every earlier model in it cost more to train. How much more, measured on
# the table:

# %%
singles = [cf / big for m, _, fr, _, cf in table2 if "Ensemble" not in m and "Transformer" not in m]
ensembles = [cf / big for m, _, fr, _, cf in table2 if "Ensemble" in m]
print(f"single models: {min(singles):.1f}x to {max(singles):.1f}x the big Transformer's EN-FR cost; "
      f"ensembles: {min(ensembles):.0f}x to {max(ensembles):.0f}x")
assert 4.3 <= min(singles) and max(singles) <= 6.6 and 34 <= min(ensembles) and max(ensembles) <= 53
assert all(fr < 41.8 for m, _, fr, _, _ in table2 if "Transformer" not in m)

# %% [markdown]
# The earlier single models cost 4.4 to 6.5 times the big Transformer's compute and the three ensembles
# 35 to 52 times (the ranges printed above), and all of them score lower.
#
# A second estimate from the model itself: a training step costs about $6N$ FLOPs per token ($2N$ forward, $4N$ backward) for $N$
# parameters. The big model has about 213 M parameters and trained 300k steps on batches of about
# 25k source + 25k target tokens:

# %%
n_params, steps, tokens_per_step = 213e6, 300e3, 25e3
six_nd = 6 * n_params * steps * tokens_per_step
print(f"6 N D = 6 x {n_params:.3g} x {steps * tokens_per_step:.3g} tokens = {six_nd:.2e} FLOPs "
      f"= {six_nd / big:.0%} of the GPU-time estimate (a factor of {big / six_nd:.1f})")

# Our own model from section 3, measured: FLOPs per step / time per step = achieved FLOP/s.
gpt = models["Transformer"]()
n = sum(p.numel() for p in gpt.parameters())
last = [r for r in timings if r.name == "Transformer"][-1]
achieved = 6 * n * batch * last.seq_len / last.seconds
print(f"our Transformer ({n / 1e6:.2f} M params) at T={last.seq_len}: about {achieved / 1e9:.1f} GFLOP/s "
      f"on this {device.type.upper()} (6 N per token, attention not counted)")

# %% [markdown]
# The two estimates agree within a factor of about 2.4 (printed above): the GPU-time figure assumes the
# chip runs at its full sustained rate, while $6ND$ counts only the useful arithmetic, so their ratio
# (about 40%) is the utilisation the paper's code reached. That ratio, the model's own FLOPs per second of
# training over the chip's peak FLOP/s, is called MFU (model FLOPs utilisation); chapter 13 measures it for our
# own models on a GPU.
#
# ## 5. Distributed training: from 8 GPUs to thousands
#
# The paper's 8 P100s ran **data parallelism**: every GPU holds a full copy of the model, takes its own
# share of each batch, and the gradients are averaged across GPUs (an all-reduce) before each update.
# `tformer translate train` does the same under `torchrun --nproc-per-node N` (PyTorch's
# `DistributedDataParallel`, `tformer/training/trainer.py`). When a model no longer fits on one GPU, the other
# axes join in:
# - **ZeRO / FSDP** (the Zero Redundancy Optimizer, Rajbhandari et al., 2020; PyTorch's Fully Sharded Data
#   Parallel) shards the optimizer state, gradients and weights across the data-parallel GPUs, so that no
#   GPU holds a full copy of them;
# - **tensor parallelism** splits each matrix product of a layer across GPUs (Megatron-LM, Shoeybi et
#   al., 2019);
# - **pipeline parallelism** puts consecutive layers on different GPUs and streams micro-batches through
#   them (GPipe, Huang et al., 2019);
# - **expert parallelism** puts a mixture-of-experts layer's experts on different GPUs (GShard, Lepikhin
#   et al., 2020; chapter 13);
# - **context parallelism** splits one long sequence (chapter 8).
#
# All of them
# rest on what sections 1-2 showed: a Transformer layer is a few large matrix products over all
# positions at once, so the work can be cut up along the batch, the model width, the depth or the
# sequence.
#
# A recent example is Tencent's **Hunyuan-Large** (Tencent Hunyuan team, 2024, "Hunyuan-Large: An
# Open-Source MoE Model with 52 Billion Activated Parameters by Tencent", arXiv:2411.02265): a
# mixture-of-experts Transformer with **389 B parameters, 52 B active per token**, a context of up to
# 256K tokens, pre-trained on 7 T tokens (the report's figures). With $6ND$ counted on the *active*
# parameters (chapter 13 explains why only those do arithmetic):

# %%
hunyuan_active, hunyuan_tokens = 52e9, 7e12
hunyuan = 6 * hunyuan_active * hunyuan_tokens
print(f"Hunyuan-Large: 6 x 52e9 x 7e12 = {hunyuan:.1e} FLOPs = {hunyuan / big:,.0f} x the big Transformer "
      f"= {hunyuan / training_flops(1, 1, P100):,.0f} P100-days")
assert 5e4 < hunyuan / big < 2e5

# %% [markdown]
# About a hundred thousand times the paper's biggest run: possible only because every axis above can
# be parallelised. The package's versions of what you wrote in the exercises: the LSTM loop (for every
# layer of an `nn.LSTM`; section 1 checked it against PyTorch's kernel) and the cost.

# %%
print(inspect.getsource(lstm_reference))
print(inspect.getsource(training_flops))

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** Section 1 counts the matrix products of the 2-layer `lstm_reference` at $T$ = 8, 16, 32
# and 64. Write the count for any $T$ as a formula in `T`, in a string. The table printed in section 1
# holds the counts.

# %%
answer = "2*T + 2"  ### ANSWER
check("ch07.q_lstm_matmuls", answer)

# %% [markdown]
# **Question 2.** In a Transformer layer with a causal mask, what does the output at position $t$ need?
# - **A.** The outputs of the layer below at every position, the later ones included.
# - **B.** The same layer's output at position $t-1$.
# - **C.** The outputs of the layer below at positions up to $t$.
#
# The cell under *2. All positions at once equals one position at a time* computes it both ways.

# %%
answer = "C"  ### ANSWER
check("ch07.q_causal_parallel", answer)

# %% [markdown]
# **Question 3.** Hunyuan-Large has 389 B parameters, 52 B of them active per token, and was pre-trained on
# 7 T tokens. With $6ND$, how many times the big Transformer's training compute (3.5 days on 8 P100 at
# 9.5 TFLOP/s each) is its pre-training? Answer with a number, within 1%. The last cell of section 5
# computes it.

# %%
answer = 6 * 52e9 * 7e12 / (3.5 * 24 * 3600 * 8 * 9.5e12)  ### ANSWER
check("ch07.q_hunyuan", answer)

# %% [markdown]
# ## Summary
# * An LSTM is a chain: two layers ran 18 matrix products at $T = 8$ and 130 at $T = 64$; all but the two
#   input products (one per layer, for all steps at once) are recurrent, each waiting for the one before;
#   a Transformer layer ran the same 5 for every $T$.
# * With a causal mask, a Transformer layer's outputs for all positions in one pass equal each position
#   computed on its own; an LSTM's $h_t$ needs $h_{t-1}$ of the same layer.
# * On a CPU, with little parallel hardware to fill, the Transformer's extra arithmetic per token shows in
#   the timed ratios; parallelism pays where there are thousands of cores to fill, which full mode
#   measures on a GPU.
# * The paper's big model: 3.5 days on 8 P100 = 2.3e19 FLOPs; Table 2's earlier single models cost 4.4 to
#   6.5 times as much and its ensembles 35 to 52 times, and all score lower. $6ND$ gives 42% of that
#   figure, the utilisation the paper's code reached.
# * Hunyuan-Large's pre-training, $6 \times$ 52e9 active parameters $\times$ 7e12 tokens = 2.2e24 FLOPs, is
#   about 95,000 times the big Transformer's.
