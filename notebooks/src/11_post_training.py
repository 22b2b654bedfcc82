# %% [markdown]
# # Chapter 11: Transformers in large language models (2/2: from a language model to an assistant)
#
# **What this notebook covers.** A pretrained GPT continues text; an assistant answers. Between the two:
# * **decoding**: how a distribution over the next token becomes text (greedy, temperature, top-k,
#   top-p, repetition penalty), and how much each setting repeats itself;
# * **supervised fine-tuning (SFT)**: train on conversations written in a *chat template*, with the loss
#   on the assistant's tokens only; tasks include code answers and a two-turn dialogue;
# * **LoRA**: fine-tune a few low-rank matrices instead of every weight;
# * **DPO**: learn from pairs "this answer is preferred to that one", with a frozen reference model;
# * **retrieval (RAG)**: put a retrieved passage into the prompt so the model answers from it.
#
# Everything is built on the GPT of the first notebook (`11_llms`), offline, on generated data.
#
# **Where the code lives.**
# * `tformer/inference/decode.py: sample_next, top_k_filter, top_p_filter, apply_repetition_penalty`; `tformer/training/metrics.py: distinct_n`
# * `tformer/training/sft.py: render, encode_chats, sft_loss, exact_match, sequence_logprob, instruction_set` (chat template, SFT)
# * `tformer/training/losses.py: causal_lm_loss` (the SFT loss is this loss with the prompt's labels ignored)
# * `tformer/training/lora.py: lora_forward, LoRALinear, add_lora, merge_lora, trainable_params`
# * `tformer/training/dpo.py: dpo_loss, preference_pairs`; `tformer/inference/rag.py: TfidfRetriever`
# * `tformer/training/trainer.py: Trainer`, the one training loop every step below uses
#
# **How to check an exercise.** Replace `raise NotImplementedError` with your code, run the cell, then
# the `check(...)` cell below it: PASS, or the smallest failing input with a hint.

# %%
import copy
import inspect
import random

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import tformer
from tformer.inference import decode
from tformer.training.dpo import dpo_loss, preference_pairs
from tformer.grading import check
from tformer.training.losses import causal_lm_loss
from tformer.data.text import LMBatches, encode, lm_loss, offline_text, split_stream, train_tokenizer
from tformer.training.lora import LoRALinear, add_lora, merge_lora, trainable_params
from tformer.training.metrics import distinct_n
from tformer.models import GPT, GPTConfig
from tformer.inference.rag import TfidfRetriever
from tformer.training.sft import (KINDS, NAMES, PLACES, encode_chat, encode_chats, exact_match, fact, instruction_set, prompt_ids,
                         sequence_logprob)
from tformer.training import TrainConfig, Trainer

tformer.seed_everything(0)
SMALL = tformer.SMALL
dev = tformer.device()
print("small mode:", SMALL, "| device:", dev)

# %% [markdown]
# ## 1. The base model
# The first notebook's recipe: byte-level BPE on Python's documentation, a small GPT, next-token
# pretraining. Every training run in this notebook goes through `tformer.training.Trainer` (AdamW, warmup
# then linear decay); `fit` only picks the trainable parameters and the settings.

# %%
def fit(model, loss_fn, batches, steps, lr, schedule="linear", weight_decay=0.0):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    cfg = TrainConfig(max_steps=steps, lr=lr, schedule=schedule, warmup=max(1, steps // 10), log_every=10,
                      progress=False)
    trainer = Trainer(model, loss_fn, batches, cfg, optimizer=opt, device=dev)
    trainer.fit()
    return [r["loss"] for r in trainer.state.history if "loss" in r]


text = offline_text()
tok = train_tokenizer([text], vocab_size=1024 if SMALL else 8192)
EOT = tok.token_to_id("<|endoftext|>")
train_ids, val_ids = split_stream(encode(tok, text), 0.9)
if SMALL:
    cfg = GPTConfig(vocab_size=tok.get_vocab_size(), context_length=64, n_layers=2, n_heads=4, d_model=64)
    pre_steps = 150
else:
    cfg = GPTConfig(vocab_size=tok.get_vocab_size(), context_length=256, n_layers=6, n_heads=6, d_model=384)
    pre_steps = 3000
tformer.seed_everything(0)
base = GPT(cfg).to(dev)
pre_losses = fit(base, lm_loss, LMBatches(train_ids, 16, cfg.context_length - 1, pre_steps, seed=0), pre_steps, 3e-3,
                 weight_decay=0.1)
print(f"GPT, {base.num_params():,} parameters: training loss {pre_losses[0]:.2f} -> {pre_losses[-1]:.2f}")

# %% [markdown]
# ## 2. Decoding: from a distribution to text
# At every step the model gives logits $z \in \mathbb{R}^V$ for the next token. Ways to pick one:
# * **greedy**: $\arg\max_v z_v$ (deterministic);
# * **temperature** $\tau$: sample from $\mathrm{softmax}(z / \tau)$; $\tau < 1$ sharpens, $\tau > 1$ flattens;
# * **top-k**: sample among the $k$ most likely tokens only;
# * **top-p (nucleus, Holtzman et al. 2020)**: sample among the smallest set of most likely tokens whose
#   probability sums to $\ge p$: few tokens where the model is sure, many where it is not;
# * **repetition penalty (CTRL)**: divide a positive logit (multiply a negative one) of every token that
#   already appeared by $\theta > 1$.
#
# ## Exercise: top-p filtering
# `logits (B, V)`, `p`: return the logits with `-inf` outside the smallest set of highest-probability
# tokens whose probability sums to at least `p`. The most likely token is always kept.

# %%
def my_top_p_filter(logits, p):
    ### BEGIN SOLUTION
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    drop_sorted = probs.cumsum(-1) - probs >= p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
    ### END SOLUTION


# %%
check("ch11.top_p_filter", my_top_p_filter)

# %% [markdown]
# The package's `sample_next` chains the filters: penalty, temperature, top-k, top-p, then a draw.

# %%
print(inspect.getsource(decode.sample_next))

# %% [markdown]
# **Greedy decoding loops.** Always taking the most likely token, a small model soon falls into a cycle
# that it then predicts with ever more confidence. Distinct-2, the share of distinct bigrams among all
# bigrams of the continuations, measures it: 1 = no bigram repeats, near 0 = a loop.

# %%
prompt = torch.tensor([tok.encode("The value of the").ids], device=dev)
n_new = 48
greedy = base.generate(prompt, n_new, temperature=0)[0, prompt.shape[1]:].tolist()
print("greedy:", repr(tok.decode(greedy)))
print(f"distinct-2 of the greedy continuation: {distinct_n([greedy], 2):.2f}")
assert distinct_n([greedy], 2) < 0.5


def continuations(n=8, seed=0, **kw):
    g = torch.Generator(device=dev).manual_seed(seed)
    return base.generate(prompt.repeat(n, 1), n_new, generator=g, **kw)[:, prompt.shape[1]:].tolist()

# %% [markdown]
# Repetition against the sampling settings: eight continuations of the same prompt per setting.

# %%
temps = [0.0, 0.3, 0.5, 0.7, 1.0, 1.3]
ps = [0.05, 0.2, 0.4, 0.6, 0.8, 0.95]
d_temp = [distinct_n(continuations(temperature=t), 2) for t in temps]
d_p = [distinct_n(continuations(temperature=1.0, top_p=p), 2) for p in ps]
fig, ax = plt.subplots(1, 2, figsize=(9, 3), sharey=True)
ax[0].plot(temps, d_temp, "o-")
ax[0].set(xlabel="temperature (0 = greedy)", ylabel="distinct-2")
ax[1].plot(ps, d_p, "o-")
ax[1].set(xlabel="top-p (temperature 1)")
plt.tight_layout()
plt.show()
print("temperature:", dict(zip(temps, [round(d, 2) for d in d_temp])))
print("top-p:      ", dict(zip(ps, [round(d, 2) for d in d_p])))
assert d_temp[0] < d_temp[-1] and d_p[0] < d_p[-1]

# %% [markdown]
# Sampling trades repetition for randomness. A repetition penalty attacks the loop directly and keeps
# greedy's determinism:

# %%
penalised = base.generate(prompt, n_new, temperature=0, repetition_penalty=1.5)[0, prompt.shape[1]:].tolist()
print("greedy + penalty 1.5:", repr(tok.decode(penalised)))
print(f"distinct-2: {distinct_n([greedy], 2):.2f} -> {distinct_n([penalised], 2):.2f}")
assert distinct_n([penalised], 2) > distinct_n([greedy], 2)

# %% [markdown]
# ## 3. Supervised fine-tuning: a chat template and a prompt-masked loss
# An instruction set of generated conversations: arithmetic, a Python answer, a two-turn dialogue
# whose answer is in the first turn, and reading (the answer is in a passage of the prompt). The chat
# template writes each as `User: ...` / `Assistant: ...`, each answer closed by `<|endoftext|>`.
#
# The model is trained to *write the answers*, not the questions: the loss counts only the assistant's
# tokens. With `targets` aligned to the logits (position $t$ predicts `targets[t]`),
# $\mathcal{L} = \frac{1}{|M|}\sum_{(b,t) \in M} -\log \mathrm{softmax}(z_{b,t})_{y_{b,t}}$ over the set
# $M$ of positions where `loss_mask` is True.
#
# ## Exercise: the SFT loss

# %%
def my_sft_loss(logits, targets, loss_mask):
    ### BEGIN SOLUTION
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
    return (ce * loss_mask).sum() / loss_mask.sum()
    ### END SOLUTION


# %%
check("ch11.sft_loss", my_sft_loss)

# %% [markdown]
# The package builds the same loss on the chapter's next-token loss: labels are the token ids with
# -100 (ignored) on the prompt, and `causal_lm_loss(model(ids), labels)` does the rest. One multi-turn
# conversation, with the tokens that carry loss in brackets:

# %%
n_train = 2000 if SMALL else 20000
train_chats, test_chats = instruction_set(n_train, seed=0), instruction_set(400, seed=1)
ids, mask = encode_chat(tok, train_chats[2])
print("".join(f"[{tok.decode([i], skip_special_tokens=False)}]" if m else tok.decode([i]) for i, m in zip(ids, mask)))
X, Y = encode_chats(tok, train_chats, pad_id=EOT)
X_test, Y_test = encode_chats(tok, test_chats, pad_id=EOT)
assert X.shape[1] <= cfg.context_length
print(f"{len(train_chats)} training conversations, padded to {X.shape[1]} tokens; "
      f"{(Y != -100).float().mean():.0%} of the positions carry loss")


def task_accuracy(model):
    """Per task: the share of test conversations whose every answer greedy decoding writes exactly."""
    em = exact_match(model, X_test.to(dev), Y_test.to(dev)).cpu()
    return {k: em[i::len(KINDS)].float().mean().item() for i, k in enumerate(KINDS)}

# %% [markdown]
# Full fine-tuning: every weight of a copy of the base model trains on the conversations.

# %%
sft_steps, batch = (300, 16) if SMALL else (2000, 32)
sft_batches = [(X[i:i + batch], Y[i:i + batch]) for i in range(0, len(X), batch)]


def sft_step_loss(model, b):
    ids, labels = b
    return causal_lm_loss(model(ids), labels)


acc_base = task_accuracy(base)
tformer.seed_everything(0)
sft = copy.deepcopy(base)
sft_losses = fit(sft, sft_step_loss, sft_batches, sft_steps, 3e-3)
acc_sft = task_accuracy(sft)
print("base model :", {k: f"{v:.0%}" for k, v in acc_base.items()})
print("after SFT  :", {k: f"{v:.0%}" for k, v in acc_sft.items()})
mean = lambda acc: sum(acc.values()) / len(acc)
assert mean(acc_base) < 0.05 and mean(acc_sft) > 0.4 and acc_sft["recall"] > 0.8

# %% [markdown]
# What the fine-tuned model writes, greedy, for new prompts of each task (the code answer, and the
# second turn of the dialogue, whose answer was given in the first):

# %%
for chat in test_chats[:4]:
    p = torch.tensor([prompt_ids(tok, chat)], device=dev)
    out = sft.generate(p, 12, temperature=0)[0, p.shape[1]:].tolist()
    out = out[:out.index(EOT)] if EOT in out else out
    print(repr(tok.decode(p[0].tolist())[-60:]), "->", repr(tok.decode(out)), "| expected:", repr(chat[-1][1]))

# %% [markdown]
# ## 4. LoRA: fine-tune a low-rank update
# LoRA (Hu et al. 2021) freezes a weight $W$ (out, in) and learns $\Delta W = \frac{\alpha}{r} B A$ with
# $A$ (r, in), $B$ (out, r), $r \ll$ in, out:
# $$y = x W^\top + b + \tfrac{\alpha}{r}\, x A^\top B^\top.$$
# $B$ starts at zero, so training starts from the pretrained model; afterwards $\Delta W$ folds into
# $W$ and inference costs nothing extra.
#
# ## Exercise: the LoRA forward pass

# %%
def my_lora_forward(x, weight, bias, A, B, alpha):
    ### BEGIN SOLUTION
    y = x @ weight.T + (alpha / A.shape[0]) * (x @ A.T) @ B.T
    return y if bias is None else y + bias
    ### END SOLUTION


# %%
check("ch11.lora_forward", my_lora_forward)

# %% [markdown]
# `add_lora` wraps every attention and FFN projection (`qkv`, `out`, `fc1`, `fc2`) and freezes the rest.
# Merged and unmerged give the same outputs. The trainable share is $r(\text{in} + \text{out}) / (\text{in} \cdot \text{out})$
# per matrix, about $2r/d$: large at this notebook's small width, below 2% at the full-mode width
# (d_model = 384, r = 4, which full mode trains).

# %%
r, alpha = (8, 16) if SMALL else (4, 16)
lora = add_lora(copy.deepcopy(base), r=r, alpha=alpha)
for m in lora.modules():                         # pretend-trained adapters for the check
    if isinstance(m, LoRALinear):
        torch.nn.init.normal_(m.B, std=0.02)
with torch.no_grad():
    torch.testing.assert_close(merge_lora(copy.deepcopy(lora)).eval()(X_test[:8].to(dev)),
                               lora.eval()(X_test[:8].to(dev)), atol=1e-5, rtol=1e-5)
print("merged == unmerged")
for m in lora.modules():
    if isinstance(m, LoRALinear):
        torch.nn.init.zeros_(m.B)
share = {}
for width, layers, vocab in [(64, 2, 1024), (384, 6, 8192)]:                # this notebook's widths, small and full
    for rank in (4, 8):
        m = add_lora(GPT(GPTConfig(vocab_size=vocab, context_length=64, n_layers=layers, n_heads=4 if width == 64 else 6,
                                   d_model=width)), r=rank, alpha=alpha)
        share[width, rank] = (lambda t: t[0] / t[1])(trainable_params(m))
print("trainable share:", {f"d_model={w}, r={k}": f"{v:.2%}" for (w, k), v in share.items()})
assert share[384, 4] < 0.02 < share[64, 4]

# %% [markdown]
# LoRA against full fine-tuning, same data and steps. The LayerNorm gains and biases (a few hundred
# numbers) train with the adapters: at this width the frozen, tied embedding table limits how confident
# the output can become, and the norms give it that scale.

# %%
for name, p in lora.named_parameters():
    if "norm" in name or "final_norm" in name:
        p.requires_grad_(True)
lora_trainable, total = trainable_params(lora)
tformer.seed_everything(0)
lora_losses = fit(lora, sft_step_loss, sft_batches, sft_steps, 1e-2)
acc_lora = task_accuracy(lora)
full_trainable = trainable_params(sft)[0]
print(f"{'':12}{'trainable':>12}{'share':>8}  accuracy per task")
print(f"{'full FT':12}{full_trainable:>12,}{1:>8.0%}  {({k: f'{v:.0%}' for k, v in acc_sft.items()})}")
print(f"{'LoRA r=' + str(r):12}{lora_trainable:>12,}{lora_trainable / total:>8.1%}  {({k: f'{v:.0%}' for k, v in acc_lora.items()})}")
assert mean(acc_lora) > mean(acc_base) and lora_losses[-1] < lora_losses[0] / 2

# %% [markdown]
# LoRA learns (from no correct answers to some), but at this width and step budget it lags full
# fine-tuning, as the loss curves show. LoRA's parity with full fine-tuning is a large-model result
# (Hu et al. 2021: GPT-3 175B with about 0.01% of the weights trained); full mode (d_model 384, r = 4,
# under 2% trained) is the place to compare.

# %%
plt.figure(figsize=(5, 3))
plt.plot(range(10, 10 * len(sft_losses) + 1, 10), sft_losses, label=f"full ({full_trainable:,} trained)")
plt.plot(range(10, 10 * len(lora_losses) + 1, 10), lora_losses, label=f"LoRA ({lora_trainable:,} trained)")
plt.xlabel("step")
plt.ylabel("SFT loss (answer tokens)")
plt.legend()
plt.show()

# %% [markdown]
# ## 5. Preference tuning with DPO
# People often cannot write the best answer but can say which of two they prefer. DPO (Rafailov et al.
# 2023) learns from such pairs directly. With $\pi$ the policy being trained, $\pi_\mathrm{ref}$ a frozen
# copy of the SFT model, and $\log\pi(y \mid x)$ a whole answer's log-probability:
# $$\mathcal{L} = -\log\sigma\Big(\beta\big[(\log\pi(y_c) - \log\pi_\mathrm{ref}(y_c)) - (\log\pi(y_r) - \log\pi_\mathrm{ref}(y_r))\big]\Big).$$
#
# ## Exercise: the DPO loss
# Inputs are four `(B,)` tensors of sequence log-probabilities and `beta`; return the batch mean.

# %%
def my_dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    ### BEGIN SOLUTION
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()
    ### END SOLUTION


# %%
check("ch11.dpo_loss", my_dpo_loss)

# %% [markdown]
# The preference here: both answers to an arithmetic question are right, but the full sentence
# ("The answer is 7.") is preferred to the bare number ("7") that SFT taught. The reference model is the
# SFT model, frozen; its log-probabilities are computed once.
#
# DPO only widens a margin, and it can do so by pushing *both* answers down: on this small model pure
# DPO wins the pairs but then writes broken text. As in Pang et al. (2024) and Llama 3's recipe, the
# training loss adds the chosen answer's per-token negative log-likelihood (`nll_weight`; set it to 0
# to see the failure).

# %%
def encode_pairs(pairs):
    c_ids, c_lab = encode_chats(tok, [c for c, _ in pairs], pad_id=EOT)
    r_ids, r_lab = encode_chats(tok, [r for _, r in pairs], pad_id=EOT)
    return c_ids.to(dev), c_lab.to(dev), r_ids.to(dev), r_lab.to(dev)


train_pairs, test_pairs = encode_pairs(preference_pairs(600, seed=0)), encode_pairs(preference_pairs(200, seed=1))
ref = copy.deepcopy(sft).eval().requires_grad_(False)
with torch.no_grad():
    ref_c, ref_r = sequence_logprob(ref, *train_pairs[:2]), sequence_logprob(ref, *train_pairs[2:])


@torch.no_grad()
def preference_accuracy(model):
    c_ids, c_lab, r_ids, r_lab = test_pairs
    return (sequence_logprob(model.eval(), c_ids, c_lab) > sequence_logprob(model, r_ids, r_lab)).float().mean().item()

# %%
beta, nll_weight, dpo_steps = 0.1, 1.0, 60 if SMALL else 300
dpo_batches = [tuple(t[i:i + batch] for t in (*train_pairs, ref_c, ref_r)) for i in range(0, len(ref_c), batch)]


def dpo_step_loss(model, b):
    c_ids, c_lab, r_ids, r_lab, rc, rr = b
    pc = sequence_logprob(model, c_ids, c_lab)
    nll_chosen = -(pc / (c_lab != -100).sum(1)).mean()                    # per token, the SFT loss on y_c
    return dpo_loss(pc, sequence_logprob(model, r_ids, r_lab), rc, rr, beta) + nll_weight * nll_chosen


policy = copy.deepcopy(sft)
pref_before = preference_accuracy(policy)
tformer.seed_everything(0)
dpo_losses = fit(policy, dpo_step_loss, dpo_batches, dpo_steps, 1e-3, schedule="constant")
pref_after = preference_accuracy(policy)
print(f"held-out pairs where the policy prefers the chosen answer: {pref_before:.0%} -> {pref_after:.0%}; "
      f"training loss (DPO + chosen NLL) {dpo_losses[0]:.2f} -> {dpo_losses[-1]:.2f}")
assert pref_before < 0.2 and pref_after > 0.9
p = torch.tensor([prompt_ids(tok, preference_pairs(1, seed=7)[0][0])], device=dev)
answer = tok.decode(policy.generate(p, 10, temperature=0)[0, p.shape[1]:].tolist())
print(repr(tok.decode(p[0].tolist())), "->", repr(answer))
assert answer.startswith("The answer is")

# %% [markdown]
# ## 6. Retrieval-augmented generation
# The SFT model has learned to *read*: given "Alice lives in Paris." it answers "Where does Alice live?".
# It cannot know facts it has never seen. RAG (Lewis et al. 2020) retrieves the passage most similar to
# the question from a document collection and puts it into the prompt. The collection: new facts (people
# and places paired at random, never trained on) mixed with paragraphs of the chapter's corpus; the
# retriever: TF-IDF vectors and cosine similarity (scikit-learn).

# %%
rng = random.Random(5)
facts = {name: rng.choice(PLACES) for name in NAMES}
passages = [fact(n, p) for n, p in facts.items()] + [t for t in text.split("\n\n")[:300] if t.strip()]
retriever = TfidfRetriever(passages)
questions = [f"Where does {n} live?" for n in facts]
top1 = [hits[0] for hits in retriever.search(questions, k=1)]
hit_rate = sum(passages[i] == fact(n, p) for i, (n, p) in zip(top1, facts.items())) / len(facts)
print(f"{len(passages)} passages; the top passage is the right fact for {hit_rate:.0%} of the questions")
assert hit_rate > 0.9

# %% [markdown]
# The loss of the true answer, with the retrieved passage in the prompt and without it:

# %%
with_passage = [[(f"{passages[i]}\n{q}", p)] for i, q, p in zip(top1, questions, facts.values())]
without = [[(q, p)] for q, p in zip(questions, facts.values())]
losses, accs = {}, {}
with torch.no_grad():
    for name, chats in [("without the passage", without), ("with the retrieved passage", with_passage)]:
        ids, labels = (t.to(dev) for t in encode_chats(tok, chats, pad_id=EOT))
        losses[name] = causal_lm_loss(sft.eval()(ids), labels).item()
        accs[name] = exact_match(sft, ids, labels).float().mean().item()
for name in losses:
    print(f"{name:28} answer loss {losses[name]:.2f}, exact answers {accs[name]:.0%}")
assert losses["with the retrieved passage"] < losses["without the passage"] / 2
plt.figure(figsize=(4, 3))
plt.bar(["without", "with passage"], list(losses.values()), color=["tab:gray", "tab:blue"])
plt.ylabel("answer loss (nats/token)")
plt.show()

# %% [markdown]
# ## 7. What production assistants add
# The pieces are the ones above, at a very different scale. Pretraining uses trillions of tokens with
# a 100k-200k-token BPE vocabulary; SFT uses hundreds of thousands to millions of human- and
# model-written conversations with a fixed chat template and special role tokens, many turns, tool
# calls and code; preference tuning uses human or AI feedback, through a learned reward model and RL
# (PPO, GRPO) or directly (DPO and its relatives), often in several rounds, for helpfulness and safety
# together. LoRA and its quantised form QLoRA make such fine-tuning fit a single GPU. Retrieval uses
# dense embedding models and vector indexes over millions of documents, often with a re-ranker, and
# the model is trained to cite and to say when the passages do not answer. Decoding adds stop
# sequences, constrained output formats (JSON), speculative decoding and batching (chapter 14). What
# the chapter's small model cannot show is what scale brings: general instruction following on tasks
# never seen in fine-tuning.
