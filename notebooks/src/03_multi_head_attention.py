# %% [markdown]
# # Chapter 3: Multi-head attention
#
# **What this chapter covers.** One attention function averages everything it attends to into one
# vector: it can follow only one pattern at a time. Multi-head attention runs $h$ attention functions
# in parallel on $h$ different learned projections and concatenates the results:
#
# $$\mathrm{MultiHead}(X) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\,W_o,\qquad
# \mathrm{head}_i = \mathrm{Attention}(XW_q^{(i)}, XW_k^{(i)}, XW_v^{(i)}).$$
#
# The paper uses $h = 8$ heads of size $d_k = d_{model}/h = 64$. We build it from split / attend /
# merge / project, count its parameters and FLOPs against one full-width head (the same). Then we train a
# small model to watch its heads learn *different* patterns, next to a single head of the same size,
# whose one pattern has to serve both lookups at once.
#
# **The tformer code it uses**: `tformer/attention.py: split_heads, merge_heads, MultiHeadAttention,
# scaled_dot_product_attention`, `tformer/models/gpt.py: GPT, GPTConfig`, `tformer/utils/plot.py: heads_grid`.
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
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
from tqdm import trange

import tformer
from tformer.grading import check
from tformer.training.losses import causal_lm_loss
from tformer.models import GPT, GPTConfig
from tformer.utils.plot import curves, heads_grid

tformer.seed_everything(0)
print("small mode:", tformer.SMALL)

# %% [markdown]
# ## 1. Split, attend per head, concatenate, project
#
# One matrix computes all heads' queries at once: $XW_q$ is $(B, T, d_{model})$ and its features are
# cut into $h$ blocks of $d_k$. `tformer.split_heads` turns $(B, T, h\,d_k)$ into $(B, h, T, d_k)$ (a
# view plus a transpose), attention runs on every head in one batched call, and `merge_heads`
# concatenates the heads back. Built from these pieces with the weights of a `tformer.MultiHeadAttention`
# and of PyTorch's `nn.MultiheadAttention`, all three agree.

# %%
d_model, h, B, T = 512, 8, 2, 10                   # the paper: d_model = 512, h = 8, d_k = 64
mha = tformer.MultiHeadAttention(d_model, h)
x = torch.randn(B, T, d_model)

q, k, v = F.linear(x, mha.qkv.weight, mha.qkv.bias).split(d_model, dim=-1)    # h projections each, in one matmul
q, k, v = (tformer.split_heads(z, h) for z in (q, k, v))                       # (B, h, T, d_k)
heads, _ = tformer.scaled_dot_product_attention(q, k, v)                       # every head at once
y = F.linear(tformer.merge_heads(heads), mha.out.weight, mha.out.bias)         # concat, then W_o
print("q per head:", tuple(q.shape), " concatenated:", tuple(tformer.merge_heads(heads).shape), " out:", tuple(y.shape))

# %% [markdown]
# Copy the same weights into PyTorch's layer and compare all three:

# %%
torch_mha = nn.MultiheadAttention(d_model, h, batch_first=True)
with torch.no_grad():
    torch_mha.in_proj_weight.copy_(mha.qkv.weight), torch_mha.in_proj_bias.copy_(mha.qkv.bias)
    torch_mha.out_proj.weight.copy_(mha.out.weight), torch_mha.out_proj.bias.copy_(mha.out.bias)
    torch.testing.assert_close(y, mha(x), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(y, torch_mha(x, x, x, need_weights=False)[0], atol=1e-5, rtol=1e-4)
print("split/attend/merge/project == tformer.MultiHeadAttention == torch.nn.MultiheadAttention")

# %% [markdown]
# The transpose in `split_heads` matters: a bare `reshape(B, h, T, d_k)` gives the right *shape* but
# puts pieces of different positions into one "head". Check it: with the reshape, head 0 no longer
# holds the first $d_k$ features of every position.

# %%
wrong = q.transpose(1, 2).reshape(B, T, d_model).reshape(B, h, T, d_model // h)
x_q = tformer.merge_heads(q)
torch.testing.assert_close(q[:, 0], x_q[..., :64])            # right: head 0 = features 0..63 of each position
assert not torch.allclose(wrong[:, 0], x_q[..., :64])          # wrong: mixes positions
print("reshape without transpose: same shape", tuple(wrong.shape), "different heads")

# %% [markdown]
# ## 2. Same parameters and FLOPs as one full-width head
#
# $h$ heads of size $d_{model}/h$ use the same projection matrices as one head of size $d_{model}$
# (they are just cut into blocks), and the attention matmuls cost $h \cdot T^2 \cdot d_{model}/h$: the
# same. Count both with PyTorch's FLOP counter.

# %%
def count(n_heads: int, t: int = 128) -> tuple[int, int]:
    m = tformer.MultiHeadAttention(d_model, n_heads, fast=False)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        m(torch.randn(1, t, d_model))
    return sum(p.numel() for p in m.parameters()), fc.get_total_flops()

counts = {n: count(n) for n in (1, 2, 8, 16)}
for n, (p, f) in counts.items():
    print(f"h={n:2d}  d_k={d_model // n:3d}  parameters {p:,}  forward FLOPs (T=128) {f / 1e6:,.1f} M")
assert len({p for p, _ in counts.values()}) == 1 and len({f for _, f in counts.values()}) == 1
assert counts[8][0] == 4 * d_model * d_model + 4 * d_model      # W_q, W_k, W_v, W_o and their biases

# %% [markdown]
# ## 3. Heads learn different patterns (a trained model)
#
# Random heads attend almost uniformly. To see heads *specialize* we train a one-layer, four-head GPT
# (`tformer.models.GPT`: a stack of causal self-attention blocks that predicts the next token; chapter
# 11 builds it in full). Its task needs two different lookups at once: the input is a random sequence
# over 8 symbols and the target at position $t$ is the *pair* $(x_{t-1}, x_{t-3})$, one of 64 classes.
#
# One head has one attention pattern per query: to read both tokens it must spread its weight
# over two positions and *average* their values into one vector. Several heads can each fetch one token
# on its own. Section 4 trains a single head of the same size to see what it does instead.
# (Small mode trains for a few seconds; full mode longer.)

# %%
V, T_task, LAGS = 8, 16, (1, 3)


def make_batch(n: int, g: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, V, (n, T_task), generator=g)
    y = torch.full((n, T_task), -100)                             # -100: no target for the first 3 positions
    y[:, 3:] = x[:, 3 - LAGS[0]:T_task - LAGS[0]] * V + x[:, 3 - LAGS[1]:T_task - LAGS[1]]
    return x, y


def head_patterns(model: GPT, x: torch.Tensor) -> torch.Tensor:
    """Average attention weights of the first block over a batch: (n_heads, T, T)."""
    with torch.no_grad(), tformer.capture_attention(model.blocks[0].attn) as weights:
        logits = model(x)
    return weights[0].mean(0), logits

# %% [markdown]
# The training loop: AdamW (the Adam optimizer with weight decay applied to the weights directly;
# Loshchilov and Hutter, 2019) on fresh random batches, the same seed and steps for any head count.

# %%
steps = 160 if tformer.SMALL else 1000
dev = tformer.device()                                          # a GPU in full mode, if there is one
x_eval, y_eval = make_batch(256, torch.Generator().manual_seed(1))


def train_task(n_heads: int) -> tuple[GPT, list[float], float]:
    """A 1-layer GPT with n_heads heads (d_model 64 in all), trained on the pair task: model, losses, accuracy."""
    tformer.seed_everything(0)
    cfg = GPTConfig(vocab_size=V * V, context_length=T_task, n_layers=1, n_heads=n_heads, d_model=64, d_ff=128)
    model = GPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for step in trange(steps, desc=f"training, {n_heads} head(s)"):
        xb, yb = (t.to(dev) for t in make_batch(64))
        loss = causal_lm_loss(model(xb), targets=yb)          # positions labelled -100 carry no loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.cpu().eval()
    with torch.no_grad():
        acc = (model(x_eval).argmax(-1)[:, 3:] == y_eval[:, 3:]).float().mean().item()
    return model, losses, acc

# %% [markdown]
# Four heads: the attention patterns at initialization, then after training.

# %%
# Figure: Training loss of the 1-layer, 4-head GPT on the two-lookup task.
tformer.seed_everything(0)
w_random, _ = head_patterns(GPT(GPTConfig(vocab_size=V * V, context_length=T_task, n_layers=1, n_heads=4, d_model=64,
                                          d_ff=128)), x_eval)       # the same initial weights train_task starts from
model, losses, acc = train_task(4)
w_trained, _ = head_patterns(model, x_eval)
print(f"loss {losses[0]:.2f} -> {losses[-1]:.3f}; accuracy on fresh sequences {acc:.3f} (chance 1/64 = {1/64:.3f})")
curves(range(steps), {"train loss": losses}, "step", "cross-entropy", "training the 1-layer, 4-head GPT", marker="");

# %% [markdown]
# The heat maps: each head's average attention (query position down, key position across). After
# training, one head sits on the diagonal one below the main diagonal (it reads the previous token),
# another on the diagonal three below (it reads $x_{t-3}$). At initialization every head is a blur.

# %%
# Figure: Each head's mean attention (query down, key across), at random initialization and after training.
def lag_mass(w: torch.Tensor, lag: int) -> torch.Tensor:
    """Mean weight each head puts on key t - lag, over the query positions t >= 3: (n_heads,)."""
    return torch.diagonal(w, offset=-lag, dim1=-2, dim2=-1)[:, 3 - lag:].mean(-1)

heads_grid(w_random, suptitle="random initialization")
heads_grid(w_trained, suptitle="after training: heads specialize")
for name, w in (("random", w_random), ("trained", w_trained)):
    print(f"{name:8s} weight on t-1 per head: {lag_mass(w, 1).numpy().round(2)}   on t-3: {lag_mass(w, 3).numpy().round(2)}")
m1, m3 = lag_mass(w_trained, 1), lag_mass(w_trained, 3)
assert acc > 0.9                                               # the task is solved ...
assert m1.max() > 0.5 and m3.max() > 0.4                       # ... by a previous-token head and a t-3 head
assert m1.argmax() != m3.argmax()                              # ... which are different heads
assert lag_mass(w_random, 1).max() < 0.3 and lag_mass(w_random, 3).max() < 0.3   # random heads do neither

# %% [markdown]
# ## 4. One head of the same size: it must blend
#
# The control: the same model with **one** head of size 64 instead of four of size 16 (the same
# parameters, section 2), trained with the same seed, batches and steps. Its single pattern has to serve
# both lags.

# %%
# Figure: Training loss with the same parameters: four heads of 16 against one head of 64.
model_1, losses_1, acc_1 = train_task(1)
w_one, _ = head_patterns(model_1, x_eval)
print(f"1 head:  accuracy {acc_1:.3f}, weight on t-1 {lag_mass(w_one, 1).item():.2f}, on t-3 {lag_mass(w_one, 3).item():.2f}")
print(f"4 heads: accuracy {acc:.3f}")
assert sum(p.numel() for p in model_1.parameters()) == sum(p.numel() for p in model.parameters())
assert acc_1 > 0.9                                                              # one head solves it too ...
assert lag_mass(w_one, 1).item() > 0.15 and lag_mass(w_one, 3).item() > 0.15   # ... with one pattern on both lags
assert max(m1.max(), m3.max()) > max(lag_mass(w_one, 1), lag_mass(w_one, 3))     # four heads: sharper
curves(range(steps), {"4 heads of 16": losses, "1 head of 64": losses_1}, "step", "cross-entropy",
       "the same parameters, one head vs four", marker="");

# %% [markdown]
# Measured: the single head solves this task too (accuracy printed above and asserted), so at this size
# one head is not a limit. What it cannot do is fetch the two tokens separately: its one pattern puts
# part of its weight on $t-1$ and part on $t-3$ (printed above) and returns a weighted *blend* of the
# two values, which is the paper's "one head averages". The blend loses resolution only when it can no longer be
# unmixed; here the two weights differ, so the blend still says which token sat where, and 8 symbols in
# 64 dimensions leave room for the feed-forward layer (the two-layer MLP after attention in every
# block, applied to each position on its own; chapter 5) to decode it.
#
# What the four heads add here is a
# separate, sharper lookup for each lag (the heat maps of section 3, and the larger weights printed
# there). The paper's reason for several heads is that with a single head "averaging inhibits"
# attending to different positions at once; on this small task that shows as a blended, less sharp
# pattern, not as a lower accuracy.
#
# ## Exercise 1: split heads
# `(B, T, n_heads * d_head) -> (B, n_heads, T, d_head)`; head $i$ gets features $i\,d_{head}$ to
# $(i+1)\,d_{head}-1$ of every position. (`tformer.split_heads` is off limits.)

# %%
def my_split_heads(x, n_heads):
    ### BEGIN SOLUTION
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)
    ### END SOLUTION


# %%
check("ch03.split_heads", my_split_heads)

# %% [markdown]
# ## Exercise 2: merge heads (the concatenation)
# `(B, n_heads, T, d_head) -> (B, T, n_heads * d_head)`, the inverse of `split_heads`.

# %%
def my_merge_heads(x):
    ### BEGIN SOLUTION
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)
    ### END SOLUTION


# %%
check("ch03.merge_heads", my_merge_heads)

# %% [markdown]
# ## Exercise 3: the multi-head attention forward pass
# Weights in `nn.Linear` layout: `w_qkv (3 d_model, d_model)` (rows: $W_q$, then $W_k$, then $W_v$),
# `b_qkv (3 d_model,)`, `w_o (d_model, d_model)`, `b_o (d_model,)`. Self-attention, no mask. You may
# reuse your functions from exercises 1 and 2.

# %%
def my_mha_forward(x, w_qkv, b_qkv, w_o, b_o, n_heads):
    ### BEGIN SOLUTION
    d = x.shape[-1]
    q, k, v = (x @ w_qkv.T + b_qkv).split(d, dim=-1)
    q, k, v = (my_split_heads(z, n_heads) for z in (q, k, v))
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // n_heads), dim=-1)
    return my_merge_heads(weights @ v) @ w_o.T + b_o
    ### END SOLUTION


# %%
check("ch03.mha_forward", my_mha_forward)

# %% [markdown]
# ## The package's version
# What you wrote in the three exercises is what `tformer` runs. Its `split_heads` and `merge_heads`:

# %%
print(inspect.getsource(tformer.split_heads))
print(inspect.getsource(tformer.merge_heads))

# %% [markdown]
# and the forward pass of `MultiHeadAttention` (with the KV cache, RoPE, Qwen3's QK-norm and grouped-query
# attention of chapters 8, 11 and 14 as extra steps around the same project / split / attend / merge /
# project; which kernel attends is `tformer/kernels.py`'s choice):

# %%
print(inspect.getsource(tformer.MultiHeadAttention.forward))

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** How many parameters does a `tformer.MultiHeadAttention` with $d_{model} = 512$ and
# $h = 4$ heads have, biases included? Answer with a number. The cell under *2. Same parameters and FLOPs
# as one full-width head* counts them for other numbers of heads.

# %%
answer = 1_050_624  ### ANSWER
check("ch03.q_params", answer)

# %% [markdown]
# **Question 2.** Section 4 trains one head of size 64 on the task that needs both $x_{t-1}$ and $x_{t-3}$.
# What does it learn?
# - **A.** Nothing useful: its accuracy stays near chance.
# - **B.** It solves the task, splitting its weight between $t-1$ and $t-3$ and blending the two values.
# - **C.** It solves the task by reading $t-1$ alone.
# - **D.** It learns two sharp patterns, one per lag, as the four heads do.
#
# The cell under *4. One head of the same size* prints its accuracy and its weight on each lag.

# %%
answer = "B"  ### ANSWER
check("ch03.q_one_head", answer)

# %% [markdown]
# ## Summary
# * Multi-head attention = project, split into $h$ heads, attend per head, concatenate, project with
#   $W_o$; built by hand it equals `tformer.MultiHeadAttention` and `torch.nn.MultiheadAttention`.
# * $h$ heads of size $d_{model}/h$ cost exactly the parameters and FLOPs of one full-width head.
# * Trained on a task that needs two lookups, different heads learn different patterns (previous
#   token, three back), measured on the attention weights.
# * A single head of the same size also solves the two-lookup task, by blending the two tokens with
#   unequal weights: one pattern per query has to average what it reads, multiple heads keep the
#   lookups apart.
