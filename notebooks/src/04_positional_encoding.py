# %% [markdown]
# # Chapter 4: Positional encoding
#
# **What this chapter covers.** Attention has no notion of order: shuffle the input tokens and the
# outputs come out shuffled the same way (it is *permutation-equivariant*). Order has to be added to
# the input. The paper adds a fixed table of sines and cosines,
#
# $$PE_{pos, 2i} = \sin(pos \cdot \omega_i),\qquad PE_{pos, 2i+1} = \cos(pos \cdot \omega_i),\qquad
# \omega_i = 10000^{-2i/d_{model}},$$
#
# chosen so that $PE_{pos+k}$ is a *fixed linear function* of $PE_{pos}$ (a rotation of each pair), which
# makes relative offsets easy to learn. Many later models learn the table instead; modern LLMs rotate
# queries and keys (RoPE). We measure each claim, then train the three on the same task and test them
# on sequences longer than any seen in training.
#
# **The tformer code it uses**: `tformer/positional.py: sinusoidal_table, SinusoidalPositionalEncoding,
# LearnedPositionalEmbedding, RotaryEmbedding, sinusoidal_shift_matrix`, `tformer/blocks.py: TransformerBlock`.
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
from tqdm import trange

import tformer
from tformer.grading import check
from tformer.utils.plot import heatmap

tformer.seed_everything(0)
print("small mode:", tformer.SMALL)

# %% [markdown]
# ## 1. Without positions, attention is permutation-equivariant
#
# Shuffle the positions of `x` with a permutation $\pi$; self-attention's output is the original output
# shuffled by the same $\pi$. The model cannot tell "dog bites man" from "man bites dog". Adding the
# positional table breaks the symmetry. The layer tested is `tformer.TransformerBlock`, one whole
# Transformer layer: attention, then a feed-forward network, each with a residual connection and a
# LayerNorm (chapter 5).

# %%
d_model, T = 32, 9
layer = tformer.TransformerBlock(tformer.BlockConfig(d_model=d_model, n_heads=4, d_ff=64, dropout=0.0)).eval()
x = torch.randn(1, T, d_model)
perm = torch.randperm(T)
with torch.no_grad():
    torch.testing.assert_close(layer(x[:, perm]), layer(x)[:, perm])
    print("no positions:   layer(shuffled x) == shuffled layer(x)")
    pe = tformer.SinusoidalPositionalEncoding(d_model)
    diff = (layer(pe(x[:, perm])) - layer(pe(x))[:, perm]).abs().max().item()
print(f"with positions: largest difference {diff:.3f}")
assert diff > 0.1

# %% [markdown]
# ## 2. The sinusoidal table
#
# Each pair of columns is a sine and a cosine of one frequency; the frequencies fall geometrically
# from 1 to $1/10000$ rad per position, so low columns change fast and high columns slowly.

# %%
# Figure: The sinusoidal table, features by position (left), and a few of its columns (right).
table = tformer.sinusoidal_table(128, 64)
fig, axes = plt.subplots(1, 2, figsize=(11, 3))
heatmap(table.T, ax=axes[0], vmin=-1, vmax=1, cmap="RdBu", title="PE: feature (rows) by position (columns)")
axes[0].set_xlabel("position"), axes[0].set_ylabel("feature")
for i in (0, 1, 10, 30):
    axes[1].plot(table[:, i], label=f"column {i}")
axes[1].set_xlabel("position"), axes[1].legend(fontsize=7), axes[1].set_title("a few columns")
plt.tight_layout()
assert torch.allclose(table.norm(dim=-1), torch.full((128,), math.sqrt(32)))   # every row: 32 pairs of sin^2+cos^2

# %% [markdown]
# The paper interleaves its columns: sine in the even ones, cosine in the odd ones. Its own code,
# tensor2tensor, and the published Marian translation models put every sine first and every cosine after.
# The two are the same table with its features reordered, so a model's first layer sees the same
# information either way (its weights permuted to match). The cell builds the second layout by hand and
# finds the first one inside it.

# %%
pos, w = torch.arange(128.0)[:, None], 10000 ** (-torch.arange(0, 64, 2) / 64)
concat = torch.cat([torch.sin(pos * w), torch.cos(pos * w)], dim=1)     # every sin, then every cos
perm = tformer.positional.sinusoidal_permutation(64)                     # [0, 2, 4, ..., 1, 3, 5, ...]
torch.testing.assert_close(table[:, perm], concat)
print(f"interleaved table, columns {perm[:3].tolist()} ... {perm[32:35].tolist()} ...: the concatenated table")

# %% [markdown]
# ## 3. $PE_{pos+k}$ is a fixed linear map of $PE_{pos}$
#
# Find the map from data: least squares for $M$ in $PE_{pos+k} \approx M\,PE_{pos}$ over all positions.
# If the claim holds, the fit is exact (residual at float precision), the same $M$ works at every
# position, and it equals the block-diagonal rotation `tformer.sinusoidal_shift_matrix(k, d)`:
# each pair $(\sin, \cos)$ turns by the angle $k\,\omega_i$.

# %%
# Figure: The least-squares map M_k from PE(pos) to PE(pos+k).
d, k, L = 16, 5, 20000                                     # long enough to see every frequency turn
pe64 = tformer.sinusoidal_table(L + k, d).double()
X, Y = pe64[:L], pe64[k:L + k]                              # rows: PE(pos) and PE(pos + k)
M_fit = torch.linalg.lstsq(X, Y).solution.T                 # Y = X M^T
M_k = tformer.sinusoidal_shift_matrix(k, d).double()
residual = (X @ M_fit.T - Y).abs().max().item()
print(f"least-squares residual {residual:.2e}; |M_fit - M_k| = {(M_fit - M_k).abs().max().item():.2e}")
assert residual < 1e-5 and torch.allclose(M_fit, M_k, atol=1e-4)
# the same matrix at positions far outside the fit
far = tformer.sinusoidal_table(50000 + k + 1, d).double()
torch.testing.assert_close(far[50000 + k], M_k @ far[50000], atol=1e-4, rtol=0)
heatmap(M_k, vmin=-1, vmax=1, cmap="RdBu", title=f"M_{k}: 2x2 rotation blocks");

# %% [markdown]
# ## 4. Learned positions, RoPE, and extrapolation past the training length
#
# A learned table (`tformer.LearnedPositionalEmbedding`) is a trainable vector per position: flexible,
# but a position never seen in training keeps its random initial vector. RoPE
# (`tformer.RotaryEmbedding`) instead rotates each query and key by an angle proportional to its
# position, so $q_t \cdot k_s$ depends only on $t - s$.
#
# A learned table simply has no row for a position past the length it was built for:

# %%
learned = tformer.LearnedPositionalEmbedding(max_len=32, d_model=8)
try:
    learned(torch.zeros(1, 40, 8))
    raise AssertionError("expected an error")
except ValueError as e:
    print("LearnedPositionalEmbedding(max_len=32) on 40 positions:", e)

# %% [markdown]
# The experiment: the same one-layer causal model with each of the three position schemes, trained on
# sequences of length 32 to output the token two positions back, then tested on length 64. The task
# is purely relative, so a scheme that *represents* relative offsets should keep working past 32. The
# block is pre-LN: each sublayer reads a LayerNorm of its input and adds its output back,
# $x + \mathrm{Sublayer}(\mathrm{LN}(x))$ (chapter 5 compares it with the paper's post-LN).

# %%
V, T_train, T_test, LAG = 16, 32, (64 if tformer.SMALL else 128), 2
width, steps = (32, 150) if tformer.SMALL else (64, 600)


class TinyLM(nn.Module):
    """Embedding + positions + one pre-LN causal tformer.TransformerBlock + output head."""

    def __init__(self, positions: str, d: int = width, n_heads: int = 2, max_len: int = T_test):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.pos = {"sinusoidal": tformer.SinusoidalPositionalEncoding(d, max_len),
                    "learned": tformer.LearnedPositionalEmbedding(max_len, d), "rope": None}[positions]
        self.rope = tformer.RotaryEmbedding(d // n_heads, max_len) if positions == "rope" else None
        block = tformer.BlockConfig(d_model=d, n_heads=n_heads, d_ff=4 * d, dropout=0.0, norm_first=True)
        self.block = tformer.TransformerBlock(block)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, V)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:      # (B, T) -> (B, T, V)
        x = self.emb(idx)
        if self.pos is not None:
            x = self.pos(x)
        return self.head(self.norm(self.block(x, is_causal=True, rope=self.rope)))

# %% [markdown]
# The data: random tokens, and the target at position $t$ is the token at $t-2$. Each scheme trains with
# the same seed on length 32 and is scored on fresh length-64 sequences, inside and past 32.

# %%
def lag_batch(n: int, t: int, g: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, V, (n, t), generator=g)
    y = torch.full((n, t), -100)
    y[:, LAG:] = x[:, :-LAG]
    return x, y


dev = tformer.device()                                          # a GPU in full mode, if there is one
x_test, y_test = lag_batch(256, T_test, torch.Generator().manual_seed(1))


def train_and_score(positions: str) -> tuple[float, float]:
    """Train TinyLM(positions) on length T_train; accuracy inside the training length and past it."""
    tformer.seed_everything(0)
    model = TinyLM(positions).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for step in trange(steps, desc=positions):
        xb, yb = (t.to(dev) for t in lag_batch(64, T_train))     # training never sees a position >= 32
        loss = F.cross_entropy(model(xb).flatten(0, 1), yb.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        correct = (model.cpu().eval()(x_test).argmax(-1) == y_test).float()
    return correct[:, LAG:T_train].mean().item(), correct[:, T_train:].mean().item()

# %% [markdown]
# Train the three and compare:

# %%
# Figure: Accuracy past the training length for each kind of position encoding, against chance.
results = {positions: train_and_score(positions) for positions in ("sinusoidal", "learned", "rope")}
print(f"accuracy (chance {1 / V:.3f})     positions < {T_train}   positions {T_train}..{T_test - 1}")
for positions, (inside, beyond) in results.items():
    print(f"  {positions:12s}             {inside:.3f}            {beyond:.3f}")
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar([p for p in results], [b for _, b in results.values()], color=["C0", "C1", "C2"])
ax.axhline(1 / V, color="gray", ls="--", label="chance")
ax.set_ylabel(f"accuracy at positions >= {T_train}"), ax.set_title("extrapolation past the training length")
ax.legend();

# %% [markdown]
# All three learn the task inside the training length. Past it, the learned table is at chance (those
# rows were never trained), the sinusoidal table keeps part of its accuracy (its positions are defined
# everywhere, but the model never saw those combinations of phases), and RoPE, relative by
# construction, keeps the most. Chapter 8 extends RoPE further with position interpolation, NTK and YaRN.

# %%
(s_in, s_out), (l_in, l_out), (r_in, r_out) = results["sinusoidal"], results["learned"], results["rope"]
assert min(s_in, l_in, r_in) > 0.95                           # inside the training length: all solved
assert l_out < 0.15                                            # learned: nothing past the trained rows
assert s_out > l_out + 0.1 and r_out > l_out + 0.3             # sinusoidal and RoPE extrapolate, partly
assert r_out > s_out                                           # RoPE the most

# %% [markdown]
# ## Exercise 1: the sinusoidal table
# Return the `(max_len, d_model)` table as float32 (compute in float64 and convert if you like: the
# angles reach hundreds of radians). `tformer.sinusoidal_table` is off limits.

# %%
def my_sinusoidal_table(max_len, d_model):
    ### BEGIN SOLUTION
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * omega)
    pe[:, 1::2] = torch.cos(pos * omega)
    return pe.float()
    ### END SOLUTION


# %%
check("ch04.sinusoidal_table", my_sinusoidal_table)

# %% [markdown]
# ## Exercise 2: the shift matrix
# Return $M_k$ `(d_model, d_model)`, float32, with $PE_{pos+k} = M_k\,PE_{pos}$ for every position
# ($k$ may be negative). Hint: $\sin(a+b) = \sin a\cos b + \cos a \sin b$.

# %%
def my_shift_matrix(k, d_model):
    ### BEGIN SOLUTION
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    i = torch.arange(0, d_model, 2)
    m[i, i], m[i, i + 1], m[i + 1, i], m[i + 1, i + 1] = c, s, -s, c
    return m.float()
    ### END SOLUTION


# %%
check("ch04.shift_matrix", my_shift_matrix)

# %% [markdown]
# ## The package's version
# What you wrote is what `tformer` ships in `tformer/positional.py`: the table, which
# `SinusoidalPositionalEncoding` adds to the embeddings, and the shift matrix, which no model runs: it is
# the property proved above, kept as a function to test it.

# %%
print(inspect.getsource(tformer.sinusoidal_table))
print(inspect.getsource(tformer.sinusoidal_shift_matrix))

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** A Transformer layer gets no positional encoding, and its input tokens are shuffled. Its
# output is:
# - **A.** the same as before, row for row.
# - **B.** different at every position.
# - **C.** the original output, shuffled the same way.
#
# The cell under *1. Without positions, attention is permutation-equivariant* checks it.

# %%
answer = "C"  ### ANSWER
check("ch04.q_permutation", answer)

# %% [markdown]
# **Question 2.** Section 3 fits a matrix $M_k$ with $PE_{pos+k} = M_k\,PE_{pos}$. What is it?
# - **A.** A permutation of the features.
# - **B.** A different matrix at each position.
# - **C.** $k$ times the identity.
# - **D.** One matrix for every position: it turns each (sin, cos) pair by the angle $k\,\omega_i$.
#
# The cell under *3. $PE_{pos+k}$ is a fixed linear map of $PE_{pos}$* fits it, tests it far from the fit
# and draws it.

# %%
answer = "D"  ### ANSWER
check("ch04.q_shift_matrix", answer)

# %% [markdown]
# **Question 3.** Trained on sequences of length 32 and tested past that length, which scheme's accuracy
# falls to chance?
# - **A.** The learned table.
# - **B.** The sinusoidal table.
# - **C.** RoPE.
# - **D.** None of them.
#
# The cell that trains the three in section 4 prints each one's accuracy inside and past the training
# length, with the chance level.

# %%
answer = "A"  ### ANSWER
check("ch04.q_extrapolation", answer)

# %% [markdown]
# ## Summary
# * Attention alone is permutation-equivariant (measured); positions must be added.
# * The sinusoidal table: $PE_{pos+k} = M_k PE_{pos}$ with one fixed rotation matrix $M_k$ for all
#   positions (fitted by least squares: exact).
# * Learned tables know only the positions they were trained on; on a relative task, sinusoidal
#   positions extrapolate partly and RoPE best.
