"""Chapter 11: BPE's merge step, the causal language-model loss (GPT) and BERT's masked-LM masking rule
(notebook 11_llms); nucleus filtering, the prompt-masked SFT loss and LoRA's forward (notebook
11_fine_tuning); DPO's loss, GRPO's group-relative advantage and its clipped loss with the KL term
(notebook 11_preference_rl)."""
import torch
import torch.nn.functional as F

from ...data import bpe
from ... import sampling as decode
from ...training import dpo, grpo, lora, sft
from ...data import text
from ...training import losses
from ...data.text import IGNORE
from ...training.losses import causal_lm_loss
from ...data.text import apply_mlm_masking
from ..core import Case, Exercise, register
from ..questions import Question

# --- BPE: one merge ---------------------------------------------------------------------------------


def _bpe_edge_cases() -> list[Case]:
    return [
        Case("empty list", ([], (1, 2), 9)),
        Case("one token", ([1], (1, 2), 9)),
        Case("pair not present (2 1 is not 1 2)", ([2, 1, 3], (1, 2), 9)),
        Case("two occurrences", ([1, 2, 3, 1, 2], (1, 2), 9)),
        Case("overlapping run 1 1 1: left to right, non-overlapping", ([1, 1, 1], (1, 1), 9)),
        Case("run of four 1 1 1 1", ([5, 1, 1, 1, 1, 5], (1, 1), 9)),
        Case("pair at the very end", ([3, 4, 1, 2], (1, 2), 7)),
    ]


def _bpe_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(10000 + seed)
    n = int(torch.randint(2, 40, (1,), generator=g))
    ids = torch.randint(0, 4 if seed % 2 else 10, (n,), generator=g).tolist()   # small alphabets: runs and repeats
    j = int(torch.randint(0, n - 1, (1,), generator=g))
    return Case(f"random #{seed}: {n} ids", (ids, (ids[j], ids[j + 1]), 100 + seed), seed=10000 + seed)


def _bpe_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == tuple(pair):
            return ids[:i] + [new_id] + ids[i + 2:]
    return list(ids)


def _bpe_right_to_left(ids, pair, new_id):
    out, i = [], len(ids) - 1
    while i >= 0:
        if i > 0 and (ids[i - 1], ids[i]) == tuple(pair):
            out.append(new_id)
            i -= 2
        else:
            out.append(ids[i])
            i -= 1
    return out[::-1]


register(Exercise(
    name="ch11.bpe_merge",
    title="one BPE merge: (ids: list[int], pair, new_id) -> list[int]",
    reference=bpe.merge,
    edge_cases=_bpe_edge_cases,
    random_case=_bpe_random_case,
    points=2,
    hint="walk i from the left: if ids[i], ids[i+1] equal the pair, append new_id and jump i += 2, else append ids[i] "
         "and i += 1. Return a new list (1 1 1 with pair (1, 1) gives [new_id, 1]).",
    mistakes={"only the first occurrence replaced": _bpe_first_only,
              "merged right to left (1 1 1 -> 1 new_id)": _bpe_right_to_left},
    forbidden=[(bpe, "merge")],
    notebook="11_llms",
))

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
    forbidden=[(losses, "causal_lm_loss")],
    notebook="11_llms",
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
    forbidden=[(text, "apply_mlm_masking"), (text, "mask_tokens")],
    notebook="11_llms",
))

# --- fine-tuning (notebook 11_fine_tuning) ---------------------------------------------------------------
# --- top-p (nucleus) filtering -------------------------------------------------------------------------


def _top_p_case(name, seed, b, v, p, scale=2.0, random=False) -> Case:
    """Logits whose probabilities have no near-ties and whose sorted cumulative sums stay 1e-6 away from p
    (so the kept set is unique); resampled from the next seed until they do."""
    for k in range(100):
        g = torch.Generator().manual_seed(seed * 100 + k)
        logits = torch.randn(b, v, generator=g) * scale
        probs = logits.double().softmax(-1).sort(-1, descending=True).values
        near_cut = (probs.cumsum(-1) - probs)[:, 1:] < p + 1e-3                 # pairs where a tie could move the cut
        gaps = (probs[:, :-1] - probs[:, 1:])[near_cut]
        if (gaps.numel() == 0 or gaps.min() > 1e-6) and ((probs.cumsum(-1) - p).abs().min() > 1e-6 or p == 1.0):
            return Case(name, (logits, p), seed=seed if random else None)
    raise RuntimeError(f"no tie-free logits for seed {seed}")


def _top_p_edge_cases() -> list[Case]:
    return [
        _top_p_case("one row, V=4, p=0.5", 1, 1, 4, 0.5),
        _top_p_case("p tiny (0.01): only the top token survives", 2, 2, 6, 0.01),
        _top_p_case("p = 1.0: every token kept", 3, 2, 6, 1.0),
        Case("peaked row: the top token alone has > p", (torch.tensor([[8.0, 1.0, 0.0, -1.0], [0.3, 0.2, 0.1, 0.0]]), 0.6)),
        _top_p_case("flat-ish logits (x 0.3): most tokens needed", 4, 3, 10, 0.9, scale=0.3),
    ]


def _top_p_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(13000 + seed)
    b, v = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(2, 60, (1,), generator=g))
    p = [0.3, 0.5, 0.8, 0.9, 0.95][seed % 5]
    return _top_p_case(f"random #{seed}: B={b} V={v} p={p}", 13000 + seed, b, v, p, random=True)


def _nucleus(logits, p, *, keep_crossing=True, sorted_order=False, dim=-1):
    probs, order = logits.softmax(dim).sort(-1, descending=True)
    cum = probs.cumsum(-1)
    drop = (cum - probs >= p) if keep_crossing else (cum > p)
    drop[..., 0] = False
    if not sorted_order:
        drop = drop.scatter(-1, order, drop)
    return logits.masked_fill(drop, float("-inf"))


def _top_p_drops_crossing(logits, p):
    return _nucleus(logits, p, keep_crossing=False)


def _top_p_sorted_mask(logits, p):
    return _nucleus(logits, p, sorted_order=True)


def _top_p_batch_softmax(logits, p):
    return _nucleus(logits, p, dim=0)


register(Exercise(
    name="ch11.top_p_filter",
    title="nucleus filtering: logits (B, V), p -> logits with -inf outside the top-p set",
    reference=decode.top_p_filter,
    edge_cases=_top_p_edge_cases,
    random_case=_top_p_random_case,
    points=2,
    hint="probs = softmax(logits); sort them descending (keep the order); a token is dropped when the mass of the "
         "tokens ranked above it is already >= p (cumsum - probs >= p); scatter that mask back to vocabulary order and "
         "masked_fill it with float('-inf'). The top token is always kept.",
    mistakes={"dropped the token that crosses p (kept only cumsum <= p)": _top_p_drops_crossing,
              "mask left in sorted order (not scattered back to the vocabulary)": _top_p_sorted_mask,
              "softmax over the batch dimension": _top_p_batch_softmax},
    forbidden=[(decode, "top_p_filter"), (decode, "sample_next")],
    notebook="11_fine_tuning",
))

# --- the SFT loss: cross-entropy on the answer's tokens only -------------------------------------------


def _sft_case(name, seed, b, t, v, density=0.5, random=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g) * 2
    targets = torch.randint(0, v, (b, t), generator=g)
    mask = torch.rand(b, t, generator=g) < density
    mask[0, -1] = True                                                 # at least one position counts
    return Case(name, (logits, targets, mask), seed=seed if random else None)


def _sft_edge_cases() -> list[Case]:
    logits, targets, _ = _sft_case("", 31, 2, 5, 7).args
    prompt_then_answer = torch.tensor([[False, False, False, True, True], [False, True, True, True, True]])
    return [
        _sft_case("one position counts (B=1, T=1)", 30, 1, 1, 5, density=1.0),
        Case("prompt then answer (3 and 1 prompt tokens)", (logits, targets, prompt_then_answer)),
        Case("mask all True: plain cross-entropy", (logits, targets, torch.ones(2, 5, dtype=torch.bool))),
        Case("confident model (logits x 20)", (logits * 20, targets, prompt_then_answer)),
    ]


def _sft_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(14000 + seed)
    b, t, v = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 5), (1, 17), (2, 40)))
    return _sft_case(f"random #{seed}: B={b} T={t} V={v}", 14000 + seed, b, t, v, density=0.3 + 0.1 * (seed % 5),
                     random=True)


def _ce_all(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


def _sft_mean_over_all(logits, targets, loss_mask):
    return (_ce_all(logits, targets) * loss_mask).mean()


def _sft_inverted_mask(logits, targets, loss_mask):
    m = ~loss_mask
    return (_ce_all(logits, targets) * m).sum() / m.sum().clamp(min=1)


def _sft_shifted(logits, targets, loss_mask):
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), targets[:, 1:].flatten(), reduction="none")
    m = loss_mask[:, 1:].flatten()
    return (ce * m).sum() / m.sum().clamp(min=1)


def _sft_sum(logits, targets, loss_mask):
    return (_ce_all(logits, targets) * loss_mask).sum()


register(Exercise(
    name="ch11.sft_loss",
    title="prompt-masked loss: logits (B, T, V), targets (B, T), loss_mask (B, T) -> scalar",
    reference=sft.sft_loss,
    edge_cases=_sft_edge_cases,
    random_case=_sft_random_case,
    points=2,
    hint="targets are already aligned with logits (no shift). Per-position cross-entropy (F.cross_entropy with "
         "reduction='none'), then the mean over the positions where loss_mask is True: sum(ce * mask) / mask.sum(). "
         "Or set targets to -100 where the mask is False and let F.cross_entropy ignore them.",
    mistakes={"averaged over every position (masked ones counted as 0)": _sft_mean_over_all,
              "mask inverted (loss on the prompt, not the answer)": _sft_inverted_mask,
              "shifted by one again (targets are already aligned)": _sft_shifted,
              "summed instead of averaged": _sft_sum},
    forbidden=[(sft, "sft_loss")],
    notebook="11_fine_tuning",
))

# --- LoRA: the adapted linear layer --------------------------------------------------------------------


def _lora_case(name, seed, shape, d_in, d_out, r, alpha, bias=True, zero_b=False, random=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, d_in, generator=g)
    w = torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
    b = torch.randn(d_out, generator=g) if bias else None
    A = torch.randn(r, d_in, generator=g) / d_in ** 0.5
    B = torch.zeros(d_out, r) if zero_b else torch.randn(d_out, r, generator=g)
    return Case(name, (x, w, b, A, B, alpha), seed=seed if random else None)


def _lora_edge_cases() -> list[Case]:
    return [
        _lora_case("rank 1, one token", 40, (1,), 3, 2, 1, 1.0),
        _lora_case("bias is None", 41, (2,), 4, 3, 2, 4.0, bias=False),
        _lora_case("B = 0 (a fresh adapter): just the linear layer", 42, (2,), 4, 3, 2, 8.0, zero_b=True),
        _lora_case("(B, T, in) input, alpha != r", 43, (2, 3), 6, 5, 4, 16.0),
    ]


def _lora_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(15000 + seed)
    d_in, d_out, r = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((2, 24), (1, 24), (1, 6)))
    alpha = [1.0, 8.0, 16.0, 32.0][seed % 4]
    return _lora_case(f"random #{seed}: in={d_in} out={d_out} r={r} alpha={alpha}", 15000 + seed, (2, 3), d_in, d_out,
                      r, alpha, bias=bool(seed % 3), random=True)


def _lin(x, weight, bias):
    return F.linear(x, weight, bias)


def _lora_alpha_not_over_r(x, weight, bias, A, B, alpha):
    return _lin(x, weight, bias) + alpha * (x @ A.T) @ B.T


def _lora_unscaled(x, weight, bias, A, B, alpha):
    return _lin(x, weight, bias) + (x @ A.T) @ B.T


def _lora_scaled_everything(x, weight, bias, A, B, alpha):
    return (alpha / A.shape[0]) * (_lin(x, weight, bias) + (x @ A.T) @ B.T)


register(Exercise(
    name="ch11.lora_forward",
    title="LoRA: x W^T + b + (alpha / r) x A^T B^T, with A (r, in), B (out, r), bias may be None",
    reference=lora.lora_forward,
    edge_cases=_lora_edge_cases,
    random_case=_lora_random_case,
    points=2,
    hint="r = A.shape[0]; F.linear(x, weight, bias) + (alpha / r) * F.linear(F.linear(x, A), B). Multiplying "
         "x by A first keeps the cost at r * (in + out) per token instead of forming the (out, in) matrix B A.",
    mistakes={"scaled by alpha instead of alpha / r": _lora_alpha_not_over_r,
              "no alpha / r scaling": _lora_unscaled,
              "the whole output scaled by alpha / r (only the update is)": _lora_scaled_everything},
    forbidden=[(lora, "lora_forward")],
    notebook="11_fine_tuning",
))

# --- DPO's loss ------------------------------------------------------------------------------------------


def _dpo_case(name, seed, b, beta, scale=5.0, random=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    pc, pr, rc, rr = (-(torch.rand(b, generator=g) * scale * 4) for _ in range(4))   # log-probs are <= 0
    return Case(name, (pc, pr, rc, rr, beta), seed=seed if random else None)


def _dpo_edge_cases() -> list[Case]:
    pc, pr, rc, rr, _ = _dpo_case("", 51, 3, 0.1).args
    return [
        _dpo_case("one pair", 50, 1, 0.1),
        Case("policy == reference: log 2", (pc, pr, pc.clone(), pr.clone(), 0.1)),
        Case("chosen and rejected swapped vs the previous case", (pr, pc, rr, rc, 0.5)),
        Case("large margins (beta * margin = -300: needs a stable log-sigmoid)",
             (torch.tensor([-1000.0, -10.0]), torch.tensor([-10.0, -1000.0]), torch.tensor([-10.0, -10.0]),
              torch.tensor([-10.0, -10.0]), 0.3)),
    ]


def _dpo_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(16000 + seed)
    b = int(torch.randint(1, 9, (1,), generator=g))
    beta = [0.05, 0.1, 0.3, 1.0][seed % 4]
    return _dpo_case(f"random #{seed}: B={b} beta={beta}", 16000 + seed, b, beta, random=True)


def _margin(pc, pr, rc, rr):
    return (pc - rc) - (pr - rr)


def _dpo_no_log(pc, pr, rc, rr, beta):
    return -torch.sigmoid(beta * _margin(pc, pr, rc, rr)).mean()


def _dpo_no_beta(pc, pr, rc, rr, beta):
    return -F.logsigmoid(_margin(pc, pr, rc, rr)).mean()


def _dpo_reference_added(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pc + rc) - (pr + rr))).mean()


def _dpo_swapped(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * _margin(pr, pc, rr, rc)).mean()


def _dpo_sum(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * _margin(pc, pr, rc, rr)).sum()


register(Exercise(
    name="ch11.dpo_loss",
    title="DPO: (policy_chosen, policy_rejected, ref_chosen, ref_rejected (B,), beta) -> scalar",
    reference=dpo.dpo_loss,
    edge_cases=_dpo_edge_cases,
    random_case=_dpo_random_case,
    points=2,
    hint="margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected); loss = the mean of "
         "-F.logsigmoid(beta * margin). F.logsigmoid stays finite where log(sigmoid(.)) underflows to log 0.",
    mistakes={"sigmoid without the log": _dpo_no_log,
              "beta left out": _dpo_no_beta,
              "reference log-probs added instead of subtracted": _dpo_reference_added,
              "chosen and rejected swapped": _dpo_swapped,
              "summed instead of averaged": _dpo_sum},
    forbidden=[(dpo, "dpo_loss")],
    notebook="11_preference_rl",
))


# --- GRPO: the group-relative advantage ------------------------------------------------------------------


def _adv_case(name, seed, b, g, binary=True, random=False) -> Case:
    gen = torch.Generator().manual_seed(seed)
    r = (torch.rand(b, g, generator=gen) < 0.4).float() if binary else torch.randn(b, g, generator=gen)
    return Case(name, (r,), seed=seed if random else None)


def _adv_edge_cases() -> list[Case]:
    return [
        Case("every reward in a group equal (all right, all wrong): 0, not 0/0",
             (torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]),)),
        Case("groups of one answer: 0", (torch.tensor([[1.0], [0.0], [1.0]]),)),
        Case("one right answer in a group of four", (torch.tensor([[0.0, 1.0, 0.0, 0.0]]),)),
        Case("two groups of different success rates (per group, not per batch)",
             (torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]),)),
        _adv_case("real-valued rewards, B=3 G=5", 61, 3, 5, binary=False),
    ]


def _adv_random_case(seed: int) -> Case:
    gen = torch.Generator().manual_seed(17000 + seed)
    b, g = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(2, 12, (1,), generator=gen))
    return _adv_case(f"random #{seed}: B={b} G={g}", 17000 + seed, b, g, binary=bool(seed % 2), random=True)


def _adv_over_batch(r):
    return (r - r.mean()) / (r.std() + 1e-4) if r.numel() > 1 else torch.zeros_like(r)


def _adv_population_std(r):
    return (r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + 1e-4)


def _adv_no_std(r):
    return r - r.mean(1, keepdim=True)


def _adv_no_eps(r):
    if r.shape[1] < 2:
        return torch.zeros_like(r)
    return (r - r.mean(1, keepdim=True)) / r.std(1, keepdim=True)


register(Exercise(
    name="ch11.group_advantages",
    title="GRPO's advantage: rewards (B, G) -> (r - group mean) / (group std + 1e-4), 0 for a group of one",
    reference=grpo.group_advantages,
    edge_cases=_adv_edge_cases,
    random_case=_adv_random_case,
    points=2,
    hint="Each row is one prompt's group. mean and std over dim 1 (keepdim=True), torch.std's default (unbiased, "
         "divide by G - 1); add 1e-4 to the std so an all-equal group gives 0 / 1e-4 = 0. With G = 1 there is "
         "nothing to compare with (and the unbiased std is NaN): return zeros.",
    mistakes={"normalised over the whole batch instead of each group": _adv_over_batch,
              "population std (divide by G, not torch.std's G - 1)": _adv_population_std,
              "no division by the std (Dr. GRPO's variant, not DeepSeekMath's)": _adv_no_std,
              "no 1e-4: an all-equal group gives 0 / 0": _adv_no_eps},
    forbidden=[(grpo, "group_advantages")],
    notebook="11_preference_rl",
))

# --- GRPO: the clipped objective with the KL term --------------------------------------------------------


def _grpo_case(name, seed, b, g, t, eps=0.2, beta=0.04, density=0.7, spread=0.6, random=False) -> Case:
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, g, t, generator=gen) * 3
    old = logp + (torch.rand(b, g, t, generator=gen) - 0.5) * spread
    ref = logp + (torch.rand(b, g, t, generator=gen) - 0.5) * spread
    adv = torch.randn(b, g, generator=gen)
    mask = torch.rand(b, g, t, generator=gen) < density
    mask[..., 0] = True
    return Case(name, (logp, old, ref, adv, mask, eps, beta), seed=seed if random else None)


def _grpo_edge_cases() -> list[Case]:
    logp, old, ref, adv, mask, _, _ = _grpo_case("", 71, 2, 3, 5).args
    right_padded = torch.arange(5).expand(2, 3, 5) < torch.tensor([[1, 3, 5], [2, 4, 5]])[..., None]
    return [
        Case("policy == old == reference: loss 0", (logp, logp.clone(), logp.clone(), adv, mask, 0.2, 0.04)),
        Case("answers of different lengths (right padding masked out)", (logp, old, ref, adv, right_padded, 0.2, 0.04)),
        Case("ratios far outside [0.8, 1.2]: the clip decides", (logp, logp + 1.0, ref, adv, mask, 0.2, 0.04)),
        Case("all advantages 0 (an all-equal group): only the KL term", (logp, old, ref, torch.zeros(2, 3), mask, 0.2, 0.5)),
        _grpo_case("a group of one answer (G=1)", 72, 3, 1, 4),
        Case("beta 0: the clipped ratio objective alone", (logp, old, ref, adv, mask, 0.2, 0.0)),
    ]


def _grpo_random_case(seed: int) -> Case:
    gen = torch.Generator().manual_seed(18000 + seed)
    b, g, t = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 4), (1, 9), (1, 12)))
    return _grpo_case(f"random #{seed}: B={b} G={g} T={t}", 18000 + seed, b, g, t, eps=[0.1, 0.2, 0.3][seed % 3],
                      beta=[0.0, 0.04, 0.1][seed % 3], random=True)


def _objective(logp, old, ref, adv, eps):
    ratio = torch.exp(logp - old)
    a = adv[..., None]
    return torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)


def _k3(logp, ref):
    return torch.exp(ref - logp) - (ref - logp) - 1


def _answer_mean(x, mask):
    m = mask.to(x.dtype)
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1)


def _grpo_no_mask(logp, old, ref, adv, mask, eps, beta):
    return -(_objective(logp, old, ref, adv, eps) - beta * _k3(logp, ref)).mean()


def _grpo_kl_sign(logp, old, ref, adv, mask, eps, beta):
    return -_answer_mean(_objective(logp, old, ref, adv, eps) + beta * _k3(logp, ref), mask).mean()


def _grpo_no_clip(logp, old, ref, adv, mask, eps, beta):
    return -_answer_mean(torch.exp(logp - old) * adv[..., None] - beta * _k3(logp, ref), mask).mean()


def _grpo_token_level(logp, old, ref, adv, mask, eps, beta):
    m = mask.to(logp.dtype)
    return -((_objective(logp, old, ref, adv, eps) - beta * _k3(logp, ref)) * m).sum() / m.sum()


def _grpo_not_negated(logp, old, ref, adv, mask, eps, beta):
    return _answer_mean(_objective(logp, old, ref, adv, eps) - beta * _k3(logp, ref), mask).mean()


register(Exercise(
    name="ch11.grpo_loss",
    title="GRPO's loss: logp, old_logp, ref_logp (B, G, T), advantages (B, G), mask (B, G, T), eps, beta -> scalar",
    reference=grpo.grpo_loss,
    edge_cases=_grpo_edge_cases,
    random_case=_grpo_random_case,
    points=3,
    hint="ratio = exp(logp - old_logp); per token min(ratio * A, clamp(ratio, 1 - eps, 1 + eps) * A) with A = "
         "advantages[..., None]; minus beta * k3, k3 = exp(ref - logp) - (ref - logp) - 1. Average each answer "
         "over ITS masked tokens (sum(x * mask, -1) / mask.sum(-1)), then the mean over answers; the loss is the "
         "negative of that objective.",
    mistakes={"answer mask forgotten (padding tokens counted)": _grpo_no_mask,
              "KL sign flipped (the penalty rewarded)": _grpo_kl_sign,
              "no clipping of the ratio": _grpo_no_clip,
              "token-level average over the batch (DAPO's, not per answer)": _grpo_token_level,
              "objective returned, not its negative (a loss to minimise)": _grpo_not_negated},
    forbidden=[(grpo, "grpo_loss"), (grpo, "k3_kl")],
    notebook="11_preference_rl",
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch11.q_uniform_loss",
    title="the loss per token of a uniform guess over V tokens",
    kind="expr", answer="log(V)", symbols=("V",), points=1, notebook="11_llms",
    mistakes={
        "1/V is the probability a uniform guess gives the right token; the loss is its negative logarithm": "1/V",
        "V is the perplexity of a uniform guess, e^loss: the loss is its logarithm": "V",
        "the natural logarithm, as the cross-entropy uses: log(V) nats, not log(V) / log(2) bits": "log(V)/log(2)",
    },
    hint="the cross-entropy of one token is -log p(right token), and a uniform guess gives every token 1/V.",
))

register(Question(
    name="ch11.q_bert_vs_gpt",
    title="which model reads the words after a position, and which can generate left to right",
    kind="choice", answer="C", choices=("A", "B", "C", "D"), points=1, notebook="11_llms",
    mistakes={
        "GPT's causal mask is part of the model: position t never sees anything after t, which is why "
        "causal_lm_loss(model(w), w) equals the loss on x alone (section 3)": "B",
        "BERT predicts a gap from both sides; to write left to right it would need the words that are not written "
        "yet": "A",
        "the loss covers the whole window at once, but with the causal mask position t never sees anything after t "
        "(the check at the end of section 3)": "D",
    },
))

register(Question(
    name="ch11.q_repetition_loop",
    title="why greedy decoding with a mild repetition penalty still loops",
    kind="choice", answer="B", choices=("A", "B", "C", "D"), points=1, notebook="11_fine_tuning",
    mistakes={
        "the penalty reaches every token already in the context, the prompt's and the generated ones: "
        "apply_repetition_penalty reads idx, all the tokens so far": "A",
        "greedy decoding takes the argmax after the penalty (sample_next applies it first), which is why "
        "distinct-2 rises with theta in the table": "C",
        "that is CTRL's first rule, for a negative logit; the course's (Hugging Face's) multiplies a negative "
        "logit by theta, so a token already written always loses probability": "D",
    },
))

register(Question(
    name="ch11.q_sft_loss_tokens",
    title="which tokens of an SFT conversation carry loss",
    kind="choice", answer="D", choices=("A", "B", "C", "D"), points=1, notebook="11_fine_tuning",
    mistakes={
        "the prompt's labels are -100 (ignored): trained on the user's turns, the model would learn to write "
        "questions as well as answers": "A",
        "every assistant turn carries loss, the first one too; only the user's turns are masked": "C",
        "the mask is the other way round: the model is trained to write the answers, so the answers carry the "
        "loss and the prompt is only read": "B",
    },
))

register(Question(
    name="ch11.q_lora_fc1_share",
    title="the share of a (4d, d) weight's numbers that LoRA of rank r trains",
    kind="expr", answer="5*r/(4*d)", symbols=("r", "d"), points=1, notebook="11_fine_tuning",
    mistakes={
        "2r/d is the share of a square (d, d) matrix; fc1 has in = d and out = 4d, and the share is "
        "r(in + out) / (in * out)": "2*r/d",
        "A (r, d) and B (4d, r) both train: r/d counts B alone": "r/d",
        "A (r, d) and B (4d, r) both train: r/(4d) counts A alone": "r/(4*d)",
        "5rd is how many numbers the adapters hold; the share divides it by the 4d^2 numbers of the weight": "5*r*d",
    },
    hint="A is (r, in) and B is (out, r): the adapters hold r(in + out) numbers, the weight in * out.",
))

register(Question(
    name="ch11.q_grpo_lone_success",
    title="the advantage GRPO gives the one right answer of a group of G",
    kind="expr", answer="(G-1)/sqrt(G)", symbols=("G",), points=1, notebook="11_preference_rl",
    mistakes={
        "sqrt(G-1) divides by the population std (over G); torch.std, as group_advantages uses it, divides "
        "the squares by G - 1: the std is 1/sqrt(G)": "sqrt(G-1)",
        "1 - 1/G is the reward minus the group mean without the division by the std (Dr. GRPO's advantage); "
        "GRPO divides by the group's std, 1/sqrt(G) here": "1-1/G",
        "sqrt(G) divides the reward itself by the std; the advantage subtracts the group mean 1/G first": "sqrt(G)",
        "-1/sqrt(G) is the advantage of each wrong answer; the right one gets (1 - 1/G) / (1/sqrt(G))": "-1/sqrt(G)",
    },
    hint="The mean of the rewards is 1/G; torch.std (unbiased) of one 1 and G - 1 zeros is 1/sqrt(G).",
))

register(Question(
    name="ch11.q_rag",
    title="what makes the answer loss fall when the retrieved passage is in the prompt",
    kind="choice", answer="B", choices=("A", "B", "C", "D"), points=1, notebook="11_preference_rl",
    mistakes={
        "nothing trains in section 4: the same SFT model, frozen (torch.no_grad), answers both ways": "A",
        "TF-IDF only ranks the passages by their similarity to the question; the language model reads the "
        "passage and writes the answer, as SFT taught it to": "C",
        "the loss counts the answer's tokens only (the prompt's labels are ignored): the passage changes what "
        "the model predicts, not what is counted": "D",
    },
))
