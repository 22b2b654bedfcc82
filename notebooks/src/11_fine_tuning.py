# %% [markdown]
# # Chapter 11: Transformers in large language models (2/3: fine-tuning a language model into an assistant)
#
# **What this notebook covers.** A pretrained GPT continues text; an assistant answers. The first steps:
# * **decoding**: how a distribution over the next token becomes text (greedy, temperature, top-k,
#   top-p, repetition penalty), and how much each setting repeats itself;
# * **supervised fine-tuning (SFT)**: train on conversations written in a *chat template*, with the loss
#   on the assistant's tokens only; tasks include code answers and a two-turn dialogue;
# * **LoRA**: fine-tune a few low-rank matrices instead of every weight.
#
# The next notebook, `11_preference_rl`, starts from such an SFT model: preference tuning (DPO),
# reinforcement learning with rewards a program checks (GRPO), and retrieval (RAG). Everything is built
# on the GPT of the first notebook (`11_llms`), offline, on generated data.
#
# **How to check an exercise.** Replace `raise NotImplementedError` with your code, run the cell, then
# the `check(...)` cell below it: PASS, or the smallest failing input with a hint.
#
# **How long.** In small mode this notebook runs in about a minute on a 2-core laptop CPU.
#
# **Where the code lives.**
# * `tformer/sampling.py: sample_next, top_k_filter, top_p_filter, apply_repetition_penalty`; `tformer/training/metrics.py: distinct_n`
# * `tformer/training/sft.py: render, encode_chats, sft_loss, exact_match, sequence_logprob, instruction_set` (chat template, SFT)
# * `tformer/training/losses.py: causal_lm_loss` (the SFT loss is this loss with the prompt's labels ignored)
# * `tformer/training/lora.py: lora_forward, LoRALinear, add_lora, merge_lora, trainable_params`
# * `tformer/training/trainer.py: Trainer, train_steps`, the one training loop every step below uses
# * `tformer/capstones/sft_start.py: notebook_recipe, pretrain, training_chats, sft_batches, save_sft_start` (the chapter's
#   SFT start, shared with the next notebook and the GRPO capstone; its data holds the two tasks with checkable
#   answers, from `tformer/training/grpo.py`, that the next notebook rewards)

# %%
import copy
import inspect
from functools import partial

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import tformer
from tformer import sampling
from tformer.grading import check
from tformer.data.text import offline_text, train_tokenizer
from tformer.training.lora import LoRALinear, add_lora, merge_lora, trainable_params
from tformer.training.metrics import distinct_n
from tformer.models import GPT, GPTConfig
from tformer.training.sft import KINDS, encode_chat, encode_chats, exact_match, instruction_set, prompt_ids, sft_step_loss
from tformer.capstones import sft_start
from tformer.training import train_steps

tformer.seed_everything(0)
SMALL = tformer.SMALL
dev = tformer.device()
print("small mode:", SMALL, "| device:", dev)

# %% [markdown]
# ## 1. The base model
# The first notebook's recipe: byte-level BPE on Python's documentation, a small GPT, next-token
# pretraining. Every training run in this notebook goes through `tformer.training.Trainer` (AdamW, warmup
# then linear decay); `fit` calls `tformer.training.train_steps`, which picks the trainable parameters and the settings.

# %%
fit = partial(train_steps, device=dev)       # fit(model, loss_fn, batches, steps, lr, schedule="linear", weight_decay=0.0)
recipe = sft_start.notebook_recipe(SMALL)    # model sizes, steps, batch sizes and learning rates, small or full mode
print(recipe)
text = offline_text()
tok = train_tokenizer([text], vocab_size=recipe["vocab_size"])
EOT = tok.token_to_id("<|endoftext|>")
base, pre_losses = sft_start.pretrain(tok, text, recipe, device=dev)     # next-token pretraining through fit's Trainer
cfg = base.cfg
print(f"GPT, {base.num_params():,} parameters: training loss {pre_losses[0]:.2f} -> {pre_losses[-1]:.2f}")

# %% [markdown]
# ## 2. Decoding: from a distribution to text
# Generation is autoregressive: the model picks one token, appends it to its input and predicts the next.
# At every step the model gives logits $z \in \mathbb{R}^V$ for the next token. Ways to pick one:
# * **greedy**: $\arg\max_v z_v$ (deterministic);
# * **temperature** $\tau$: sample from $\mathrm{softmax}(z / \tau)$; $\tau < 1$ sharpens, $\tau > 1$ flattens;
# * **top-k**: sample among the $k$ most likely tokens only;
# * **top-p (nucleus, Holtzman et al. 2020)**: sample among the smallest set of most likely tokens whose
#   probability sums to $\ge p$: few tokens where the model is sure, many where it is not;
# * **repetition penalty**: make every token that already appeared less likely by $\theta > 1$. CTRL
#   (Keskar et al. 2019) divides its logit by $\theta$ whatever its sign, which *raises* a negative
#   logit; the course uses Hugging Face's rule (`RepetitionPenaltyLogitsProcessor`): divide a positive
#   logit by $\theta$, multiply a negative one, so the token always loses probability.
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
print(inspect.getsource(sampling.sample_next))

# %% [markdown]
# **Greedy decoding loops.** Always taking the most likely token, a small model soon falls into a cycle
# that it then predicts with ever more confidence. Distinct-2, the share of distinct bigrams among all
# bigrams of the continuations, measures it: 1 = no bigram repeats, near 0 = a loop. The cell prints the
# greedy continuation, which ends in a few tokens repeated over and over (in small mode, quotes), and under
# it one sample from the same prompt at temperature 1, which does not loop but drifts: the trade the
# rest of this section measures.

# %%
prompt = torch.tensor([tok.encode("The value of the").ids], device=dev)
n_new = 48
greedy = base.generate(prompt, n_new, temperature=0)[0, prompt.shape[1]:].tolist()
sampled = base.generate(prompt, n_new, temperature=1.0, generator=torch.Generator(device=dev).manual_seed(0))
sampled = sampled[0, prompt.shape[1]:].tolist()
print("greedy:  ", repr(tok.decode(greedy)))
print("sampled: ", repr(tok.decode(sampled)))
print(f"distinct-2: greedy {distinct_n([greedy], 2):.2f}, sampled {distinct_n([sampled], 2):.2f}")
assert distinct_n([greedy], 2) < 0.5 < distinct_n([sampled], 2)


def continuations(n=8, seed=0, **kw):
    g = torch.Generator(device=dev).manual_seed(seed)
    return base.generate(prompt.repeat(n, 1), n_new, generator=g, **kw)[:, prompt.shape[1]:].tolist()

# %% [markdown]
# Repetition against the sampling settings: eight continuations of the same prompt per setting.

# %%
# Figure: Distinct-2 of eight continuations against temperature (left) and top-p (right).
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
# Sampling trades repetition for randomness. A repetition penalty keeps greedy's determinism and pushes
# back on tokens already written. It acts once per token, whatever the number of times it appeared,
# so a mild penalty only moves the loop to other tokens; the table gives, per $\theta$, distinct-2 and
# the longest run of one repeated token at the end of the output.

# %%
def tail_run(ids):
    """How many times the last token repeats at the end of ids (1 = no loop on one token)."""
    n = 1
    while n < len(ids) and ids[-n - 1] == ids[-1]:
        n += 1
    return n


pen_out = {th: base.generate(prompt, n_new, temperature=0, repetition_penalty=th)[0, prompt.shape[1]:].tolist()
           for th in (1.0, 1.3, 1.5, 2.0, 3.0)}
for th, out in pen_out.items():
    print(f"theta {th}: distinct-2 {distinct_n([out], 2):.2f}, final run {tail_run(out):2d} | {tok.decode(out)[-50:]!r}")
ends = [th for th, out in pen_out.items() if distinct_n([out], 2) > 0.8 and tail_run(out) < 3]
print("settings that end the loop within", n_new, "tokens:", ends or "none: the penalty only delays it here")
assert ends and distinct_n([pen_out[max(ends)]], 2) > distinct_n([greedy], 2)

# %% [markdown]
# Read the table: the mild penalties (1.3, 1.5) raise distinct-2 but only delay the loop. It moves
# to a token the penalty has not yet reached (here the newline, whose logit stays the largest after one
# division). The settings listed last end it within the 48 tokens, at the price of wandering text. The
# penalty is per token, not per occurrence, so no value of it forbids a loop outright.

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
# `logits (B, T, V)`, `targets (B, T)` token ids (long), `loss_mask (B, T)` bool, True on the answer
# tokens: return the mean cross-entropy over the masked positions, a scalar.

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
# conversation, with the tokens that carry loss in brackets. The training set also holds as many
# problems of two tasks whose answers a program checks (two-digit addition with carries, sorting four
# digits; `tformer.training.grpo`), minus the prompts held out for good: the next notebook starts from
# this model and rewards them with GRPO.

# %%
n_train = recipe["sft"]["n_train"]
train_chats, test_chats = instruction_set(n_train, seed=0), instruction_set(400, seed=1)
ids, mask = encode_chat(tok, train_chats[2])
print("".join(f"[{tok.decode([i], skip_special_tokens=False)}]" if m else tok.decode([i]) for i, m in zip(ids, mask)))
chats = sft_start.training_chats(n_train)    # train_chats + as many GRPO-task problems (for the next notebook), shuffled
X, Y = encode_chats(tok, chats, pad_id=EOT)  # (N, T) ids, (N, T) labels: the ids on answer tokens, -100 elsewhere
X_test, Y_test = encode_chats(tok, test_chats, pad_id=EOT)
assert X.shape[1] <= cfg.context_length
print(f"{len(chats)} training conversations, padded to {X.shape[1]} tokens; "
      f"{(Y != -100).float().mean():.0%} of the positions carry loss")


def task_accuracy(model):
    """Per task: the share of test conversations whose every answer greedy decoding writes exactly."""
    em = exact_match(model, X_test.to(dev), Y_test.to(dev)).cpu()
    return {k: em[i::len(KINDS)].float().mean().item() for i, k in enumerate(KINDS)}

# %% [markdown]
# Full fine-tuning: every weight of a copy of the base model trains on the conversations.

# %%
sft_steps, batch, sft_lr = recipe["sft"]["steps"], recipe["sft"]["batch_size"], recipe["sft"]["lr"]
sft_batches = sft_start.sft_batches(X, Y, batch)          # [(ids (b, T), labels (b, T)), ...]
print(inspect.getsource(sft_step_loss))                   # the package's: causal_lm_loss(model(ids), labels), 1

acc_base = task_accuracy(base)
tformer.seed_everything(0)
sft = copy.deepcopy(base)
sft_losses = fit(sft, sft_step_loss, sft_batches, sft_steps, sft_lr)
acc_sft = task_accuracy(sft)
print("base model :", {k: f"{v:.0%}" for k, v in acc_base.items()})
print("after SFT  :", {k: f"{v:.0%}" for k, v in acc_sft.items()})
mean = lambda acc: sum(acc.values()) / len(acc)
assert mean(acc_base) < 0.05 and mean(acc_sft) > 0.4 and acc_sft["recall"] > 0.8

# %% [markdown]
# The SFT model goes to a run folder, `runs/11_fine_tuning/` in the checkout (weights, tokenizer, and the
# recipe it was made with): the next notebook starts from it when the recipe matches, and trains the
# same one itself when it does not find it.

# %%
folder = sft_start.save_sft_start(sft, tok, recipe, SMALL)
print(f"saved to runs/{folder.name}/:", sorted(p.name for p in folder.iterdir()))

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
# `x (..., in)`, the frozen `weight (out, in)` and `bias (out,)` or `None`, `A (r, in)`, `B (out, r)`,
# `alpha` a number: return $y$ `(..., out)` as in the formula above, with $r$ read from `A`.

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
# Merged and unmerged give the same outputs. Two different shares: *per matrix*, a (d, d) projection
# trains $r(\text{in} + \text{out}) / (\text{in} \cdot \text{out}) = 2r/d$ of its numbers (at d = 64,
# r = 8: 25%); for the *whole model* the share is smaller, because the embedding table, the norms and
# the wider FFN matrices count in the total. The cell prints both, at both widths, then the share of
# one matrix that is not square, the FFN's `fc1`, in this notebook's model.

# %%
r, alpha = (16, 32) if SMALL else (8, 16)
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
        share[width, rank] = (2 * rank / width, (lambda t: t[0] / t[1])(trainable_params(m)))
for (w, k), (per_matrix, whole) in share.items():
    print(f"d_model={w:3d}, r={k}: per (d, d) matrix 2r/d = {per_matrix:6.2%}, whole model {whole:6.2%}")
fc1 = lora.blocks[0].ffn.fc1                                                # the FFN's first matrix, not square
print(f"this notebook's fc1, weight {tuple(fc1.base.weight.shape)}, r={r}: "
      f"{(fc1.A.numel() + fc1.B.numel()) / fc1.base.weight.numel():.2%} of its numbers")
assert all(whole < per_matrix for per_matrix, whole in share.values()) and share[384, 4][1] < 0.02

# %% [markdown]
# LoRA against full fine-tuning on the same data, with LoRA's usual recipe: a learning rate several
# times full fine-tuning's, adapters on every projection, and a rank the tasks need (here r = 16 of
# d = 64). The LayerNorm gains and biases (a few hundred numbers) train with the adapters: at this width
# the frozen embedding table, which is tied (the same matrix embeds the input tokens and, transposed,
# scores the next one), limits how confident the output can become, and the norms give it that scale.
# LoRA gets twice full fine-tuning's steps, because each of its steps moves the model less; to see it
# with the same steps, set `lora_steps = sft_steps` in the next cell.

# %%
for name, p in lora.named_parameters():
    if "norm" in name or "final_norm" in name:
        p.requires_grad_(True)
lora_trainable, total = trainable_params(lora)
tformer.seed_everything(0)
lora_steps = 2 * sft_steps
lora_losses = fit(lora, sft_step_loss, sft_batches, lora_steps, 1.5e-2)
acc_lora = task_accuracy(lora)
full_trainable = trainable_params(sft)[0]
print(f"{'':12}{'trainable':>12}{'share':>8}  accuracy per task")
print(f"{'full FT':12}{full_trainable:>12,}{1:>8.0%}  {({k: f'{v:.0%}' for k, v in acc_sft.items()})}")
print(f"{'LoRA r=' + str(r):12}{lora_trainable:>12,}{lora_trainable / total:>8.1%}  {({k: f'{v:.0%}' for k, v in acc_lora.items()})}")
half = {k: acc_lora[k] >= acc_sft[k] / 2 for k in KINDS}
print("LoRA at least half of full fine-tuning's accuracy:", half)
print(f"mean accuracy: full {mean(acc_sft):.0%}, LoRA {mean(acc_lora):.0%}")
print(f"final training loss: full {sft_losses[-1]:.2f} after {sft_steps} steps, LoRA {lora_losses[-1]:.2f} after {lora_steps}")
assert mean(acc_lora) > mean(acc_base) + 0.1 and lora_losses[-1] < lora_losses[0] / 3

# %% [markdown]
# The line above says, task by task, whether LoRA reaches half of full fine-tuning at this width. In
# small mode, even with twice the steps, LoRA stays behind: its mean accuracy and its final loss (both
# printed above) are well short of full fine-tuning's, task by task in the accuracy line. How many answers
# of each task it gets right moves with the last bits of rounding (torch's fused and unfused AdamW kernels alone change it), so read the
# per-task line as a rough picture and the means as the result.
#
# The likely reason LoRA stays behind is the base, not the adapters: copying words from the context
# needs attention circuits that a 64-wide model pretrained for 150 steps barely has. Full
# fine-tuning can build them from every weight, while a low-rank update to frozen weights mostly re-uses
# what is there.
#
# LoRA's parity with full fine-tuning is measured on large pretrained models (Hu et al.
# 2021: GPT-3 175B with about 0.01% of the weights trained); full mode (d_model 384, 3000 pretraining
# steps, r = 8) is the place to compare. The curves below put both runs on one step axis; LoRA's
# learning rate decays over its longer run, so at full fine-tuning's last step it is not where a LoRA
# run of that many steps would end.

# %%
# Figure: SFT loss on answer tokens: full fine-tuning against LoRA.
plt.figure(figsize=(5, 3))
plt.plot(range(10, 10 * len(sft_losses) + 1, 10), sft_losses, label=f"full ({full_trainable:,} trained)")
plt.plot(range(10, 10 * len(lora_losses) + 1, 10), lora_losses, label=f"LoRA ({lora_trainable:,} trained)")
plt.xlabel("step")
plt.ylabel("SFT loss (answer tokens)")
plt.legend()
plt.show()

# %% [markdown]
# ## 5. Next
# The SFT model answers in the format it was shown. The next notebook, `11_preference_rl`, teaches it
# which of two answers people prefer (DPO), makes it right more often on tasks a program can check
# (GRPO), and gives it facts it never saw through retrieval (RAG).

# %% [markdown]
# ## Questions

# %% [markdown]
# **Question 1.** In section 2, greedy decoding with a mild repetition penalty ($\theta$ = 1.3 or 1.5)
# still ends in a loop. Why?
# - **A.** The penalty applies to the prompt's tokens only, not to the tokens the model writes.
# - **B.** A token loses the same factor whether it appeared once or many times, so a token whose logit
#   stays the largest after that one division is chosen again and again.
# - **C.** Greedy decoding takes the most likely token before the penalty applies; only sampling feels it.
# - **D.** Dividing by $\theta$ raises the logits of the tokens already written, so they come back.
#
# The table printed by the repetition-penalty cell of *2. Decoding* gives distinct-2 and the final run
# of one repeated token for each $\theta$, and the text under it names the token the loop moves to.

# %%
answer = "B"  ### ANSWER
check("ch11.q_repetition_loop", answer)

# %% [markdown]
# **Question 2.** In supervised fine-tuning, which tokens of a conversation carry loss?
# - **A.** Every token of the conversation: the model learns the whole dialogue.
# - **B.** The user's tokens only: the model learns to understand the questions.
# - **C.** The last answer only: the earlier turns are context.
# - **D.** The assistant's tokens only, in every turn.
#
# The cell under *3. Supervised fine-tuning* prints a two-turn conversation with the tokens that carry
# loss in brackets, and the share of positions that carry loss.

# %%
answer = "D"  ### ANSWER
check("ch11.q_sft_loss_tokens", answer)

# %% [markdown]
# **Question 3.** LoRA of rank $r$ on the FFN's first matrix `fc1`, whose weight is $(4d, d)$: what share
# of the weight's numbers do its adapters train? Answer with a formula in `r` and `d`, as a string. The
# text above the share cell of *4. LoRA* gives the rule for any shape, and that cell prints the share of
# this notebook's `fc1`: your formula at its $d$ and $r$ should give the same.

# %%
answer = "5*r/(4*d)"  ### ANSWER
check("ch11.q_lora_fc1_share", answer)

# %% [markdown]
# ## Summary
# * Greedy decoding loops: its continuation's distinct-2 stays below 0.5 (asserted). Higher temperature and
#   higher top-p raise distinct-2 (asserted); a repetition penalty ends the loop only at the strong settings
#   the cell lists, because it acts once per token.
# * SFT with the loss on the assistant's tokens only takes the base model from under 5% exact answers to a
#   mean above 40% over the four tasks, and above 80% on the two-turn recall (asserted).
# * LoRA's merged and unmerged weights give the same outputs; a $(d, d)$ matrix trains $2r/d$ of its
#   numbers, the whole model less (1.06% at $d_{model}$ = 384, $r$ = 4).
# * At small mode's width LoRA stays well behind full fine-tuning even with twice the steps; its parity is
#   a result on large pretrained models, which full mode approaches.
