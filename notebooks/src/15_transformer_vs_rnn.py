# %% [markdown]
# # Chapter 15: Transformer vs RNN
#
# **What this chapter covers.** The course ends where the paper began: why replace recurrence with
# attention? Three claims, each measured on an LSTM (`tformer.models.LSTMLM`) and a Transformer
# (`tformer.models.GPT`) of about the same number of parameters:
#
# 1. **Long-range dependency.** In a recall task the answer sits `d` tokens back. Attention reaches
#    it in one step from any distance; an LSTM must carry it through `d` state updates. We plot
#    accuracy vs distance, and the gradient that reaches each earlier position.
# 2. **Parallelism.** A training step of an LSTM runs T dependent steps; a Transformer layer computes
#    all positions at once. We time training steps vs sequence length (chapter 7 showed the op count).
# 3. **Scalability.** Five widths of each family trained on the same number of tokens: validation loss
#    against parameters, fitted by a power law $L(N) = a N^{-\alpha}$, and the two exponents compared.
#
# Two graded exercises: the power-law fit itself, and the compute-optimal split of a training budget
# into parameters and tokens (Chinchilla's rule). **How to check one:** replace `raise NotImplementedError`
# in the exercise cell with your code, run it, then run the `check(...)` cell below it: PASS, or the
# smallest failing input with a hint.
#
# **Where the code lives:**
# * `tformer/models/gpt.py: GPT, GPTConfig`, `tformer/models/rnn.py: LSTMLM, LSTMConfig`
# * `tformer/measure/timing.py: step_time_vs_length, format_table`
# * `tformer/training/trainer.py: Trainer, TrainConfig`, `tformer/data/text.py: LMBatches, offline_text, split_stream`
# * `tformer/training/metrics.py: fit_power_law, compute_optimal` (each printed after you have written it
#   in its exercise)
#
# Set `TFORMER_SMALL=1` for the quick CPU version. Timings on a shared machine are noisy, and on a
# CPU with two cores there is little parallel hardware for the Transformer to use; full mode on a GPU
# runs the same measurements at larger sizes.

# %%
import inspect
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

import tformer
from tformer.grading import check
from tformer.data.text import LMBatches, offline_text, split_stream
from tformer.training.metrics import compute_optimal, fit_power_law
from tformer.models import GPT, GPTConfig, LSTMConfig, LSTMLM
from tformer.measure.timing import format_table, step_time_vs_length
from tformer.training import TrainConfig, Trainer
from tformer.training.losses import lm_loss

tformer.seed_everything(0)
dev = tformer.device()
SMALL = tformer.SMALL
print("small mode:", SMALL, "| device:", dev)

# %% [markdown]
# ## The models
# Same width budget: a 2-layer GPT and a 2-layer LSTM whose widths give about the same parameter count
# (an LSTM layer of width d has $8d^2$ weights, a Transformer layer $12d^2$).

# %%
N_KEYS, N_NOISE = 8, 16                        # key symbols 0..7, noise symbols 8..23, the query symbol 24
VOCAB = N_KEYS + N_NOISE + 1
QUERY = VOCAB - 1
distances = [4, 12, 36] if SMALL else [8, 32, 128, 512]
width = 64 if SMALL else 256


def make_transformer(vocab=VOCAB, d=width, block=max(distances) + 2):
    return GPT(GPTConfig(vocab_size=vocab, context_length=block, n_layers=2, n_heads=4, d_model=d))


def make_lstm(vocab=VOCAB, d=width):
    return LSTMLM(LSTMConfig(vocab_size=vocab, d_model=int(d * 1.25), n_layers=2))


for name, m in (("Transformer", make_transformer()), ("LSTM", make_lstm())):
    print(f"{name:12s} {sum(p.numel() for p in m.parameters()):>9,} parameters")

# %% [markdown]
# ## 1. Long-range dependency: key recall over growing distance
# Each sequence is a key symbol, then `d` random noise symbols, then a query symbol; the model must
# output the key at the query position:
#
# `K  n n n ... n  ?   ->  K`
#
# Only the last position carries a loss. Both models are trained the same number of steps at each
# distance and tested on fresh sequences.

# %%
def recall_batch(batch, distance, generator):
    """(B, distance + 2) token ids and the (B,) keys to recall."""
    keys = torch.randint(0, N_KEYS, (batch,), generator=generator)
    noise = torch.randint(N_KEYS, N_KEYS + N_NOISE, (batch, distance), generator=generator)
    idx = torch.cat([keys[:, None], noise, torch.full((batch, 1), QUERY)], dim=1)
    return idx, keys


def train_recall(model, distance, steps, batch=32, lr=3e-3, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = model.to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        idx, keys = recall_batch(batch, distance, g)
        loss = F.cross_entropy(model(idx.to(dev))[:, -1], keys.to(dev))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    idx, keys = recall_batch(1000, distance, torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        return (model(idx.to(dev))[:, -1].argmax(-1).cpu() == keys).float().mean().item()

# %% [markdown]
# Train both models at each distance, from the same seed, and test them on 1,000 fresh sequences.

# %%
steps = 150 if SMALL else 1500
acc = {"Transformer": [], "LSTM": []}
for d in tqdm(distances, desc="distances"):
    torch.manual_seed(0)
    acc["Transformer"].append(train_recall(make_transformer(), d, steps))
    torch.manual_seed(0)
    acc["LSTM"].append(train_recall(make_lstm(), d, steps))
print(format_table([{"distance": d, "Transformer acc": a, "LSTM acc": b}
                    for d, a, b in zip(distances, acc["Transformer"], acc["LSTM"])]))
print(f"chance = {1 / N_KEYS:.3f}")

# %%
# Figure: Key-recall test accuracy against the distance between key and query.
plt.figure(figsize=(5, 3.2))
for name, ys in acc.items():
    plt.plot(distances, ys, "o-", label=name)
plt.axhline(1 / N_KEYS, color="gray", ls=":", label="chance")
plt.xscale("log"); plt.xlabel("distance d (tokens between key and query)"); plt.ylabel("test accuracy")
plt.title(f"key recall after {steps} training steps"); plt.legend(); plt.show()

# %%
assert min(acc["Transformer"]) > 0.9                      # attention finds the key at any distance
assert acc["LSTM"][-1] < acc["Transformer"][-1] - 0.2      # the LSTM falls behind as the distance grows
assert acc["LSTM"][0] == max(acc["LSTM"])                  # ... and does best at the shortest distance

# %% [markdown]
# With the same training budget the Transformer recalls the key at every distance; the LSTM does best
# at the shortest distance and drops toward chance as the key moves further back (the table above). (An LSTM *can* learn long
# delays, given much more training; what grows with distance is how hard it is to learn.)
#
# **Why: the gradient that reaches early positions.** Take the loss at the last position of a
# sequence of length T and measure the gradient with respect to the input embedding at each earlier
# position. In the LSTM it passes through every state update in between; in the Transformer one
# attention step links any two positions.

# %%
def grad_by_position(model, t_len, n=8):
    """|d loss(last position) / d embedding(position t)|, averaged over n random sequences: (T,)."""
    model = model.to(dev).train()
    saved = {}

    def keep(module, inputs, output):
        output.retain_grad()
        saved["emb"] = output
    handle = model.tok_embed.register_forward_hook(keep)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (n, t_len), generator=g).to(dev)
    target = torch.randint(0, VOCAB, (n,), generator=g).to(dev)
    F.cross_entropy(model(idx)[:, -1], target).backward()
    handle.remove()
    return saved["emb"].grad.norm(dim=-1).mean(0).cpu()     # (T,)

# %% [markdown]
# Both models at initialisation, on the same random sequences of length T:

# %%
# Figure: Gradient norm at each input against its distance back from the loss position, at initialisation.
t_len = 128 if SMALL else 512
torch.manual_seed(0)
g_tf = grad_by_position(make_transformer(block=t_len), t_len)
torch.manual_seed(0)
g_lstm = grad_by_position(make_lstm(), t_len)
back = torch.arange(t_len - 1, -1, -1)                   # distance from the last position
plt.figure(figsize=(5, 3.2))
plt.semilogy(back, g_tf, label="Transformer")
plt.semilogy(back, g_lstm, label="LSTM")
plt.xlabel("distance back from the loss position"); plt.ylabel("gradient norm at that input")
plt.title("gradient reaching earlier positions (initialisation)"); plt.legend(); plt.show()
far, near = slice(0, t_len // 2), slice(t_len // 2, t_len - 1)   # >= T/2 steps back; 1 .. T/2 - 1 back
for name, gr in (("Transformer", g_tf), ("LSTM", g_lstm)):
    print(f"{name:12s} mean gradient, far half / last position {gr[far].mean() / gr[-1]:.2e}, "
          f"far half / near half {gr[far].mean() / gr[near].mean():.2e}")
assert g_tf[far].mean() / g_tf[-1] > 100 * g_lstm[far].mean() / g_lstm[-1]
assert g_tf[far].mean() / g_tf[near].mean() > 0.5                     # flat beyond the last position
assert g_lstm[far].mean() / g_lstm[near].mean() < 1e-3                # the LSTM's decays with distance

# %% [markdown]
# The LSTM's gradient shrinks geometrically with distance (each step multiplies it by the forget
# gate and a Jacobian of norm < 1): its far half gets orders of magnitude less than its near half
# (printed). The Transformer's curve has two levels. The last position's own input reaches the loss
# along the residual stream, without passing through attention, and gets far more than any other
# (the far half / last ratio printed above). Every earlier position is one attention step away,
# whatever its distance: beyond the last position the curve is flat, and the far half gets about as
# much as the near half (printed). That flatness is path length 1.
#
# ## 2. Parallelism: training-step time vs sequence length
# Same batch, growing T, a full training step (forward, loss, backward, AdamW) through
# `tformer.measure.timing.step_time_vs_length`.

# %%
# Figure: Training tokens/s against sequence length, Transformer and LSTM.
lengths = [32, 128, 384] if SMALL else [256, 1024, 2048, 4096]
batch = 4 if SMALL else 16
# threads, set explicitly: every core in full mode; one in small mode, where two threads on tiny models
# thrash as soon as another program shares the cores (a busy laptop), and the chapter must stay quick
n_threads = tformer.utils.runtime.SMALL_THREADS if tformer.SMALL else tformer.utils.runtime.ALL_THREADS
with tformer.utils.runtime.threads(n_threads):
    rows = step_time_vs_length({"Transformer": lambda: make_transformer(256, width, max(lengths)),
                                "LSTM": lambda: make_lstm(256, width)},
                               lengths, batch, 256, device=dev, warmup=1, repeat=2 if SMALL else 5, progress=not SMALL)
print(format_table([r.__dict__ for r in rows]))
plt.figure(figsize=(5, 3.2))
for name in ("Transformer", "LSTM"):
    plt.plot(lengths, [r.tokens_per_s for r in rows if r.name == name], "o-", label=name)
plt.xscale("log"); plt.yscale("log"); plt.xlabel("sequence length T"); plt.ylabel("training tokens/s")
plt.title(f"throughput on {dev.type}"); plt.legend(); plt.show()
ratio = {t: next(r.tokens_per_s for r in rows if r.name == "Transformer" and r.seq_len == t)
         / next(r.tokens_per_s for r in rows if r.name == "LSTM" and r.seq_len == t) for t in lengths}
print("Transformer / LSTM tokens/s:", {t: round(v, 2) for t, v in ratio.items()})
for name in ("Transformer", "LSTM"):
    tps = [r.tokens_per_s for r in rows if r.name == name]
    print(f"{name:12s} tokens/s from T = {lengths[0]} to {lengths[-1]}: {tps[0]:.3g} -> {tps[-1]:.3g} "
          f"(x {tps[-1] / tps[0]:.2f})")

# %% [markdown]
# What the CPU shows, and why. A ratio below 1 means the Transformer processes fewer tokens per
# second than the LSTM, its step taking 1/ratio times as long. Timings move with the machine's load, so
# no cell asserts them; on a laptop CPU the ratio is typically below 1 and falls as $T$ grows.
#
# Small mode runs tiny models (width 64, the sizes printed at the top) on one thread, and
# full mode on a CPU has only the machine's few cores. There is little parallel hardware for the
# Transformer's one large computation to fill, so what counts is arithmetic per token, and attention's
# grows with $T$ ($O(T^2)$ per sequence). PyTorch's LSTM runs its $T$ dependent steps in a compiled
# loop with little overhead per step. Its work per token does not depend on $T$, yet its tokens/s
# can rise with $T$ (this run's factor is printed above): a step also has fixed costs (the optimizer update over every weight, kernel launches, Python), and
# a longer sequence spreads them over more tokens.
#
# None of that is claim 2: a CPU with one thread or a
# few cores cannot show what the parallel form buys. A GPU can: this chapter in full mode measures it
# there, and so does `python benchmarks/gpu_check.py --only rnn-vs-transformer`.
#
# ## 3. Scalability: loss against model size at a fixed token budget
# Five widths of each family, each trained on the same tokens in the same order (a fixed token budget
# $D$), on byte-level text. $N$ counts the parameters without the embedding tables (Kaplan et al. 2020
# found the law cleaner that way); the training throughput of each run is recorded too.

# %%
text = offline_text()[: (200_000 if SMALL else None)]
ids = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
train_ids, val_ids = split_stream(ids, 0.9)
widths = [8, 16, 32, 64, 128] if SMALL else [64, 128, 256, 384, 512]
lm_steps, lm_block, lm_batch = (80, 64, 8) if SMALL else (1000, 256, 32)
budget = lm_steps * lm_block * lm_batch                        # tokens every model sees
val = LMBatches(val_ids, lm_batch, lm_block, 4 if SMALL else 50, shuffle=False)


def non_embedding(model):
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith(("tok_embed", "pos_embed")))

# %% [markdown]
# The sweep: one `Trainer` run per family and width, same seed, same batches.

# %%
scale_rows = []
for w in tqdm(widths, desc="widths", disable=SMALL):
    for name, build in (("Transformer", lambda: make_transformer(256, w, lm_block)), ("LSTM", lambda: make_lstm(256, w))):
        torch.manual_seed(0)
        model = build()
        cfg = TrainConfig(max_steps=lm_steps, lr=3e-3 if SMALL else 1e-3, schedule="constant", warmup=lm_steps // 10,
                          betas=(0.9, 0.95), adam_eps=1e-8, progress=False, log_every=lm_steps, seed=0)
        res = Trainer(model, lm_loss, LMBatches(train_ids, lm_batch, lm_block, lm_steps), cfg, val_data=val,
                      device=dev).fit()
        scale_rows.append({"model": name, "width": w, "N": non_embedding(model),
                           "tokens/s": res["tokens_per_s"], "val loss": res["val_loss"]})
print(f"token budget D = {budget:,} tokens per run")
print(format_table(scale_rows))

# %% [markdown]
# ## Exercise: fit the scaling law
# Kaplan et al. (2020) fit $L(N) = (N_c / N)^{\alpha_N}$; with an irreducible loss $c$ it reads
# $L(N) = a N^{-\alpha} + c$. With $c$ fixed this is a straight line in log-log space:
# $\log(L - c) = \log a - \alpha \log N$. Given `n_params (K,)` and `losses (K,)` (float64) and the
# float `c`, return `torch.tensor([a, alpha])` (float64) from the least-squares line.

# %%
def my_power_law_fit(n_params, losses, c):
    ### BEGIN SOLUTION
    x, y = n_params.log(), (losses - c).log()
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return torch.stack([(y.mean() - slope * x.mean()).exp(), -slope])
    ### END SOLUTION


# %%
check("ch15.power_law_fit", my_power_law_fit)

# %% [markdown]
# The package's version, which the next cell uses (the same line, with checks on its input):

# %%
print(inspect.getsource(fit_power_law))

# %% [markdown]
# **The fit.** Which $c$? Five points cannot pin down three parameters: fitted freely, $c$ trades off
# against $\alpha$ and the exponent is not meaningful. We fix $c = 0$, Kaplan's form, for both families,
# so the two exponents are measured the same way (with $c > 0$ both would come out larger).

# %%
# Figure: Validation loss against non-embedding parameters with the fitted power law (left), and training tokens/s (right).
C_FIXED = 0.0
fits = {}
for name in ("Transformer", "LSTM"):
    r = [x for x in scale_rows if x["model"] == name]
    n = torch.tensor([x["N"] for x in r], dtype=torch.float64)
    loss = torch.tensor([x["val loss"] for x in r], dtype=torch.float64)
    fits[name] = (n, loss, *fit_power_law(n, loss, C_FIXED).tolist())
    print(f"{name:12s} L(N) = {fits[name][2]:.2f} * N^-{fits[name][3]:.3f} + {C_FIXED}")
fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
for name, (n, loss, a, alpha) in fits.items():
    line = ax[0].loglog(n, loss, "o", label=f"{name}: alpha = {alpha:.3f}")[0]
    ax[0].loglog(n, a * n ** -alpha + C_FIXED, "-", color=line.get_color())
    ax[1].plot(n, [x["tokens/s"] for x in scale_rows if x["model"] == name], "o-", label=name)
ax[0].set_ylabel("validation loss (nats/byte)"); ax[1].set_ylabel("training tokens/s")
for a_ in ax:
    a_.set_xscale("log"); a_.set_xlabel("non-embedding parameters N"); a_.legend()
plt.tight_layout(); plt.show()
assert fits["Transformer"][3] > 0 and fits["LSTM"][3] > 0            # both improve with size
assert fits["Transformer"][3] > fits["LSTM"][3]                       # the Transformer's loss falls faster

# %% [markdown]
# Both families improve with size on the same budget, and the Transformer's exponent is the larger
# one: each doubling of $N$ buys it more. Kaplan et al. (2020, section 3.2.1 and figure 7) found the
# same at scale: the Transformer's loss falls faster with non-embedding parameters than the LSTM's,
# and LSTMs match Transformers only on tokens early in the context. (These are small models trained far from convergence; full mode repeats the sweep
# at widths 64-512 on 1,000 steps of 32 x 256 tokens.)
#
# **How many tokens for how many parameters?** Chapter 7 estimated a training run's compute as
# $C \approx 6ND$ FLOPs (forward 2, backward 4 per parameter per token). The sweep above fixed $D$ and
# grew $N$, so the bigger models also spent more compute. Hoffmann et al. (2022, "Chinchilla") fixed $C$
# instead and asked which split of $C = 6ND$ gives the lowest loss: about **20 training tokens per
# parameter**, growing $N$ and $D$ together. Both rules at once give the split of a budget.
#
# ## Exercise 2: the compute-optimal split of a budget
# Given a training budget of `flops` FLOPs and a ratio `tokens_per_param` $r$ (Chinchilla's: 20),
# return the floats `(n_params, n_tokens)` that spend it, $C = 6ND$, at that ratio, $D = rN$.

# %%
def my_compute_optimal(flops, tokens_per_param=20.0):
    ### BEGIN SOLUTION
    n_params = math.sqrt(flops / (6 * tokens_per_param))
    return n_params, tokens_per_param * n_params
    ### END SOLUTION


# %%
check("ch15.compute_optimal", my_compute_optimal)

# %% [markdown]
# The package's version, which the next cell uses:

# %%
print(inspect.getsource(compute_optimal))

# %% [markdown]
# Where the sweep sits: each Transformer's compute, and the model size that compute would buy at 20
# tokens per parameter.

# %%
print(f"D = {budget:,} tokens: Chinchilla's 20 tokens per parameter fits N = D / 20 = {budget / 20:,.0f}")
for x in scale_rows[::2]:                                       # the Transformer rows
    flops = 6 * x["N"] * budget
    n_opt, _ = compute_optimal(flops)                           # C = 6 N D with D = 20 N
    print(f"width {x['width']:4d}: N = {x['N']:>9,}  D/N = {budget / x['N']:8.1f} tokens per parameter  "
          f"C = 6ND = {flops:.2e} FLOPs  -> Chinchilla-optimal N for this C: {n_opt:>9,.0f}")
assert all(x["model"] == "Transformer" for x in scale_rows[::2])

# %% [markdown]
# Models up to $D/20$ parameters (printed above) get Chinchilla's ratio or more; the larger ones are larger
# than compute-optimal for what they spent, which is why they are still far from what their size could
# reach. (At a fixed $D$ a bigger model still wins, as the two positive exponents say: it also spends
# more compute.)
# For scale (quoted from the papers): GPT-3 (Brown et al. 2020: 175B parameters, 300B tokens) trained on
# 1.7 tokens per parameter; Chinchilla (70B, 1.4T tokens) on 20, and beat Gopher (280B, trained with the
# same compute) on almost every task.

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** In section 1, beyond the last position, the Transformer's gradient is about the same at
# every distance back from the loss. Why?
# - **A.** The causal mask lets the last position see only the nearest tokens, so the far ones all get the
#   same small gradient.
# - **B.** It does fall with distance, only more slowly than the LSTM's.
# - **C.** Its positional encoding gives far tokens more weight to make up for the distance.
# - **D.** Every earlier position is one attention step from the loss position, whatever its distance.
#
# The figure *gradient reaching earlier positions* and the ratios printed under it show it.

# %%
answer = "D"  ### ANSWER
check("ch15.q_flat_gradient", answer)

# %% [markdown]
# **Question 2.** On a CPU the Transformer of section 2 typically trains fewer tokens per second than
# the LSTM, and the ratio falls as $T$ grows. Why does that not contradict the claim that a Transformer
# trains in parallel and an RNN cannot?
# - **A.** It does contradict it: attention is simply slower to train than recurrence.
# - **B.** The LSTM's $T$ steps must run one after another, the Transformer's positions need not; but a CPU
#   with one or two threads has little parallel hardware to fill, so the arithmetic per token decides, and
#   attention's grows with $T$.
# - **C.** PyTorch's LSTM also computes all positions at once, in one compiled kernel.
# - **D.** The causal mask makes the Transformer compute its positions one after another in training.
#
# The table under *2. Parallelism*, the ratios printed under it and the text after them show it.

# %%
answer = "B"  ### ANSWER
check("ch15.q_parallel_cpu", answer)

# %% [markdown]
# **Question 3.** Chinchilla has 70B parameters and was trained on 1.4T tokens. With $6ND$, what was its
# training compute, in FLOPs? Answer with a number (`5e20` is a number). The cell after *Exercise 2* computes the
# same for each model of the sweep.

# %%
answer = 6 * 70e9 * 1.4e12  ### ANSWER
check("ch15.q_chinchilla_flops", answer)

# %% [markdown]
# ## Summary
# | property | LSTM | Transformer |
# |---|---|---|
# | path between two positions | $O(d)$ state updates | 1 attention step |
# | sequential steps per layer | $O(T)$ | $O(1)$ |
# | cost per layer | $O(T d^2)$ | $O(T^2 d + T d^2)$ |
# | long-range recall (measured) | falls with distance | flat |
# | loss vs size at a fixed budget (measured) | smaller exponent $\alpha$ | larger exponent $\alpha$ |
