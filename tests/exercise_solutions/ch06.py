"""Chapter 6: causal and padding masks."""
import torch


def causal_mask(t_q, t_k):
    return torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)


def causal_padding_mask(tok, pad_id):
    b, t = tok.shape
    return (causal_mask(t, t) & (tok != pad_id)[:, None, None, :]).expand(b, 1, t, t)


SOLUTIONS = {"ch06.causal_mask": causal_mask, "ch06.causal_padding_mask": causal_padding_mask}
