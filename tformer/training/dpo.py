"""Direct preference optimisation (Rafailov et al. 2023), chapter 11.

From pairs (prompt, chosen answer, rejected answer), DPO trains the policy directly, without a reward
model: with a frozen reference model (the SFT model) and each answer's log-probability log pi(y | x),

    loss = -log sigmoid(beta * ((log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r))))

The policy gains probability on the chosen answer relative to the reference, and loses it on the
rejected one; beta says how far from the reference it may drift (a KL penalty in the original RL form).

    pc, pr = sequence_logprob(policy, ids_c, labels_c), sequence_logprob(policy, ids_r, labels_r)
    with torch.no_grad():
        rc, rr = sequence_logprob(ref, ids_c, labels_c), sequence_logprob(ref, ids_r, labels_r)
    loss = dpo_loss(pc, pr, rc, rr, beta=0.1)
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from .sft import Turn


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """Mean over the batch of -log sigmoid(beta * ((pc - rc) - (pr - rr))); every input (B,) sequence log-probs."""
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected, ref_chosen, ref_rejected)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"dpo_loss: expected four (B,) tensors of sequence log-probabilities, got shapes {shapes}")
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def preference_pairs(n: int, seed: int = 0) -> list[tuple[list[Turn], list[Turn]]]:
    """n pairs (chosen conversation, rejected conversation) on the arithmetic task: both answers are right,
    people prefer the full sentence ("The answer is 7.") to the bare number ("7")."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        q = f"What is {a} + {b}?"
        pairs.append(([(q, f"The answer is {a + b}.")], [(q, str(a + b))]))
    return pairs


__all__ = ["dpo_loss", "preference_pairs"]
