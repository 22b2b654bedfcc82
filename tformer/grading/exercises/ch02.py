"""Chapter 2: self-attention and cross-attention from the projection matrices W_q, W_k, W_v."""
import math

import torch

from ... import attention
from ...attention import scaled_dot_product_attention
from ..core import Case, Exercise, register
from ..questions import Question

# Weights are (d_model, d_k) matrices used as x @ W (the paper's notation), not nn.Linear's (out, in).


def _weights(g: torch.Generator, d_model: int, d_k: int, d_v: int):
    s = d_model ** -0.5
    return (torch.randn(d_model, d_k, generator=g) * s, torch.randn(d_model, d_k, generator=g) * s,
            torch.randn(d_model, d_v, generator=g) * s)


def _self_case(name: str, seed: int, b: int, t: int, d_model: int, d_k: int, d_v: int, random: bool = False) -> Case:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, d_model, generator=g)
    return Case(name, (x, *_weights(g, d_model, d_k, d_v)), seed=seed if random else None)


def _self_edge_cases() -> list[Case]:
    x, wq, wk, wv = _self_case("", 11, 2, 5, 6, 4, 3).args
    return [
        _self_case("length 1", 10, 1, 1, 4, 4, 4),
        _self_case("batch of 1, d_k != d_model", 12, 1, 3, 8, 2, 8),
        _self_case("d_v != d_k", 11, 2, 5, 6, 4, 3),
        Case("non-contiguous input", (x.transpose(0, 1).contiguous().transpose(0, 1), wq, wk, wv)),
    ]


def _self_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(3000 + seed)
    b, t, d_model, d_k, d_v = (int(torch.randint(1, n, (1,), generator=g)) for n in (4, 9, 17, 9, 9))
    return _self_case(f"random #{seed}: B={b} T={t} d_model={d_model} d_k={d_k} d_v={d_v}", 3000 + seed,
                      b, t, d_model, d_k, d_v, random=True)


def self_attention_reference(x, w_q, w_k, w_v):
    """x (B, T, d_model) -> (B, T, d_v): queries, keys and values all come from x."""
    return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)[0]


def _softmax_attend(q, k, v, scale):
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def _self_no_scale(x, w_q, w_k, w_v):
    return _softmax_attend(x @ w_q, x @ w_k, x @ w_v, 1.0)


def _self_scale_d_model(x, w_q, w_k, w_v):
    return _softmax_attend(x @ w_q, x @ w_k, x @ w_v, 1 / math.sqrt(x.shape[-1]))


def _self_wrong_axis(x, w_q, w_k, w_v):
    q, k = x @ w_q, x @ w_k
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2) @ (x @ w_v)



FORBIDDEN = [(attention, "scaled_dot_product_attention"), (attention, "fast_attention"),
              (torch.nn.functional, "scaled_dot_product_attention"),
              (torch.nn.functional, "multi_head_attention_forward"), (torch.nn.MultiheadAttention, "forward"),
              (attention.MultiHeadAttention, "forward")]

register(Exercise(
    name="ch02.self_attention",
    title="self-attention from W_q, W_k, W_v -> (B, T, d_v)",
    reference=self_attention_reference,
    edge_cases=_self_edge_cases,
    random_case=_self_random_case,
    points=2,
    hint="the four steps: Q, K, V = x W_q, x W_k, x W_v; scores = Q K^T; divide by sqrt(d_k) (the key size, "
         "not d_model) and softmax over the keys (last axis); weighted sum of V.",
    mistakes={"missing 1/sqrt(d_k) scale": _self_no_scale,
              "scaled by 1/sqrt(d_model) instead of 1/sqrt(d_k)": _self_scale_d_model,
              "softmax over the wrong axis (queries instead of keys)": _self_wrong_axis},
    forbidden=FORBIDDEN,
))


# --- cross-attention -----------------------------------------------------------------------------------

def _cross_case(name: str, seed: int, b: int, t_q: int, t_k: int, d_model: int, d_k: int, d_v: int,
                random: bool = False) -> Case:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t_q, d_model, generator=g)
    ctx = torch.randn(b, t_k, d_model, generator=g)
    return Case(name, (x, ctx, *_weights(g, d_model, d_k, d_v)), seed=seed if random else None)


def _cross_edge_cases() -> list[Case]:
    return [
        _cross_case("one query, one context token", 20, 1, 1, 1, 4, 4, 4),
        _cross_case("one query, 4 context tokens", 21, 1, 1, 4, 4, 4, 4),
        _cross_case("T_q=3 > T_k=2", 22, 2, 3, 2, 6, 4, 5),
        _cross_case("T_q=2 < T_k=6", 23, 2, 2, 6, 6, 4, 5),
    ]


def _cross_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(4000 + seed)
    b, t_q, t_k, d_model, d_k, d_v = (int(torch.randint(1, n, (1,), generator=g)) for n in (4, 9, 9, 17, 9, 9))
    return _cross_case(f"random #{seed}: B={b} T_q={t_q} T_k={t_k} d_model={d_model} d_k={d_k} d_v={d_v}",
                       4000 + seed, b, t_q, t_k, d_model, d_k, d_v, random=True)


def cross_attention_reference(x, context, w_q, w_k, w_v):
    """x (B, T_q, d_model) asks, context (B, T_k, d_model) answers -> (B, T_q, d_v)."""
    return scaled_dot_product_attention(x @ w_q, context @ w_k, context @ w_v)[0]


def _cross_self(x, context, w_q, w_k, w_v):
    return _softmax_attend(x @ w_q, x @ w_k, x @ w_v, 1 / math.sqrt(w_q.shape[-1]))


def _cross_no_scale(x, context, w_q, w_k, w_v):
    return _softmax_attend(x @ w_q, context @ w_k, context @ w_v, 1.0)


register(Exercise(
    name="ch02.cross_attention",
    title="cross-attention: queries from x, keys and values from context",
    reference=cross_attention_reference,
    edge_cases=_cross_edge_cases,
    random_case=_cross_random_case,
    points=1,
    hint="Q = x W_q; K = context W_k; V = context W_v. The output has one row per query (T_q rows).",
    mistakes={"self-attention instead (keys and values taken from x, not context)": _cross_self,
              "missing 1/sqrt(d_k) scale": _cross_no_scale},
    forbidden=FORBIDDEN,
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch02.q_cross_weights",
    title="the shape of cross-attention's weights: 7 queries, a context of 11",
    kind="choice", answer="C", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "7 x 7 is self-attention's: in cross-attention the keys come from the context, 11 of them": "A",
        "the rows are the queries, and they come from x (7 positions), not from the context": "B",
        "rows and columns swapped: one row per query (from x), one column per key (from the context)": "D",
    },
))

register(Question(
    name="ch02.q_path_length",
    title="the maximum path length between two positions: one self-attention layer, an RNN",
    kind="choice", answer="A", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "attention does not pass information through the positions in between: every query reads every key "
        "directly, in one step": "B",
        "O(log n) is a stack of dilated convolutions (a tree); one attention layer links every pair in one step": "C",
        "an RNN carries x_i through every step between i and the output: its path grows with the distance": "D",
    },
))
