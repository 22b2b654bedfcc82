"""GRPO: reinforcement learning with verifiable rewards (DeepSeekMath, Shao et al. 2024), chapter 11.

For each prompt q the policy samples a group of G answers o_1..o_G; a checker gives each a reward r_i
(1 if the answer is exactly right, else 0). No value network: each answer's advantage is its reward
relative to its own group,

    A_i = (r_i - mean(r)) / (std(r) + 1e-4)          torch.std over the group (unbiased); 0 for G = 1

and every token of o_i gets A_i. The policy maximises the clipped ratio objective (PPO's, epsilon 0.2)
minus a KL penalty to the frozen SFT reference (beta 0.04), each answer averaged over its own tokens,
then over the group:

    J = mean_i 1/|o_i| sum_t [ min(rho_t A_i, clip(rho_t, 1 - eps, 1 + eps) A_i) - beta * KL_t ]
    rho_t = pi(o_t | q, o_<t) / pi_old(o_t | ...),   KL_t = ref/pi - log(ref/pi) - 1   (Schulman's k3)

`grpo_loss` returns -J. Known variants change the averaging: Dr. GRPO (Liu et al. 2025) drops the 1/|o_i|
and the std division; DAPO (Yu et al. 2025) averages over all tokens of the batch at once.

The tasks have answers a function checks exactly and task spaces large enough to hold prompts out:
two-digit addition with carries ("What is 47 + 85?" -> "132") and sorting four digits
("Sort 5 2 8 1." -> "1 2 5 8"). `held_out(prompt)` (a hash of the prompt) decides, once and for all, which
prompts no training set ever contains.

    adv = group_advantages(rewards)                         # rewards (B, G)
    loss = grpo_loss(logp, old_logp, ref_logp, adv, mask)   # (B, G, T) each, mask True on answer tokens
    pass_at_k(n=16, c=3, k=4)                               # unbiased pass@k (Chen et al. 2021)
"""
from __future__ import annotations

import copy
import math
import random
import weakref
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..utils.device import amp_dtype
from ..utils.gpu import grad_scaler
from .sft import Turn, prompt_ids
from .trainer import fusable

EPS_STD = 1e-4
TASKS = ("add", "sort")


# --- the objective ---------------------------------------------------------------------------------------

def group_advantages(rewards: torch.Tensor, eps: float = EPS_STD) -> torch.Tensor:
    """rewards (B, G) -> (B, G): (r - group mean) / (group std + eps), torch.std (unbiased) over each row;
    all zeros for groups of one (G = 1: no other answer to compare with)."""
    if rewards.dim() != 2:
        raise ValueError(f"group_advantages: expected rewards (B, G), got shape {tuple(rewards.shape)}")
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + eps)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, eps: float = 0.2, beta: float = 0.04) -> torch.Tensor:
    """-J, DeepSeekMath's GRPO objective. logp, old_logp, ref_logp (B, G, T): per-token log-probabilities of
    the sampled answers under the policy, the sampling policy and the reference; advantages (B, G);
    mask (B, G, T) True on answer tokens. Each answer averages over its own tokens, then the mean over
    the group (and the batch)."""
    if not (logp.shape == old_logp.shape == ref_logp.shape == mask.shape) or logp.dim() != 3 \
            or advantages.shape != logp.shape[:2]:
        raise ValueError(f"grpo_loss: expected logp, old_logp, ref_logp, mask (B, G, T) and advantages (B, G); got "
                         f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(ref_logp.shape)}, "
                         f"{tuple(mask.shape)}, {tuple(advantages.shape)}")
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages[..., None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    per_token = surrogate - beta * k3_kl(logp, ref_logp)
    per_answer = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return -per_answer.mean()


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


# --- verifiable tasks ------------------------------------------------------------------------------------

def held_out(prompt: str) -> bool:
    """True for the prompts kept out of every training set (about 1 in 8, fixed by a hash of the text)."""
    return zlib.crc32(prompt.encode()) % 8 == 0


def make_problem(kind: str, rng: random.Random) -> tuple[str, str]:
    """(prompt, answer): add = two two-digit numbers (carries included), sort = four digits ascending."""
    if kind == "add":
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        return f"What is {a} + {b}?", str(a + b)
    if kind == "sort":
        xs = [rng.randrange(10) for _ in range(4)]
        return f"Sort {' '.join(map(str, xs))}.", " ".join(map(str, sorted(xs)))
    raise ValueError(f"make_problem: kind must be one of {TASKS}, got {kind!r}")


def problems(n: int, seed: int = 0, split: str = "train", kinds: tuple[str, ...] = TASKS) -> list[tuple[str, str, str]]:
    """n distinct (kind, prompt, answer), kinds in turn; split 'train' never holds a held-out prompt,
    'test' holds only held-out ones."""
    if split not in ("train", "test"):
        raise ValueError(f"problems: split must be 'train' or 'test', got {split!r}")
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < n:
        kind = kinds[len(out) % len(kinds)]
        for _ in range(10000):
            q, a = make_problem(kind, rng)
            if held_out(q) == (split == "test") and q not in seen:
                break
        else:
            raise ValueError(f"problems: cannot find {n} distinct {split} prompts")
        seen.add(q)
        out.append((kind, q, a))
    return out


def reward(text: str, answer: str) -> float:
    """1.0 when the generated answer (decoded, up to the end token) is exactly the expected one."""
    return float(text.strip() == answer)


# --- sampling and scoring --------------------------------------------------------------------------------

@dataclass
class Rollout:
    ids: torch.Tensor        # (N, P + L) prompt then sampled answer (N = prompts x G, prompt-major)
    mask: torch.Tensor       # (N, P + L - 1) True where position t predicts an answer token (up to the end token)
    texts: list[str]         # decoded answers, up to the end token
    rewards: torch.Tensor    # (N,)


def token_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """(N, T - 1): log p(ids[:, t + 1] | ids[:, :t + 1]) under the model."""
    logp = F.log_softmax(model(ids)[:, :-1].float(), dim=-1)
    return logp.gather(-1, ids[:, 1:, None])[..., 0]


@torch.no_grad()
def sample_answers(model, tok, prompts: list[str], answers: list[str], group: int, max_new: int, end_id: int,
                   temperature: float = 1.0, generator: torch.Generator | None = None) -> Rollout:
    """`group` sampled answers per prompt, batched: prompts of equal token length go through one
    `GPT.generate` call (KV cache, every row of the batch in the same tensor operations); rows are
    returned prompt-major (prompt 0's G answers, then prompt 1's, ...), right-padded with end_id."""
    dev = next(model.parameters()).device
    enc = [prompt_ids(tok, [(q, "")]) for q in prompts]
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(enc):
        by_len.setdefault(len(p), []).append(i)
    width = max(len(p) for p in enc) + max_new
    ids = torch.full((len(prompts) * group, width), end_id, dtype=torch.long, device=dev)
    mask = torch.zeros(len(prompts) * group, width - 1, dtype=torch.bool, device=dev)
    for n, rows in by_len.items():
        x = torch.tensor([enc[i] for i in rows], device=dev).repeat_interleave(group, 0)
        out = model.generate(x, max_new, temperature=temperature, generator=generator)
        gen = out[:, n:]
        ended = (gen == end_id).long().cumsum(1)
        keep = (ended == 0) | ((ended == 1) & (gen == end_id))                  # up to and including the first end
        dst = (torch.tensor(rows, device=dev)[:, None] * group + torch.arange(group, device=dev)).view(-1)
        ids[dst, :n + max_new] = torch.cat([out[:, :n], torch.where(keep, gen, end_id)], 1)
        mask[dst, n - 1:n - 1 + max_new] = keep
    texts, rewards = [], []
    for row in range(ids.shape[0]):
        ans = ids[row, 1:][mask[row]].tolist()
        ans = ans[:-1] if ans and ans[-1] == end_id else ans
        texts.append(tok.decode(ans))
        rewards.append(reward(texts[-1], answers[row // group]))
    return Rollout(ids, mask, texts, torch.tensor(rewards, device=dev))


@torch.no_grad()
def greedy_accuracy(model, tok, data: list[tuple[str, str, str]], end_id: int, max_new: int = 10,
                    samples: int = 0, temperature: float = 1.0, seed: int = 0) -> dict:
    """Exact-answer accuracy per task with greedy decoding; with samples = n > 0 also the number of correct
    answers among n samples per prompt (for pass@k), as {'greedy': {kind: acc}, 'correct': [c per prompt]}."""
    kinds = sorted({k for k, _, _ in data})
    roll = sample_answers(model, tok, [q for _, q, _ in data], [a for _, _, a in data], 1, max_new, end_id,
                          temperature=0.0)
    r = roll.rewards.cpu()
    res = {"greedy": {k: r[[i for i, (kk, _, _) in enumerate(data) if kk == k]].mean().item() for k in kinds}}
    if samples:
        g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
        roll = sample_answers(model, tok, [q for _, q, _ in data], [a for _, _, a in data], samples, max_new, end_id,
                              temperature=temperature, generator=g)
        res["correct"] = roll.rewards.view(len(data), samples).sum(1).long().tolist()
    return res


def sft_chats(data: list[tuple[str, str, str]]) -> list[list[Turn]]:
    """The problems as one-turn conversations for supervised fine-tuning."""
    return [[(q, a)] for _, q, a in data]


def start_from(sft, lr: float):
    """(policy, reference, optimizer) for GRPO from an SFT model: the policy a trainable copy, the reference a
    frozen copy in eval mode (the KL term's anchor), AdamW without weight decay, betas (0.9, 0.99)."""
    policy = copy.deepcopy(sft)
    ref = copy.deepcopy(sft).eval().requires_grad_(False)
    return policy, ref, torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0,
                                          fused=fusable(policy.parameters()))


# each GRPO optimizer's gradient scaler (fp16 only), kept across grpo_step calls as the Trainer keeps its own
_SCALERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grpo_step(policy, ref, optimizer, tok, batch: list[tuple[str, str, str]], *, group: int = 8, max_new: int = 10,
              end_id: int, updates: int = 2, eps: float = 0.2, beta: float = 0.04, temperature: float = 1.0,
              generator: torch.Generator | None = None, clip_norm: float = 1.0) -> dict:
    """One GRPO iteration: sample `group` answers per prompt from the current policy (which becomes pi_old),
    score them, then `updates` gradient steps on grpo_loss. Returns the mean reward, the KL to the
    reference (mean k3 over answer tokens) and the loss.

    The log-probabilities and the updates run under the device policy's autocast
    (`tformer.utils.device.amp_dtype`): none on a CPU (float32, as before), bf16 on sm80+, fp16 on an older
    GPU such as a T4, through a gradient scaler kept with `optimizer`. Sampling runs in float32."""
    dev = next(policy.parameters()).device
    amp = amp_dtype(dev)
    cast = amp not in (None, torch.float32)
    if optimizer not in _SCALERS:
        _SCALERS[optimizer] = grad_scaler(amp, dev)
    scaler = _SCALERS[optimizer]

    def autocast():
        return torch.autocast(dev.type, dtype=amp if cast else torch.bfloat16, enabled=cast)
    policy.eval()
    roll = sample_answers(policy, tok, [q for _, q, _ in batch], [a for _, _, a in batch], group, max_new, end_id,
                          temperature=temperature, generator=generator)
    b = len(batch)
    adv = group_advantages(roll.rewards.view(b, group))
    with torch.no_grad(), autocast():
        old = token_logprobs(policy, roll.ids)
        ref_lp = token_logprobs(ref, roll.ids)
    shape = (b, group, -1)
    m = roll.mask
    policy.train()
    for _ in range(updates):
        with autocast():
            logp = token_logprobs(policy, roll.ids)
            loss = grpo_loss(logp.view(shape), old.view(shape), ref_lp.view(shape), adv, m.view(shape), eps, beta)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                       # fp16: the true gradients, before clipping them
        torch.nn.utils.clip_grad_norm_(policy.parameters(), clip_norm)
        scaler.step(optimizer)                           # fp16: skipped when a gradient overflowed
        scaler.update()
    kl = (k3_kl(logp.detach(), ref_lp) * m).sum() / m.sum().clamp(min=1)
    return {"reward": roll.rewards.mean().item(), "kl": kl.item(), "loss": loss.item()}


__all__ = ["group_advantages", "k3_kl", "grpo_loss", "pass_at_k", "held_out", "make_problem", "problems", "reward",
           "Rollout", "token_logprobs", "sample_answers", "greedy_accuracy", "sft_chats", "grpo_step", "TASKS"]
