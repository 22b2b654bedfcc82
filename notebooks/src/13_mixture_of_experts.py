# %% [markdown]
# # Chapter 13: Mixture of experts
#
# **What this chapter covers.** A mixture-of-experts (MoE) layer replaces a Transformer block's one
# feed-forward network by $E$ parallel FFNs, the *experts*, and a *router* that sends each token to
# only $k$ of them:
#
# $$p = \mathrm{softmax}(x W_r),\qquad \mathcal{T} = \mathrm{top}_k(p),\qquad
# y = \sum_{e \in \mathcal{T}} g_e\, \mathrm{FFN}_e(x),\quad g_e = \frac{p_e}{\sum_{j\in\mathcal{T}} p_j}.$$
#
# Total parameters grow with $E$; the compute per token grows only with $k$: capacity is decoupled from
# compute. Qwen3-235B-A22B sends each token to 8 of 128 experts and uses about 22B of its 235B
# parameters per token. We build the router and the dispatch, count total vs active parameters,
# show why a load-balancing loss is needed (without it the router piles tokens onto a few experts), and
# train a small MoE language model against a dense one with the same active parameters. On a CUDA GPU
# of sm80 or newer the capstone runs attention through the flash kernel, forced, and reports tokens/s and
# MFU (model FLOPs utilisation: the FLOPs the model's arithmetic needs per second, over the GPU's peak
# FLOP/s). On a T4 (sm75: no flash kernel, no bf16) it runs SDPA's memory-efficient kernel in fp16
# instead, as the device policy chooses.
#
# **How to check an exercise.** Replace `raise NotImplementedError` in an exercise cell with your code,
# run it, then run the `check(...)` cell below it: it prints PASS, or the smallest failing input with a
# hint (and the name of a common mistake when it recognizes one).
#
# Small mode (`TFORMER_SMALL=1`) trains for a few seconds on the CPU on Python's bundled documentation;
# full mode trains on WikiText-103 through `datasets` (downloaded once, then cached) on a GPU. Offline,
# full mode stops with a message: run with `TFORMER_SMALL=1`, or fetch the data once while online.
#
# **How long.** In small mode this notebook runs in about a minute on a 2-core laptop CPU.
#
# **Where the code lives** (its router and balancing loss are printed at the end, after you have
# written them in the exercises):
# * `tformer/moe/__init__.py: MoE, MoEConfig, top_k_route, load_balancing_loss, router_z_loss` (the idea)
# * `tformer/moe/dispatch.py: make_plan, expert_capacity, Experts` (the fast dispatch)
# * `tformer/moe/params.py: moe_lm_param_counts, QWEN3_235B_A22B, MIXTRAL_8X7B, deepseek_v3_param_counts, DEEPSEEK_V3`
#   and `mla_params` (parameter counts of published models)
# * `tformer/models/gpt.py: GPT, GPTConfig` (`moe=MoEConfig(n_experts=..., top_k=..., d_ff=...)` makes its FFNs
#   MoE layers)
# * `tformer/measure/flash.py: force_flash, run_with_flash, lm_throughput`
# * `tformer/training/trainer.py: Trainer, TrainConfig`, `tformer/data/text.py: LMBatches, train_tokenizer, encode`

# %%
import contextlib
import inspect

import matplotlib.pyplot as plt
import torch
import transformers
from torch.nn.attention import sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import tformer
from tformer.utils import device as policy, gpu
from tformer.measure.flash import force_flash, lm_throughput, run_with_flash, sdpa_backends_used
from tformer.grading import check
from tformer.data.text import LMBatches, encode, hf_text, offline_text, split_stream, train_tokenizer
from tformer.models import GPT, GPTConfig
from tformer.moe import MoE, MoEConfig, load_balancing_loss, top_k_route
from tformer.moe.dispatch import expert_capacity, grouped_mm_available, make_plan
from tformer.moe.params import (DEEPSEEK_V3, MIXTRAL_8X7B, QWEN3_235B_A22B, deepseek_v3_param_counts, mla_params,
                                moe_lm_param_counts)
from tformer.utils.plot import curves, heatmap
from tformer.measure.timing import time_fn
from tformer.training import TrainConfig, Trainer
from tformer.training.losses import lm_loss

SMALL = tformer.SMALL
tformer.seed_everything(0)
dev = tformer.device()
print("small mode:", SMALL, "| device:", dev)

# %% [markdown]
# ## 1. Top-k gating, built by hand
#
# The router is one linear map to $E$ scores. After the softmax each token keeps its $k$ best experts;
# their probabilities, renormalised over the $k$ (Mixtral, Qwen3), weight the experts' outputs. Written
# out with a loop over tokens it is exactly `tformer.moe.MoE`. The layer takes its width, activation and
# bias from the model that builds it; `MoEConfig` holds only what is MoE's own (experts, $k$, an expert's
# width, capacity, loss weights). Each expert here is a SwiGLU FFN, the gated feed-forward layer of
# Llama, Mixtral and Qwen3: $W_2(\mathrm{SiLU}(W_1 x) \odot W_3 x)$, with
# $\mathrm{SiLU}(z) = z\,\sigma(z)$ and $\odot$ the elementwise product:

# %%
E, k, d = 8, 2, 16
layer = MoE(d, MoEConfig(n_experts=E, top_k=k, d_ff=32), activation="swiglu")
x = torch.randn(6, d)                                                   # 6 tokens

probs = torch.softmax(layer.router(x), dim=-1)                          # (N, E)
gates, chosen = probs.topk(k, dim=-1)                                   # (N, k) best first
gates = gates / gates.sum(-1, keepdim=True)
by_hand = torch.stack([sum(gates[t, j] * layer.experts.expert(int(chosen[t, j]), x[t]) for j in range(k))
                       for t in range(len(x))])
torch.testing.assert_close(by_hand, layer(x))
print("token -> experts:", chosen.tolist())
print("gates:", [[round(g, 2) for g in row] for row in gates.tolist()])

# %% [markdown]
# ## 2. Dispatch without a loop over tokens
#
# Looping over tokens is far too slow for a real model. `tformer.moe` turns the $N\times k$ choices into a
# *plan*: sort the (token, choice) pairs by expert, so each expert's tokens form one contiguous block.
# Then either scatter the blocks into an $(E, C, d)$ buffer and run all experts with one batched matmul
# (`"padded"`), or run one *grouped* matmul over the jagged blocks (`"grouped"`,
# `torch.nn.functional.grouped_mm`: fp32 or bf16 on a CPU, bf16 on a GPU).
#
# Every path computes the same
# function as the per-token loop, gradients included (`tests/test_moe.py` checks them all). `"auto"`
# picks the faster path for the device: `"grouped"` on a CPU (which GPUs get which is a note at the end of
# section 6).

# %%
plan = make_plan(gates, chosen, E, capacity=None)
print("expert of each sorted row:", plan.expert_sorted.tolist())
print("token of each sorted row: ", plan.token_sorted.tolist())
print("tokens per expert:        ", plan.counts.tolist())

xb = torch.randn(4, 32, d)
paths = ["naive", "padded"] + (["grouped"] if grouped_mm_available(xb, d, 32) else [])
outs = {p: layer(xb, dispatch=p) for p in paths}
for p in paths[1:]:
    torch.testing.assert_close(outs[p], outs["naive"], rtol=1e-5, atol=1e-6)
print("paths that agree with the per-token loop:", paths[1:])

# %% [markdown]
# ## 3. Total vs active parameters; compute follows $k$, not $E$
#
# Adding experts adds parameters, but each token still visits $k$ experts. Counting FLOPs of one forward
# pass (capacity factor 1, so each expert gets exactly its share of $N k / E$ token slots) shows the
# compute staying put while the parameters grow linearly: the figure draws the FLOPs on an axis from 0.
# The wall-clock time is printed for reference (it also pays for sorting and scattering).

# %%
# Figure: Total and active parameters (left) and forward FLOPs (right) against the number of experts E.
n_tok, flops, params, times = 512, {}, {}, {}
xt = torch.randn(n_tok, 64)
for n_exp in (2, 4, 8, 16, 32):
    m = MoE(64, MoEConfig(n_experts=n_exp, top_k=2, d_ff=128, capacity_factor=1.0, dispatch="padded"))
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        m(xt)
    flops[n_exp], params[n_exp] = fc.get_total_flops(), m.params_total_active()
    with torch.no_grad():
        times[n_exp] = time_fn(lambda: m(xt), warmup=1, repeat=3) * 1e3
for n_exp in flops:
    print(f"E={n_exp:3d}  total params {params[n_exp][0]:8,d}  active {params[n_exp][1]:7,d}  "
          f"forward MFLOPs {flops[n_exp] / 1e6:6.1f}  time {times[n_exp]:5.2f} ms")
expert_flops = {e: f - 2 * n_tok * 64 * e for e, f in flops.items()}          # minus the router's matmul
assert len(set(expert_flops.values())) == 1, expert_flops                      # expert compute: independent of E
assert params[32][0] > 12 * params[2][0]                                       # parameters: ~linear in E

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
curves(list(flops), {"total": [p[0] for p in params.values()], "active per token": [p[1] for p in params.values()]},
       "experts E", "parameters", "Parameters of one MoE layer (k = 2)", logx=True, ax=a1)
curves(list(flops), {"whole layer": [f / 1e6 for f in flops.values()],
                     "experts only (no router)": [f / 1e6 for f in expert_flops.values()]},
       "experts E", "forward MFLOPs", "Forward FLOPs, 512 tokens (k = 2)", logx=True, ax=a2)
a1.set_ylim(bottom=0), a2.set_ylim(0, 1.15 * max(flops.values()) / 1e6)          # both axes from 0
plt.show()

# %% [markdown]
# ### Qwen3-235B-A22B from its published configuration
#
# 94 layers, hidden size 4096, 64 query and 4 key/value heads of size 128, 128 experts per layer with 8
# active, each expert a SwiGLU FFN of width 1536 (a gated feed-forward layer,
# $W_2(\mathrm{SiLU}(W_1 x) \odot W_3 x)$), vocabulary 151,936, untied input and output embeddings.
# `moe_lm_param_counts` adds up embeddings, attention, norms, routers and experts (the test suite checks
# it against Hugging Face's `Qwen3MoeForCausalLM` built from a small configuration).

# %%
print(QWEN3_235B_A22B)
qwen = moe_lm_param_counts(**QWEN3_235B_A22B)
for key in ("embeddings", "attention", "experts", "total", "active"):
    print(f"{key:>10}: {qwen[key] / 1e9:7.2f} B")
print(f"active share per token: {qwen['active'] / qwen['total']:.1%}")
assert 234e9 < qwen["total"] < 236e9 and 21.5e9 < qwen["active"] < 22.5e9      # "235B" total, "A22B" active

# the same count for Mixtral-8x7B (8 experts, top-2): Mistral quotes 46.7B total and 12.9B active
mixtral = moe_lm_param_counts(**MIXTRAL_8X7B)
print(f"Mixtral-8x7B: total {mixtral['total'] / 1e9:.1f} B, active {mixtral['active'] / 1e9:.1f} B")
assert round(mixtral["total"] / 1e9, 1) == 46.7 and round(mixtral["active"] / 1e9, 1) == 12.9

# %% [markdown]
# ### DeepSeek-V3: shared experts, dense first layers and latent attention
#
# DeepSeek-V3 (DeepSeek-AI, *DeepSeek-V3 Technical Report*, arXiv:2412.19437; its `config.json` on
# huggingface.co/deepseek-ai/DeepSeek-V3) reports 671B total and 37B active parameters. Three things
# differ from Qwen3 and Mixtral, and each changes the count:
# * **Multi-head latent attention (MLA).** Keys and values are not projected per head from $x$: $x$ is
#   first compressed to a 512-wide latent $c^{KV}$ (what the KV cache stores, plus a 64-wide shared RoPE
#   key), then expanded to 128 heads of keys (128 + 64 wide) and values (128). Queries go through a
#   1536-wide latent the same way. Each down/up pair is a low-rank factorisation of a big projection.
# * **Shared + routed experts.** Every MoE layer has 1 shared expert that every token uses and 256
#   routed experts of which each token uses 8 (each a SwiGLU FFN of width 2048).
# * **The first 3 of the 61 layers are dense** (one SwiGLU FFN of width 18,432).
#
# The **multi-token-prediction (MTP) module** (one extra layer that predicts the token after next during
# training) is *not* in the 671B: the model card says the 685B checkpoint holds 671B of main model and
# 14B of MTP module. We count it separately. The routers' bias terms used for load balancing are not
# trained by gradient (Hugging Face keeps them as buffers); at 256 numbers a layer they change nothing.

# %% [markdown]
# `tformer.moe.params.deepseek_v3_param_counts` adds it up. Every layer has MLA (`mla_params`: query
# down/norm/up, joint key-value down with the shared RoPE key, norm, up, output) and two RMSNorms
# (LayerNorm without the mean: divide by the root mean square, then scale). The first 3 layers have a
# dense FFN, the other 58 a router, the shared expert and 256 routed experts; the input and output
# embeddings are untied. It also counts the MTP module.

# %%
print(DEEPSEEK_V3)
print(inspect.getsource(mla_params))
print(inspect.getsource(deepseek_v3_param_counts))

# %% [markdown]
# The function is checked against Hugging Face's `DeepseekV3ForCausalLM` built from a tiny configuration
# of the same layout (on the `meta` device: shapes only, no memory), then applied to the real one.

# %%
tiny = dict(DEEPSEEK_V3, vocab_size=100, hidden_size=32, num_hidden_layers=4, first_k_dense_replace=1,
            intermediate_size=48, num_attention_heads=4, q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8,
            qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=6, moe_intermediate_size=12,
            num_experts_per_tok=2, n_group=2, topk_group=1)
with torch.device("meta"):
    hf_tiny = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**tiny, tie_word_embeddings=False))
assert sum(p.numel() for p in hf_tiny.parameters()) == deepseek_v3_param_counts(tiny)["total"]
deepseek = deepseek_v3_param_counts(DEEPSEEK_V3)
lookup = DEEPSEEK_V3["vocab_size"] * DEEPSEEK_V3["hidden_size"]           # the input embedding: a lookup
print(f"DeepSeek-V3: total {deepseek['total'] / 1e9:.1f} B, active {deepseek['active'] / 1e9:.1f} B "
      f"({(deepseek['active'] - lookup) / 1e9:.1f} B without the input embedding, which is a table lookup)")
assert 670.5e9 < deepseek["total"] < 671.5e9                                # "671B total"
assert 36.5e9 < deepseek["active"] - lookup < 37.5e9 < deepseek["active"]   # "37B activated"

# %% [markdown]
# So the reported 37B counts what a token multiplies with (the output head, not the input table). The
# MTP module: one more MoE layer of the same shape, a projection from the two concatenated
# 7,168-wide inputs back to 7,168, two RMSNorms, and its own copy of the embedding and output head in the
# checkpoint. Side by side with the other two models:

# %%
mtp = deepseek["mtp"]
print(f"MTP module {mtp / 1e9:.1f} B; with it the checkpoint holds {(deepseek['total'] + mtp) / 1e9:.1f} B "
      "(the model card: 685B = 671B + 14B)")
assert 684e9 < deepseek["total"] + mtp < 686e9
print(f"{'model':>16} {'total':>9} {'active':>8} {'active share':>13}")
for name, cnt in (("Mixtral-8x7B", mixtral), ("Qwen3-235B-A22B", qwen), ("DeepSeek-V3", deepseek)):
    print(f"{name:>16} {cnt['total'] / 1e9:8.1f}B {cnt['active'] / 1e9:7.1f}B {cnt['active'] / cnt['total']:12.1%}")

# %% [markdown]
# ## 4. Load balancing
#
# Nothing stops a router from sending most tokens to the same few experts: they get more gradient,
# improve, and attract even more tokens. The Switch Transformer adds
#
# $$\mathcal{L}_{bal} = \alpha\, E \sum_{i=1}^{E} f_i\, P_i,$$
#
# with $f_i$ the share of the $N k$ routing choices that went to expert $i$ and $P_i$ the mean router
# probability of expert $i$. It is 1 for perfectly uniform routing and $E$ when everything collapses
# onto one expert; its gradient flows through $P_i$. (The router z-loss, $\mathrm{mean}(\mathrm{logsumexp}(xW_r)^2)$,
# keeps the router's logits small.)

# %%
uniform = torch.full((8, 4), 0.25)
spread = torch.tensor([[0], [1], [2], [3], [0], [1], [2], [3]])
collapsed = torch.zeros(8, 4)
collapsed[:, 0] = 1.0
print("uniform routing:", load_balancing_loss(uniform, spread).item(),
      "| collapse onto one of 4:", load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long)).item())

# %% [markdown]
# ## 5. Capstone: a small MoE language model vs a dense one with the same active parameters
#
# Both models are GPTs (pre-LN, learned positions, tied embeddings). The dense model's FFN has width
# $4d$; the MoE model has 8 experts of width $2d$ in every block and sends each token to 2 of them, so a
# token meets the same number of FFN weights in both models (plus a tiny router). A third model is the
# same MoE without the balancing and z losses. All three see the same tokens in the same order, trained
# by the course's `Trainer` (which also runs under `torchrun` with DistributedDataParallel). Full mode's
# size is one a 16 GB T4 trains within the chapter's 15 minutes: d = 384, 6 layers, 2,000 steps of
# 32 x 256 tokens, from the first 30M characters of WikiText-103.

# %%
if SMALL:
    text, val_text = offline_text(), None
    vocab, width, layers, heads, block, batch, steps, lr = 512, 64, 2, 4, 32, 16, 200, 3e-3
else:
    text = hf_text("wikitext", "train", max_chars=30_000_000)            # raises with advice when offline
    val_text = hf_text("wikitext", "validation")
    vocab, width, layers, heads, block, batch, steps, lr = 8192, 384, 6, 6, 256, 32, 2000, 1e-3   # a T4's size
tok = train_tokenizer([text], vocab)
ids = encode(tok, text)
if val_text is None:
    train_ids, val_ids = split_stream(ids, 0.9)
else:
    train_ids, val_ids = ids, encode(tok, val_text)
print(f"{len(train_ids):,} training tokens, {len(val_ids):,} validation tokens, vocabulary {vocab}")

base = dict(vocab_size=vocab, context_length=block, n_layers=layers, n_heads=heads, d_model=width, dropout=0.0)
configs = {
    "dense": GPTConfig(**base, d_ff=4 * width),
    "MoE 8x top-2": GPTConfig(**base, moe=MoEConfig(n_experts=8, top_k=2, d_ff=2 * width)),
    "MoE, no balancing loss": GPTConfig(**base, moe=MoEConfig(n_experts=8, top_k=2, d_ff=2 * width,
                                                              balance_weight=0.0, z_weight=0.0)),
}
for name, cfg in configs.items():
    torch.manual_seed(0)
    m = GPT(cfg)
    print(f"{name:>24}: total {m.num_params():>11,d}  active per token {m.num_params(active=True):>11,d}")

# %%
n_val = 8 if SMALL else 50
val_batches = LMBatches(val_ids, batch, block, min(n_val, (len(val_ids) - 1) // (batch * block)), shuffle=False)
runs = {}
for name, cfg in configs.items():
    torch.manual_seed(0)
    model = GPT(cfg)
    train_cfg = TrainConfig(max_steps=steps, lr=lr, schedule="constant", warmup=max(10, steps // 20),
                            betas=(0.9, 0.95), adam_eps=1e-8, weight_decay=0.0, eval_every=steps // 5,
                            log_every=steps // 5, progress=False)              # the curves below show the run
    trainer = Trainer(model, lm_loss, LMBatches(train_ids, batch, block, steps, seed=0), train_cfg,
                      val_data=val_batches, device=dev)
    if dev.type != "cuda":
        kernel = contextlib.nullcontext()
    elif gpu.why_no_flash(dev) is None:     # sm80+: the flash kernel or an error
        kernel = force_flash()
    else:                                   # a T4 (sm75): the policy's kernel, memory-efficient
        kernel = sdpa_kernel([policy.attention_backend(dev)])
    with kernel:
        trainer.fit()
    runs[name] = (model, [(h["step"], h["val_loss"]) for h in trainer.state.history if "val_loss" in h])
    print(f"{name:>24}: validation loss {runs[name][1][-1][1]:.3f}")

# %%
# Figure: Validation loss of the dense and MoE models at equal active parameters, on the same tokens.
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, (_, hist) in runs.items():
    ax.plot([s for s, _ in hist], [v for _, v in hist], marker="o", ms=3, label=name)
ax.set_xlabel("step (same tokens for every model)"), ax.set_ylabel("validation loss")
ax.set_title("Dense vs MoE at equal active parameters"), ax.grid(alpha=0.3), ax.legend(fontsize=8)
plt.show()
dense_loss, moe_loss = runs["dense"][1][-1][1], runs["MoE 8x top-2"][1][-1][1]
print(f"final validation loss: dense {dense_loss:.3f}, MoE {moe_loss:.3f} ({moe_loss - dense_loss:+.3f})")
print("lowest final validation loss of the three:", min(runs, key=lambda name: runs[name][1][-1][1]))
assert all(h[-1][1] < h[0][1] for _, h in runs.values())                       # every model learned
if not SMALL:                      # at equal active parameters the MoE should win once trained longer
    assert moe_loss < dense_loss, "MoE should beat dense per token at equal active parameters"

# %% [markdown]
# In small mode the run is 200 steps on 0.2M tokens: which model ends ahead (the cell prints the gap and
# the lowest of the three) is decided by a margin of the order of run-to-run noise. There the MoE without
# the balancing loss ends lowest, and the balanced MoE behind the dense model. Its router is not the
# better one for that: the next two figures show its load piling onto a few experts, and more of its
# choices dropped once experts have a fixed capacity (these runs drop none). The MoE also starts
# slower (its experts each see only a quarter of the tokens). The capstone's seeds below are what can rank
# them; full mode asserts only that the balanced MoE ends below the dense model.
#
# With more training the extra parameters pay off. A controlled comparison below
# 25M parameters (Wael 2026, *Dense vs Sparse Pretraining at Tiny Scale*, arXiv:2605.13769; 4 experts,
# top-2, balancing and z losses, three seeds) reports a best validation loss of 1.579 for the MoE against
# 1.655 for a dense model with the same active parameters. A dense model with the same *total*
# parameters reached 1.561. Full mode here asserts that the MoE beats the active-matched dense model.
#
# ### Expert load, with and without the balancing loss
#
# We run the validation set through each trained MoE model and count how many routing choices each
# expert received in each layer.

# %%
# Figure: Share of routing choices per expert and layer, with and without the balancing loss.
@torch.no_grad()
def expert_load(model):
    """(layers, E) share of the routing choices per expert over the validation set."""
    model.eval()
    moes = [b.ffn for b in model.blocks if isinstance(b.ffn, MoE)]
    counts = torch.zeros(len(moes), moes[0].cfg.n_experts)
    for xb, _ in val_batches:
        model(xb.to(dev))
        counts += torch.stack([m.last_counts.float().cpu() for m in moes])
    return counts / counts.sum(1, keepdim=True)

loads = {name: expert_load(runs[name][0]) for name in ("MoE 8x top-2", "MoE, no balancing loss")}
fig, axes = plt.subplots(1, 2, figsize=(10, 3), sharey=True)
for ax, (name, load) in zip(axes, loads.items()):
    for layer_i, row in enumerate(load):
        ax.bar(torch.arange(8) + 0.8 * layer_i / len(load) - 0.3, row, width=0.8 / len(load), label=f"layer {layer_i}")
    ax.axhline(1 / 8, color="k", ls="--", lw=0.8)
    ax.set_title(name, fontsize=10), ax.set_xlabel("expert"), ax.legend(fontsize=7)
axes[0].set_ylabel("share of routing choices")
plt.show()
for name, load in loads.items():
    print(f"{name:>24}: busiest expert gets {load.max():.1%} of the choices (uniform: 12.5%), "
          f"least busy {load.min():.1%}")
assert loads["MoE, no balancing loss"].max() > loads["MoE 8x top-2"].max()

# %% [markdown]
# ### Capacity: what imbalance costs
#
# Real systems give each expert a fixed buffer of $C = \lceil c \cdot N k / E \rceil$ slots (capacity
# factor $c$) so that shapes are static and work is even across devices; choices beyond an expert's
# capacity are *dropped* (the token skips that expert through its residual connection). The more
# unbalanced the router, the more tokens are dropped at a given capacity factor.

# %%
# Figure: Share of routing choices dropped against the capacity factor.
@torch.no_grad()
def dropped_share(model, factor):
    model.eval()
    first = next(b.ffn for b in model.blocks if isinstance(b.ffn, MoE))
    xb, _ = next(iter(val_batches))
    model(xb.to(dev))                                    # the layer records its routing: last_gates, last_experts
    g, e = first.last_gates, first.last_experts
    cap = expert_capacity(len(e), 8, 2, factor)
    return 1 - make_plan(g, e, 8, cap).keep.float().mean().item()

factors = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
drops = {name: [dropped_share(runs[name][0], f) for f in factors] for name in loads}
curves(factors, drops, "capacity factor", "share of choices dropped", "Dropped choices (first MoE layer)")
plt.show()
print({name: [round(v, 3) for v in vals] for name, vals in drops.items()})

# %% [markdown]
# ### Routing drawn: which tokens go where
#
# Each row is a token of a validation sentence, each column an expert of the first MoE layer; the colour
# is the gate weight the token gives that expert (two non-zero cells per row).

# %%
# Figure: Gate weight per token and expert in the first MoE layer, on a validation sentence.
model = runs["MoE 8x top-2"][0].eval()
first = model.blocks[0].ffn
snippet = val_ids[:24][None].to(dev)
with torch.no_grad():
    model(snippet)
g, e = first.last_gates, first.last_experts                             # (24, 2): the routing of this forward
grid = torch.zeros(24, 8, device=g.device).scatter(1, e, g)
labels = [repr(tok.decode([i]))[1:-1] for i in snippet[0].tolist()]
ax = heatmap(grid.detach().cpu(), y_labels=labels, x_labels=[str(i) for i in range(8)],
             title="gate weight per token and expert")
ax.set_xlabel("expert"), ax.set_ylabel("token")
plt.show()

# %% [markdown]
# **Which is better: one minute cannot say.** The runs above are the one-minute version: they show the
# routing, the balance across experts and the equal active FLOPs per token. But a few hundred steps on
# a small corpus are too few to rank the MoE against the dense model (their gap is of the order of the
# difference between seeds).
#
# That claim belongs to the capstone's CPU tier, `tformer capstone moe`. It trains
# dense vs MoE 8x top-2 at equal active parameters and equal tokens on the Python standard library's
# own source (byte-level BPE, split by file; d_model 128, 4 layers, 1,000 steps of 4,096 tokens: 4.1M
# tokens per run), three seeds each, a cosine schedule per run (the learning rate warms up, then falls
# along half a cosine to 0 at the run's last step). It takes about 45 minutes on a 2-core CPU (it
# resumes after a kill). The MoE is
# ahead only if its mean final validation loss is below the dense mean by more than twice the larger
# spread over seeds. The cell shows that run when it exists, else the committed reference; with
# neither, it prints the command.

# %%
# Figure: The MoE capstone's training loss, three seeds each of the dense and the MoE model.
from tformer.capstones import show

moe_capstone = show("moe")

# %% [markdown]
# What the seeds say, from the same result. The cell prints the gap in mean final validation loss against twice the larger
# spread over seeds, the MoE's training speed relative to the dense model's, the busiest expert's share
# of the routing over the uniform share, and the comparison at equal wall-clock time (the MoE's
# validation loss when each dense run finished). The busiest expert is counted twice: on batches drawn as
# training draws them (windows from all over the corpus, where the balancing loss evens the load), and on
# the validation split alone (the last files), where experts that specialise by content can be busier.

# %%
if moe_capstone:
    r = moe_capstone
    gap, bar = r["dense_mean"] - r["moe_mean"], 2 * r["max_seed_spread"]
    print(f"dense {r['dense_mean']:.4f} vs MoE {r['moe_mean']:.4f}: the MoE ahead by {gap:.4f}; twice the "
          f"larger seed spread {bar:.4f} -> MoE ahead beyond seed noise: {gap > bar}")
    print(f"training tokens/s: MoE {r['tokens_per_s']['ratio']:.2f}x the dense model's; busiest expert "
          f"{max(r['busiest_expert_vs_uniform']):.2f}x the uniform share on batches drawn as in training, "
          f"{max(r.get('busiest_expert_on_validation') or [float('nan')]):.2f}x on the validation split "
          "(worst layer, worst seed)")
    print(f"at each dense run's wall-clock time, the MoE's validation loss: {r['moe_val_loss_at_dense_minutes']} "
          f"(dense at the end: {r['dense_val_loss']})")

# %% [markdown]
# ## 6. Flash attention on the GPU: forced, checked, measured
#
# `F.scaled_dot_product_attention` chooses a kernel by itself and quietly falls back to a slower one
# when the fast one cannot take the input. `tformer.measure.flash.force_flash()` allows only the flash kernel
# (anything it cannot run raises an error), and `run_with_flash(fn)` profiles fn and raises unless a
# flash kernel actually ran. On a CUDA GPU of sm80 or newer the capstone trains under `force_flash()` in
# bf16; a T4 (sm75: no flash kernel, no bf16) trains with SDPA's memory-efficient kernel in fp16 instead,
# as the device policy chooses.
#
# Here we
# prove which kernel runs and measure tokens/s and MFU (model FLOPs utilisation: 6 x active parameters
# + attention FLOPs per token, over the GPU's datasheet peak). On a CPU the same check finds PyTorch's
# CPU flash kernel. A GPU older than sm80 (NVIDIA's compute capability 8.0, the A100's; a free Colab T4 is
# sm75) has no flash kernel and no bf16:
# there the cell says so and checks the kernel that runs instead, SDPA's memory-efficient one, in fp16
# (`tformer.utils.device` decides by compute capability; `lm_throughput` adds a gradient scaler).

# %%
model = runs["MoE 8x top-2"][0].train()
probe = train_ids[: 2 * block].view(2, block).to(dev)

def forward_backward():
    with torch.autocast(dev.type, dtype=policy.amp_dtype(dev) or torch.bfloat16, enabled=dev.type == "cuda"):
        loss = model(probe).float().mean() + model.aux_loss
    loss.backward()
    model.zero_grad(set_to_none=True)

if gpu.why_no_flash(dev):          # e.g. a T4: say why, and prove the memory-efficient kernel runs instead
    print("flash cannot be forced here:", gpu.why_no_flash(dev))
    with sdpa_kernel([policy.attention_backend(dev)]):
        _, kernels = sdpa_backends_used(forward_backward)
    assert kernels == ["efficient"], kernels
else:
    _, kernels = run_with_flash(forward_backward)
    assert kernels == (["flash"] if dev.type == "cuda" else ["flash (cpu)"])
print("attention kernels that ran:", kernels)

# %% [markdown]
# The check fails loudly: a model that bypasses SDPA (here by capturing attention weights) is caught,
# and on a GPU an fp32 input, which the flash kernel cannot take, raises instead of running slowly.

# %%
try:
    with tformer.capture_attention(model):
        run_with_flash(forward_backward)
    raise AssertionError("expected run_with_flash to refuse")
except RuntimeError as err:
    print("refused:", str(err)[:110], "...")
if dev.type == "cuda":             # fp32 has no flash kernel: forcing flash raises instead of falling back
    q = torch.randn(1, 2, 16, 64, device=dev)
    try:
        with force_flash():
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        raise AssertionError("expected the flash kernel to refuse fp32")
    except RuntimeError as err:
        print("fp32 refused:", str(err).splitlines()[0][:110])

# %%
for name in ("dense", "MoE 8x top-2"):
    r = lm_throughput(runs[name][0], batch_size=batch, seq_len=block, steps=3 if SMALL else 20,
                      warmup=1 if SMALL else 5)
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (no known peak for this device)"
    print(f"{name:>14} on {r['device']} ({r['dtype']}): {r['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, "
          f"kernels {r['backends']}")

# %% [markdown]
# **A note on GPUs: which dispatch `"auto"` picks.** `"grouped"` is chosen only where the grouped matmul is
# one kernel with no host sync (no wait for the GPU to send a value back to the CPU): an sm90 or sm100 GPU,
# NVIDIA's compute capability 9.0 (Hopper) or 10.0 (Blackwell), as `tformer.utils.gpu.grouped_mm_fast`
# decides. On an A100 (sm80) or a T4, PyTorch's grouped matmul copies the block offsets to the host and
# loops over the experts, so `"auto"` pads instead.
#
# ## Exercises
#
# ### Exercise 1: a top-k router
# Given router logits `(N, E)`, return `(gates (N, k), experts (N, k))`: the softmax probabilities
# (over all $E$ experts) of the $k$ best experts, best first, renormalised to sum to 1 over the $k$ when
# `normalize` is true.

# %%
def my_top_k_router(logits, k, normalize=True):
    ### BEGIN SOLUTION
    probs = torch.softmax(logits, dim=-1)
    gates, experts = probs.topk(k, dim=-1)
    if normalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates, experts
    ### END SOLUTION


# %%
check("ch13.top_k_router", my_top_k_router)

# %% [markdown]
# ### Exercise 2: the load-balancing loss
# Given router probabilities `probs (N, E)` and the chosen experts `experts (N, k)`, return
# $E \sum_i f_i P_i$ (without $\alpha$): $f_i$ the share of the $N k$ choices equal to $i$, $P_i$ the mean
# probability of expert $i$. Uniform routing gives 1.

# %%
def my_balance_loss(probs, experts):
    ### BEGIN SOLUTION
    n_experts = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=n_experts).to(probs.dtype) / experts.numel()
    return n_experts * (f * probs.mean(dim=0)).sum()
    ### END SOLUTION


# %%
check("ch13.balance_loss", my_balance_loss)

# %% [markdown]
# ## The package's versions
# What `tformer.moe` runs, now that you have written both: `MoE.forward` routes every token with this
# `top_k_route` (asking it for the router probabilities too, `return_probs=True`, which the balancing loss
# needs). That is the same top-k gating as yours, with the softmax in float32 even under bf16 autocast and
# checks that name the expected shapes. Then it adds the Switch balancing loss below to its auxiliary loss.

# %%
print(inspect.getsource(top_k_route))
print(inspect.getsource(load_balancing_loss))

# %% [markdown]
# ## Questions
# The first two count Qwen3-235B-A22B's parameters from its configuration, as section 3 did with
# `moe_lm_param_counts`. Its source:

# %%
print(inspect.getsource(moe_lm_param_counts))

# %% [markdown]
# **Question 1.** What share of Qwen3-235B-A22B's parameters does one token use, in percent? Answer with a
# number. The cell under *Qwen3-235B-A22B from its published configuration* prints the counts.

# %%
answer = 100 * 22.19 / 235.09  ### ANSWER
check("ch13.q_active_share", answer)

# %% [markdown]
# **Question 2.** Keep everything of Qwen3-235B-A22B's configuration but send each token to 16 experts
# instead of 8. How many parameters does a token use, in billions? Answer with a number, computed from
# what the chapter prints: the same cell prints the configuration and the active count with 8 experts,
# and the source above shows which terms depend on the experts per token.

# %%
answer = 22.19 + 94 * 8 * 3 * 4096 * 1536 / 1e9  ### ANSWER
check("ch13.q_active_16", answer)

# %% [markdown]
# **Question 3.** In section 3 one MoE layer grows from 2 to 32 experts, each token still visiting $k = 2$.
# What happens to its parameters and to its forward FLOPs?
# - **A.** The parameters grow about linearly with $E$; the experts' FLOPs stay the same, only the
#   router's small matmul grows.
# - **B.** Both grow about linearly with $E$: a bigger layer costs more to run.
# - **C.** The parameters stay the same; the FLOPs fall, since each expert gets fewer tokens.
# - **D.** Neither changes: parameters that a token does not visit do not count.
#
# The table under *3. Total vs active parameters* prints both.

# %%
answer = "A"  ### ANSWER
check("ch13.q_compute_follows_k", answer)

# %% [markdown]
# ## Summary
# * Top-k gating built by hand, with a loop over tokens, equals `tformer.moe.MoE`, and the sorted dispatch
#   paths equal the loop.
# * From 2 to 32 experts the total parameters grow 16-fold while a token's active parameters and the
#   forward FLOPs barely move: compute follows $k$, not $E$. Qwen3-235B-A22B uses 9.4% of its
#   parameters per token, DeepSeek-V3 37.6 B of 671.0 B.
# * The balancing loss is 1.0 for uniform routing and 4.0 for a collapse onto one of 4 experts; trained
#   without it, the busiest expert takes a larger share of the choices (asserted), and more choices are
#   dropped at a given capacity factor.
# * One minute cannot rank MoE against dense; the committed capstone, three seeds each, puts the MoE ahead
#   by 0.0597 in validation loss, beyond twice the larger seed spread (0.0130), at 0.89x the dense model's
#   tokens per second.
# * `run_with_flash` proves which attention kernel ran, and refuses a model that bypasses SDPA.
