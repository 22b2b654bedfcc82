# %% [markdown]
# # Chapter 5: Residual connections, LayerNorm and the feed-forward network
#
# **What this chapter covers.** Every sublayer of the Transformer (attention, feed-forward) is wrapped
# in a residual connection and a layer normalization. The paper's order is *post-LN*,
#
# $$x \leftarrow \mathrm{LayerNorm}(x + \mathrm{Sublayer}(x)),$$
#
# later models (GPT-2, ViT) use *pre-LN*, $x \leftarrow x + \mathrm{Sublayer}(\mathrm{LayerNorm}(x))$.
# The residual path gives the gradient a direct route to the early layers; LayerNorm normalizes each
# token's features; the position-wise feed-forward network $\mathrm{FFN}(x) = W_2\,\mathrm{ReLU}(W_1 x +
# b_1) + b_2$ expands each token to $d_{ff} = 4\,d_{model}$ and contracts it back, with the same
# weights at every position. Each claim is measured below.
#
# **The tformer code it uses**: `tformer/blocks.py: FeedForward, TransformerBlock, BlockConfig`,
# `tformer/attention.py: MultiHeadAttention`, `tformer/utils/plot.py: curves`.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in an exercise cell with your code,
# run it, then run the `check(...)` cell below it: it prints PASS, or the smallest failing input with a
# hint (and the name of a common mistake when it recognizes one).

# %%
import inspect

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

import tformer
from tformer.grading import check
from tformer.utils.plot import curves

tformer.seed_everything(0)
print("small mode:", tformer.SMALL)

# %% [markdown]
# ## 1. The residual path keeps gradients alive in deep stacks
#
# Stack $N$ feed-forward sublayers (`tformer.FeedForward`) three ways and measure the gradient that
# reaches the **first** layer's weights:
# * no residual: $x \leftarrow \mathrm{LN}(\mathrm{FFN}(x))$;
# * post-LN with residual (the paper): $x \leftarrow \mathrm{LN}(x + \mathrm{FFN}(x))$;
# * pre-LN with residual: $x \leftarrow x + \mathrm{FFN}(\mathrm{LN}(x))$.

# %%
d = 32


class FFNStack(nn.Module):
    def __init__(self, n_layers: int, kind: str):
        super().__init__()
        self.kind = kind
        self.ffn = nn.ModuleList(tformer.FeedForward(d, 4 * d) for _ in range(n_layers))
        self.ln = nn.ModuleList(nn.LayerNorm(d) for _ in range(n_layers))

    def forward(self, x):
        for ffn, ln in zip(self.ffn, self.ln):
            x = {"no residual": lambda: ln(ffn(x)), "post-LN + residual": lambda: ln(x + ffn(x)),
                 "pre-LN + residual": lambda: x + ffn(ln(x))}[self.kind]()
        return x

# %% [markdown]
# For each depth, one backward pass of a random linear loss; the norm of the gradient on layer 1's $W_1$:

# %%
# Figure: Gradient norm at the first layer against depth, without a residual, with post-LN and with pre-LN.
def first_layer_grad(n_layers: int, kind: str) -> float:
    torch.manual_seed(0)
    m = FFNStack(n_layers, kind)
    x = torch.randn(16, 8, d, generator=torch.Generator().manual_seed(1))
    y = m(x)
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(2))).sum().backward()  # a random linear loss
    return m.ffn[0].fc1.weight.grad.norm().item()


depths = [2, 4, 8, 16, 32, 64] if tformer.SMALL else [2, 4, 8, 16, 32, 64, 128, 256]
kinds = ["no residual", "post-LN + residual", "pre-LN + residual"]
grads = {kind: [first_layer_grad(n, kind) for n in depths] for kind in kinds}
curves(depths, grads, "layers", "|grad| of layer 1's W_1", "gradient reaching the first layer", logx=True, logy=True)
for kind, g in grads.items():
    print(f"{kind:20s}", "  ".join(f"{v:9.3g}" for v in g))
no_res, post = grads["no residual"], grads["post-LN + residual"]
assert no_res[-1] < 0.05 * no_res[0]                          # without the residual: decays with depth
assert post[-1] > 0.5 * post[0] and post[-1] > 20 * no_res[-1]  # with it: stays the same size

# %% [markdown]
# ## 2. Post-LN (the paper) vs pre-LN
#
# Both are `tformer.TransformerBlock`, built from a `tformer.BlockConfig` whose `norm_first` is `False` /
# `True` (every model in the course fills one such config for its blocks). First, build one post-LN layer from
# its parts and check it is the module.
#
# Then stack 12 of each and watch the residual stream (the running sum $x$ that every sublayer reads
# from and adds its output to): post-LN
# renormalizes after every layer (each token's features keep standard deviation 1), pre-LN keeps
# adding to an un-normalized stream whose size grows with depth, with a clean identity path from the
# output to every layer. The right panel shows the gradient each layer's attention weights receive at
# initialization in both. The paper's post-LN needs a learning-rate warmup to train stably; pre-LN
# usually does not (chapter 10 trains both, with and without warmup).

# %%
cfg = tformer.BlockConfig(d_model=d, n_heads=4, d_ff=4 * d, dropout=0.0, norm_first=False)
layer = tformer.TransformerBlock(cfg).eval()
x = torch.randn(2, 6, d)
with torch.no_grad():
    h = layer.norm1(x + layer.attn(x))                         # x = LN(x + MHA(x))
    h = layer.norm2(h + layer.ffn(h))                          # x = LN(x + FFN(x))
    torch.testing.assert_close(h, layer(x))
print("LN(x + FFN(LN(x + MHA(x)))) == tformer.TransformerBlock(BlockConfig(norm_first=False))")

# %% [markdown]
# Now 12 layers of each kind: the size of the residual stream after every layer, and the gradient each
# layer's attention weights receive.

# %%
# Figure: The residual stream's size after every layer (left) and the gradient reaching each layer (right).
n_layers = 12 if tformer.SMALL else 48
stream_std, layer_grads = {}, {}
for norm_first, name in ((False, "post-LN"), (True, "pre-LN")):
    torch.manual_seed(0)
    block = tformer.BlockConfig(d_model=d, n_heads=4, d_ff=4 * d, dropout=0.0, norm_first=norm_first)
    stack = nn.ModuleList(tformer.TransformerBlock(block) for _ in range(n_layers))
    h, stds = torch.randn(8, 16, d, generator=torch.Generator().manual_seed(1)), []
    for blk in stack:
        h = blk(h)
        stds.append(h.std(-1).mean().item())
    (h * torch.randn(h.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    stream_std[name] = stds
    layer_grads[name] = [blk.attn.qkv.weight.grad.norm().item() for blk in stack]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
curves(range(1, n_layers + 1), stream_std, "layer", "per-token std of the stream", "forward: residual stream", ax=axes[0])
curves(range(1, n_layers + 1), layer_grads, "layer", "|grad| of W_qkv", "backward: gradient per layer", ax=axes[1])
plt.tight_layout()
print("stream std after the last layer:", {k: round(v[-1], 2) for k, v in stream_std.items()})
assert all(abs(s - 1) < 0.05 for s in stream_std["post-LN"])  # post-LN: normalized after every layer
assert stream_std["pre-LN"][-1] > 1.2 * stream_std["pre-LN"][0]  # pre-LN: the stream grows with depth

# %% [markdown]
# ## 3. LayerNorm normalizes each token's features
#
# $\mathrm{LN}(x) = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta$ with $\mu, \sigma^2$ the
# mean and (biased) variance of **one token's** $d$ features. So every token comes out with mean 0 and
# variance 1 over its features (before $\gamma, \beta$), whatever its scale; and unlike BatchNorm a token's
# output does not depend on the other tokens in the batch.

# %%
ln = nn.LayerNorm(d, elementwise_affine=False)
x = torch.randn(4, 10, d) * (torch.rand(4, 10, 1) * 10 + 0.5) + torch.randn(4, 10, 1) * 5   # tokens of all scales
y = ln(x)
print(f"per token:   mean {y.mean(-1).abs().max():.1e} (max |.|), variance {y.var(-1, unbiased=False).mean():.4f}")
print(f"per feature: variance across tokens ranges {y.var((0, 1)).min():.2f} .. {y.var((0, 1)).max():.2f} (not normalized)")
assert torch.allclose(y.mean(-1), torch.zeros(4, 10), atol=1e-5)
assert torch.allclose(y.var(-1, unbiased=False), torch.ones(4, 10), atol=1e-3)
torch.testing.assert_close(ln(3.0 * x + 7.0), y, atol=1e-4, rtol=1e-4)          # invariant to each token's scale and shift
x2 = x.clone()
x2[1:] = torch.randn(3, 10, d) * 100                            # change every *other* sequence in the batch
torch.testing.assert_close(ln(x2)[0], y[0])                     # LayerNorm: token outputs unchanged
bn = nn.BatchNorm1d(d).train()
assert not torch.allclose(bn(x2.transpose(1, 2))[0], bn(x.transpose(1, 2))[0])   # BatchNorm: they change
print("LayerNorm: a token's output ignores the rest of the batch; BatchNorm's does not")

# %% [markdown]
# ## 4. The position-wise feed-forward network
#
# Expand $d \to d_{ff}$, ReLU, contract $d_{ff} \to d$. "Position-wise" means the *same* weights are
# applied to every token independently: running the FFN on the whole sequence equals running it on
# each token alone, equals a 1x1 convolution over positions, and shuffling positions shuffles the output.

# %%
ffn = tformer.FeedForward(512, 2048)                            # the paper: d_model = 512, d_ff = 2048
print("W_1", tuple(ffn.fc1.weight.shape), "(expand)   W_2", tuple(ffn.fc2.weight.shape), "(contract)   "
      f"parameters {sum(p.numel() for p in ffn.parameters()):,} = 2 * 512 * 2048 + 2048 + 512")
assert sum(p.numel() for p in ffn.parameters()) == 2 * 512 * 2048 + 2048 + 512
x = torch.randn(2, 7, 512)
with torch.no_grad():
    y = ffn(x)
    one_by_one = torch.stack([ffn(x[:, t]) for t in range(7)], dim=1)
    conv1 = nn.Conv1d(512, 2048, 1)
    conv2 = nn.Conv1d(2048, 512, 1)
    conv1.weight.copy_(ffn.fc1.weight[..., None]), conv1.bias.copy_(ffn.fc1.bias)
    conv2.weight.copy_(ffn.fc2.weight[..., None]), conv2.bias.copy_(ffn.fc2.bias)
    as_conv = conv2(F.relu(conv1(x.transpose(1, 2)))).transpose(1, 2)
    perm = torch.randperm(7)
    torch.testing.assert_close(y, one_by_one)
    torch.testing.assert_close(y, as_conv, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ffn(x[:, perm]), y[:, perm])
print("FFN(sequence) == FFN(each token) == two 1x1 convolutions; it commutes with shuffling positions")

# %% [markdown]
# ## Exercise 1: LayerNorm
# `x (..., d)`, `weight (d,)`, `bias (d,)`, `eps`. Normalize over the last axis with the **biased**
# variance. `F.layer_norm` and `nn.LayerNorm` are off limits.

# %%
def my_layer_norm(x, weight, bias, eps=1e-5):
    ### BEGIN SOLUTION
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias
    ### END SOLUTION


# %%
check("ch05.layer_norm", my_layer_norm)

# %% [markdown]
# ## Exercise 2: the position-wise FFN
# `x (B, T, d)`, `w1 (d_ff, d)`, `b1 (d_ff,)`, `w2 (d, d_ff)`, `b2 (d,)` in `nn.Linear` layout.

# %%
def my_ffn(x, w1, b1, w2, b2):
    ### BEGIN SOLUTION
    return torch.relu(x @ w1.T + b1) @ w2.T + b2
    ### END SOLUTION


# %%
check("ch05.ffn", my_ffn)

# %% [markdown]
# ## Exercise 3: a post-LN encoder layer
# `params` is the `state_dict` of a `tformer.TransformerBlock`: `attn.qkv.weight (3d, d)`, `attn.qkv.bias`,
# `attn.out.weight`, `attn.out.bias`, `ffn.fc1.*`, `ffn.fc2.*`, `norm1.*`, `norm2.*`. Compute
# $x \leftarrow \mathrm{LN}_1(x + \mathrm{MHA}(x))$, then $x \leftarrow \mathrm{LN}_2(x + \mathrm{FFN}(x))$
# with `n_heads` heads, no mask, LayerNorm eps 1e-5. Reuse your functions.

# %%
def my_encoder_layer(x, params, n_heads):
    ### BEGIN SOLUTION
    p = params
    b, t, d = x.shape
    q, k, v = (x @ p["attn.qkv.weight"].T + p["attn.qkv.bias"]).split(d, dim=-1)
    q, k, v = (z.view(b, t, n_heads, d // n_heads).transpose(1, 2) for z in (q, k, v))
    att = torch.softmax(q @ k.transpose(-2, -1) / (d // n_heads) ** 0.5, dim=-1) @ v
    att = att.transpose(1, 2).reshape(b, t, d) @ p["attn.out.weight"].T + p["attn.out.bias"]
    x = my_layer_norm(x + att, p["norm1.weight"], p["norm1.bias"])
    f = my_ffn(x, p["ffn.fc1.weight"], p["ffn.fc1.bias"], p["ffn.fc2.weight"], p["ffn.fc2.bias"])
    return my_layer_norm(x + f, p["norm2.weight"], p["norm2.bias"])
    ### END SOLUTION


# %%
check("ch05.encoder_layer", my_encoder_layer)

# %% [markdown]
# ## The package's version
# What you wrote is what `tformer` runs: the feed-forward network and the encoder layer's forward pass
# in `tformer/blocks.py` (`norm_first` picks post-LN or pre-LN).

# %%
print(inspect.getsource(tformer.FeedForward.forward))
print(inspect.getsource(tformer.TransformerBlock.forward))

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** In section 1, how does the gradient that reaches the first of 64 layers compare with the
# one at the first of 2 layers?
# - **A.** Without the residual it grows with depth.
# - **B.** About the same with or without the residual: the LayerNorm after every layer keeps it alive.
# - **C.** Without the residual it shrinks by orders of magnitude; with it (post-LN) it keeps its size.
# - **D.** With the residual it shrinks too, only more slowly.
#
# The table printed under section 1's figure holds the numbers, one column per depth.

# %%
answer = "C"  ### ANSWER
check("ch05.q_residual", answer)

# %% [markdown]
# **Question 2.** LayerNorm computes its mean and variance over:
# - **A.** the features of one token.
# - **B.** one feature, over the tokens of the batch.
# - **C.** one feature, over the positions of one sequence.
# - **D.** every number of the tensor at once.
#
# The cell under *3. LayerNorm normalizes each token's features* measures both ways.

# %%
answer = "A"  ### ANSWER
check("ch05.q_layernorm", answer)

# %% [markdown]
# **Question 3.** The paper's FFN, $d_{model} = 512$ and $d_{ff} = 2048$, runs on a sequence of 7 tokens.
# How many parameters does it use, biases included? Answer with a number. The cell under *4. The
# position-wise feed-forward network* runs it on 7 tokens.

# %%
answer = 2_099_712  ### ANSWER
check("ch05.q_ffn_params", answer)

# %% [markdown]
# ## Summary
# * Without residual connections the gradient at the first layer shrinks with depth; with them it
#   keeps its size (measured to 64 layers).
# * Post-LN renormalizes the stream after every sublayer; pre-LN lets it grow and keeps an identity
#   path (chapter 10: post-LN needs warmup).
# * LayerNorm normalizes each token over its features, independently of the rest of the batch.
# * The FFN expands to $d_{ff}$ and contracts back, with the same weights at every position.
