# %% [markdown]
# # Chapter 1: Attention
#
# **What this chapter covers.** Attention lets every position pick, by content, which other positions
# to read from, at any distance. Each position is turned into a **query** (what am I looking for?), a
# **key** (what can I be matched on?) and a **value** (what do I carry?). The Transformer's scoring
# function is scaled dot-product attention,
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V,$$
#
# and this chapter shows why the $1/\sqrt{d_k}$ is there: without it, scores grow with $d_k$, the
# softmax saturates and its gradient vanishes.
#
# **The tformer code it uses**: `tformer/attention.py: scaled_dot_product_attention`,
# `tformer/utils/plot.py: curves, heatmap`.
#
# **How to check an exercise.** Write the body of the function in an exercise cell (replace
# `raise NotImplementedError`), run it, then run the cell below it: `check("ch01.attention", my_attention)`.
# It prints PASS, or the smallest input where your function disagrees with the reference, the largest
# difference, a hint, and the name of the mistake if it is a common one.
#
# Set `TFORMER_SMALL=1` before starting Jupyter for the quick CPU version (`make lab` does).
# On a new machine, run `tformer doctor` in a terminal first: it checks that this machine's kernels compute
# the course's numbers and estimates how long the capstones take here.

# %%
import inspect
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import tformer
from tformer.grading import check
from tformer.utils.plot import curves, heatmap

tformer.seed_everything(0)
print("small mode:", tformer.SMALL)

# %% [markdown]
# ## 1. Queries, keys and values: a soft dictionary lookup
#
# Three keys, three values. A query close to key 1 gets most of its weight on position 1, so the output
# is mostly value 1. Attention is a *differentiable* lookup: the weights are a softmax over the
# query-key similarities, not a hard argmax.

# %%
keys = torch.tensor([[1.0, 0.0, 0.0, 0.0],     # position 0 advertises "feature 0"
                     [0.0, 1.0, 0.0, 0.0],     # position 1 advertises "feature 1"
                     [0.0, 0.0, 1.0, 1.0]])    # position 2 advertises "features 2 and 3"
values = torch.tensor([[10.0, 0.0], [0.0, 10.0], [-10.0, -10.0]])
query = torch.tensor([[0.2, 3.0, 0.1, 0.0]])   # looking for feature 1

out, w = tformer.scaled_dot_product_attention(query, keys, values)
print("weights:", w.numpy().round(3), " output:", out.numpy().round(2))
assert w.argmax().item() == 1 and w[0, 1] > 0.6
assert torch.allclose(w.sum(-1), torch.ones(1))          # the weights are a distribution over the keys
sharp = tformer.scaled_dot_product_attention(query * 10, keys, values)[0]
print("a 10x sharper query reads almost exactly value 1:", sharp.numpy().round(2))
assert torch.allclose(sharp, values[1:2], atol=1e-2)

# %% [markdown]
# ## 2. Scaled dot-product attention, step by step
#
# The four lines below are the whole function. `tformer.scaled_dot_product_attention` is the same
# computation (plus masking, chapter 6) and returns the weights too; PyTorch's fused
# `F.scaled_dot_product_attention` computes the same output without materializing the weights.

# %%
# Figure: Attention weights of random queries and keys: each row, one query, is a distribution over the keys and sums to 1.
B, H, T, d_k = 2, 4, 6, 16
q, k, v = (torch.randn(B, H, T, d_k) for _ in range(3))

scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)   # (B, H, T_q, T_k): similarity of every query with every key
weights = torch.softmax(scores, dim=-1)             # normalize over the keys: each row sums to 1
out = weights @ v                                    # (B, H, T_q, d_v): weighted average of the values

ref_out, ref_w = tformer.scaled_dot_product_attention(q, k, v)
torch.testing.assert_close(out, ref_out)
torch.testing.assert_close(weights, ref_w)
torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
print("from scratch == tformer == torch.nn.functional.scaled_dot_product_attention")
heatmap(ref_w[0, 0], title="attention weights (random q, k): rows sum to 1");

# %% [markdown]
# ## 3. Why divide by $\sqrt{d_k}$?
#
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, then
# $q\cdot k = \sum_{i=1}^{d_k} q_i k_i$ has variance $d_k$: its typical size grows like $\sqrt{d_k}$.
# Measure it.

# %%
dims = [4, 16, 64, 256, 1024] if tformer.SMALL else [4, 16, 64, 256, 1024, 4096]
n_keys = 32
g = torch.Generator().manual_seed(0)
std_raw, std_scaled = [], []
for d in dims:
    qq, kk = torch.randn(512, d, generator=g), torch.randn(n_keys, d, generator=g)
    s = qq @ kk.T
    std_raw.append(s.std().item())
    std_scaled.append((s / math.sqrt(d)).std().item())
    print(f"d_k={d:5d}  std(q.k) = {std_raw[-1]:6.2f}  (sqrt(d_k) = {math.sqrt(d):5.1f})   std(q.k / sqrt(d_k)) = {std_scaled[-1]:.2f}")
for d, s_raw, s_sc in zip(dims, std_raw, std_scaled):
    assert abs(s_raw / math.sqrt(d) - 1) < 0.15 and abs(s_sc - 1) < 0.15

# %% [markdown]
# Large scores push the softmax into saturation: one key takes almost all the weight and the gradient
# that flows back into the scores vanishes, because the softmax Jacobian $\mathrm{diag}(p) - pp^\top$ is
# nearly zero when $p$ is nearly one-hot. The entropy of the weights, $H(p) = -\sum_j p_j \log p_j$,
# measures how spread they are: 0 when one key takes everything, $\log n$ when $n$ keys share equally.
# With the natural logarithm it is counted in *nats* (with $\log_2$, in bits).
# We measure both, scaled and unscaled, for the same random queries and keys: the entropy of each row of weights,
# and the norm of $\partial L / \partial \text{scores}$ for a random linear loss $L = \sum_j r_j p_j$ on
# the weights (whatever the loss, its gradient reaches the scores through this Jacobian).

# %%
# Figure: Softmax entropy and score gradient against d_k, with and without the 1/sqrt(d_k) scale.
def saturation(d: int, scale: bool, n_queries: int = 256) -> tuple[float, float]:
    g = torch.Generator().manual_seed(d)
    qq, kk = torch.randn(n_queries, d, generator=g), torch.randn(n_keys, d, generator=g)
    s = (qq @ kk.T / (math.sqrt(d) if scale else 1.0)).requires_grad_()
    p = torch.softmax(s, dim=-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean()
    loss = (p * torch.randn(n_queries, n_keys, generator=g)).sum()      # a random linear loss on the weights
    (grad,) = torch.autograd.grad(loss, s)
    return entropy.item(), grad.norm(dim=-1).median().item()   # median over queries

res = {scale: [saturation(d, scale) for d in dims] for scale in (True, False)}
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
curves(dims, {"scaled by 1/sqrt(d_k)": [e for e, _ in res[True]], "unscaled": [e for e, _ in res[False]],
              "uniform (max)": [math.log(n_keys)] * len(dims)},
       "d_k", "softmax entropy (nats)", "entropy of the attention weights", logx=True, ax=axes[0])
curves(dims, {"scaled by 1/sqrt(d_k)": [gn for _, gn in res[True]], "unscaled": [gn for _, gn in res[False]]},
       "d_k", "median |dL/d scores| per query", "gradient reaching the scores", logx=True, logy=True, ax=axes[1])
plt.tight_layout()
for d, (e_s, g_s), (e_u, g_u) in zip(dims, res[True], res[False]):
    print(f"d_k={d:5d}  entropy scaled {e_s:.2f} unscaled {e_u:.2f}   grad norm scaled {g_s:.3g} unscaled {g_u:.3g}")

# %% [markdown]
# The claim, measured: with the scale the entropy stays put as $d_k$ grows; without it the weights
# collapse toward one key and the (median) gradient on the scores shrinks by orders of magnitude relative to
# the scaled version.

# %%
(e_s_lo, g_s_lo), (e_s_hi, g_s_hi) = res[True][0], res[True][-1]
e_u_hi, g_u_hi = res[False][-1]
assert abs(e_s_hi - e_s_lo) < 0.5                    # scaled: entropy roughly independent of d_k
assert e_u_hi < 0.25 * e_s_hi                        # unscaled: nearly one-hot at large d_k
assert g_u_hi < 0.01 * g_s_hi                        # unscaled: the gradient has (almost) vanished
print(f"at d_k={dims[-1]}: entropy {e_s_hi:.2f} vs {e_u_hi:.2f} nats; gradient {g_s_hi:.3g} vs {g_u_hi:.3g}")

# %% [markdown]
# ## Exercise 1: a numerically stable softmax
# `torch.softmax` is off limits here: write it from `torch.exp`. Its inputs are logits (scores before
# the softmax, any real numbers): logits of 1000 must not overflow, and a `-inf` logit (a masked key)
# must get weight exactly 0.

# %%
def my_softmax(x):
    ### BEGIN SOLUTION
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)
    ### END SOLUTION


# %%
check("ch01.softmax", my_softmax)

# %% [markdown]
# ## Exercise 2: scaled dot-product attention
# Return `(out, weights)` for `q (..., T_q, d_k)`, `k (..., T_k, d_k)`, `v (..., T_k, d_v)`. `mask` is
# bool, True = may attend, broadcastable to `(..., T_q, T_k)`; a query with every key masked must get
# zero weights and a zero output (not NaN). The checker also tries length 1, a fully padded row, causal
# plus padding, a batch of 1 and non-contiguous inputs.

# %%
def my_attention(q, k, v, mask=None):
    ### BEGIN SOLUTION
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        any_key = mask.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~mask, float("-inf")).masked_fill(~any_key, 0.0)
        weights = torch.softmax(scores, dim=-1).masked_fill(~any_key, 0.0)
    return weights @ v, weights
    ### END SOLUTION


# %%
check("ch01.attention", my_attention)

# %% [markdown]
# ## The package's version
# What you wrote is `tformer`'s reference attention, `tformer/attention.py`'s
# `scaled_dot_product_attention`, with the same fully-masked-row rule (the input checks first name what
# they expected when a shape is wrong). `tformer.MultiHeadAttention` runs it when the weights are wanted;
# otherwise it calls PyTorch's fused kernel, `F.scaled_dot_product_attention`, which the tests check
# against this reference. On a CPU, training with dropout or short sequences in bf16 (bfloat16: 16-bit floats with float32's
# range and fewer digits, which chapter 10 trains in) runs this reference too, because there it is the faster (chapter 9 measures it).

# %%
print(inspect.getsource(tformer.scaled_dot_product_attention))

# %% [markdown]
# ## Questions
# Each question has one answer: a number, a letter, or a formula written as a string (such as
# `"n**2 / 2"`). Replace the `...` in the question's cell and run it: the checker says whether the answer
# is right, and names the misconception behind a common wrong one. Every answer follows from a cell above.
# The later chapters end with questions of the same form.

# %% [markdown]
# **Question 1.** Section 1 also runs the query multiplied by 10. What does multiplying a query by 10 do to
# the attention output?
# - **A.** It becomes 10 times larger: attention is linear in the query.
# - **B.** Nothing: the softmax does not depend on the size of the scores.
# - **C.** The weights spread out more evenly over the keys.
# - **D.** The weights concentrate on the best-matching key, and the output approaches that key's value.
#
# The cell under *1. Queries, keys and values* prints the answer on its last line.

# %%
answer = "D"  ### ANSWER
check("ch01.q_sharper_query", answer)

# %% [markdown]
# **Question 2.** The entries of $q$ and $k$ are independent, with mean 0 and variance 1, and $d_k = 64$.
# What is the variance of the unscaled score $q \cdot k$? Answer with a number. The cell under
# *3. Why divide by $\sqrt{d_k}$?* prints its standard deviation for each $d_k$.

# %%
answer = 64  ### ANSWER
check("ch01.q_score_variance", answer)

# %% [markdown]
# **Question 3.** Without the $1/\sqrt{d_k}$, what happens to the softmax of the scores as $d_k$ grows?
# - **A.** The weights become nearly one-hot, and the gradient that reaches the scores vanishes.
# - **B.** The weights become nearly uniform over the keys.
# - **C.** The gradient that reaches the scores grows with the scores.
# - **D.** Nothing: the softmax normalizes the scores anyway.
#
# The figure of entropy and gradient against $d_k$, and the cell after it, measure both.

# %%
answer = "A"  ### ANSWER
check("ch01.q_saturation", answer)

# %% [markdown]
# ## Summary
# * Query-key dot products decide *where* to read, values decide *what* is read.
# * $\mathrm{softmax}(QK^\top/\sqrt{d_k})V$: measured equal to tformer's and PyTorch's implementations.
# * Unscaled scores have standard deviation $\sqrt{d_k}$; the softmax saturates (entropy toward 0) and
#   the gradient on the scores vanishes. Dividing by $\sqrt{d_k}$ keeps both steady.
