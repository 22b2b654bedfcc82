# %% [markdown]
# # Chapter 14: Efficient inference
#
# **What this chapter covers.** Generating text one token at a time is slow for reasons training never
# meets: every step re-reads the weights and all earlier keys and values. Five tools attack that cost,
# and each is measured here on small GPT models trained in this notebook:
#
# 1. **KV cache**: keep the keys and values of earlier tokens instead of recomputing them.
# 2. **MQA / GQA**: share key/value heads between query heads, so the cache shrinks.
# 3. **Paged KV cache** (vLLM's PagedAttention): keep the cache in fixed-size blocks, so a batch of
#    requests of mixed lengths wastes almost no memory.
# 4. **Weight quantization**: int8 per channel, int4 per group (two values per byte).
# 5. **Speculative decoding**: a small draft model proposes, the large model verifies several tokens
#    in one pass, and the output distribution does not change.
#
# Then what they are for: **serving many requests at once**. A scheduler adds and removes requests from
# the running batch at every step over the paged cache (continuous batching), behind an OpenAI-compatible
# server that the official `openai` client talks to.
#
# **How to check an exercise.** Write the body of the function in an exercise cell, run it, then run
# the cell below it: `check("ch14.kv_step", my_kv_step)` prints PASS, or the smallest input where your
# function disagrees with the reference, with a hint.
#
# Set `TFORMER_SMALL=1` for the quick CPU version (a few minutes of training becomes a few seconds;
# the numbers are then rougher). Timings on a shared machine are noisy: compare ratios, not seconds.
#
# **How long.** In small mode this notebook runs in about a minute on a 2-core laptop CPU.
#
# **Where the code lives** (the package runs what this chapter builds; its versions are printed at the end,
# after the exercises):
# * `tformer/cache.py: KVCache, make_caches` (`KVCache.append`, `truncate`, `nbytes`)
# * `tformer/models/gpt.py: GPT, GPTConfig` (`n_kv_heads` for GQA/MQA; `GPT.generate`)
# * `tformer/inference/paged_cache.py: PagedConfig, BlockPool, BlockTable, generate_paged, kv_memory`
# * `tformer/inference/quantize.py: quantize_int8, quantize_int4, QuantLinear, quantize_model, model_bytes`
# * `tformer/inference/speculative.py: speculative_accept, speculative_generate`
# * `tformer/inference/engine.py: Engine, SamplingParams, plan_admission` (continuous batching)
# * `tformer/serve/app.py: build_app, start_in_background` (`tformer serve`)
# * `tformer/training/trainer.py: Trainer, TrainConfig`, `tformer/data/text.py: LMBatches, train_tokenizer`,
#   `tformer/measure/timing.py: time_fn`

# %%
import inspect
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import tformer
from tformer.cache import KVCache, make_caches
from tformer.grading import check
from tformer.data.text import DataUnavailableError, LMBatches, encode, hf_text, offline_text, split_stream, train_tokenizer
from tformer.training.metrics import perplexity
from tformer.models import GPT, GPTConfig
from tformer.inference.paged_cache import (BlockPool, DecodeIndex, PagedConfig, generate_paged, kv_memory,
                                           paged_decode_attention, write_kv)
from tformer.inference.quantize import QuantLinear, model_bytes, quantize_int4, quantize_int8, quantize_model
from tformer.inference.speculative import speculative_accept, speculative_generate
from tformer.inference.engine import Engine, SamplingParams, plan_admission
from tformer.measure.timing import time_fn
from tformer.training import TrainConfig, Trainer
from tformer.training.losses import lm_loss

tformer.seed_everything(0)
dev = tformer.device()
SMALL = tformer.SMALL
print("small mode:", SMALL, "| device:", dev)

# %% [markdown]
# ## Data and models
# Small mode trains on Python's bundled documentation (offline). Full mode uses WikiText-2 through
# `datasets` (downloaded once and cached); offline, it says so and falls back to the bundled text.
#
# We train four GPTs on the same tokens: a **target** with multi-head attention (MHA), the same model
# with grouped-query attention (**GQA**, 2 key/value heads) and multi-query attention (**MQA**, 1 key/value
# head), and a much smaller **draft** model for speculative decoding.

# %%
if SMALL:
    text, vocab, block, steps, batch = offline_text()[:150_000], 512, 64, 100, 8
    width, layers, heads = 64, 2, 4
else:
    try:
        text = hf_text("wikitext2", max_chars=8_000_000)
    except DataUnavailableError as e:
        print(f"{e}\nFalling back to the bundled offline text.")
        text = offline_text()
    vocab, block, steps, batch = 4096, 256, 3000, 32
    width, layers, heads = 384, 6, 6

tok = train_tokenizer([text], vocab_size=vocab)
ids = encode(tok, text)
train_ids, val_ids = split_stream(ids, 0.9)
val_batches = LMBatches(val_ids, 8, block, min(4 if SMALL else 40, (len(val_ids) - 1) // (8 * block)), shuffle=False)
print(f"{len(ids):,} tokens, vocabulary {vocab}")

# %% [markdown]
# One builder and one training recipe for all four models, so they differ only in their shapes.

# %%
def make_gpt(n_kv_heads=None, n_layers=layers, d_model=width, n_heads=heads):
    cfg = GPTConfig(vocab_size=vocab, context_length=block, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                    d_model=d_model, dropout=0.0)
    return GPT(cfg)


def train(model, name):
    cfg = TrainConfig(max_steps=steps, lr=3e-3 if SMALL else 1e-3, schedule="constant", warmup=steps // 10,
                      betas=(0.9, 0.95), adam_eps=1e-8, progress=not SMALL, log_every=max(steps // 5, 1), seed=0)
    batches = LMBatches(train_ids, batch, block, steps, seed=0)
    result = Trainer(model, lm_loss, batches, cfg, val_data=val_batches, device=dev).fit()
    print(f"{name:6s} {model.num_params():>9,} params  val loss {result['val_loss']:.3f}  "
          f"({result['minutes'] * 60:.1f} s)")
    return model.eval(), result["val_loss"]


# %% [markdown]
# Train the three attention variants and the draft on the same tokens in the same order.

# %%
t0 = time.perf_counter()
models, val_loss = {}, {}
for name, kv in [("MHA", None), ("GQA", 2), ("MQA", 1)]:
    models[name], val_loss[name] = train(make_gpt(kv), name)
draft, val_loss["draft"] = train(make_gpt(n_layers=1, d_model=width // 2, n_heads=2), "draft")
target = models["MHA"]
print(f"training took {time.perf_counter() - t0:.0f} s")

# %% [markdown]
# ## 1. The KV cache
# At step $t$ the new token needs keys and values of all $t$ earlier tokens. Without a cache the model
# recomputes them: the step costs a forward pass over $t$ tokens, and $n$ tokens cost $O(n^2)$ token
# passes. With the cache, each step feeds only the new token: $O(n)$. Below, the model is the same, the
# output is the same, only the time differs.

# %%
# Figure: Greedy decoding time against generated tokens, with and without the KV cache.
# Speed does not depend on training: a random-init model with a longer context shows the trend better.
speed_model = GPT(GPTConfig(vocab_size=vocab, context_length=256 if SMALL else 1024, n_layers=layers, n_heads=heads,
                            d_model=2 * width)).to(dev).eval()
prompt = val_ids[:8][None].to(dev)
lengths = [32, 96, 192] if SMALL else [128, 256, 512, 1000]
with_cache, without = [], []
for n in lengths:
    with_cache.append(time_fn(lambda: speed_model.generate(prompt, n, temperature=0, use_cache=True), warmup=0, repeat=1))
    without.append(time_fn(lambda: speed_model.generate(prompt, n, temperature=0, use_cache=False), warmup=0, repeat=1))
for n, a, b in zip(lengths, with_cache, without):
    passes = sum(8 + i for i in range(n))                             # token positions run through the model
    print(f"{n:4d} new tokens: cache {a * 1e3:7.1f} ms ({n + 7} token passes)   no cache {b * 1e3:7.1f} ms "
          f"({passes} token passes)   speed-up {b / a:4.1f}x")
p0, p1 = (sum(8 + i for i in range(n)) for n in (lengths[0], lengths[-1]))
print(f"{lengths[0]} -> {lengths[-1]} new tokens (x{lengths[-1] / lengths[0]:.1f}): no cache x{p1 / p0:.1f} token "
      f"passes, x{without[-1] / without[0]:.1f} time; cache x{with_cache[-1] / with_cache[0]:.1f} time")
plt.figure(figsize=(5, 3.2))
plt.plot(lengths, [t * 1e3 for t in without], "o-", label="no cache (recompute the past)")
plt.plot(lengths, [t * 1e3 for t in with_cache], "o-", label="KV cache")
plt.xlabel("generated tokens"); plt.ylabel("ms"); plt.legend(); plt.title("greedy decoding time")
plt.show()

# %% [markdown]
# The gap grows with length. Without the cache the token passes grow quadratically with the length;
# the last line prints their growth beside the length's and the times'. In small mode the uncached time
# grows faster than the length but well short of its token passes: on a model this small, every step
# also pays a fixed overhead that does not grow with its tokens. The cached time grows about as the
# length does. Both paths compute the same logits: `tests/test_core_*.py` asserts it.
#
# ## 2. MQA and GQA: a smaller cache for (almost) the same quality
# The cache holds, per token and layer, $2 \times n_{kv} \times d_{head}$ numbers. MHA has
# $n_{kv} = n_{heads}$; GQA shares each key/value head among a group of query heads; MQA keeps one.
# We measure the bytes the cache actually holds after generating, and the validation loss of the three
# models trained on the same data for the same number of steps.

# %%
# Figure: KV-cache bytes per token (left) and validation loss (right) of MHA, GQA and MQA.
rows, ctx = [], block // 2
for name, m in models.items():
    caches = make_caches(m.cfg.n_layers, block)
    with torch.no_grad():
        m(val_ids[:ctx][None].to(dev), caches)                        # fill the cache with a context
    per_token = sum(c.nbytes() for c in caches) / ctx
    rows.append((name, m.cfg.n_kv_heads or m.cfg.n_heads, per_token, val_loss[name]))
    print(f"{name}: {rows[-1][1]} KV heads  {per_token:6.0f} bytes/token of cache  val loss {val_loss[name]:.3f}"
          f"  ({rows[0][2] / per_token:.0f}x smaller than MHA)")
assert len({r[2] / r[1] for r in rows}) == 1                          # cache bytes proportional to KV heads
fig, ax = plt.subplots(1, 2, figsize=(8, 3))
ax[0].bar([r[0] for r in rows], [r[2] for r in rows]); ax[0].set_title("KV cache bytes per token")
ax[1].bar([r[0] for r in rows], [r[3] for r in rows]); ax[1].set_title("validation loss")
ax[1].set_ylim(min(r[3] for r in rows) - 0.2, max(r[3] for r in rows) + 0.1)
plt.tight_layout(); plt.show()

# %% [markdown]
# GQA and MQA also have fewer parameters (smaller K/V projections), so some loss gap is expected; at
# this scale it is small next to the cache savings the cell prints, $n_{heads}/n_{kv}$: 2x and 4x in small
# mode (4 heads), 3x and 6x in full mode (6 heads). That trade is why GQA is now the default:
# Llama 2 used it only in its largest models (34B and 70B; the 7B and 13B keep MHA), every Llama 3 model
# uses it (8 key/value heads), and so do Mistral 7B and Qwen2 and later.
#
# ## 3. The paged KV cache
# A contiguous cache reserves `max_len` slots per request. Real requests have mixed lengths, and the
# reservation is mostly empty. PagedAttention cuts the cache into blocks of `block_size` tokens; a
# *block table* per sequence maps its logical blocks to physical ones taken from a shared pool by an
# allocator. First: the paged cache gives exactly the outputs of the contiguous one.

# %%
pool = BlockPool(PagedConfig.for_model(target, block_size=16, n_blocks=256), device=dev)
paged, contiguous = pool.new_caches(batch=2), make_caches(target.cfg.n_layers, block)
x = val_ids[:40].view(2, 20).to(dev)
with torch.no_grad():
    for chunk in (x[:, :12], x[:, 12:13], x[:, 13:20]):               # prompt, one step, a chunk
        torch.testing.assert_close(target(chunk, paged), target(chunk, contiguous))
print("paged == contiguous; block table of sequence 0:", paged[0].table.ids[0].tolist())
paged[0].table.free()

# %% [markdown]
# Now a batch of requests with mixed prompt and output lengths, served together from one pool: each
# request takes a block when its last one is full and returns all of them when it finishes. We
# measure the peak pool usage, and compare it with reserving the maximum length for every request.

# %%
g = torch.Generator().manual_seed(0)
n_req = 8 if SMALL else 32
prompt_lens = torch.randint(4, block // 4, (n_req,), generator=g).tolist()
new_lens = torch.randint(4, block // 2, (n_req,), generator=g).tolist()
starts = torch.randint(0, len(val_ids) - block, (n_req,), generator=g).tolist()
prompts = [val_ids[s:s + n].to(dev) for s, n in zip(starts, prompt_lens)]
pool = BlockPool(PagedConfig.for_model(target, block_size=16, n_blocks=512), device=dev)
outs, stats = generate_paged(target, prompts, new_lens, pool)
for p, n, o in list(zip(prompts, new_lens, outs))[:3]:               # same tokens as plain generation
    assert torch.equal(o, target.generate(p[None], n, temperature=0)[0])
print(f"{n_req} requests served from one pool; peak {stats['peak_bytes'] / 1e6:.2f} MB of blocks")

# %% [markdown]
# What the same batch would hold in a contiguous cache that reserves `max_len` slots per request:

# %%
# Figure: KV memory for a mixed-length batch: tokens held, paged blocks at their peak, a contiguous reservation.
bytes_per_token = pool.block_bytes() // pool.cfg.block_size
final = [p + n for p, n in zip(prompt_lens, new_lens)]
acct = kv_memory(final, block, 16, bytes_per_token)
reserved = acct["contiguous"]
print(f"{n_req} requests, final lengths {final}")
print(f"contiguous, max_len={block} each: {reserved / 1e6:.2f} MB reserved, {acct['contiguous_waste']:.0%} of it unused at the end")
print(f"paged (16-token blocks):       {stats['peak_bytes'] / 1e6:.2f} MB at the peak, "
      f"{acct['paged_waste']:.0%} of the final blocks unused")
assert stats["peak_bytes"] < reserved / 2
plt.figure(figsize=(5, 3))
plt.bar(["tokens held\n(final)", "paged blocks\n(peak)", "contiguous\nreservation"],
        [acct["used"] / 1e6, stats["peak_bytes"] / 1e6, reserved / 1e6])
plt.ylabel("MB"); plt.title("KV memory for a mixed-length batch"); plt.show()

# %% [markdown]
# The paged cache wastes at most one partly filled block per sequence, and finished requests free
# their blocks for new ones (the peak above is below the sum of final lengths, because short requests
# finished early). vLLM reports under 4% waste against 60-80% for contiguous reservations.
#
# ## 4. Weight quantization: int8 and int4
# Symmetric quantization stores an integer $q = \mathrm{round}(w / s)$ and a scale $s$ per group:
# int8 with one scale per output channel (row), int4 with one scale per group of 32-64 inputs, packed
# two values per byte. `QuantLinear` keeps only the integers and scales, and its matmul uses them.

# %%
w = target.blocks[0].ffn.fc1.weight.detach().cpu()
q8, s8 = quantize_int8(w)
p4, s4 = quantize_int4(w, group_size=32)
print(f"weight {tuple(w.shape)} float32 {w.numel() * 4:,} bytes | int8 {q8.numel() + s8.numel() * 4:,} bytes | "
      f"int4 {p4.numel() + s4.numel() * 4:,} bytes (packed {tuple(p4.shape)} uint8)")
err8 = (q8.float() * s8[:, None] - w).abs().mean() / w.abs().mean()
err4 = (tformer.inference.quantize.dequantize_int4(p4, s4) - w).abs().mean() / w.abs().mean()
print(f"mean relative weight error: int8 {err8:.4f}, int4 {err4:.4f}")

# %% [markdown]
# Now whole models: every `nn.Linear` of the blocks replaced by a `QuantLinear`, and the validation
# perplexity of each.

# %%
@torch.no_grad()
def val_perplexity(model):
    model.eval()
    sums = [lm_loss(model, (xb.to(dev), yb.to(dev))) for xb, yb in val_batches]   # (nll sum, tokens) per batch
    return perplexity(sum(s.item() for s, _ in sums) / sum(n for _, n in sums))


def copy_of(model):
    c = GPT(model.cfg).to(dev)
    c.load_state_dict(model.state_dict())
    return c.eval()


quant = {"float32": target, "int8": quantize_model(copy_of(target), bits=8),
         "int4 (g=32)": quantize_model(copy_of(target), bits=4, group_size=32)}
linear_bytes = {}
for name, m in quant.items():
    linear_bytes[name] = sum(model_bytes(mod) for mod in m.modules() if isinstance(mod, (QuantLinear, torch.nn.Linear))
                             and mod is not m.head)
    print(f"{name:12s} transformer-block weights {linear_bytes[name] / 1e6:6.3f} MB   "
          f"whole model {model_bytes(m) / 1e6:6.3f} MB   validation perplexity {val_perplexity(m):7.2f}")
assert linear_bytes["int8"] < 0.3 * linear_bytes["float32"] and linear_bytes["int4 (g=32)"] < 0.2 * linear_bytes["float32"]
print(f"block weights: int8 {linear_bytes['float32'] / linear_bytes['int8']:.1f}x smaller, "
      f"int4 {linear_bytes['float32'] / linear_bytes['int4 (g=32)']:.1f}x smaller (ceiling 32 / (4 + 32/32) = 6.4x)")
print(type(quant["int8"].blocks[0].attn.qkv).__name__, quant["int8"].blocks[0].attn.qkv)

# %% [markdown]
# int4 does not reach 8x: each group of 32 weights also stores a float32 scale, 1 bit per weight, so
# 5 bits replace 32 and 6.4x is the ceiling. The cell prints the measured ratio, a little under it: the
# biases stay in float32. int8 costs almost nothing in perplexity; int4 a little more, which is why real int4 schemes (GPTQ,
# AWQ) choose the rounding with calibration data. The embedding (tied to the output layer) stays in
# float here; in big models the blocks dominate. On a GPU the win is speed as well as memory:
# decoding is limited by reading the weights, and int4 weights are about 6x fewer bytes to read (the
# ratio printed above).
#
# ## 5. Speculative decoding
# The draft model proposes $k$ tokens; the target scores all of them in one forward pass. With greedy
# decoding, the output must be **exactly** the target's own greedy output:

# %%
# Figure: Speculative decoding: acceptance rate (left) and speed-up (right) against the draft length k.
prompt = val_ids[100:108][None].to(dev)
n_new = 40 if SMALL else 200
reference = target.generate(prompt, n_new, temperature=0)
results = []
for k in ((2, 4) if SMALL else (1, 2, 4, 6)):
    out, st = speculative_generate(target, draft, prompt, n_new, k=k)
    assert torch.equal(out, reference)
    t_spec = time_fn(lambda: speculative_generate(target, draft, prompt, n_new, k=k), warmup=0, repeat=1 if SMALL else 3)
    results.append((k, st.acceptance_rate, st.tokens_per_target_call, t_spec))
t_target = time_fn(lambda: target.generate(prompt, n_new, temperature=0), warmup=0, repeat=1 if SMALL else 3)
print(f"target alone: {n_new / t_target:.0f} tokens/s")
for k, acc, per_call, t in results:
    print(f"k={k}: acceptance {acc:.0%}, {per_call:.2f} tokens per target pass, "
          f"{n_new / t:.0f} tokens/s, speed-up {t_target / t:.2f}x")
fig, ax = plt.subplots(1, 2, figsize=(8, 3))
ax[0].plot([r[0] for r in results], [r[1] for r in results], "o-"); ax[0].set_title("acceptance rate vs k")
ax[1].plot([r[0] for r in results], [t_target / r[3] for r in results], "o-"); ax[1].axhline(1, color="gray", ls=":")
ax[1].set_title("speed-up vs k")
ax[0].set(ylabel="share of draft tokens accepted", ylim=(0, 1.05))
ax[1].set(ylabel="speed-up over the target alone (x)", ylim=(0, max(1.2, *(t_target / r[3] for r in results)) * 1.1))
for a in ax:
    a.set(xlabel="draft length k", xticks=[r[0] for r in results])
plt.tight_layout(); plt.show()

# %% [markdown]
# The target runs far fewer passes than tokens. Whether that becomes wall-clock speed depends on how
# much cheaper the draft is and how memory-bound the target is (memory-bound: its time goes to reading
# the weights, not to arithmetic): on a GPU a pass over k+1 tokens costs
# about as much as a pass over one, so 2-3x speed-ups are common. On a CPU with tiny models the target
# pass is not much dearer than the draft's, so the speed-up can be small or below 1: the acceptance
# rate and tokens per target pass are the portable numbers.
#
# **Sampling keeps the target's distribution.** With temperature 1 the rule accepts a draft token $x$
# with probability $\min(1, p(x)/q(x))$ and otherwise draws from $\mathrm{norm}(\max(0, p - q))$.
# Take the real $p$ (target) and $q$ (draft) at one position, apply the rule many times, and compare
# the histogram of the emitted token with $p$ and with $q$. The cell measures each gap by the total
# variation distance, $\frac12\sum_x |a(x) - b(x)|$ between distributions $a$ and $b$: the most
# probability the two give differently to any set of tokens, 0 when they are equal, 1 when they share
# no token:

# %%
# Figure: Next-token distribution on the likeliest tokens: the target's p, speculative samples and the draft's q.
with torch.no_grad():
    p = F.softmax(target(prompt)[0, -1].double(), -1)
    q = F.softmax(draft(prompt)[0, -1].double(), -1)
g = torch.Generator().manual_seed(0)
trials = 2000 if SMALL else 10000
xs = torch.multinomial(q.cpu(), trials, replacement=True, generator=g)
us = torch.rand(trials, generator=g, dtype=torch.float64)
p_rows, q_rows = torch.stack([p, p]).cpu(), q[None].cpu()            # k = 1 (the second row of p: bonus, unused)
emitted = torch.empty(trials, dtype=torch.long)
for i in range(trials):
    n, dist = speculative_accept(p_rows, q_rows, xs[i:i + 1], us[i:i + 1])
    emitted[i] = xs[i] if int(n) == 1 else torch.multinomial(dist, 1, generator=g)[0]
hist = torch.bincount(emitted, minlength=vocab).double() / trials
tv_p, tv_q = 0.5 * (hist - p.cpu()).abs().sum(), 0.5 * (hist - q.cpu()).abs().sum()
noise = 0.5 * torch.sqrt(2 * p * (1 - p) / (math.pi * trials)).sum()   # E|hist - p| of N draws from p, summed
print(f"total variation distance: samples vs target p = {tv_p:.3f}, vs draft q = {tv_q:.3f}, "
      f"p vs q = {0.5 * (p - q).abs().sum():.3f}; expected from sampling noise alone {noise:.3f}")
assert tv_p < tv_q
top = torch.argsort(p, descending=True)[:12].cpu()
plt.figure(figsize=(7, 3))
plt.bar(torch.arange(12) - 0.27, p.cpu()[top], 0.27, label="target p")
plt.bar(torch.arange(12), hist[top], 0.27, label="speculative samples")
plt.bar(torch.arange(12) + 0.27, q.cpu()[top], 0.27, label="draft q")
plt.xticks(range(12), [repr(tok.decode([int(t)])) for t in top], rotation=60, fontsize=7)
plt.legend(); plt.title("next-token distribution"); plt.tight_layout(); plt.show()

# %% [markdown]
# The samples follow the target, not the draft. The remaining distance is sampling noise: N draws from
# $p$ itself land, in expectation, $\frac12\sum_x \sqrt{2p(x)(1-p(x))/(\pi N)}$ away from $p$ (each
# count is binomial), which the cell prints beside the measured distance; the two agree. (A bound such as
# $\sqrt{V/N}$ treats all $V$ tokens as equally likely and is far too large here: most of the vocabulary
# has almost no mass.) `tests/test_speculative.py` checks the same with a chi-square test, end to end
# through `speculative_generate`.
#
# ## 6. Serving many requests at once
# Sections 1-5 make one request fast. A server meets many, arriving and finishing at different times.
# Batching them shares each read of the weights among all of them, but a *static* batch (wait for a
# full batch, pad, run it to its longest member) leaves a slot idle from the moment its request
# finishes. **Continuous batching** (Orca, then vLLM, SGLang, TGI) changes the batch at every step:
#
# 1. **admit**: while the head of the queue fits in the free blocks of the paged cache, prefill it (run its
#    whole prompt through the model in one pass, filling its cache);
# 2. **decode**: one forward pass gives every running sequence its next token, whatever its length
#    (each reads its own blocks through its block table);
# 3. **retire**: a sequence that produced a stop token or reached `max_tokens` returns its blocks now.
#
# When a running sequence needs a block and none is free, the newest one is *preempted*: it gives its
# blocks back and waits to be recomputed by one prefill (cheaper here than copying its cache out and
# back). Requests that start with the same tokens share those full blocks (prefix sharing), with a
# reference count per block. `tformer.inference.engine.Engine` does all of this.
#
# First the property that makes it safe: under any arrivals, each greedy request gets exactly the tokens
# it gets decoded alone. We check it in float64, where batched and single matrix products agree, with
# random arrival steps, prompt lengths and output lengths, and a pool small enough to force preemption.

# %%
model64 = copy_of(target).double()
g = torch.Generator().manual_seed(1)
arrivals = sorted((int(torch.randint(0, 6, (1,), generator=g)), int(s), int(torch.randint(1, block // 2, (1,), generator=g)),
                   int(torch.randint(1, block // 2, (1,), generator=g)))
                  for s in torch.randint(0, len(val_ids) - block, (10,), generator=g))
eng = Engine(model64, n_blocks=block // 8 + 1, block_size=8, max_running=4)   # room for one full-length request
reqs, step = [], 0
while len(reqs) < len(arrivals) or eng.has_work():
    for t, s0, n_p, n_new in arrivals:
        if t == step:
            reqs.append((eng.add_request(val_ids[s0:s0 + n_p].tolist(), SamplingParams(max_tokens=n_new)), s0, n_p))
    eng.step()
    step += 1
for r, s0, n_p in reqs:
    alone = model64.generate(val_ids[s0:s0 + n_p][None].to(dev), r.params.max_tokens, temperature=0)[0, n_p:]
    assert r.output == alone.tolist()
print(f"{len(reqs)} requests over {step} steps, {sum(r.n_preempted for r, _, _ in reqs)} preemptions: "
      "every request's tokens equal the request decoded alone")
assert eng.blocks.n_free == eng.pool.cfg.n_blocks                    # every block returned
assert sum(r.n_preempted for r, _, _ in reqs) > 0                     # the pool was tight enough to preempt

# %% [markdown]
# **Reading the blocks in place.** At each decoding step every running sequence attends over its own
# keys and values, scattered over the pool. Copying them into one tensor first (what `PagedKVCache.get`
# does in section 3) copies the whole cache at every layer and step, and attention then reads the copy.
# vLLM's PagedAttention kernel reads the blocks where they are. Plain PyTorch has an operation that
# reads rows picked by index and sums them with weights, without copying them out, `F.embedding_bag`,
# and both halves of attention are such sums:
#
# $$s_t = \sum_d q_d\,K_{t,d} \qquad\qquad o = \sum_t p_t\,V_t, \quad p = \mathrm{softmax}(s/\sqrt{d})$$
#
# The output is a bag of the sequence's value rows weighted by $p$. For the scores, the pool stores the
# keys of a block transposed, (head_dim, block_size), as vLLM's key cache is: a block's `block_size`
# scores are then a bag of `head_dim` rows weighted by the query's features.
# `paged_decode_attention` does both for every sequence of the batch in two calls, whatever the
# lengths; below it is checked against SDPA over each sequence's keys alone.

# %%
g = torch.Generator().manual_seed(3)
small_pool = BlockPool(PagedConfig(n_layers=1, n_kv_heads=2, head_dim=16, block_size=4, n_blocks=32))
lengths = [3, 9, 14]                                                  # 1, 3 and 4 blocks, the last ones part full
tables = torch.randperm(32, generator=g)[:8].split([-(-n // 4) for n in lengths])
kv = []
for ids, n in zip(tables, lengths):
    k, v = torch.randn(2, 1, n, 2, 16, generator=g)                   # (1, T, H_kv, head_dim) each
    write_kv(small_pool, 0, ids[torch.arange(n) // 4][None], torch.arange(n) % 4, k, v)
    kv.append((k[0].transpose(0, 1)[None], v[0].transpose(0, 1)[None]))
idx = DecodeIndex.build(torch.nn.utils.rnn.pad_sequence(list(tables), batch_first=True), torch.tensor(lengths),
                        n_heads=2, n_kv_heads=2, head_dim=16, block_size=4)
q = torch.randn(3, 2, 1, 16, generator=g)
out = paged_decode_attention(q, small_pool.k[0], small_pool.v[0], idx)
for i, (k, v) in enumerate(kv):
    torch.testing.assert_close(out[i:i + 1], F.scaled_dot_product_attention(q[i:i + 1], k, v))
print("block tables:", [t.tolist() for t in tables])
n_blk = sum(len(t) for t in tables)
print(f"key rows read: {idx.k_rows.numel()} (= {n_blk} blocks x 2 heads x 16 features); value rows: "
      f"{idx.v_rows.numel()} ({n_blk} blocks x 2 heads x 4 slots); outputs equal SDPA over each sequence alone")

# %% [markdown]
# Now throughput. Closed-loop clients (each sends its next request when its last one is done) with
# mixed prompt and output lengths; generated tokens per second for continuous batching at each
# concurrency, against the same requests served one at a time with the plain KV cache.

# %%
def workload(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [(val_ids[s:s + int(n_p)].tolist(), int(n_new)) for s, n_p, n_new in
            zip(torch.randint(0, len(val_ids) - block, (n,), generator=g).tolist(),
                torch.randint(4, block // 2, (n,), generator=g), torch.randint(8, block // 2, (n,), generator=g))]


@torch.no_grad()
def closed_loop(clients, work):
    """`clients` clients share the list of requests; each sends the next one when its last one is done."""
    queue = list(work)
    eng = Engine(target, n_blocks=clients * (block // 8 + 1) + 1, block_size=8, max_running=clients)

    def send():
        prompt, n = queue.pop()
        eng.add_request(prompt, SamplingParams(max_tokens=n))
    t0 = time.perf_counter()
    for _ in range(clients):
        send()
    while eng.has_work():
        for _ in eng.step():                                          # a request finished: its client sends the next
            if queue:
                send()
    return eng.generated_tokens / (time.perf_counter() - t0)


# %% [markdown]
# The same requests for every concurrency; the baseline serves the first 8 of them one after another
# with `GPT.generate`.

# %%
concurrency = (1, 2, 4, 8) if SMALL else (1, 4, 16, 64)
work = workload(16 if SMALL else 128, 2)
t0 = time.perf_counter()
with torch.no_grad():
    for p, n in work[:8]:
        target.generate(torch.tensor([p], device=dev), n, temperature=0)
one_at_a_time = sum(n for _, n in work[:8]) / (time.perf_counter() - t0)
tps = [closed_loop(c, work) for c in concurrency]
for c, x in zip(concurrency, tps):
    print(f"{c:3d} clients: {x:7.0f} tokens/s ({x / one_at_a_time:.1f}x one at a time)")
assert tps[-1] > 1.5 * tps[0]                                         # more clients, more tokens per second

# %%
# Figure: Generated tokens/s against concurrent clients: continuous batching against one request at a time.
plt.figure(figsize=(5, 3))
plt.plot(concurrency, tps, "o-", label="continuous batching")
plt.axhline(one_at_a_time, color="gray", ls=":", label="one request at a time")
plt.xscale("log", base=2); plt.xlabel("concurrent clients"); plt.ylabel("generated tokens/s")
plt.title("throughput vs concurrency"); plt.legend(); plt.tight_layout(); plt.show()

# %% [markdown]
# Throughput grows with concurrency because one decoding pass serves every running request: the
# weights are read once per step, not once per request. At one client the engine is slower than the
# plain cache: at every step and layer it writes the new key and value into their block and reads the
# blocks through index lists (two `embedding_bag` calls, a masked softmax, two index
# selections). The plain cache makes one attention call on one contiguous tensor. For a model this
# small those extra operations cost about as much as the layer's matrix products. A compiled
# paged-attention kernel (vLLM's) does the same reading in one call.
#
# Measured elsewhere: `python benchmarks/bench_serve.py` measures the same against static batching with
# the sizes of a real course model, with time to first token beside it, and
# `python benchmarks/bench_decode_attention.py` builds such a kernel for the CPU in C++
# (`benchmarks/paged_decode.cpp`), puts it in the engine, and times the engine with it, with the package's
# attention, and with attention skipped altogether (their figures are in `benchmarks/RESULTS.md`).
#
# **The server.** `tformer serve --run RUN` (or `--hf DIR`, or `--demo`) puts the engine behind an
# OpenAI-compatible HTTP API (`/v1/completions`, `/v1/chat/completions` with streaming, `/v1/models`,
# `/health`, `/metrics`), so the official `openai` client works unchanged. Here it serves the target
# model from a background thread on a free port (port 0), and is stopped at the end of the cell. What the
# cell proves is the plumbing: the text that comes back over HTTP is the engine's, token for token, and
# the streamed pieces join to it. The words are the target's own: in small mode, trained for seconds,
# it answers "Return the" with a loop of " the".

# %%
import openai
from tformer.serve.app import build_app, start_in_background

server = start_in_background(build_app(target, tok, name="ch14-target", block_size=8, n_blocks=64), port=0)
try:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    print("models:", [m.id for m in client.models.list().data])
    r = client.completions.create(model="ch14-target", prompt="Return the", max_tokens=12, temperature=0)
    print(repr("Return the"), "->", repr(r.choices[0].text), r.usage)
    same = Engine(target, n_blocks=16, block_size=8).generate([tok.encode("Return the").ids], SamplingParams(
        max_tokens=12, stop_token_ids=(tok.token_to_id("<|endoftext|>"),)))[0]
    assert r.choices[0].text == tok.decode(same.output)                # the engine's tokens, through HTTP
    stream = client.completions.create(model="ch14-target", prompt="Return the", max_tokens=12, temperature=0,
                                       stream=True)
    pieces = [chunk.choices[0].text for chunk in stream]
    print(len(pieces), "streamed pieces:", pieces[:6])
    assert "".join(pieces) == r.choices[0].text
finally:
    server.stop()

# %% [markdown]
# ## Exercise 1: a decoding step with a KV cache
# Given the new queries, keys and values (B, H, T_new, d) and the cache (B, H, T_past, d) (T_past may
# be 0), return `(out, k_all, v_all)`: the keys/values with the new ones appended after the cached ones,
# and the attention of the new queries over them. New query i sees every cached key and the new keys
# 0..i (a causal mask aligned to the bottom-right).

# %%
def my_kv_step(q, k_new, v_new, k_cache, v_cache):
    ### BEGIN SOLUTION
    k_all = torch.cat([k_cache, k_new], dim=2)
    v_all = torch.cat([v_cache, v_new], dim=2)
    t_q, t_k = q.shape[2], k_all.shape[2]
    scores = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
    visible = torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)
    out = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v_all
    return out, k_all, v_all
    ### END SOLUTION


# %%
check("ch14.kv_step", my_kv_step)

# %% [markdown]
# ## Exercise 2: the speculative accept/reject rule
# `p` (k+1, V) are the target's probabilities at the k draft positions and one more, `q` (k, V) the
# draft's, `draft` (k,) the draft tokens and `u` (k,) uniform numbers. Draft token i is accepted iff
# `u[i] < p[i, x_i] / q[i, x_i]` and all earlier ones were. Return `(n, dist)`: n, the number of
# accepted tokens (a 0-d `torch.int64` tensor: the checker compares its dtype too), and the distribution of
# the next token, a (V,) tensor in `p`'s dtype:
# $\mathrm{norm}(\max(0, p_n - q_n))$ after a rejection at n, or $p_k$ if all k were accepted.

# %%
def my_accept(p, q, draft, u):
    ### BEGIN SOLUTION
    k = draft.shape[0]
    rows = torch.arange(k)
    accepted = u < p[rows, draft] / q[rows, draft]
    n = accepted.long().cumprod(0).sum()
    if int(n) == k:
        return n, p[k]
    residual = torch.clamp(p[n] - q[n], min=0)
    return n, residual / residual.sum()
    ### END SOLUTION


# %%
check("ch14.accept", my_accept)

# %% [markdown]
# ## Exercise 3: int8 per-channel quantization
# Return `(q, scale)` for a weight `w` (out, in): one scale per output channel (row),
# `scale = max|row| / 127` (1 for an all-zero row), and `q = round(w / scale)` as `torch.int8`.

# %%
def my_int8(w):
    ### BEGIN SOLUTION
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -128, 127).to(torch.int8)
    return q, scale
    ### END SOLUTION


# %%
check("ch14.int8", my_int8)

# %% [markdown]
# ## Exercise 4: the scheduler's admission rule
# The engine admits waiting requests in arrival order. Request i has $L_i$ = `lengths[i]` tokens whose
# keys and values it needs, and its first $s_i$ = `shared[i]` blocks are already cached (shared with
# another request). With $b$ = `block_size` and $F$ = `n_free` free blocks, it fits if the free blocks
# cover its other blocks *plus the block its first generated token may open*, and still leave
# `watermark` blocks free for running sequences to grow into:
#
# $$F - \big(\lceil (L_i + 1) / b \rceil - s_i\big) \ge \mathrm{watermark}.$$
#
# It then takes the blocks its tokens fill, $F \leftarrow F - (\lceil L_i / b \rceil - s_i)$, and the next
# request is tried. The first request that does not fit stops admission (first come, first served).
# `lengths` and `shared` are Python lists of ints of the same length (possibly empty); `n_free`,
# `block_size` and `watermark` are ints. Return how many requests are admitted now, an int.

# %%
def my_admit(lengths, shared, n_free, block_size, watermark):
    ### BEGIN SOLUTION
    admitted = 0
    for length, sh in zip(lengths, shared):
        if n_free - (math.ceil((length + 1) / block_size) - sh) < watermark:
            break
        n_free -= math.ceil(length / block_size) - sh
        admitted += 1
    return admitted
    ### END SOLUTION


# %%
check("ch14.admit", my_admit)

# %% [markdown]
# ## The package's versions
# Now that you have written them, here is what `tformer` runs: the cache's `append` (a preallocated
# buffer instead of your `torch.cat`, which would copy the whole cache every token), the accept/reject
# rule, int8 quantization, and the admission rule.

# %%
print(inspect.getsource(KVCache.append))
print(inspect.getsource(speculative_accept))
print(inspect.getsource(quantize_int8))
print(inspect.getsource(plan_admission))


# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** Llama 3 8B has 32 layers and uses GQA with 8 key/value heads of size 128; its cache is
# kept in bf16. How many bytes of KV cache does one token take? Answer with a number. The cell under
# *2. MQA and GQA* measures the same for the chapter's models, and the text above it gives the formula.

# %%
answer = 2 * 32 * 8 * 128 * 2  ### ANSWER
check("ch14.q_kv_bytes", answer)

# %% [markdown]
# **Question 2.** Without a cache, every step of greedy decoding runs the model over the whole context so
# far. How many token positions does it run to generate $n$ tokens after a prompt of $P$ tokens? Answer
# with a formula in `n` and `P`, as a string. The cell under *1. The KV cache* counts them for $P = 8$.

# %%
answer = "n * P + n * (n - 1) / 2"  ### ANSWER
check("ch14.q_no_cache_passes", answer)

# %% [markdown]
# **Question 3.** With temperature 1, speculative sampling accepts a draft token $x$ with probability
# $\min(1, p(x)/q(x))$ and otherwise draws from $\mathrm{norm}(\max(0, p - q))$. Which distribution do
# the emitted tokens follow?
# - **A.** The draft's $q$: the draft proposes every token.
# - **B.** Only the target's greedy choice: speculative decoding works for greedy decoding only.
# - **C.** A mixture of $p$ and $q$ that depends on the acceptance rate.
# - **D.** The target's $p$, exactly.
#
# The histogram cell of *5. Speculative decoding* prints the distances to $p$ and to $q$.

# %%
answer = "D"  ### ANSWER
check("ch14.q_speculative_distribution", answer)

# %% [markdown]
# ## Summary
# | technique | what it saves | measured above |
# |---|---|---|
# | KV cache | recomputing the past: $O(n^2) \to O(n)$ token passes | decoding time vs length |
# | GQA / MQA | cache size, by $n_{heads}/n_{kv}$ | bytes per token, validation loss |
# | paged KV cache | memory reserved but unused | peak blocks vs contiguous reservation |
# | int8 / int4 weights | weight memory (and bandwidth), a little under the ceilings of 4x and 6.4x (a float32 scale per 32 int4 weights; biases stay float32) | bytes, perplexity |
# | speculative decoding | target passes per token | acceptance rate, tokens per pass, speed-up |
# | continuous batching | idle batch slots; recomputing shared prefixes | tokens/s vs concurrency, equal tokens, the server |
