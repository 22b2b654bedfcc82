"""Chapter 11: language-model objectives."""
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
