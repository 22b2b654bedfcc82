# %% [markdown]
# # Chapter 9: Cheaper attention
#
# **What this chapter covers.** Three routes to attention that costs less than $n^2$:
#
# 1. **Sparse patterns** score only some (query, key) pairs: the Sparse Transformer (strided and fixed,
#    $O(n\sqrt n)$), Longformer (sliding window + a few global tokens), BigBird (random + window +
#    global). We draw each as its mask and count its cost as $n$ grows.
# 2. **Linear attention** approximates the softmax: Linformer projects keys and values from $n$ rows to
#    $k$; Performer (FAVOR+) replaces $\exp(q\cdot k)$ by random features $\phi(q)\cdot\phi(k)$. On a
#    key-lookup task we compare every method's accuracy with exact attention.
# 3. **Hardware-aware exact attention**: FlashAttention computes the *same* softmax attention in tiles
#    with an online softmax, never storing the $n \times n$ matrix. We build it in PyTorch, prove it
#    exact against `F.scaled_dot_product_attention`, measure its memory, look at which backend of SDPA
#    (scaled dot-product attention, PyTorch's `F.scaled_dot_product_attention`) runs, and list the published FlashAttention-2/3/4 figures.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in an exercise cell with your code,
# run it, then run the `check(...)` cell below it. Exercises: the strided pattern, one online-softmax step.
#
# **The tformer code it uses**: `tformer/sparse.py: strided_pattern, fixed_pattern, longformer_mask,
# bigbird_mask, count_pairs, PatternAttention`, `tformer/efficient.py: LinformerAttention,
# PerformerAttention, online_softmax_step, tiled_attention`, `tformer/measure/flash.py: sdpa_backends_used`,
# `tformer/blocks.py: TransformerBlock`, `tformer/measure/timing.py: peak_memory`,
# `tformer/training/metrics.py: fit_power_law`.

# %%
import inspect
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import trange

import tformer
from tformer.efficient import LinformerAttention, PerformerAttention, online_softmax_step, tiled_attention
from tformer.measure.flash import sdpa_backends_used
from tformer.grading import check
from tformer.sparse import (PatternAttention, bigbird_mask, count_pairs, fixed_pattern, longformer_mask,
                            strided_pattern)
from tformer.training.metrics import fit_power_law
from tformer.measure.timing import format_table, peak_memory

tformer.seed_everything(0)
device = tformer.device()
print("small mode:", tformer.SMALL, "| device:", device)

# %% [markdown]
# ## 1. Sparse patterns, drawn as masks
#
# Every pattern is a bool mask, True (dark) = the query (row) may attend to the key (column).
# The Sparse Transformer splits its pattern over two heads; together they connect any two tokens in
# two hops.

# %%
# Figure: Each sparse pattern as a mask, query rows by key columns, with its count of scored pairs.
t = 32
patterns = {
    "causal (dense)": tformer.causal_mask(t),
    "sliding window w=4": tformer.sliding_window_mask(t, 4),
    "strided head 1: local": strided_pattern(t, 6)[0],
    "strided head 2: every 6th": strided_pattern(t, 6)[1],
    "fixed (union of heads)": fixed_pattern(t, 8).any(0),
    "Longformer w=3 + global {0, 16}": longformer_mask(t, 3, (0, 16)),
    "BigBird block 4": bigbird_mask(t, 4, n_random=1, n_global=1, seed=0),
}
fig, axes = plt.subplots(1, len(patterns), figsize=(2.3 * len(patterns), 2.6))
for ax, (name, m) in zip(axes, patterns.items()):
    ax.imshow(m, cmap="Greys", vmin=0, vmax=1)
    ax.set_title(f"{name}\n{count_pairs(m)} of {t * t} pairs", fontsize=7)
    ax.set_xticks([]), ax.set_yticks([])
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Exercise: the strided pattern
# Return the Sparse Transformer's strided pattern as a causal `(2, T, T)` bool tensor: head 0 lets
# query $i$ see the previous `stride` tokens ($0 \le i - j <$ `stride`), head 1 every `stride`-th token
# back ($i - j \ge 0$ and $(i - j) \bmod$ `stride` $= 0$).

# %%
def my_strided_pattern(t, stride):
    ### BEGIN SOLUTION
    d = torch.arange(t).unsqueeze(1) - torch.arange(t).unsqueeze(0)      # i - j
    return torch.stack([(d >= 0) & (d < stride), (d >= 0) & (d % stride == 0)])
    ### END SOLUTION


# %%
check("ch09.strided_pattern", my_strided_pattern)

# %% [markdown]
# The package's version (`tformer/sparse.py`), which the rest of the chapter uses:

# %%
print(inspect.getsource(strided_pattern))

# %% [markdown]
# ## 2. Cost vs $n$
#
# We count the pairs each pattern scores for growing $n$ (stride $\sqrt n$ for the Sparse Transformer,
# as in the paper) and fit the exponent. Linformer scores $n \times k$ pairs and Performer computes
# $n \times m$ features: linear for a fixed $k$, $m$.

# %%
# Figure: Scored pairs (or features) against n for each pattern, with its fitted exponent p.
ns = [512, 1024, 2048, 4096]
costs = {
    "dense causal": [count_pairs(tformer.causal_mask(n)) for n in ns],
    "sliding window w=64": [count_pairs(tformer.sliding_window_mask(n, 64)) for n in ns],
    "strided, stride sqrt(n)": [count_pairs(strided_pattern(n, int(math.isqrt(n)))) for n in ns],
    "fixed, stride sqrt(n)": [count_pairs(fixed_pattern(n, int(math.isqrt(n)))) for n in ns],
    "Longformer w=64 + 2 global": [count_pairs(longformer_mask(n, 64, (0, 1))) for n in ns],
    "BigBird block 64": [count_pairs(bigbird_mask(n, 64, n_random=2, n_global=1)) for n in ns],
    "Linformer k=256": [n * 256 for n in ns],
    "Performer m=256": [n * 256 for n in ns],
}
exps = {name: -float(fit_power_law(ns, c)[1]) for name, c in costs.items()}   # cost ~ n^p, p = -alpha
print(format_table([{"method": k, **{f"n={n}": c for n, c in zip(ns, v)}, "cost ~ n^p, p =": exps[k]}
                    for k, v in costs.items()], floatfmt=".3g"))
assert abs(exps["dense causal"] - 2) < 0.05 and abs(exps["strided, stride sqrt(n)"] - 1.5) < 0.1
assert exps["sliding window w=64"] < 1.15 and exps["BigBird block 64"] < 1.15

fig, ax = plt.subplots(figsize=(6, 3.6))
for name, c in costs.items():
    ax.plot(ns, c, "o-", ms=3, label=f"{name} (p={exps[name]:.2f})")
ax.set_xscale("log", base=2), ax.set_yscale("log")
ax.set_xlabel("n"), ax.set_ylabel("scored pairs / features")
ax.legend(fontsize=6), ax.grid(alpha=0.3)
plt.show()

# %% [markdown]
# A mask only *describes* the saving: run through a dense kernel with a mask, the work is still $n^2$.
# The saving is real only in a kernel that skips the masked blocks (block-sparse kernels, or the
# banded `sliding_window_attention` of chapter 8).
#
# ## 3. What the approximations cost: a key-lookup task
#
# Each sequence lists 15 (key, value) pairs, then asks for the value of one of the keys. The answer
# sits anywhere in the sequence, so the last token must be able to read every position. We train the
# same one-layer model with each attention (all swap in for `MultiHeadAttention`, same call shape)
# and compare accuracy on 1000 fresh sequences.

# %%
N_KEYS, N_VALS, N_PAIRS = 32, 8, 15
T = N_PAIRS + 1                                     # the query is the last token


def make_batch(b: int, g: torch.Generator):
    """(key ids (B, T), value ids (B, T), answer (B,), position of the answer (B,))."""
    keys = torch.rand(b, N_KEYS, generator=g).argsort(-1)[:, :N_PAIRS]            # distinct keys
    vals = torch.randint(0, N_VALS, (b, N_PAIRS), generator=g)
    pick = torch.randint(0, N_PAIRS, (b,), generator=g)
    key_ids = torch.cat([keys, keys.gather(1, pick[:, None])], 1)                # the query repeats a key
    val_ids = torch.cat([vals, torch.full((b, 1), N_VALS)], 1)                    # N_VALS = "?" at the query
    return key_ids, val_ids, vals.gather(1, pick[:, None]).squeeze(1), pick

# %% [markdown]
# The model: key, value and position embeddings, one pre-LN encoder layer whose attention is swapped
# for each variant, and a classifier on the last (query) token.

# %%
class Lookup(nn.Module):
    """Token = key embedding + value embedding + position; encoder layers; classify the last token."""

    def __init__(self, make_attention, d: int = 32, n_heads: int = 2, n_layers: int = 1):
        super().__init__()
        self.key_emb, self.val_emb = nn.Embedding(N_KEYS, d), nn.Embedding(N_VALS + 1, d)
        self.pos = nn.Parameter(torch.randn(T, d) * 0.02)
        block = tformer.BlockConfig(d_model=d, n_heads=n_heads, d_ff=4 * d, dropout=0.0, norm_first=True)
        self.layers = nn.ModuleList(tformer.TransformerBlock(block) for _ in range(n_layers))
        for layer in self.layers:
            layer.attn = make_attention(d, n_heads)                               # the swap
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, N_VALS)

    def forward(self, key_ids, val_ids):
        x = self.key_emb(key_ids) + self.val_emb(val_ids) + self.pos             # (B, T, d)
        for layer in self.layers:
            x = layer(x)                                                          # bidirectional
        return self.head(self.norm(x[:, -1]))                                     # (B, N_VALS)

# %% [markdown]
# The six attentions, each a drop-in for `MultiHeadAttention` (window 3; Longformer makes the query
# token global; BigBird adds a random and a global block to the window):

# %%
variants = {
    "exact": lambda d, h: tformer.MultiHeadAttention(d, h),
    "sliding window w=3": lambda d, h: PatternAttention(d, h, window=3),
    "Longformer w=3 + global query": lambda d, h: PatternAttention(
        d, h, pattern=lambda n, dev: longformer_mask(n, 3, (n - 1,), device=dev)),
    "BigBird block 4": lambda d, h: PatternAttention(
        d, h, pattern=lambda n, dev: bigbird_mask(n, 4, n_random=1, n_global=1, device=dev)),
    "Linformer k=4": lambda d, h: LinformerAttention(d, h, max_len=T, k=4),
    "Performer m=32": lambda d, h: PerformerAttention(d, h, n_features=32),
}

# %% [markdown]
# Every variant trains with the same seed and batches; we score it on 1000 fresh sequences, overall and
# split by how far back the answer sits.

# %%
steps = 120 if tformer.SMALL else 2000
test = make_batch(1000, torch.Generator().manual_seed(123))


def train_and_score(make) -> tuple[float, float, float]:
    """Accuracy of Lookup(make) after training: overall, answer far away, answer within 3 tokens."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = Lookup(make).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in trange(steps, leave=False):
        key_ids, val_ids, y, _ = (z.to(device) for z in make_batch(32, g))
        loss = F.cross_entropy(model(key_ids, val_ids), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        key_ids, val_ids, y, pick = (z.to(device) for z in test)
        correct = (model(key_ids, val_ids).argmax(-1) == y).float()
    far = pick < N_PAIRS - 3                                                      # more than 3 tokens back
    return correct.mean().item(), correct[far].mean().item(), correct[~far].mean().item()

# %% [markdown]
# Train and score all six:

# %%
accuracy = {name: train_and_score(make) for name, make in variants.items()}
print(format_table([{"attention": k, "accuracy": a, "answer far away": f, "answer within 3 tokens": n}
                    for k, (a, f, n) in accuracy.items()], floatfmt=".3f"))
print(f"chance: {1 / N_VALS:.3f}")
assert accuracy["exact"][0] > accuracy["sliding window w=3"][0] + 0.3

# %% [markdown]
# Exact attention answers most lookups, far above chance (its accuracy is printed above). The sliding
# window cannot see far answers and scores about chance on them. Longformer's trick fixes exactly this:
# make the query token *global* and its row sees everything again. With one layer only the query's row
# matters, so Longformer here is *the same model* as exact attention (identical numbers), and so is
# BigBird: on 16 tokens its window + global + random blocks cover the query's whole row (on long
# sequences they do not; see the pair counts above). 
#
# Linformer squeezes 16 positions into $k$
# mixtures and loses which value belongs to which key; Performer's random-feature softmax is
# blurrier than the real one. That is the trade: linear methods are much faster on long sequences
# (`benchmarks/bench_long_attention.py`) but lose accuracy exactly on recall tasks like this one.
#
# **What sparse attention gives up in theory.** BigBird's paper (Zaheer et al., 2020, "Big Bird:
# Transformers for Longer Sequences", section 3) proves that a sparse attention with $O(n)$ pairs keeps
# the two properties known for full attention. Encoders with it are **universal approximators** of
# continuous sequence-to-sequence functions (as Yun et al., 2020 showed for full Transformers). With
# its full encoder-decoder it is **Turing complete** (as Pérez et al., 2019 showed for full attention).
#
# The key ingredient is the global tokens: any token reaches any other in two hops through one of them,
# so stacked layers can still move information anywhere, only more slowly. The same paper also proves
# the price: there is a task that full attention solves with $O(1)$ layers for which any sparse attention
# with $\tilde O(n)$ pairs needs $\tilde\Omega(n)$ layers. The key-lookup table above is a small measured case of
# that trade-off: with one layer the window alone cannot reach far answers, and the global query token
# (Longformer, BigBird) restores them.
#
# ## 4. FlashAttention: exact attention in tiles
#
# The softmax of a row needs its maximum and its sum before any weight is known, which is why explicit
# attention stores the whole row. The **online softmax** keeps, for each query, a running maximum $m$,
# a running sum $\ell = \sum e^{s - m}$ and a running output $\mathrm{acc} = \sum e^{s - m} v$, and folds
# in one block of keys at a time. When a block raises the maximum to $m'$, everything so far is
# rescaled by $e^{m - m'}$; at the end, output $= \mathrm{acc} / \ell$. Exact, in one pass.
#
# ## Exercise: one online-softmax step
# Given the running `m (..., T_q, 1)`, `l (..., T_q, 1)`, `acc (..., T_q, d)` and a block's
# `scores (..., T_q, B_k)` (`-inf` where masked) and values `v (..., B_k, d)`, return the updated
# `(m, l, acc)`. Before the first block `m` is `-inf`: make sure that gives zeros, not NaN.

# %%
def my_online_softmax_step(m, l, acc, scores, v):
    ### BEGIN SOLUTION
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - m_safe)
    alpha = torch.exp(m - m_safe)
    return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v
    ### END SOLUTION


# %%
check("ch09.online_softmax_step", my_online_softmax_step)

# %% [markdown]
# The package's version of the step you wrote (`tformer/efficient.py`):

# %%
print(inspect.getsource(online_softmax_step))

# %% [markdown]
# `tformer.efficient.tiled_attention` streams blocks of keys and values through exactly this step
# (`online_softmax_step`), with causal masking (blocks entirely in the future are skipped), and a
# backward pass that recomputes each block from the saved log-sum-exp, as FlashAttention does. It is
# exact: equal to PyTorch's fused attention within float32 rounding, values and gradients.

# %%
q, k, v = (torch.randn(2, 4, 300, 32, device=device, requires_grad=True) for _ in range(3))
for causal in (False, True):
    ours = tiled_attention(q, k, v, is_causal=causal, block=64)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    print(f"causal={causal}: tiled == F.scaled_dot_product_attention, largest difference "
          f"{(ours - ref).abs().max().item():.1e} (float32)")

# %% [markdown]
# And its memory grows linearly: we measure the peak for growing $n$ (same method as chapter 8).

# %%
ns = [512, 1024, 2048] if tformer.SMALL else [1024, 2048, 4096, 8192]
mem = {"explicit": [], "tiled (block 128)": [], "SDPA (fused)": []}
for n in ns:
    q, k, v = torch.randn(3, 1, 2, n, 64, device=device)
    with torch.no_grad():
        mem["explicit"].append(peak_memory(lambda: tformer.scaled_dot_product_attention(q, k, v)[0], device))
        mem["tiled (block 128)"].append(peak_memory(lambda: tiled_attention(q, k, v, block=128), device))
        mem["SDPA (fused)"].append(peak_memory(lambda: F.scaled_dot_product_attention(q, k, v), device))
print(format_table([{"method": k, **{f"MiB n={n}": b / 2 ** 20 for n, b in zip(ns, v)},
                     "memory ~ n^p, p =": -float(fit_power_law(ns, v)[1])} for k, v in mem.items()]))
assert -fit_power_law(ns, mem["tiled (block 128)"])[1] < 1.3 and -fit_power_law(ns, mem["explicit"])[1] > 1.8
assert mem["tiled (block 128)"][-1] * 4 < mem["explicit"][-1]

# %% [markdown]
# On a GPU, FlashAttention also gets *faster*: the tiles live in on-chip SRAM, so the $n \times n$ scores
# never travel to and from HBM, the slow memory. Our PyTorch loop shows the algorithm and its memory; it
# is not fast (each block is a separate kernel). Measured elsewhere: `python benchmarks/bench_long_attention.py`
# runs the same comparison up to $n = 8192$ (its figures are in `benchmarks/RESULTS.md`).
#
# ## 5. PyTorch's SDPA backends: which one runs?
#
# `F.scaled_dot_product_attention` dispatches to one of several kernels: FLASH_ATTENTION (also on CPU),
# EFFICIENT_ATTENTION (memory-efficient, the kernel of Meta's xFormers library; CUDA), CUDNN_ATTENTION (CUDA) and MATH (the
# explicit reference). `sdpa_kernel([...])` restricts the choice; a backend that cannot take the input
# raises. `tformer.measure.flash.sdpa_backends_used` runs a call under the profiler and reports the kernel.

# %%
q, k, v = torch.randn(3, 1, 4, 256, 64, device=device)
rows = []
for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                SDPBackend.MATH):
    try:
        with sdpa_kernel([backend]):
            out, used = sdpa_backends_used(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        status = "runs: " + ", ".join(used) if used else "runs"
    except RuntimeError as e:
        status = "not available here: " + str(e).split("\n")[0][:60]
    rows.append({"backend": backend.name, "on " + device.type: status})
_, default = sdpa_backends_used(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
rows.append({"backend": "(default choice)", "on " + device.type: ", ".join(default)})
print(format_table(rows))

# %% [markdown]
# On a CPU PyTorch picks its CPU flash kernel; on a recent NVIDIA GPU with fp16/bf16 inputs it picks
# FlashAttention-2 (or cuDNN's attention), and falls back to the memory-efficient or math kernel for
# inputs the fast one cannot take (fp32 on some paths, an arbitrary float mask, unusual head sizes).
# A T4 (sm75: no flash kernel, no bf16) has no FLASH_ATTENTION for any input: there the course trains
# with SDPA's memory-efficient kernel in fp16 instead, as the device policy (`tformer/utils/device.py`)
# chooses.
#
#
# Fused is not always faster. On a CPU in bf16, the flash kernel's backward can lose to the explicit
# math for short sequences, while its forward wins. Measured elsewhere:
# `python benchmarks/bench_cpu_attention.py` times both, forward and backward, from 16 x 16 positions (a
# Multi30k batch) up, and finds the length where fused starts to win. Below that length, `MultiHeadAttention`
# trains bf16 steps on a CPU through the math (`tformer.kernels.CPU_LOWP_MATH_MAX`).
#
# ## 6. FlashAttention 1 to 4: the published figures
#
# | version | paper / release | hardware | headline figure |
# |---|---|---|---|
# | FlashAttention | Dao et al., 2022 | A100 | exact attention, memory linear in $n$; 2-4x faster attention; GPT-2 training up to 3x faster |
# | FlashAttention-2 | Dao, 2023 | A100 | about 2x FlashAttention; up to 230 TFLOPs/s forward+backward, 50-73% of peak; 225 TFLOPs/s per GPU end-to-end GPT training (72% MFU) |
# | FlashAttention-3 | Shah et al., 2024 | H100 | warp specialisation + asynchronous TMA + FP8: 1.5-2.0x FA-2; up to 740 TFLOPs/s in FP16 (75% of peak), close to 1.2 PFLOPs/s in FP8 |
# | FlashAttention-4 | Zadouri et al., March 2026 | Blackwell (B200) | pipelines and softmax reworked for Blackwell, whose tensor cores outgrew its exponential units and shared memory: up to 1613 TFLOPs/s in BF16 (71% of peak), 1.3x cuDNN 9.13, 2.7x Triton |
#
# (TMA, the Tensor Memory Accelerator, copies tiles between global and shared memory in hardware, without
# the threads' help; warp specialisation gives some warps, groups of 32 threads, only the copying and
# others only the arithmetic, so the two overlap.)
#
# None of them changes the mathematics: each computes softmax attention exactly, as
# `tiled_attention` does, and differs in how well it keeps a particular chip busy.

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** The Sparse Transformer uses the strided pattern with stride $\sqrt n$. Its count of
# scored pairs grows as $n^p$: what is $p$? Answer with a number. The table under *2. Cost vs $n$* fits
# the exponent of every pattern.

# %%
answer = 1.5  ### ANSWER
check("ch09.q_strided_exponent", answer)

# %% [markdown]
# **Question 2.** On the one-layer key lookup of section 3, which attentions score exactly what exact
# attention scores?
# - **A.** Linformer and Performer: their approximation of the softmax is close enough for a lookup.
# - **B.** Longformer and BigBird: with one layer only the query's row matters, and it sees every key.
# - **C.** The sliding window: the answer is usually close to the query.
# - **D.** None of them: every cheaper attention loses some accuracy.
#
# The accuracy table under *3. What the approximations cost* shows it.

# %%
answer = "B"  ### ANSWER
check("ch09.q_lookup_exact", answer)

# %% [markdown]
# **Question 3.** `tiled_attention` folds the keys in blocks of $b$ through `online_softmax_step`. For
# one head with $n$ queries and $n$ keys, how many scores does it hold at once? Answer with a formula in
# `n` and `b`, as a string. The source of `online_softmax_step` printed above gives the shape of one
# block's scores; the memory table of section 4 shows the peak growing as $n$, not $n^2$.

# %%
answer = "n * b"  ### ANSWER
check("ch09.q_tiled_memory", answer)

# %% [markdown]
# ## Summary
# * Counted pairs: dense causal attention grows as $n^2$, the strided pattern with stride $\sqrt n$ as
#   about $n^{1.5}$, the sliding window, Longformer and BigBird as about $n$. A mask through a dense kernel
#   still costs $n^2$: the saving needs a kernel that skips the masked blocks.
# * On a one-layer key-value lookup, Longformer and BigBird score exactly what exact attention scores (their
#   query row sees every key); the sliding window is near chance on far answers, and Linformer and
#   Performer lose accuracy.
# * Tiled attention with the online softmax equals PyTorch's fused attention within float32 rounding,
#   values and gradients, and its peak memory grows as $n$ (fitted exponent 1) against explicit
#   attention's $n^2$.
# * `F.scaled_dot_product_attention` dispatches to one of several kernels: on a CPU its flash kernel; the
#   table shows which backends run on this machine.
