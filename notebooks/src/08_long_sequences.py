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
#    NTK-aware scaling and YaRN, and plot the loss against the evaluation length.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in an exercise cell with your code,
# run it, then run the `check(...)` cell below it: it prints PASS, or the smallest failing input with a
# hint. Exercises here: a sliding-window mask, and NTK-scaled RoPE frequencies.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from tqdm.auto import trange

import tformer
from tformer.efficient import orthogonal_gaussian, performer_attention
from tformer.grading import check
from tformer.models import GPT, GPTConfig
from tformer.positional import RotaryEmbedding, rope_frequencies
from tformer.sparse import sliding_window_attention
from tformer.timing import fit_power, format_table, peak_memory, time_fn

tformer.seed_everything(0)
device = tformer.device()
print("small mode:", tformer.SMALL, "| device:", device)

# %% [markdown]
# ## 1. Attention costs $n^2$: measure it
#
# Explicit attention, $\mathrm{softmax}(QK^\top/\sqrt d)V$ (`tformer.scaled_dot_product_attention`),
# materialises the $n \times n$ weights. We time it and measure its peak memory
# (`tformer.timing.peak_memory`: on a GPU `torch.cuda.max_memory_allocated`, on a CPU the allocation
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

rows = []
for name, r in results.items():
    p_time, _ = fit_power(ns, r["ms"])
    p_mem, _ = fit_power(ns, r["MiB"])
    r["p_time"], r["p_mem"] = p_time, p_mem
    rows.append({"method": name, **{f"MiB n={n}": m for n, m in zip(ns, r["MiB"])},
                 "memory ~ n^p, p =": p_mem, "time ~ n^p, p =": p_time})
print(format_table(rows))
assert 1.8 < results["explicit"]["p_mem"] < 2.2, "explicit attention's memory should grow as n^2"
assert results["sliding window"]["p_mem"] < 1.3 and results["linear (Performer)"]["p_mem"] < 1.3

# %%
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
#   (a ramp between $\beta$ turns), keep the fast ones, and scale the logits by $0.1 \ln s + 1$.
#
# `tformer.positional.rope_frequencies` implements all three; the tests check them against Hugging
# Face's own `transformers.modeling_rope_utils`. The frequencies for $d = 64$, $L = 2048$, $s = 8$:

# %%
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
# ## 3. Train short, evaluate long
#
# A small GPT with RoPE learns next-byte prediction at length $L$. We then evaluate it on longer
# sequences ($2L$ ... $8L$) with plain RoPE and with each scaling (factor $s$ = length / $L$), and
# report the loss on the **last $L$ tokens** of each sequence: the positions the model never saw in
# training. In small mode the text is Python's bundled documentation (offline); in full mode WikiText-2
# through `datasets` (cached after the first download).

# %%
def load_text() -> str:
    from pydoc_data.topics import topics                       # bundled with Python: no download
    offline = "\n\n".join(topics[k] for k in sorted(topics))
    if tformer.SMALL:
        return offline
    try:
        import datasets
        ds = datasets.load_dataset("Salesforce/wikitext", "wikitext-2-raw-v1", split="train")
        return "".join(ds["text"])
    except Exception as e:  # noqa: BLE001
        print(f"WikiText-2 is not available ({type(e).__name__}: {e}).\nOffline: run this notebook once with a "
              "network connection (datasets caches it in ~/.cache/huggingface), or set TFORMER_SMALL=1. "
              "Using Python's bundled documentation instead.")
        return offline


data = torch.tensor(list(load_text().encode("utf-8")), dtype=torch.long)
split = int(0.9 * len(data))
train_data, val_data = data[:split], data[split:]
print(f"{len(data):,} bytes of text")

if tformer.SMALL:
    L, steps, batch_size, d_model, n_layers, n_heads, evals = 32, 150, 16, 64, 2, 4, 8
else:
    L, steps, batch_size, d_model, n_layers, n_heads, evals = 256, 3000, 32, 384, 6, 6, 32
gen = torch.Generator().manual_seed(0)


def get_batch(src, t, b, g):
    ix = torch.randint(0, len(src) - t - 1, (b,), generator=g)
    xy = torch.stack([src[i:i + t + 1] for i in ix.tolist()])
    return xy[:, :-1].to(device), xy[:, 1:].to(device)


model = GPT(GPTConfig(vocab_size=256, block_size=L, n_layers=n_layers, n_heads=n_heads, d_model=d_model,
                      positional="rope")).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3 if tformer.SMALL else 1e-3)
model.train()
for step in trange(steps, desc=f"training at L={L}"):
    x, y = get_batch(train_data, L, batch_size, gen)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"final training loss {loss.item():.3f} (nats per byte)")

# %%
lengths = [L * m for m in (1, 2, 4, 8)]
schemes = [None, "linear", "ntk", "yarn"]
label = {None: "RoPE (no scaling)", "linear": "position interpolation", "ntk": "NTK-aware", "yarn": "YaRN"}
model.eval()
trained_rope = model.rope
eval_gen = torch.Generator().manual_seed(1)
losses = {sch: [] for sch in schemes}
for t in lengths:
    x, y = get_batch(val_data, t, evals, eval_gen)                  # the same sequences for every scheme
    for sch in schemes:
        factor = t / L
        model.rope = RotaryEmbedding(model.cfg.head_dim, t, model.cfg.rope_base, sch if factor > 1 else None,
                                     factor, original_max_len=L).to(device)
        with torch.no_grad():
            logits = model(x)
        losses[sch].append(F.cross_entropy(logits[:, -L:].flatten(0, 1), y[:, -L:].flatten()).item())
model.rope = trained_rope
print(format_table([{"scaling": label[sch], **{f"T={t}": v for t, v in zip(lengths, losses[sch])}}
                    for sch in schemes], floatfmt=".3f"))
assert all(math.isfinite(v) for vs in losses.values() for v in vs)

fig, ax = plt.subplots(figsize=(6, 3.6))
for sch in schemes:
    ax.plot(lengths, losses[sch], "o-", label=label[sch])
ax.axvline(L, color="gray", ls=":", lw=1)
ax.set_xscale("log", base=2)
ax.set_xlabel("evaluation length (trained at L = %d)" % L)
ax.set_ylabel("loss on the last L tokens")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
plt.show()
best = min(schemes, key=lambda sch: losses[sch][-1])
print(f"at {lengths[-1]} tokens ({lengths[-1] // L}x the training length): plain RoPE {losses[None][-1]:.3f}, "
      f"best {label[best]} {losses[best][-1]:.3f}")

# %% [markdown]
# At $1\times$ all four are the same model (no scaling). Past the training length plain RoPE meets
# angles it never saw and its loss rises; the scaled variants bring the unseen angles back into the
# trained range. Position interpolation blurs *local* order (every pair is slowed, even the fast ones
# that encode "which byte came just before"), which costs it at small factors; NTK and YaRN keep the
# fast pairs and usually extrapolate best without any fine-tuning. With a tiny model and a few
# evaluation sequences (small mode) the differences are noisy; in full mode (a larger model, $L$=256,
# up to 2048 tokens) they are clear. In practice a short fine-tune at the new length (a few hundred
# steps) follows, and YaRN needs the least of it.
