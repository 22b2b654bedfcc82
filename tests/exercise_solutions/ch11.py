"""Chapter 11: BPE, language-model objectives, nucleus filtering, SFT, LoRA, DPO and GRPO."""
import torch


def causal_lm_loss(logits, idx):
    lp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return -lp.gather(-1, idx[:, 1:, None]).mean().to(logits.dtype)


def mlm_masking(ids, u_select, u_action, random_ids, mask_id, p=0.15, special=None):
    chosen = u_select < p
    if special is not None:
        chosen &= ~special
    labels = ids.clone()
    labels[~chosen] = -100
    inputs = ids.clone()
    inputs[chosen & (u_action < 0.8)] = mask_id
    rnd = chosen & (u_action >= 0.8) & (u_action < 0.9)
    inputs[rnd] = random_ids[rnd]
    return inputs, labels


SOLUTIONS = {"ch11.causal_lm_loss": causal_lm_loss, "ch11.mlm_masking": mlm_masking}


def bpe_merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if ids[i:i + 2] == list(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def top_p_filter(logits, p):
    probs = torch.softmax(logits.double(), -1)
    out = logits.clone()
    for b in range(logits.shape[0]):
        mass = 0.0
        for v in probs[b].argsort(descending=True).tolist():
            if mass >= p:
                out[b, v] = float("-inf")
            mass += probs[b, v].item()
    return out


def sft_loss(logits, targets, loss_mask):
    lp = torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None])[..., 0]
    return (-(lp[loss_mask]).mean()).to(logits.dtype)


def lora_forward(x, weight, bias, A, B, alpha):
    w = weight.double() + (alpha / A.shape[0]) * (B.double() @ A.double())
    y = x.double() @ w.T
    return (y if bias is None else y + bias.double()).to(x.dtype)


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    z = beta * ((policy_chosen.double() - ref_chosen.double()) - (policy_rejected.double() - ref_rejected.double()))
    return torch.nn.functional.softplus(-z).mean().to(policy_chosen.dtype)      # -log sigmoid(z) = softplus(-z)


SOLUTIONS.update({"ch11.bpe_merge": bpe_merge, "ch11.top_p_filter": top_p_filter, "ch11.sft_loss": sft_loss,
                  "ch11.lora_forward": lora_forward, "ch11.dpo_loss": dpo_loss})


def group_advantages(rewards):
    r = rewards.double()
    out = torch.zeros_like(r)
    g = r.shape[1]
    if g > 1:
        for b in range(r.shape[0]):
            m = sum(r[b].tolist()) / g
            sd = (sum((x - m) ** 2 for x in r[b].tolist()) / (g - 1)) ** 0.5
            out[b] = (r[b] - m) / (sd + 1e-4)
    return out.to(rewards.dtype)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, eps, beta):
    lp, old, ref = logp.double(), old_logp.double(), ref_logp.double()
    total = torch.zeros((), dtype=torch.float64)
    n = 0
    for b in range(lp.shape[0]):
        for i in range(lp.shape[1]):
            keep = mask[b, i]
            if keep.any():
                rho = torch.exp(lp[b, i][keep] - old[b, i][keep])
                a = advantages[b, i].double()
                surrogate = torch.minimum(rho * a, torch.clamp(rho, 1 - eps, 1 + eps) * a)
                log_r = ref[b, i][keep] - lp[b, i][keep]
                total = total + (surrogate - beta * (torch.exp(log_r) - log_r - 1)).mean()
            n += 1
    return (-total / n).to(logp.dtype)


SOLUTIONS.update({"ch11.group_advantages": group_advantages, "ch11.grpo_loss": grpo_loss})
