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
# 3. **Scalability.** Throughput and validation loss as the models grow.
#
# There are no graded exercises in this chapter: it is a set of experiments.
# Set `TFORMER_SMALL=1` for the quick CPU version. Timings on a shared machine are noisy, and on a
# CPU with two cores there is little parallel hardware for the Transformer to use: the GPU run (full
# mode) is where claim 2 shows in full.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

import tformer
from tformer.lm_data import LMBatches, lm_loss, offline_text, split_stream
from tformer.models import GPT, GPTConfig, LSTMConfig, LSTMLM
from tformer.timing import format_table, step_time_vs_length
from tformer.train import TrainConfig, Trainer

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
    return GPT(GPTConfig(vocab_size=vocab, block_size=block, n_layers=2, n_heads=4, d_model=d))


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
plt.figure(figsize=(5, 3.2))
for name, ys in acc.items():
    plt.plot(distances, ys, "o-", label=name)
plt.axhline(1 / N_KEYS, color="gray", ls=":", label="chance")
plt.xscale("log"); plt.xlabel("distance d (tokens between key and query)"); plt.ylabel("test accuracy")
plt.title(f"key recall after {steps} training steps"); plt.legend(); plt.show()

# %%
assert acc["Transformer"][-1] > 0.9                       # attention finds the key at any distance
assert acc["LSTM"][-1] < acc["Transformer"][-1] - 0.2      # the LSTM falls behind as the distance grows

# %% [markdown]
# With the same training budget the Transformer recalls the key at every distance; the LSTM learns it
# at short distances and drops toward chance as the key moves further back. (An LSTM *can* learn long
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
    handle = model.wte.register_forward_hook(keep)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (n, t_len), generator=g).to(dev)
    target = torch.randint(0, VOCAB, (n,), generator=g).to(dev)
    F.cross_entropy(model(idx)[:, -1], target).backward()
    handle.remove()
    return saved["emb"].grad.norm(dim=-1).mean(0).cpu()     # (T,)


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
far = slice(0, t_len // 2)                               # the first half: at least T/2 steps back
print(f"mean gradient, far half / last position: Transformer {g_tf[far].mean() / g_tf[-1]:.2e}, "
      f"LSTM {g_lstm[far].mean() / g_lstm[-1]:.2e}")
assert g_tf[far].mean() / g_tf[-1] > 100 * g_lstm[far].mean() / g_lstm[-1]

# %% [markdown]
# The LSTM's gradient shrinks geometrically with distance (each step multiplies it by the forget
# gate and a Jacobian of norm < 1); the Transformer's stays within a small factor: path length 1.
#
# ## 2. Parallelism: training-step time vs sequence length
# Same batch, growing T, a full training step (forward, loss, backward, AdamW) through
# `tformer.timing.step_time_vs_length`.

# %%
lengths = [32, 128, 384] if SMALL else [256, 1024, 2048, 4096]
batch = 4 if SMALL else 16
with tformer.runtime.threads(tformer.runtime.ALL_THREADS):   # parallel speed: every core, set explicitly here
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

# %% [markdown]
# The LSTM's throughput is flat in T at best: its T steps run one after another, whatever the hardware.
# The Transformer's work per token grows with T (attention is $O(T^2)$), but it is one large parallel
# computation, which a GPU turns into far higher throughput; on a two-core CPU there is little to run
# in parallel, so the gap is small or even reversed there. The full-mode run on a GPU shows the
# Transformer ahead at every length.
#
# ## 3. Scalability: throughput and loss vs model size
# Train byte-level language models of growing width on the same text for the same number of steps,
# and record training throughput and validation loss.

# %%
text = offline_text()[: (200_000 if SMALL else None)]
ids = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
train_ids, val_ids = split_stream(ids, 0.9)
widths = [32, 64] if SMALL else [128, 256, 512]
lm_steps, lm_block, lm_batch = (50, 64, 8) if SMALL else (1500, 256, 32)
val = LMBatches(val_ids, lm_batch, lm_block, 4 if SMALL else 50, shuffle=False)
scale_rows = []
for w in widths:
    for name, build in (("Transformer", lambda: make_transformer(256, w, lm_block)), ("LSTM", lambda: make_lstm(256, w))):
        torch.manual_seed(0)
        model = build()
        cfg = TrainConfig(max_steps=lm_steps, lr=3e-3 if SMALL else 1e-3, schedule="constant", warmup=lm_steps // 10,
                          betas=(0.9, 0.95), adam_eps=1e-8, progress=not SMALL, log_every=lm_steps, seed=0)
        res = Trainer(model, lm_loss, LMBatches(train_ids, lm_batch, lm_block, lm_steps), cfg, val_data=val,
                      device=dev).fit()
        scale_rows.append({"model": name, "width": w, "params": sum(p.numel() for p in model.parameters()),
                           "tokens/s": res["tokens_per_s"], "val loss": res["val_loss"]})
print(format_table(scale_rows))
fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
for name in ("Transformer", "LSTM"):
    r = [x for x in scale_rows if x["model"] == name]
    ax[0].plot([x["params"] for x in r], [x["tokens/s"] for x in r], "o-", label=name)
    ax[1].plot([x["params"] for x in r], [x["val loss"] for x in r], "o-", label=name)
for a, y in zip(ax, ("training tokens/s", "validation loss (nats/byte)")):
    a.set_xscale("log"); a.set_xlabel("parameters"); a.set_ylabel(y); a.legend()
plt.tight_layout(); plt.show()
for name in ("Transformer", "LSTM"):
    r = [x for x in scale_rows if x["model"] == name]
    assert r[-1]["val loss"] < r[0]["val loss"] + 0.05      # a larger model is not worse on the same budget

# %% [markdown]
# Both model families improve with size on the same budget. What the Transformer adds is that its
# cost is dominated by large matrix products over all positions at once, which is exactly what GPUs
# (and many GPUs together) accelerate; the LSTM's sequential steps cap how much hardware one sequence
# can use. That, more than any single benchmark, is why the field scaled Transformers.
#
# ## Summary
# | property | LSTM | Transformer |
# |---|---|---|
# | path between two positions | $O(d)$ state updates | 1 attention step |
# | sequential steps per layer | $O(T)$ | $O(1)$ |
# | cost per layer | $O(T d^2)$ | $O(T^2 d + T d^2)$ |
# | long-range recall (measured) | falls with distance | flat |
