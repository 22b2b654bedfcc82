"""Chapter 13: the top-k router and the load-balancing loss."""
import torch


def top_k_router(logits, k, normalize=True):
    probs = torch.softmax(logits, dim=-1)
    gates, experts = torch.sort(probs, dim=-1, descending=True)       # a different route than topk
    gates, experts = gates[:, :k], experts[:, :k]
    if normalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates, experts


def balance_loss(probs, experts):
    n, e = probs.shape
    onehot = torch.nn.functional.one_hot(experts, e).to(probs.dtype)  # (N, k, E)
    f = onehot.sum(dim=(0, 1)) / experts.numel()
    return e * (f * probs.mean(dim=0)).sum()


SOLUTIONS = {"ch13.top_k_router": top_k_router, "ch13.balance_loss": balance_loss}
