"""Chapter 14: a KV-cache step, speculative acceptance, int8 quantization, the admission rule."""
import math

import torch


def kv_step(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    t_q, t_k = q.shape[2], k_all.shape[2]
    scores = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
    visible = torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v_all, k_all, v_all


def accept(p, q, draft, u):
    k = draft.shape[0]
    n = 0
    while n < k and u[n] < p[n, draft[n]] / q[n, draft[n]]:
        n += 1
    if n == k:
        return torch.tensor(n), p[k]
    r = torch.clamp(p[n] - q[n], min=0)
    return torch.tensor(n), r / r.sum()


def int8(w):
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
    return torch.clamp(torch.round(w / scale[:, None]), -128, 127).to(torch.int8), scale


def admit(lengths, shared, n_free, block_size, watermark):
    admitted = 0
    for length, sh in zip(lengths, shared):
        held = math.ceil(length / block_size) - sh              # blocks its tokens take now
        opens = math.ceil((length + 1) / block_size) - sh       # ... and with its first new token
        if n_free - opens < watermark:
            break
        n_free -= held
        admitted += 1
    return admitted


SOLUTIONS = {"ch14.kv_step": kv_step, "ch14.accept": accept, "ch14.int8": int8, "ch14.admit": admit}
