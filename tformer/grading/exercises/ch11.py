"""Chapter 11: the causal language-model loss (GPT) and BERT's masked-LM masking rule."""
import torch
import torch.nn.functional as F

from ... import lm
from ...lm import IGNORE, apply_mlm_masking, causal_lm_loss
from ..core import Case, Exercise, register

# --- causal LM loss ----------------------------------------------------------------------------------


def _lm_case(name, seed, b, t, v, random=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    return Case(name, (torch.randn(b, t, v, generator=g) * 2, torch.randint(0, v, (b, t), generator=g)),
                seed=seed if random else None)


def _lm_edge_cases() -> list[Case]:
    logits, idx = _lm_case("", 11, 2, 6, 7).args
    return [
        _lm_case("two tokens, vocabulary 3", 10, 1, 2, 3),
        _lm_case("batch of 3, T=5, V=11", 12, 3, 5, 11),
        Case("non-contiguous logits", (logits.transpose(0, 1).contiguous().transpose(0, 1), idx)),
        Case("confident model (logits x 20)", (logits * 20, idx)),
    ]


def _lm_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(11000 + seed)
    b, t, v = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 5), (2, 17), (2, 50)))
    return _lm_case(f"random #{seed}: B={b} T={t} V={v}", 11000 + seed, b, t, v, random=True)


def _ce(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _no_shift(logits, idx):
    return _ce(logits, idx)


def _shift_wrong_way(logits, idx):
    return _ce(logits[:, 1:], idx[:, :-1])


def _sum_not_mean(logits, idx):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1), reduction="sum")


register(Exercise(
    name="ch11.causal_lm_loss",
    title="next-token cross-entropy: logits (B, T, V), idx (B, T) -> scalar",
    reference=causal_lm_loss,
    edge_cases=_lm_edge_cases,
    random_case=_lm_random_case,
    points=2,
    hint="position t predicts token t+1: compare logits[:, :-1] with idx[:, 1:], flatten to (B*(T-1), V) and "
         "(B*(T-1),), and take the mean cross-entropy (F.cross_entropy is allowed).",
    mistakes={"no shift (each position predicts itself)": _no_shift,
              "shifted the wrong way (logits[:, 1:] vs idx[:, :-1])": _shift_wrong_way,
              "summed instead of averaged": _sum_not_mean},
    forbidden=[(lm, "causal_lm_loss")],
))

# --- MLM masking -------------------------------------------------------------------------------------


def _mlm_case(name, seed, b, t, v=50, p=0.15, with_special=False, random=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, v, (b, t), generator=g)
    special = None
    if with_special:
        ids[:, 0] = 1
        special = ids == 1
    args = (ids, torch.rand(b, t, generator=g), torch.rand(b, t, generator=g),
            torch.randint(0, v, (b, t), generator=g), 4)
    return Case(name, args, {"p": p, "special": special}, seed=seed if random else None)


def _mlm_edge_cases() -> list[Case]:
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    u_sel = torch.tensor([[0.01, 0.10, 0.149, 0.15, 0.9, 0.05]])
    u_act = torch.tensor([[0.0, 0.79, 0.8, 0.5, 0.5, 0.95]])  # boundaries: 0.8 is "random", 0.15 is not chosen
    rnd = torch.tensor([[7, 8, 9, 6, 5, 3]])
    return [
        Case("one row, every branch and the boundaries (u = 0.8, u_select = 0.15)", (ids, u_sel, u_act, rnd, 4)),
        _mlm_case("special tokens ([CLS] at position 0) are never chosen", 21, 3, 8, p=0.5, with_special=True),
        _mlm_case("p = 0: nothing chosen", 22, 2, 6, p=0.0),
        _mlm_case("p = 1: every token chosen", 23, 2, 6, p=1.0),
    ]


def _mlm_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(12000 + seed)
    b, t = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 33, (1,), generator=g))
    p = [0.15, 0.3, 0.5][seed % 3]
    return _mlm_case(f"random #{seed}: B={b} T={t} p={p}" + (" with specials" if seed % 2 else ""), 12000 + seed,
                     b, t, p=p, with_special=bool(seed % 2), random=True)


def _rule(ids, u_select, u_action, random_ids, mask_id, p, special, *, use_special=True, all_mask=False):
    """The masking rule written out again (not the reference), with switches for the known mistakes."""
    chosen = u_select < p
    if special is not None and use_special:
        chosen = chosen & ~special
    to_mask = chosen if all_mask else chosen & (u_action < 0.8)
    to_rand = chosen & (u_action >= 0.8) & (u_action < 0.9) & ~to_mask
    inputs = torch.where(to_rand, random_ids, torch.where(to_mask, torch.full_like(ids, mask_id), ids))
    return inputs, torch.where(chosen, ids, torch.full_like(ids, IGNORE))


def _labels_everywhere(ids, u_select, u_action, random_ids, mask_id, p=0.15, special=None):
    return _rule(ids, u_select, u_action, random_ids, mask_id, p, special)[0], ids.clone()


def _mask_all_chosen(ids, u_select, u_action, random_ids, mask_id, p=0.15, special=None):
    return _rule(ids, u_select, u_action, random_ids, mask_id, p, special, all_mask=True)


def _ignore_special(ids, u_select, u_action, random_ids, mask_id, p=0.15, special=None):
    return _rule(ids, u_select, u_action, random_ids, mask_id, p, special, use_special=False)


def _labels_from_inputs(ids, u_select, u_action, random_ids, mask_id, p=0.15, special=None):
    inputs, labels = _rule(ids, u_select, u_action, random_ids, mask_id, p, special)
    return inputs, torch.where(labels != IGNORE, inputs, labels)


register(Exercise(
    name="ch11.mlm_masking",
    title="BERT masking: (ids, u_select, u_action, random_ids, mask_id, p, special) -> (inputs, labels)",
    reference=apply_mlm_masking,
    edge_cases=_mlm_edge_cases,
    random_case=_mlm_random_case,
    points=2,
    hint="chosen = (u_select < p) & ~special; among chosen: u_action < 0.8 -> mask_id, 0.8 <= u_action < 0.9 -> "
         "random_ids, else unchanged. labels = the ORIGINAL id where chosen, -100 elsewhere (torch.where).",
    mistakes={"labels everywhere (loss on unmasked tokens too)": _labels_everywhere,
              "every chosen token replaced by [MASK] (no 10% random / 10% kept)": _mask_all_chosen,
              "special tokens were chosen": _ignore_special,
              "labels taken from the corrupted inputs instead of the original ids": _labels_from_inputs},
    forbidden=[(lm, "apply_mlm_masking"), (lm, "mask_tokens")],
))
