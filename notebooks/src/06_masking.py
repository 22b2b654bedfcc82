# %% [markdown]
# # Chapter 6: Masking
#
# **What this chapter covers.** A mask decides which keys each query may see. Masked scores are set to
# $-\infty$ before the softmax, so their weight is exactly 0: the mask is part of the layer's
# mathematics, not an implementation detail. Three masks matter:
# * the **causal** mask in the decoder's self-attention: position $t$ sees only positions $\le t$, so
#   changing a future token can never change a past output (what autoregressive generation needs);
# * **cross-attention** (no mask over the source, only padding): each decoder position reads the
#   encoder output, and after training it aligns with the source position it needs;
# * the **padding** mask: padded keys are invisible, so a padded batch gives exactly the results each
#   sequence gives alone.
#
# tformer's convention: a bool mask, **True = may attend**, broadcastable to `(B, H, T_q, T_k)`.
#
# **The tformer code it uses**: `tformer/masks.py: causal_mask, padding_mask`,
# `tformer/attention.py: scaled_dot_product_attention`, `tformer/models/transformer.py: Transformer`,
# `tformer/models/gpt.py: GPT`.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in an exercise cell with your code,
# run it, then run the `check(...)` cell below it: it prints PASS, or the smallest failing input with a
# hint (and the name of a common mistake when it recognizes one).

# %%
import inspect

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from tqdm import trange

import tformer
from tformer.grading import check
from tformer.models import GPT, GPTConfig, Transformer, TransformerConfig
from tformer.utils.plot import curves, heads_grid, heatmap

tformer.seed_everything(0)
print("small mode:", tformer.SMALL)

# %% [markdown]
# ## 1. $-\infty$ gives exactly zero weight
#
# Hide the last 3 of 8 keys. With $-\infty$ their weight is exactly 0.0 and the output does not depend
# on their values at all (bit for bit). A finite penalty only shrinks the weight: $-10$ still leaks.

# %%
q, k, v = torch.randn(1, 1, 4, 16) * 2, torch.randn(1, 1, 8, 16) * 2, torch.randn(1, 1, 8, 16)
keep = torch.tensor([[True] * 5 + [False] * 3])                # (1, T_k): True = may attend, same for every query
scores = q @ k.transpose(-2, -1) / 4.0                           # (1, 1, 4, 8), scaled by sqrt(16)
leak = {}
for penalty in (-1.0, -10.0, -100.0, float("-inf")):
    p = torch.softmax(scores.masked_fill(~keep, penalty), dim=-1)
    leak[penalty] = p[..., ~keep[0]].sum(-1).max().item()
    print(f"masked scores set to {penalty:>6}: weight left on the hidden keys {leak[penalty]:.3g}")
assert leak[float("-inf")] == 0.0 and leak[-10.0] > 0

out, w = tformer.scaled_dot_product_attention(q, k, v, mask=keep)
v_changed = v.clone()
v_changed[..., ~keep[0], :] = 1e6                                   # rewrite the hidden values
out2, _ = tformer.scaled_dot_product_attention(q, k, v_changed, mask=keep)
assert torch.equal(w[..., ~keep[0]], torch.zeros_like(w[..., ~keep[0]]))  # exactly zero weight
assert torch.equal(out, out2)                                     # the output ignores them, bit for bit
print("with -inf: hidden keys get weight exactly 0.0 and their values cannot change the output")

# %% [markdown]
# ## 2. The causal mask: the future never changes the past
#
# `tformer.causal_mask(T)` is lower-triangular (query $i$ sees keys $j \le i$). When a KV cache (the keys
# and values of earlier tokens, kept so that generation computes them once; chapter 14) already
# holds earlier tokens ($T_k > T_q$) the queries are the *last* $T_q$ positions, so the triangle is
# aligned bottom-right. The experiment: a GPT (`tformer.models.GPT`, causal in every layer), fed a
# sequence and the same sequence with every token after position 5 replaced. Outputs at positions
# 0..5 are identical; a bidirectional layer (no mask) lets the change leak backwards.

# %%
# Figure: causal_mask(6), and causal_mask(2, 6): two new queries after 4 cached keys.
fig, axes = plt.subplots(1, 2, figsize=(7, 3))
heatmap(tformer.causal_mask(6).float(), ax=axes[0], title="causal_mask(6)", colorbar=False)
heatmap(tformer.causal_mask(2, 6).float(), ax=axes[1], title="causal_mask(2, 6): 4 cached keys", colorbar=False)
plt.tight_layout()

gpt = GPT(GPTConfig(vocab_size=50, context_length=16, n_layers=2, n_heads=2, d_model=32)).eval()
a = torch.randint(0, 50, (1, 12))
b = a.clone()
b[:, 6:] = torch.randint(0, 50, (1, 6))                          # a different future
with torch.no_grad():
    la, lb = gpt(a), gpt(b)
past_change = (la[:, :6] - lb[:, :6]).abs().max().item()
future_change = (la[:, 6:] - lb[:, 6:]).abs().max().item()
print(f"causal GPT: change in outputs at positions 0..5 = {past_change:.1e}, at 6..11 = {future_change:.2f}")
assert past_change < 1e-5 and future_change > 1e-2

layer = tformer.TransformerBlock(tformer.BlockConfig(d_model=32, n_heads=2, d_ff=64, dropout=0.0)).eval()
x = torch.randn(1, 12, 32)
x2 = x.clone()
x2[:, 6:] = torch.randn(1, 6, 32)
with torch.no_grad():
    leak_bi = (layer(x)[:, :6] - layer(x2)[:, :6]).abs().max().item()
    leak_causal = (layer(x, is_causal=True)[:, :6] - layer(x2, is_causal=True)[:, :6]).abs().max().item()
print(f"one layer, no mask: past outputs change by {leak_bi:.2f}; with is_causal=True: {leak_causal:.1e}")
assert leak_bi > 1e-2 and leak_causal < 1e-5

# %% [markdown]
# ## 3. Cross-attention aligns the decoder with the encoder output
#
# A small encoder-decoder (`tformer.models.Transformer`: one encoder and one decoder layer, 2 heads)
# learns to **reverse** a sequence of 8 symbols. Decoder position $j$ must output source token
# $S-1-j$, and its cross-attention learns to look there: the weights form the anti-diagonal.

# %%
V, S, BOS = 12, 8, 1                                             # ids: 0 = padding, 1 = start, 2..11 = symbols
cfg = TransformerConfig(src_vocab_size=V, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
                        n_decoder_layers=1, dropout=0.0, context_length=32)


def reverse_batch(n: int, g: torch.Generator | None = None):
    src = torch.randint(2, V, (n, S), generator=g)
    tgt = src.flip(1)
    dec_in = torch.cat([torch.full((n, 1), BOS), tgt[:, :-1]], dim=1)   # teacher forcing: shifted right
    return src, dec_in, tgt

# %% [markdown]
# Train it with teacher forcing (the decoder reads the target shifted right):

# %%
tformer.seed_everything(0)
dev = tformer.device()                                          # a GPU in full mode, if there is one
seq2seq = Transformer(cfg).to(dev)
opt = torch.optim.Adam(seq2seq.parameters(), lr=3e-3)
steps = 250 if tformer.SMALL else 1000
losses = []
for step in trange(steps, desc="training"):
    src, dec_in, tgt = (t.to(dev) for t in reverse_batch(64))
    loss = F.cross_entropy(seq2seq(src, dec_in).flatten(0, 1), tgt.flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())

# %% [markdown]
# Record the decoder's cross-attention weights on fresh sequences, and measure how much of each target
# position's weight sits on the aligned source token $S-1-j$:

# %%
# Figure: The decoder's cross-attention per head on the reversal task (rows: target position, columns: source position).
seq2seq.cpu().eval()
cross = seq2seq.decoder.layers[0].cross_attn
src, dec_in, tgt = reverse_batch(128, torch.Generator().manual_seed(1))
with torch.no_grad(), tformer.capture_attention(cross) as weights:
    acc = (seq2seq(src, dec_in).argmax(-1) == tgt).float().mean().item()
w_cross = weights[0].mean(0)                                  # (heads, T_tgt, S) averaged over the batch
anti = w_cross.flip(-1).diagonal(dim1=-2, dim2=-1).mean(-1)       # weight on source position S-1-j
print(f"loss {losses[0]:.2f} -> {losses[-1]:.3f}; reversal accuracy {acc:.3f}; "
      f"cross-attention weight on the aligned source token, per head: {anti.numpy().round(2)}")
heads_grid(w_cross, suptitle="decoder cross-attention (rows: target position, columns: source position)")
assert acc > 0.9 and anti.max() > 0.5                             # uniform attention would give 1/8

# %% [markdown]
# ## 4. Padding: a padded batch equals each sequence alone
#
# Sequences of different lengths share a batch by padding them to the longest with `pad_id`. The
# padding mask (`tformer.padding_mask(tokens, pad_id)`, shape `(B, 1, 1, T)`) hides the padded *keys*
# (columns) from every query. Encoding the padded batch must then give, at each real position, exactly
# what encoding each sequence alone gives. Without the mask the padding leaks in.

# %%
seqs = [torch.randint(2, V, (n,)) for n in (5, 8, 3)]
batch = torch.zeros(3, 8, dtype=torch.long)                      # pad_id = 0
for i, s in enumerate(seqs):
    batch[i, :len(s)] = s
print("padding mask of the batch:\n", tformer.padding_mask(batch, 0)[:, 0, 0].int())
with torch.no_grad():
    mem_batch, _ = seq2seq.encode(batch)
    worst = 0.0
    for i, s in enumerate(seqs):
        mem_alone, _ = seq2seq.encode(s[None])
        worst = max(worst, (mem_batch[i, :len(s)] - mem_alone[0]).abs().max().item())
    # the same encoder with the mask switched off (every key visible, padding included)
    x_emb = seq2seq.embed(batch, seq2seq.src_embed)
    mem_nomask = seq2seq.encoder(x_emb, None)
    leak = (mem_nomask[2, :3] - seq2seq.encode(seqs[2][None])[0][0]).abs().max().item()
print(f"padded batch vs alone: largest difference {worst:.1e};  without the padding mask: {leak:.2f}")
assert worst < 1e-5 and leak > 1e-2

# %% [markdown]
# ## Exercise 1: the causal mask
# Return a `(T_q, T_k)` bool tensor, True = may attend. The queries are the *last* $T_q$ of the $T_k$
# positions (a KV cache holds the first $T_k - T_q$). `tformer.causal_mask` is off limits.

# %%
def my_causal_mask(t_q, t_k):
    ### BEGIN SOLUTION
    query_pos = torch.arange(t_q)[:, None] + (t_k - t_q)
    return torch.arange(t_k)[None, :] <= query_pos
    ### END SOLUTION


# %%
check("ch06.causal_mask", my_causal_mask)

# %% [markdown]
# ## Exercise 2: causal + padding mask from token ids
# `tokens (B, T)` with `pad_id` marking padding. Return `(B, 1, T, T)` bool: query $i$ may see key $j$
# iff $j \le i$ and token $j$ is not padding.

# %%
def my_causal_padding_mask(tokens, pad_id):
    ### BEGIN SOLUTION
    b, t = tokens.shape
    causal = torch.arange(t)[None, :] <= torch.arange(t)[:, None]         # (T, T)
    keys_ok = (tokens != pad_id)[:, None, None, :]                         # (B, 1, 1, T): hide padded keys
    return (causal & keys_ok).expand(b, 1, t, t)
    ### END SOLUTION


# %%
check("ch06.causal_padding_mask", my_causal_padding_mask)

# %% [markdown]
# ## The package's version
# What you wrote is what `tformer` runs: `tformer/masks.py`'s causal and padding masks.

# %%
print(inspect.getsource(tformer.causal_mask))
print(inspect.getsource(tformer.padding_mask))

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** How does a mask hide a key from a query, so that the query's weights over the other keys
# still sum to 1?
# - **A.** 10 is subtracted from its score before the softmax.
# - **B.** Its score is set to 0 before the softmax.
# - **C.** Its weight is set to 0 after the softmax.
# - **D.** Its score is set to $-\infty$ before the softmax.
#
# The first cell of *1. $-\infty$ gives exactly zero weight* prints what each choice of score leaves on the
# hidden keys.

# %%
answer = "D"  ### ANSWER
check("ch06.q_mask_value", answer)

# %% [markdown]
# **Question 2.** Which entries (query $i$, key $j$) of a $4 \times 4$ causal mask are allowed (True)?
# - **A.** $j < i$
# - **B.** $j \le i$
# - **C.** $j \ge i$
# - **D.** all 16
#
# The figure under *2. The causal mask* draws `causal_mask(6)`, and the same cell shows that the future
# never changes the past.

# %%
answer = "B"  ### ANSWER
check("ch06.q_causal_4x4", answer)

# %% [markdown]
# **Question 3.** Sequences of different lengths share a batch, padded to the longest. What does the
# padding mask hide?
# - **A.** The padded keys (columns), from every query.
# - **B.** The padded queries (rows).
# - **C.** Nothing needs hiding: a padding token carries no information.
#
# The cell under *4. Padding* prints the mask and the difference with and without it.

# %%
answer = "A"  ### ANSWER
check("ch06.q_padding", answer)

# %% [markdown]
# ## Summary
# * A score set to $-\infty$ gets weight exactly 0, and the masked values cannot touch the output;
#   finite penalties leak.
# * Causal mask: changing future tokens leaves every past output of a GPT unchanged.
# * Cross-attention learns to align: reversing a sequence, decoder position $j$ reads source $S-1-j$.
# * Padding mask: a padded batch gives each sequence's results exactly.
