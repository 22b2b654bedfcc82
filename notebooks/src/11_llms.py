# %% [markdown]
# # Chapter 11: Transformers in large language models (1/3: tokens and pretraining)
#
# **What this chapter covers.** How raw text becomes tokens, and the two families of pretrained Transformers:
# * **byte-pair encoding (BPE)**: the tokenizer of GPT-2 and most LLMs, built here from scratch and
#   checked against Hugging Face `tokenizers`;
# * **decoder-only (GPT)**: a causal stack trained to predict the next token,
#   $\mathcal{L} = -\frac{1}{T-1}\sum_t \log p(x_{t+1} \mid x_{\le t})$, then used to generate text one
#   token at a time;
# * **encoder-only (BERT)**: a bidirectional stack trained with *masked-language modelling*: choose 15% of
#   the tokens, replace 80% of those by `[MASK]`, 10% by a random token, keep 10%, and predict the
#   originals. Every token sees the whole sentence, so BERT cannot generate left to right, but its
#   representations are good to *adapt*: a small classification head fine-tuned on a few labels.
#
# We pretrain both on a real corpus (offline: Python's own documentation, `pydoc_data.topics`; full mode
# online: TinyStories through `datasets`), show loss, perplexity ($e^{\text{loss}}$) and samples, then fine-tune BERT and
# compare with a model trained from scratch. Finally the course's own GPT loads real GPT-2 weights.
# The chapter's next notebooks turn a pretrained GPT into an assistant: `11_fine_tuning` (decoding,
# instruction tuning, LoRA), then `11_preference_rl` (DPO, GRPO with verifiable rewards, retrieval).
#
# **How to check an exercise.** Replace `raise NotImplementedError` with your code, run the cell, then
# the `check(...)` cell below it: PASS, or the smallest failing input with a hint.
#
# **How long.** In small mode this notebook runs in about a minute on a 2-core laptop CPU.
#
# **Where the code lives.**
# * `tformer/data/bpe.py: merge, train_bpe, BytePairEncoding` (BPE from scratch)
# * `tformer/data/text.py: offline_text, train_tokenizer, encode, LMBatches` (BPE through `tokenizers`, batches)
# * `tformer/training/losses.py: causal_lm_loss, lm_loss, masked_lm_loss`, `tformer/data/text.py: apply_mlm_masking, mask_tokens`
# * `tformer/models/gpt.py: GPT, GPTConfig` (with `GPT.generate`, `GPT.from_hf_gpt2`); `tformer/models/bert.py: BERT, BertClassifier`
# * `tformer/data/pretrained.py: load_pretrained` (real GPT-2 weights when online; offline it says what to do)
# * `tformer/measure/timing.py: training_step` (one step: autocast as the device policy says, backward, clipping, AdamW)

# %%
import inspect
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from tqdm import tqdm

import tformer
from tformer.grading import check
from tformer.training.losses import causal_lm_loss, lm_loss, masked_lm_loss
from tformer.data.text import mask_tokens
from tformer.data.bpe import tokenizers_merges, train_bpe
from tformer.data.text import (IGNORE, DataUnavailableError, LMBatches, encode, hf_text, offline_text, split_stream,
                             train_tokenizer)
from tformer.data.pretrained import load_pretrained
from tformer.models import BERT, GPT, BertClassifier, BertConfig, GPTConfig
from tformer.measure.timing import training_step
from tformer.utils.device import amp_dtype

tformer.seed_everything(0)
SMALL = tformer.SMALL
dev = tformer.device()
print("small mode:", SMALL, "| device:", dev)

# %% [markdown]
# ## 1. Byte-pair encoding from scratch
# A model reads integers, so text must become a sequence of ids. Characters give short vocabularies but
# long sequences; whole words give short sequences but an endless vocabulary with unknown words. BPE
# (Sennrich et al. 2016; byte-level in GPT-2) sits between: start from the 256 bytes, then repeat
# 1. count every adjacent pair of tokens in the corpus,
# 2. **merge** the most frequent pair into one new token (its id is the next free one),
#
# until the vocabulary has the size asked for. Byte-level BPE never meets an unknown character.
#
# ## Exercise: one merge
# Replace every non-overlapping occurrence of `pair` in `ids`, scanning left to right, by `new_id`:
# `[1, 1, 1]` with pair `(1, 1)` becomes `[new_id, 1]`.

# %%
def my_bpe_merge(ids, pair, new_id):
    ### BEGIN SOLUTION
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
    ### END SOLUTION


# %%
check("ch11.bpe_merge", my_bpe_merge)

# %% [markdown]
# The training loop around `merge` counts pairs inside words (GPT-2's pre-tokenizer splits the text into
# words that keep their leading space, written `Ġ`, so merges never cross a space) and, after each merge,
# updates only the words that held the pair. This is the package's version:

# %%
print(inspect.getsource(train_bpe))

# %% [markdown]
# Hugging Face `tokenizers` (Rust) learns BPE with the same rule: most frequent pair first, a tie going to
# the pair with the smaller ids. On the same text and vocabulary size, the two learn the same merges in
# the same order, and encode unseen text to the same ids:

# %%
text = offline_text()
sample_text, unseen = text[:60_000], text[300_000:303_000]
t0 = time.perf_counter()
ours = train_bpe([sample_text], vocab_size=512)
t_ours = time.perf_counter() - t0
t0 = time.perf_counter()
theirs = train_tokenizer([sample_text], vocab_size=512)
t_theirs = time.perf_counter() - t0
assert ours.merges == tokenizers_merges(theirs) and ours.vocab == theirs.get_vocab()
assert ours.encode(unseen) == theirs.encode(unseen).ids
print(f"{len(ours.merges)} merges, identical to tokenizers'; first ten: {ours.merges[:10]}")
print(f"train: from scratch {t_ours:.2f} s, tokenizers {t_theirs:.2f} s (Rust, parallel)")
print([ours.id_to_token[i] for i in ours.encode("The for statement iterates over a sequence.")])

# %% [markdown]
# **Vocabulary size trades sequence length for table size.** A bigger vocabulary holds longer pieces, so
# each token covers more characters and a passage needs fewer tokens (cheaper attention, longer reach
# for the same context), at the price of a larger embedding table and rarer tokens.

# %%
# Figure: Characters per token (left) and tokens for the held-out text (right) against vocabulary size.
sizes = [257, 300, 512, 1024, 2048, 4096] if SMALL else [257, 512, 1024, 4096, 8192, 16384]
fit_text, held_out = text[:200_000], text[400_000:]
chars_per_token = []
for v in sizes:
    n_tokens = len(train_tokenizer([fit_text], vocab_size=v).encode(held_out).ids)
    chars_per_token.append(len(held_out) / n_tokens)
fig, ax = plt.subplots(1, 2, figsize=(9, 3))
ax[0].plot(sizes, chars_per_token, "o-")
ax[0].set(xscale="log", xlabel="vocabulary size", ylabel="characters per token")
ax[1].plot(sizes, [len(held_out) / c for c in chars_per_token], "o-")
ax[1].set(xscale="log", xlabel="vocabulary size", ylabel=f"tokens for {len(held_out):,} characters")
plt.tight_layout()
plt.show()
print({v: round(c, 2) for v, c in zip(sizes, chars_per_token)})
assert all(a < b for a, b in zip(chars_per_token, chars_per_token[1:]))

# %% [markdown]
# ## 2. The corpus and the tokenizer the models use
# From here on the tokenizer is `tokenizers`' (the same algorithm, in Rust, and it runs in parallel).

# %%
if not SMALL:
    try:
        text = hf_text("tinystories", max_chars=50_000_000)
    except DataUnavailableError as e:
        print(e, "\n-> using the offline corpus instead")
vocab = 1024 if SMALL else 8192
t0 = time.perf_counter()
tok = train_tokenizer([text], vocab_size=vocab)
ids = encode(tok, text)
train_ids, val_ids = split_stream(ids, 0.9)
print(f"{len(text):,} characters -> {len(ids):,} tokens ({len(text) / len(ids):.2f} chars/token), "
      f"vocabulary {tok.get_vocab_size()}, {time.perf_counter() - t0:.1f} s")
sample = "The for statement is used to iterate over the elements of a sequence."
print([tok.id_to_token(i) for i in tok.encode(sample).ids])

# %% [markdown]
# ## 3. GPT: pretrain a small decoder-only model
#
# ## Exercise: the causal LM loss
# `logits (B, T, V)` from the model on `idx (B, T)`. Position $t$ predicts token $t+1$: the last position
# has no target and the first token is never predicted. Return the mean cross-entropy.

# %%
def my_causal_lm_loss(logits, idx):
    ### BEGIN SOLUTION
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), idx[:, 1:].reshape(-1))
    ### END SOLUTION


# %%
check("ch11.causal_lm_loss", my_causal_lm_loss)

# %% [markdown]
# A model that knows nothing predicts every token with probability $1/V$: loss $\ln V$, perplexity
# $e^{\ln V} = V$ (perplexity is $e^{\text{loss}}$: the number of tokens a uniform guess would choose among).
# Training should bring the validation perplexity far below that.

# %%
if SMALL:
    gpt_cfg = GPTConfig(vocab_size=tok.get_vocab_size(), context_length=64, n_layers=2, n_heads=4, d_model=64)
    steps, batch, lr = 150, 16, 3e-3
else:
    gpt_cfg = GPTConfig(vocab_size=tok.get_vocab_size(), context_length=256, n_layers=6, n_heads=6, d_model=384, dropout=0.1)
    steps, batch, lr = 3000, 64, 1e-3
T = gpt_cfg.context_length
tformer.seed_everything(0)
gpt = GPT(gpt_cfg).to(dev)
print(f"GPT: {gpt.num_params():,} parameters")

# %% [markdown]
# `LMBatches` cuts windows of the token stream into inputs `x` and next-token targets `y` (x shifted by
# one); `lm_loss(model, (x, y))` returns the summed cross-entropy and the number of targets. Each training
# step below is `tformer.measure.timing.training_step`: on a CPU the plain float32 step; on a CUDA GPU it
# runs under the device policy's autocast (bf16 on sm80+; fp16 with a gradient scaler on a T4).

# %%
val_batches = LMBatches(val_ids, 16, T - 1, min(8, (len(val_ids) - 1) // (16 * T)), shuffle=False)


@torch.no_grad()
def val_loss(model):
    model.eval()
    sums = [lm_loss(model, (x.to(dev), y.to(dev))) for x, y in val_batches]
    model.train()
    return sum(s.item() for s, _ in sums) / sum(n for _, n in sums)


prompt = torch.tensor([tok.encode("The for statement").ids], device=dev)
g = torch.Generator(device=dev).manual_seed(0)
print("before training:", repr(tok.decode(gpt.generate(prompt, 30, temperature=0.8, top_k=20, generator=g)[0].tolist())))
before = val_loss(gpt)
print(f"validation loss before training {before:.2f} (ln V = {math.log(gpt_cfg.vocab_size):.2f}), "
      f"perplexity {math.exp(before):.0f}")

# %%
def gpt_loss(x, y):
    loss_sum, n = lm_loss(gpt, (x, y))
    return loss_sum / n


opt = torch.optim.AdamW(gpt.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
step = training_step(gpt_loss, opt, dev, amp_dtype(dev), clip=1.0)    # backward, clip at 1, AdamW
gpt_losses, t0 = [], time.perf_counter()
for x, y in tqdm(LMBatches(train_ids, batch, T - 1, steps, seed=0), desc="GPT"):
    loss = step(x.to(dev), y.to(dev))
    sched.step()
    gpt_losses.append(loss.item())
after = val_loss(gpt)
print(f"{steps} steps in {(time.perf_counter() - t0) / 60:.2f} min: validation loss {before:.2f} -> {after:.2f}, "
      f"perplexity {math.exp(before):.0f} -> {math.exp(after):.1f}")

# %%
# Figure: GPT training loss, beside ln V, the loss of a uniform guess.
plt.figure(figsize=(5, 3))
plt.plot(gpt_losses)
plt.axhline(math.log(gpt_cfg.vocab_size), color="gray", ls="--", label="ln V (uniform guess)")
plt.xlabel("step")
plt.ylabel("training loss")
plt.legend()
plt.show()
assert after < before - 1.0 and math.exp(after) < gpt_cfg.vocab_size / 4

g = torch.Generator(device=dev).manual_seed(0)
print("after training:", repr(tok.decode(gpt.generate(prompt, 40, temperature=0.8, top_k=20, generator=g)[0].tolist())))

# %% [markdown]
# The loss of the loop is the one you wrote: on the whole window $w$ (`x` plus the last target),
# `causal_lm_loss(model(w), w)` equals the cross-entropy of `model(x)` against `y`, because with the causal
# mask position $t$ never sees anything after $t$.

# %%
x, y = next(iter(val_batches))
w = torch.cat([x, y[:, -1:]], dim=1).to(dev)                               # (B, T): x plus the last target
with torch.no_grad():
    loss_sum, n = lm_loss(gpt.eval(), (x.to(dev), y.to(dev)))
    torch.testing.assert_close(causal_lm_loss(gpt(w), w), loss_sum / n, atol=1e-5, rtol=1e-5)
print("causal_lm_loss(model(w), w) == cross-entropy of model(x) against y")

# %% [markdown]
# ## 4. BERT: masked-language modelling
#
# ## Exercise: BERT's masking rule
# The randomness is given as inputs (all `(B, T)`): a position is chosen when `u_select < p` and it is not
# `special`; a chosen position becomes `mask_id` if `u_action < 0.8`, `random_ids` if
# `0.8 <= u_action < 0.9`, and stays otherwise. Return `(inputs, labels)`, labels = the original id at
# chosen positions and `-100` (ignored by the loss) elsewhere.

# %%
def my_mlm_masking(ids, u_select, u_action, random_ids, mask_id, p=0.15, special=None):
    ### BEGIN SOLUTION
    chosen = u_select < p
    if special is not None:
        chosen = chosen & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    inputs = torch.where(chosen & (u_action < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(chosen & (u_action >= 0.8) & (u_action < 0.9), random_ids, inputs)
    return inputs, labels
    ### END SOLUTION


# %%
check("ch11.mlm_masking", my_mlm_masking)

# %% [markdown]
# Two extra ids extend the BPE vocabulary: `[MASK]` and `[CLS]` (whose final state feeds the
# classification head). On real windows of the corpus, the rule gives the advertised rates:

# %%
V = tok.get_vocab_size()
MASK, CLS, PAD = V, V + 1, V + 2
g = torch.Generator().manual_seed(0)
win = LMBatches(train_ids, 64, 63, 1, seed=1)
xb = next(iter(win))[0]
xb = torch.cat([torch.full((64, 1), CLS), xb], dim=1)                     # (64, 64): [CLS] + 63 tokens
inp, lab = mask_tokens(xb, V, MASK, p=0.15, special_ids=(CLS,), generator=g)
chosen = lab != IGNORE
rates = {"chosen": chosen.float().mean().item(), "-> [MASK]": (inp[chosen] == MASK).float().mean().item(),
         "-> random": ((inp[chosen] != MASK) & (inp[chosen] != xb[chosen])).float().mean().item(),
         "kept": (inp[chosen] == xb[chosen]).float().mean().item()}
print({k: f"{v:.1%}" for k, v in rates.items()}, "| [CLS] never chosen:", not chosen[:, 0].any().item())
assert abs(rates["chosen"] - 0.15) < 0.02 and abs(rates["-> [MASK]"] - 0.8) < 0.05

# %%
if SMALL:
    bert_cfg = BertConfig(vocab_size=V + 3, context_length=64, d_model=64, n_layers=2, n_heads=4, d_ff=128, dropout=0.0, pad_id=PAD)
    mlm_steps, mlm_batch, mlm_lr = 300, 32, 3e-3
else:
    bert_cfg = BertConfig(vocab_size=V + 3, context_length=128, d_model=256, n_layers=4, n_heads=4, d_ff=1024, dropout=0.1, pad_id=PAD)
    mlm_steps, mlm_batch, mlm_lr = 3000, 64, 5e-4
L = bert_cfg.context_length


def with_cls(x):
    return torch.cat([torch.full((x.shape[0], 1), CLS), x], dim=1)


tformer.seed_everything(0)
bert = BERT(bert_cfg).to(dev)
print(f"BERT: {bert.num_params():,} parameters")

# %% [markdown]
# Each step masks a fresh 15% of `[CLS]` + a window of the corpus and scores the predictions at the chosen
# positions only.

# %%
# Figure: BERT's masked-LM training loss.
opt = torch.optim.AdamW(bert.parameters(), lr=mlm_lr, weight_decay=0.01)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=mlm_lr, total_steps=mlm_steps, pct_start=0.1)
step = training_step(lambda inp, lab: masked_lm_loss(bert.mlm_logits(bert(inp)), lab), opt, dev, amp_dtype(dev))
g = torch.Generator().manual_seed(0)
mlm_losses, t0 = [], time.perf_counter()
for x, _ in tqdm(LMBatches(train_ids, mlm_batch, L - 1, mlm_steps, seed=2), desc="BERT MLM"):
    inp, lab = mask_tokens(with_cls(x), V, MASK, special_ids=(CLS,), generator=g)
    loss = step(inp.to(dev), lab.to(dev))
    sched.step()
    mlm_losses.append(loss.item())
print(f"{mlm_steps} MLM steps in {(time.perf_counter() - t0) / 60:.2f} min; "
      f"masked-token loss {sum(mlm_losses[:10]) / 10:.2f} -> {sum(mlm_losses[-10:]) / 10:.2f}")
plt.figure(figsize=(5, 3))
plt.plot(mlm_losses)
plt.xlabel("step")
plt.ylabel("masked-LM loss")
plt.show()
assert sum(mlm_losses[-10:]) < sum(mlm_losses[:10]) - 5.0      # mean loss down by more than 0.5 nats

# %% [markdown]
# **Fill in the blank.** BERT reads both sides of the gap: the prediction at `[MASK]` uses the words
# after it too. The control: the same gap with the words after it cut off. If the model read only to
# its left, the two predictions would be identical.

# %%
sentence = "The for statement is used to iterate over the elements of a sequence."
s_ids = tok.encode(sentence).ids
pos = next(i for i, t in enumerate(s_ids) if tok.id_to_token(t) == "Ġstatement")


def guess(ids):
    """BERT's distribution over the vocabulary at position `pos` of `ids`, masked."""
    x = with_cls(torch.tensor([ids]))
    x[0, pos + 1] = MASK                                  # +1: [CLS] comes first
    with torch.no_grad():
        return bert.mlm_logits(bert(x.to(dev)))[0, pos + 1, :V].float().softmax(-1).cpu()


bert.eval()
both, left = guess(s_ids), guess(s_ids[:pos + 1])         # the whole sentence / only what precedes the gap
print(sentence.replace(" statement", " [MASK]"))
for name, p in (("both sides", both), ("left only", left)):
    print(f"{name:>10}: p(' statement') = {p[s_ids[pos]]:.3f}; top-5",
          [tok.decode([i]) for i in p.topk(5).indices.tolist()])
tv = 0.5 * (both - left).abs().sum().item()
print(f"total variation between the two guesses: {tv:.2f} (0 = the words after the gap were ignored)")
shift = both - left                                       # what the words after the gap changed, token by token
print("raised most by the words after the gap:", [f"{tok.decode([i])!r} {shift[i]:+.3f}" for i in shift.topk(5).indices])
assert tv > 0.01

# %% [markdown]
# A model that reads only to its left would print a total variation of exactly 0: here the words after
# the gap move the guess. Where the two top-5 lists barely differ, the small model has learned little
# beyond which tokens are frequent, and the words after the gap shift its probabilities without
# changing its first choices: the last line names the tokens they raised most, and by how much.

# %% [markdown]
# ## 5. Pretrain, then adapt
# A small labelled task that works offline: is a window of text genuine, or were about a quarter of its
# tokens replaced by random ones? (A sentence-level cousin of ELECTRA's replaced-token detection: telling
# them apart needs knowledge of the language, which MLM pretraining provides.) With the same few labelled
# examples and the same fine-tuning steps, compare the pretrained encoder with the same architecture
# trained from scratch.

# %%
def corruption_task(stream, n, seed):
    """n windows of 31 tokens (+ [CLS]): label 1 genuine, label 0 with ~25% of the tokens replaced at random."""
    gen = torch.Generator().manual_seed(seed)
    x = next(iter(LMBatches(stream, n, 31, 1, seed=seed)))[0]
    y = (torch.rand(n, generator=gen) < 0.5).long()
    noise = torch.randint(0, V, (n, 31), generator=gen)
    hit = (torch.rand(n, 31, generator=gen) < 0.25) & (y[:, None] == 0)
    return with_cls(torch.where(hit, noise, x)), y


# %% [markdown]
# A few labelled windows for fine-tuning, a held-out set from the validation stream, and one fine-tuning
# recipe for both encoders: a linear head on `[CLS]`, every weight trained.

# %%
n_labelled = 256 if SMALL else 1024
x_ft, y_ft = corruption_task(train_ids, n_labelled, seed=10)
x_te, y_te = corruption_task(val_ids, 512, seed=11)


def fine_tune(encoder, steps=60 if SMALL else 300, lr=1e-3, seed=0):
    tformer.seed_everything(seed)
    clf = BertClassifier(encoder, 2).to(dev)
    opt = torch.optim.AdamW(clf.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, n_labelled, (32,), generator=gen)
        loss = F.cross_entropy(clf(x_ft[i].to(dev)), y_ft[i].to(dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    clf.eval()
    with torch.no_grad():
        return (clf(x_te.to(dev)).argmax(-1).cpu() == y_te).float().mean().item()


# %%
# Figure: Held-out accuracy after fine-tuning: the pretrained encoder against the same model from scratch.
import copy

tformer.seed_everything(1)
acc_pre = fine_tune(copy.deepcopy(bert).train())
acc_scratch = fine_tune(BERT(bert_cfg))
print(f"{n_labelled} labelled windows, genuine or corrupted: pretrained + fine-tuned {acc_pre:.1%}  vs  from scratch {acc_scratch:.1%} "
      f"(chance 50%)")
plt.figure(figsize=(4, 3))
plt.bar(["pretrained", "from scratch"], [acc_pre, acc_scratch], color=["tab:blue", "tab:gray"])
plt.axhline(0.5, color="k", ls="--", lw=1)
plt.ylabel("held-out accuracy")
plt.ylim(0, 1)
plt.show()
assert acc_pre > acc_scratch, (acc_pre, acc_scratch)

# %% [markdown]
# ## 6. Real GPT-2 weights in the course's own model
# `GPT.from_hf_gpt2` reads Hugging Face's `GPT2LMHeadModel`. Offline we prove it on a randomly
# initialised GPT-2 (same logits); online (full mode) we load the real 124M-parameter `gpt2` and let
# it write.

# %%
import transformers

hf_cfg = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                 bos_token_id=None, eos_token_id=None)    # GPT-2's 50256 is outside our vocabulary
hf_small = transformers.GPT2LMHeadModel(hf_cfg).eval()
ours = GPT.from_hf_gpt2(hf_small).eval()
w = torch.tensor([s_ids])
with torch.no_grad():
    torch.testing.assert_close(ours(w), hf_small(input_ids=w).logits, atol=1e-4, rtol=1e-4)
print("tformer GPT == transformers GPT2LMHeadModel on the same (random) weights")

if SMALL:
    print("Real GPT-2: run this notebook in full mode (TFORMER_SMALL=0) with a network connection.")
else:
    loaded = load_pretrained(lambda: (transformers.GPT2LMHeadModel.from_pretrained("gpt2"),
                                      transformers.GPT2TokenizerFast.from_pretrained("gpt2")), "gpt2")
    if loaded is not None:                                    # offline: load_pretrained said what to do
        hf_gpt2, gpt2_tok = loaded
        gpt2 = GPT.from_hf_gpt2(hf_gpt2).to(dev).eval()
        p = torch.tensor([gpt2_tok.encode("The Transformer architecture")], device=dev)
        with torch.no_grad():
            torch.testing.assert_close(gpt2(p).cpu(), hf_gpt2(input_ids=p.cpu()).logits, atol=1e-3, rtol=1e-3)
        out = gpt2.generate(p, 40, temperature=0.8, top_k=40, generator=torch.Generator(device=dev).manual_seed(0))
        print(gpt2_tok.decode(out[0].tolist()))

# %% [markdown]
# **Today's open models are the same class.** Llama and Qwen3 change a few switches of GPT-2's recipe,
# and `GPTConfig.llama(...)` / `GPTConfig.qwen3(...)` set them. They are RoPE (chapter 4), a SwiGLU FFN (a
# gated feed-forward layer), RMSNorm (LayerNorm without the mean), grouped-query attention (chapter 14),
# no biases and an output head of its own. Qwen3 adds an RMSNorm on each query and key head. `GPT.from_hf_llama`
# and `GPT.from_hf_qwen3` load Hugging Face's `LlamaForCausalLM` and `Qwen3ForCausalLM`, and
# `tests/test_llama.py` checks that the logits and the greedy tokens equal theirs.

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** Before training, the GPT's validation loss sits near the loss of a uniform guess over
# the $V$ tokens of its vocabulary. What is that loss per token? Answer with a formula in `V`, as a string
# (`log` is the natural logarithm). The cell that prints the validation loss before training shows it
# beside the measured value, and the training-loss figure draws it as a line.

# %%
answer = "log(V)"  ### ANSWER
check("ch11.q_uniform_loss", answer)

# %% [markdown]
# **Question 2.** Which is true of the two families?
# - **A.** BERT generates left to right as well as GPT: filling a gap is the same task as predicting the
#   next word.
# - **B.** Both read the whole sentence; GPT's causal mask only makes training faster.
# - **C.** BERT's guess at a gap uses the words after it; GPT predicts each token from the ones before it
#   only, which is what lets it generate left to right.
# - **D.** GPT also uses the words after a position, since its loss is computed on the whole window at once.
#
# The fill-in-the-blank cell of section 4 prints the total variation between BERT's two guesses, and the
# cell at the end of section 3 checks GPT's loss on a whole window.

# %%
answer = "C"  ### ANSWER
check("ch11.q_bert_vs_gpt", answer)

# %% [markdown]
# ## Summary
# * BPE from scratch learns the same merges as Hugging Face's `tokenizers`; a bigger vocabulary holds
#   longer pieces, so the same text takes fewer tokens.
# * Pretraining a small GPT takes its validation loss from $\ln V$ (a uniform guess) to a perplexity
#   below $V/4$ (asserted), and `causal_lm_loss` is the loss of the training loop.
# * BERT's masking rule chooses about 15% of the tokens and turns about 80% of those into `[MASK]`
#   (asserted); the fill-in's guess changes when the words after the gap are cut off.
# * Pretrained on masked-LM and then fine-tuned, the encoder beats the same model trained from scratch on
#   the same labelled windows (asserted).
# * The course's GPT gives the logits of Hugging Face's `GPT2LMHeadModel` on the same weights.
