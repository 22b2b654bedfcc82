"""Language-model objectives and a small offline text pipeline (chapter 11).

    causal LM (GPT):  predict token t+1 from tokens <= t: logits[:, :-1] against idx[:, 1:]
    masked LM (BERT): choose 15% of the tokens; of those 80% -> [MASK], 10% -> a random token,
                      10% unchanged; predict the original token only at the chosen positions

The text pipeline (offline corpus, BPE tokenizer, batches) is `tformer.lm_data`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_rank, check_tokens

IGNORE = -100  # label of positions that carry no loss (F.cross_entropy's ignore_index)


def causal_lm_loss(logits: torch.Tensor, idx: torch.Tensor | None = None, *, targets: torch.Tensor | None = None,
                   ignore_index: int = IGNORE, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: the one LM loss of the package (training loops, timing, Trainer losses).

    logits (B, T, V) from the model on idx (B, T): position t predicts idx[:, t+1], so the last position has
    no target and the first token is never predicted. Or pass `targets` (B, T) already shifted
    (targets[:, t] = the token after position t, as `lm_data.LMBatches` yields them): every position counts.
    Positions whose target is `ignore_index` carry no loss. reduction: "mean" or "sum" (as F.cross_entropy).
    """
    check_rank(logits, 3, "causal_lm_loss(logits)", "(B, T, V)")
    if (idx is None) == (targets is None):
        raise ValueError("causal_lm_loss: pass exactly one of idx (the model's input) or targets= (already shifted)")
    if idx is not None:
        check_tokens(idx, "causal_lm_loss(idx)")
        if logits.shape[:2] != idx.shape:
            raise ValueError(f"causal_lm_loss: logits {tuple(logits.shape)} and idx {tuple(idx.shape)} need the same (B, T)")
        logits, targets = logits[:, :-1], idx[:, 1:]
    elif logits.shape[:2] != targets.shape:
        raise ValueError(f"causal_lm_loss: logits {tuple(logits.shape)} and targets {tuple(targets.shape)} need the same (B, T)")
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), ignore_index=ignore_index, reduction=reduction)


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy at the masked positions only. logits (B, T, V); labels (B, T), IGNORE elsewhere."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def apply_mlm_masking(ids: torch.Tensor, u_select: torch.Tensor, u_action: torch.Tensor, random_ids: torch.Tensor,
                      mask_id: int, p: float = 0.15, special: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking rule with its randomness given as inputs (all (B, T)).

    A position is chosen when u_select < p (and it is not `special`). A chosen position becomes
    `mask_id` when u_action < 0.8, `random_ids` when 0.8 <= u_action < 0.9, and stays as it is otherwise.
    Returns (inputs (B, T), labels (B, T)): labels hold the original id at chosen positions, IGNORE elsewhere.
    """
    check_tokens(ids, "ids")
    chosen = u_select < p
    if special is not None:
        chosen = chosen & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    inputs = torch.where(chosen & (u_action < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(chosen & (u_action >= 0.8) & (u_action < 0.9), random_ids.to(ids.dtype), inputs)
    return inputs, labels


def mask_tokens(ids: torch.Tensor, vocab_size: int, mask_id: int, p: float = 0.15, special_ids: tuple[int, ...] = (),
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-LM inputs and labels for ids (B, T): draws the randomness and calls `apply_mlm_masking`.
    Tokens in `special_ids` ([CLS], [SEP], [PAD], ...) are never chosen."""
    check_tokens(ids, "ids")
    shape, dev = ids.shape, ids.device
    u_select = torch.rand(shape, generator=generator).to(dev)
    u_action = torch.rand(shape, generator=generator).to(dev)
    random_ids = torch.randint(0, vocab_size, shape, generator=generator).to(dev)
    special = torch.isin(ids, torch.tensor(list(special_ids), dtype=ids.dtype, device=dev)) if special_ids else None
    return apply_mlm_masking(ids, u_select, u_action, random_ids, mask_id, p, special)
