# %% [markdown]
# # Chapter 2: Self-attention
#
# **What this chapter covers.** In *self*-attention the queries, keys and values all come from the same
# sequence; in *cross*-attention the queries come from one sequence and the keys and values from
# another. Self-attention takes four steps:
#
# 1. project every position with three learned matrices: $Q = XW_q$, $K = XW_k$, $V = XW_v$;
# 2. score every query against every key: $QK^\top$;
# 3. scale by $1/\sqrt{d_k}$ and softmax over the keys;
# 4. take the weighted sum of the values.
#
# Because every position reads every other position in one step, the path between any two positions
# has constant length, where a recurrent network needs as many steps as the distance. We show it with
# gradients: after one self-attention layer, $\partial\, \mathrm{out}_j / \partial x_i$ is non-zero for
# every $i$; through an RNN it decays with the distance.
#
# **The tformer code it uses**: `tformer/attention.py: scaled_dot_product_attention, MultiHeadAttention`,
# `tformer/utils/plot.py: curves, heatmap`.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in an exercise cell with your code,
# run it, then run the `check(...)` cell below it: it prints PASS, or the smallest failing input with a
# hint (and the name of a common mistake when it recognizes one).

# %%
import inspect
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

import tformer
from tformer.grading import check
from tformer.utils.plot import curves, heatmap

tformer.seed_everything(0)
print("small mode:", tformer.SMALL)

# %% [markdown]
# ## 1. The four steps, from $W_q$, $W_k$, $W_v$

# %%
B, T, d_model, d_k, d_v = 2, 7, 16, 8, 8
x = torch.randn(B, T, d_model)
W_q, W_k, W_v = (torch.randn(d_model, d) / math.sqrt(d_model) for d in (d_k, d_k, d_v))

Q, K, V = x @ W_q, x @ W_k, x @ W_v                           # step 1: (B, T, d_k), (B, T, d_k), (B, T, d_v)
scores = Q @ K.transpose(-2, -1)                              # step 2: (B, T, T)
weights = torch.softmax(scores / math.sqrt(d_k), dim=-1)      # step 3: each row sums to 1
out = weights @ V                                             # step 4: (B, T, d_v)

torch.testing.assert_close(out, tformer.scaled_dot_product_attention(Q, K, V)[0])
print("out", tuple(out.shape), "== tformer.scaled_dot_product_attention(x W_q, x W_k, x W_v)")

# %% [markdown]
# `tformer.MultiHeadAttention` with one head is the same layer with the three matrices stacked in one
# `nn.Linear` (and an output projection $W_o$; inside it $d_k = d_v = d_{model}$ / heads, where the heads
# are parallel attentions, each on its own slice of the features: chapter 3). Load square
# matrices into it and compare with the four steps.

# %%
mha = tformer.MultiHeadAttention(d_model, n_heads=1, bias=False)
Wq, Wk, Wv, Wo = (torch.randn(d_model, d_model) / math.sqrt(d_model) for _ in range(4))
with torch.no_grad():                                   # nn.Linear stores (out, in): the transpose of x @ W
    mha.qkv.weight.copy_(torch.cat([Wq, Wk, Wv], dim=1).T)
    mha.out.weight.copy_(Wo.T)
ours = tformer.scaled_dot_product_attention(x @ Wq, x @ Wk, x @ Wv)[0] @ Wo
torch.testing.assert_close(mha(x), ours, atol=1e-5, rtol=1e-4)
print("tformer.MultiHeadAttention(n_heads=1) == the four steps followed by W_o")

# %% [markdown]
# ## 2. Self- vs cross-attention: one source or two
#
# Same layer, same weights. Self-attention: `mha(x)` reads `x`. Cross-attention: `mha(x, context)` asks
# with `x` and reads the context: the weights are $(T_q, T_k)$ with $T_k$ the context length, and the
# output changes with the context while the queries stay the same.

# %%
# Figure: Self-attention weights (T x T) beside cross-attention weights (T_q x T_k) of the same layer.
context = torch.randn(B, 11, d_model)
y_self, w_self = mha(x, need_weights=True)
y_cross, w_cross = mha(x, context, need_weights=True)
print("self-attention weights ", tuple(w_self.shape), "  cross-attention weights", tuple(w_cross.shape))
assert w_self.shape[-2:] == (T, T) and w_cross.shape[-2:] == (T, 11)
assert y_cross.shape == x.shape                                 # one output per *query*
y_other = mha(x, torch.randn(B, 11, d_model))
assert not torch.allclose(y_cross, y_other)                     # a different context, a different answer
torch.testing.assert_close(mha(x, x), y_self)                   # cross-attention to itself is self-attention
fig, axes = plt.subplots(1, 2, figsize=(8, 3))
heatmap(w_self[0, 0], ax=axes[0], title="self-attention: T x T")
heatmap(w_cross[0, 0], ax=axes[1], title="cross-attention: T_q x T_k (context)")
plt.tight_layout()

# %% [markdown]
# ## 3. Constant path length: one layer links every pair
#
# Take a sequence of length $T$ and look at the gradient of the *last* output with respect to every
# input position, $\lVert \partial\, \mathrm{out}_{T-1} / \partial x_i \rVert$. One self-attention layer:
# every position is one step away, so it is non-zero (and of similar size) for every $i$. A recurrent
# network (here `nn.RNN` and `nn.LSTM` at their default initialization) must carry $x_i$ through
# $T-1-i$ steps, and the gradient decays with the distance.

# %%
# Figure: Gradient of the last output with respect to each input position, against its distance: one self-attention layer, an RNN and an LSTM.
T_long = 64 if tformer.SMALL else 256
d = 32
x_seq = torch.randn(1, T_long, d)


def grad_to_last(f) -> torch.Tensor:
    """|d out[T-1] / d x_i| for every input position i (norm over features)."""
    xs = x_seq.clone().requires_grad_()
    out = f(xs)                                                 # (1, T, d_out)
    (g,) = torch.autograd.grad(out[0, -1].sum(), xs)
    return g[0].norm(dim=-1)                                    # (T,)


attn = tformer.MultiHeadAttention(d, n_heads=1)
rnn, lstm = nn.RNN(d, d, batch_first=True), nn.LSTM(d, d, batch_first=True)
g_attn = grad_to_last(attn)
g_rnn = grad_to_last(lambda s: rnn(s)[0])
g_lstm = grad_to_last(lambda s: lstm(s)[0])
distance = list(range(T_long - 1, -1, -1))                      # position i is T-1-i steps from the last
curves(distance, {"self-attention (1 layer)": g_attn.tolist(), "RNN": g_rnn.tolist(), "LSTM": g_lstm.tolist()},
       "distance from the last position (T-1-i)", "|d out_last / d x_i|", "how far does one output reach?",
       logy=True, marker="")
print(f"self-attention: smallest / largest gradient over all positions = {(g_attn.min() / g_attn.max()).item():.3f}")
print(f"RNN:  gradient at distance {T_long - 1} / at distance 0 = {(g_rnn[0] / g_rnn[-1]).item():.2e}")
print(f"LSTM: gradient at distance {T_long - 1} / at distance 0 = {(g_lstm[0] / g_lstm[-1]).item():.2e}")
assert (g_attn > 0).all()                                       # every position reaches the last output
assert (g_attn.min() / g_attn.max()) > 1e-2                     # ... with comparable strength
assert (g_rnn[0] / g_rnn[-1]) < 1e-6 and (g_lstm[0] / g_lstm[-1]) < 1e-6   # recurrence: decays with distance

# %% [markdown]
# ## Exercise 1: self-attention from $W_q$, $W_k$, $W_v$
# `x (B, T, d_model)`, `w_q, w_k (d_model, d_k)`, `w_v (d_model, d_v)` (used as `x @ w`). Return the
# output `(B, T, d_v)`. Scale by $\sqrt{d_k}$, the size of a key, which need not be `d_model`.

# %%
def my_self_attention(x, w_q, w_k, w_v):
    ### BEGIN SOLUTION
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v
    ### END SOLUTION


# %%
check("ch02.self_attention", my_self_attention)

# %% [markdown]
# ## Exercise 2: cross-attention
# Queries from `x (B, T_q, d_model)`, keys and values from `context (B, T_k, d_model)`. Return
# `(B, T_q, d_v)`.

# %%
def my_cross_attention(x, context, w_q, w_k, w_v):
    ### BEGIN SOLUTION
    q, k, v = x @ w_q, context @ w_k, context @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v
    ### END SOLUTION


# %%
check("ch02.cross_attention", my_cross_attention)

# %% [markdown]
# ## The package's version
# `tformer.MultiHeadAttention` keeps $W_q$, $W_k$, $W_v$ stacked in one `nn.Linear` (`qkv`) and $W_o$ in
# `out`; with a `context` it projects the queries from `x` and the keys and values from the context,
# as in your two functions. Its constructor (the forward pass is chapter 3's exercise):

# %%
print(inspect.getsource(tformer.MultiHeadAttention.__init__))

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** Section 2's layer attends from `x`, 7 positions, to a context of 11 positions. What shape
# is one head's matrix of attention weights, for one sequence?
# - **A.** $7 \times 7$
# - **B.** $11 \times 11$
# - **C.** $7 \times 11$
# - **D.** $11 \times 7$
#
# The cell under *2. Self- vs cross-attention* prints the shapes.

# %%
answer = "C"  ### ANSWER
check("ch02.q_cross_weights", answer)

# %% [markdown]
# **Question 2.** Between two positions of a sequence of $n$ tokens, what is the maximum path length (the
# number of steps information takes from one to the other) in one self-attention layer, and in a recurrent
# network?
# - **A.** $O(1)$ and $O(n)$
# - **B.** $O(n)$ and $O(n)$
# - **C.** $O(\log n)$ and $O(n)$
# - **D.** $O(1)$ and $O(1)$
#
# The figure under *3. Constant path length* shows it with gradients, and its cell prints how far they fall
# across the sequence.

# %%
answer = "A"  ### ANSWER
check("ch02.q_path_length", answer)

# %% [markdown]
# ## Summary
# * Self-attention: $Q, K, V$ from one sequence; cross-attention: $Q$ from one, $K, V$ from another
#   (the weights are $T_q \times T_k$).
# * The four steps, built by hand, equal `tformer.scaled_dot_product_attention` and `MultiHeadAttention`.
# * One layer connects every pair of positions: the gradient from the last output reaches every input
#   with comparable size, while through an RNN or LSTM it decays by many orders of magnitude.
