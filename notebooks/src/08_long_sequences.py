# %% [markdown]
# # Chapter 8: Long sequences
#
# **What this chapter covers.** Self-attention scores every query against every key: for $n$ tokens
# that is an $n \times n$ matrix, so time and memory grow as $n^2$. We
#
# 1. measure attention's time and peak memory as $n$ grows and fit the exponent (it is 2);
# 2. do the same for the three ways around it: a **sliding window** (each token sees its $w$
#    neighbours: $O(nw)$), **sparse** patterns (chapter 9) and **linear** attention (a kernel
#    approximation: $O(n)$);
# 3. stretch a model past the length it was trained on with **RoPE scaling**: position interpolation,
#    NTK-aware scaling (named after the neural tangent kernel, the theory its author reasoned from) and
#    YaRN, and plot the loss against the evaluation length.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in an exercise cell with your code,
# run it, then run the `check(...)` cell below it: it prints PASS, or the smallest failing input with a
# hint. Exercises here: a sliding-window mask, and NTK-scaled RoPE frequencies.
#
# **The tformer code it uses**: `tformer/measure/timing.py: time_fn, peak_memory, training_step`,
# `tformer/training/metrics.py: fit_power_law`,
# `tformer/sparse.py: sliding_window_attention`, `tformer/masks.py: sliding_window_mask`,
# `tformer/efficient.py: performer_attention, orthogonal_gaussian`,
# `tformer/positional.py: rope_frequencies, RotaryEmbedding`, `tformer/data/text.py: offline_text, LMBatches`,
# `tformer/models/gpt.py: GPT`.

# %%
import inspect
import math

import matplotlib.pyplot as plt
import torch
from tqdm import tqdm

import tformer
from tformer.efficient import orthogonal_gaussian, performer_attention
from tformer.grading import check
from tformer.training.losses import causal_lm_loss
from tformer.data.text import DataUnavailableError, LMBatches, hf_text, offline_text, split_stream
from tformer.models import GPT, GPTConfig
from tformer.positional import RotaryEmbedding, rope_frequencies, rotate_half
from tformer.sparse import sliding_window_attention
from tformer.training.metrics import fit_power_law
from tformer.measure.timing import format_table, peak_memory, time_fn, training_step
from tformer.utils.device import amp_dtype

tformer.seed_everything(0)
device = tformer.device()
print("small mode:", tformer.SMALL, "| device:", device)

# %% [markdown]
# ## 1. Attention costs $n^2$: measure it
#
# Explicit attention, $\mathrm{softmax}(QK^\top/\sqrt d)V$ (`tformer.scaled_dot_product_attention`),
# materialises the $n \times n$ weights. We time it and measure its peak memory
# (`tformer.measure.timing.peak_memory`: on a GPU `torch.cuda.max_memory_allocated`, on a CPU the allocation
# events of PyTorch's allocator recorded by `torch.profiler`), then fit $y = c\,n^p$ in log-log space.

# %%
H, d = 2, 64
ns = [128, 256, 512, 1024] if tformer.SMALL else [512, 1024, 2048, 4096, 8192]
window, n_features = 64, 64                          # sliding window size, Performer random features
w_feat = orthogonal_gaussian(n_features, d, torch.Generator().manual_seed(0)).to(device)

methods = {
    "explicit": lambda q, k, v: tformer.scaled_dot_product_attention(q, k, v)[0],
    "sliding window": lambda q, k, v: sliding_window_attention(q, k, v, window, causal=False),
    "linear (Performer)": lambda q, k, v: performer_attention(q, k, v, w_feat),
}
results = {name: {"ms": [], "MiB": []} for name in methods}
for n in ns:
    q, k, v = torch.randn(3, 1, H, n, d, device=device)
    for name, fn in methods.items():
        with torch.no_grad():
            results[name]["ms"].append(1e3 * time_fn(lambda: fn(q, k, v), warmup=1, repeat=3, device=device))
            results[name]["MiB"].append(peak_memory(lambda: fn(q, k, v), device) / 2 ** 20)

# %% [markdown]
# Fit the exponent $p$ of each curve, $y = c\,n^p$, with `fit_power_law` (chapter 15's least-squares line in
# log-log space; it fits $a\,n^{-\alpha}$, the falling form of a scaling law, so here $p = -\alpha$):

# %%
rows = []
for name, r in results.items():
    p_time = -float(fit_power_law(ns, r["ms"])[1])               # y = a n^-alpha, so p = -alpha
    p_mem = -float(fit_power_law(ns, r["MiB"])[1])
    r["p_time"], r["p_mem"] = p_time, p_mem
    rows.append({"method": name, **{f"MiB n={n}": m for n, m in zip(ns, r["MiB"])},
                 "memory ~ n^p, p =": p_mem, "time ~ n^p, p =": p_time})
print(format_table(rows))
assert 1.8 < results["explicit"]["p_mem"] < 2.2, "explicit attention's memory should grow as n^2"
assert results["sliding window"]["p_mem"] < 1.3 and results["linear (Performer)"]["p_mem"] < 1.3

# %%
# Figure: Attention time (left) and peak memory (right) against sequence length n, with an n^2 reference line.
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
for name, r in results.items():
    axes[0].plot(ns, r["ms"], "o-", label=name)
    axes[1].plot(ns, r["MiB"], "o-", label=name)
ref = [results["explicit"]["MiB"][0] * (n / ns[0]) ** 2 for n in ns]
axes[1].plot(ns, ref, "k--", lw=1, label="$\\propto n^2$")
for ax, ylabel in zip(axes, ["time (ms)", "peak memory (MiB)"]):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle(f"Attention, 1 x {H} heads x d={d}, on {device.type.upper()}")
fig.tight_layout()
plt.show()

# %% [markdown]
# Memory is the clean measurement: explicit attention's exponent is 2 (doubling $n$ quadruples the
# weights matrix), the sliding window's and the linear method's are about 1. Time exponents are noisier
# (fixed overheads dominate at small $n$, and a shared CPU adds noise) but show the same order. The
# benchmark `benchmarks/bench_long_attention.py` runs the same comparison up to $n = 8192$ with
# PyTorch's fused kernel and tiled attention (chapter 9) as well.
#
# **The routes around $n^2$.**
# * *Sliding window*: token $i$ attends to keys $j$ with $|i - j| < w$. Cost $O(nw)$, and stacking
#   $L$ layers still gives a receptive field of $L w$ tokens (Longformer, Mistral).
# * *Sparse patterns*: a fixed set of pairs, e.g. local + strided, $O(n\sqrt n)$ (chapter 9).
# * *Linear attention*: replace $\exp(q \cdot k)$ by $\phi(q) \cdot \phi(k)$ and reorder the product,
#   $\phi(Q)(\phi(K)^\top V)$: $O(n)$, approximate (Performer; Linformer projects $K, V$ to $k$ rows).
#
# `tformer.sparse.sliding_window_attention` computes the window without the $n \times n$ matrix: it cuts
# the queries into blocks of $w$, and block $b$ only needs keys from blocks $b-1, b, b+1$.
# The mask it implements is the exercise.
#
# ## Exercise: sliding-window mask
# Return a bool `(T, T)` mask, True = may attend: query `i` sees key `j` when $|i - j| <$ `window`; with
# `causal=True` only keys $j \le i$. No Python loops.

# %%
def my_sliding_window_mask(t, window, causal=True):
    ### BEGIN SOLUTION
    i = torch.arange(t).unsqueeze(1)
    j = torch.arange(t).unsqueeze(0)
    mask = (i - j).abs() < window
    return mask & (j <= i) if causal else mask
    ### END SOLUTION


# %%
check("ch08.sliding_window_mask", my_sliding_window_mask)

# %% [markdown]
# The banded kernel equals dense attention restricted by this mask:

# %%
qs, ks, vs = torch.randn(3, 1, 2, 50, 16, dtype=torch.float64)
dense, _ = tformer.scaled_dot_product_attention(qs, ks, vs, tformer.sliding_window_mask(50, 8))
torch.testing.assert_close(sliding_window_attention(qs, ks, vs, 8, causal=True), dense)
print("banded sliding-window kernel == dense attention with the sliding-window mask")

# %% [markdown]
# ## 2. Past the training length: RoPE scaling
#
# RoPE (chapter 4) rotates each pair of query/key features $i$ by the angle $m\,\theta_i$ at position
# $m$, $\theta_i = b^{-2i/d}$. A model trained on $L$ tokens has only seen angles up to $L\,\theta_i$;
# the slow pairs (small $\theta_i$) never completed a turn. Beyond $L$ they show angles the model never
# saw. Three fixes that need no retraining, for a target length $sL$:
#
# * **Position interpolation** (Chen et al., 2023): $\theta_i / s$ for every pair: positions are
#   squeezed back into the trained range, but neighbouring tokens become harder to tell apart.
# * **NTK-aware** scaling (bloc97, 2023): raise the base, $b' = b \cdot s^{d/(d-2)}$: fast pairs
#   (local order) barely change, the slowest is interpolated by exactly $s$.
# * **YaRN** (Peng et al., 2023): interpolate only pairs whose wavelength is long compared with $L$
#   and keep the fast ones: a pair that turns fewer than $\beta_{slow} = 1$ times within $L$ is
#   divided by $s$, one that turns more than $\beta_{fast} = 32$ times is kept, and the pairs in
#   between follow a linear ramp over the pair index. Then multiply both $\cos$ and $\sin$ by
#   $0.1 \ln s + 1$. Queries and keys are both rotated with them, so the logits $q \cdot k$ scale by the
#   *square*, $(0.1 \ln s + 1)^2$: a slightly sharper softmax over the longer context.
#
# `tformer.positional.rope_frequencies` implements all three; the tests check them against Hugging
# Face's own `transformers.modeling_rope_utils`. The frequencies for $d = 64$, $L = 2048$, $s = 8$:

# %%
# Figure: Each scaling's RoPE frequencies relative to plain RoPE, feature pair by feature pair.
hd, base, L0, s = 64, 10000.0, 2048, 8.0
freqs = {"RoPE": rope_frequencies(hd, base)[0]}
freqs["position interpolation"] = rope_frequencies(hd, base, "linear", s)[0]
freqs["NTK-aware"] = rope_frequencies(hd, base, "ntk", s)[0]
freqs["YaRN"] = rope_frequencies(hd, base, "yarn", s, L0)[0]
fig, ax = plt.subplots(figsize=(6, 3.4))
for name, f in freqs.items():
    ax.plot(f / freqs["RoPE"], "o-", ms=3, label=name)
ax.set_xlabel("feature pair i (fast -> slow)")
ax.set_ylabel("theta_i / RoPE theta_i")
ax.set_title(f"Scaled RoPE frequencies, d={hd}, factor {s:g}")
ax.legend()
ax.grid(alpha=0.3)
plt.show()
ratio = freqs["NTK-aware"] / freqs["RoPE"]
print(f"NTK: fastest pair x{ratio[0]:.3f}, slowest pair x{ratio[-1]:.4f} (= 1/{1 / ratio[-1]:.1f})")

# %% [markdown]
# YaRN's logit scale, checked: rotate a query and a key with `RotaryEmbedding(scaling="yarn")` and with
# the same frequencies at scale 1; their dot products differ by exactly $(0.1 \ln s + 1)^2$.

# %%
yarn = RotaryEmbedding(hd, 64, base, "yarn", s, original_max_len=L0)
ang = torch.outer(torch.arange(64.0), yarn.inv_freq).repeat(1, 2)       # (T, hd): YaRN's angles


def rotate_unscaled(x):                                       # RoPE with those angles, cos and sin not scaled
    return x * ang.cos() + rotate_half(x) * ang.sin()


qy, ky = torch.randn(2, 1, 1, 64, hd)
logits_yarn = (yarn(qy) * yarn(ky)).sum(-1)
logits_plain = (rotate_unscaled(qy) * rotate_unscaled(ky)).sum(-1)
m_scale = 0.1 * math.log(s) + 1
torch.testing.assert_close(logits_yarn, logits_plain * m_scale ** 2)
print(f"YaRN logits = {m_scale ** 2:.4f} x the unscaled ones = (0.1 ln {s:g} + 1)^2")

# %% [markdown]
# ## Exercise: NTK-aware RoPE frequencies
# Return the `(head_dim // 2,)` float32 frequencies $\theta_i = b'^{-2i/d}$ with the NTK-aware base
# $b' = b \cdot \mathrm{factor}^{d/(d-2)}$.

# %%
def my_ntk_frequencies(head_dim, base, factor):
    ### BEGIN SOLUTION
    new_base = base * factor ** (head_dim / (head_dim - 2))
    i = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (new_base ** (-i)).float()
    ### END SOLUTION


# %%
check("ch08.ntk_rope", my_ntk_frequencies)

# %% [markdown]
# The package's version, which the rest of the chapter uses: all three scalings in one function.

# %%
print(inspect.getsource(rope_frequencies))

# %% [markdown]
# ## 3. Train short, evaluate long
#
# A small GPT with RoPE learns next-byte prediction at length $L$. We then evaluate it on longer
# sequences ($2L$ ... $8L$) with plain RoPE and with each scaling (factor $s$ = length / $L$), and
# report the loss on the **last $L$ tokens** of each sequence: the positions the model never saw in
# training. In small mode the text is Python's bundled documentation (offline); in full mode WikiText-2
# through `datasets` (cached after the first download). Losses are in nats per byte: cross-entropy
# with the natural log, so a uniform guess over the 256 bytes costs $\ln 256 \approx 5.5$ nats.

# %%
try:
    text = offline_text() if tformer.SMALL else hf_text("wikitext2")
except DataUnavailableError as e:                               # full mode without the network
    print(e, "\nUsing Python's bundled documentation instead.")
    text = offline_text()
data = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)   # bytes: a vocabulary of 256
train_data, val_data = split_stream(data, 0.9)
print(f"{len(data):,} bytes of text")

if tformer.SMALL:
    L, steps, batch_size, d_model, n_layers, n_heads, evals = 32, 150, 16, 64, 2, 4, 32
else:
    L, steps, batch_size, d_model, n_layers, n_heads, evals = 256, 3000, 32, 384, 6, 6, 32
SEEDS = (0, 1, 2)                                               # three models: average out the luck of one

# %% [markdown]
# One seed's model: `LMBatches` draws random windows of $L + 1$ bytes (inputs and next-byte targets).
# Each step is `tformer.measure.timing.training_step`: forward and loss, backward, AdamW. On a CPU that
# is the plain float32 step; on a CUDA GPU it runs under the device policy's autocast (bf16 on sm80+; fp16
# with a gradient scaler on a T4).

# %%
def train_model(seed: int) -> GPT:
    tformer.seed_everything(seed)
    model = GPT(GPTConfig(vocab_size=256, context_length=L, n_layers=n_layers, n_heads=n_heads, d_model=d_model,
                          positional="rope")).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3 if tformer.SMALL else 1e-3)
    step = training_step(lambda x, y: causal_lm_loss(model(x), targets=y), opt, device, amp_dtype(device))
    for x, y in tqdm(LMBatches(train_data, batch_size, L, steps, seed=seed), desc=f"seed {seed}, L={L}"):
        loss = step(x.to(device), y.to(device))
    print(f"seed {seed}: final training loss {loss.item():.3f} (nats per byte)")
    return model.eval()

# %% [markdown]
# Evaluation: for each length, the same `evals` validation windows for every scheme and model; the loss on
# the last $L$ tokens, with each RoPE scaling at factor $s$ = length / $L$.

# %%
lengths = [L * m for m in (1, 2, 4, 8)]
schemes = [None, "linear", "ntk", "yarn"]
label = {None: "RoPE (no scaling)", "linear": "position interpolation", "ntk": "NTK-aware", "yarn": "YaRN"}
eval_batches = {t: next(iter(LMBatches(val_data, evals, t, 1, seed=100))) for t in lengths}


def tail_losses(model: GPT) -> dict:
    out, trained_rope = {sch: [] for sch in schemes}, model.rope
    for t, (x, y) in eval_batches.items():
        for sch in schemes:
            factor = t / L
            model.rope = RotaryEmbedding(model.cfg.head_dim, t, model.cfg.rope_base, sch if factor > 1 else None,
                                         factor, original_max_len=L).to(device)
            with torch.no_grad():
                logits = model(x.to(device))
            out[sch].append(causal_lm_loss(logits[:, -L:], targets=y[:, -L:].to(device)).item())
    model.rope = trained_rope
    return out

# %% [markdown]
# Train the three models and average their losses:

# %%
per_seed = [tail_losses(train_model(seed)) for seed in SEEDS]
losses = {sch: [sum(r[sch][i] for r in per_seed) / len(SEEDS) for i in range(len(lengths))] for sch in schemes}
print(format_table([{"scaling": label[sch], **{f"T={t}": v for t, v in zip(lengths, losses[sch])}}
                    for sch in schemes], floatfmt=".3f"))

# %%
# Figure: Loss on the last L tokens against evaluation length for each RoPE scaling, mean of the models.
fig, ax = plt.subplots(figsize=(6, 3.6))
for sch in schemes:
    ax.plot(lengths, losses[sch], "o-", label=label[sch])
ax.axvline(L, color="gray", ls=":", lw=1)
ax.set_xscale("log", base=2)
ax.set_xlabel("evaluation length (trained at L = %d)" % L)
ax.set_ylabel(f"loss on the last L tokens (mean of {len(SEEDS)} models)")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
plt.show()
gain = {sch: [losses[None][i] - losses[sch][i] for i in range(1, len(lengths))] for sch in schemes[1:]}
print("loss below plain RoPE's (nats per byte; + = better):")
print(format_table([{"scaling": label[sch], **{f"{t // L}x (T={t})": g for t, g in zip(lengths[1:], gain[sch])}}
                    for sch in schemes[1:]], floatfmt="+.3f"))
largest = max(max(g) for g in gain.values())
print(f"largest gain {largest:.3f} against plain RoPE's {min(losses[None][1:]):.2f}-{max(losses[None][1:]):.2f}; "
      f"YaRN's gain at {lengths[-1] // L}x, model by model: "
      + ", ".join(f"{r[None][-1] - r['yarn'][-1]:+.3f}" for r in per_seed))

# %% [markdown]
# The claim, on these averages: past the training length YaRN's loss is below plain RoPE's at every
# factor, and NTK's at the longest.

# %%
assert all(losses["yarn"][i] < losses[None][i] for i in range(1, len(lengths)))
assert losses["ntk"][-1] < losses[None][-1]
assert all(r["yarn"][-1] < r[None][-1] for r in per_seed)     # at 8x, for each of the three models
assert largest < 0.25 or not tformer.SMALL                     # small mode: under a quarter of a nat

# %% [markdown]
# At $1\times$ all four are the same model (no scaling). Past the training length plain RoPE meets
# angles it never saw; the scaled variants bring the unseen angles back into the trained range.
# Position interpolation slows every pair, even the fast ones that encode "which byte came just
# before", which can cost it at small factors; NTK and YaRN keep the fast pairs. How much each gains
# is in the table above, at every factor (a negative entry: worse than no scaling).
#
# At small mode's scale (a 2-layer model trained for 150 steps on 32-byte windows, still near 2.5 nats
# per byte) every gain is under a quarter of a nat (the largest is printed, and asserted in the cell
# above). One model's gain also differs from the next one's (printed model by model): that is why the
# table averages three. In practice a short fine-tune at the new
# length (a few hundred steps) follows, and YaRN needs the least of it (Peng et al., 2023).
#
# **How production models reach a million tokens.** Three pieces work together. *Memory*: exact
# attention computed in tiles with an online softmax never stores the $n \times n$ matrix
# (FlashAttention, Dao et al., 2022; FlashAttention-2, Dao, 2023; chapter 9), so memory grows as $n$,
# though time still grows as $n^2$.
#
# *Positions*: RoPE's base is raised, then the model is trained a
# little longer on long documents. Code Llama went from base $10^4$ to $10^6$ for 100k-token contexts
# (Rozière et al., 2023). Meta's "Effective Long-Context Scaling" raised the base for 32k (Xiong et
# al., 2023), and YaRN / LongRoPE-style scalings stretch further (Peng et al., 2023; Ding et al., 2024).
#
# *Devices*: no single GPU holds the activations of a million tokens, so the sequence itself is split
# across GPUs: **ring attention** passes key/value blocks around a ring of devices while each computes
# its queries' share (Liu, Zaharia and Abbeel, 2023). DeepSpeed-Ulysses swaps the sequence split
# for a head split around attention with all-to-all communication (Jacobs et al., 2023). Megatron-LM
# calls this *context parallelism*. Llama 3 trained its 128k context with context parallelism in the
# last stage of pre-training (Llama team, "The Llama 3 Herd of Models", 2024).

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** Doubling the sequence length $n$ multiplies the peak memory of explicit attention by about
# how much? Answer with a number. The table under section 1 prints the memory at each $n$ and the fitted
# exponent.

# %%
answer = 4  ### ANSWER
check("ch08.q_memory_doubling", answer)

# %% [markdown]
# **Question 2.** At scaling factor $s$, which RoPE frequencies do position interpolation and NTK-aware
# scaling change?
# - **A.** NTK-aware scaling divides the fastest pair's by $s$ and keeps the slowest pair's.
# - **B.** Both divide every pair's frequency by $s$.
# - **C.** Position interpolation divides every pair's by $s$; NTK-aware scaling keeps the fastest pair's
#   and divides the slowest pair's by $s$.
# - **D.** Neither changes a frequency: both only rescale the logits.
#
# The figure of scaled frequencies in section 2 and the line printed under it show it.

# %%
answer = "C"  ### ANSWER
check("ch08.q_rope_scaling", answer)

# %% [markdown]
# **Question 3.** YaRN multiplies the cos and the sin of the rotation by $0.1 \ln s + 1$. By what factor
# does that multiply the logits $q \cdot k$? Write it as a formula in `s`, in a string (`log` is the
# natural logarithm). The cell after *YaRN's logit scale, checked* measures it at the factor of section 2.

# %%
answer = "(0.1*log(s) + 1)**2"  ### ANSWER
check("ch08.q_yarn_logits", answer)

# %% [markdown]
# ## Summary
# * Explicit attention's peak memory grows as $n^2$ (fitted exponent between 1.8 and 2.2, asserted); the
#   sliding window's and Performer's linear attention's as $n$ (below 1.3). Time exponents are noisier.
# * The banded sliding-window kernel equals dense attention with the sliding-window mask, without building
#   the $n \times n$ matrix.
# * RoPE scalings change the rotation frequencies: at factor 8, NTK-aware scaling keeps the fastest pair
#   and slows the slowest 8 times; YaRN also scales the logits, by $(0.1 \ln 8 + 1)^2 = 1.4591$.
# * Trained at one length and evaluated at 2, 4 and 8 times it, YaRN's loss (mean of three models) is
#   below plain RoPE's at every factor, and NTK's at 8 times; in small mode every gain is under a quarter of
#   a nat.
