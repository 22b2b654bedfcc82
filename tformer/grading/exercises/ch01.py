"""Chapter 1: a numerically stable softmax, and scaled dot-product attention."""
import math

import torch

from ... import attention
from ...attention import scaled_dot_product_attention
from ..core import Case, Exercise, register
from ..inputs import attention_edge_cases, attention_random_case
from ..questions import Question


def _masked(scores, mask):
    return scores if mask is None else scores.masked_fill(~mask, float("-inf"))


def _no_scale(q, k, v, mask=None):
    w = torch.softmax(_masked(q @ k.transpose(-2, -1), mask), -1)
    return w @ v, w


def _wrong_axis(q, k, v, mask=None):
    w = torch.softmax(_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask), -2)
    return w @ v, w


def _mask_after_softmax(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
    w = w if mask is None else w.masked_fill(~mask, 0.0)
    return w @ v, w


register(Exercise(
    name="ch01.attention",
    title="scaled dot-product attention -> (out, weights)",
    reference=scaled_dot_product_attention,
    edge_cases=attention_edge_cases,
    random_case=attention_random_case,
    points=3,
    hint="scores = q @ k^T / sqrt(d_k); set masked scores to -inf before a softmax over the last axis (keys); "
         "a row with every key masked must give zeros, not NaN.",
    mistakes={"missing 1/sqrt(d_k) scale": _no_scale, "softmax over the wrong axis (queries instead of keys)": _wrong_axis,
              "mask applied after the softmax (weights no longer sum to 1)": _mask_after_softmax},
    forbidden=[(attention, "scaled_dot_product_attention"), (torch.nn.functional, "scaled_dot_product_attention")],
))


# --- a numerically stable softmax --------------------------------------------------------------------

def _softmax_edge_cases() -> list[Case]:
    g = torch.Generator().manual_seed(7)
    return [
        Case("one element", (torch.tensor([3.0]),)),
        Case("all equal logits", (torch.zeros(2, 4),)),
        Case("large logits (naive exp overflows)", (torch.tensor([[1000.0, 999.0, 998.0], [-5.0, 0.0, 5.0]]),)),
        Case("-inf entries (masked keys)", (torch.tensor([[0.0, float("-inf"), 1.0], [2.0, 2.0, float("-inf")]]),)),
        Case("non-contiguous input", (torch.randn(5, 3, generator=g).t(),)),
    ]


def _softmax_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(2000 + seed)
    shape = tuple(int(torch.randint(1, 7, (1,), generator=g)) for _ in range(1 + seed % 3))
    scale = [1.0, 10.0, 100.0][seed % 3]
    return Case(f"random #{seed}: shape {shape}, logits x{scale:g}", (torch.randn(*shape, generator=g) * scale,),
                seed=2000 + seed)


def _softmax_reference(x):
    return torch.softmax(x, dim=-1)


def _softmax_naive(x):
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def _softmax_first_axis(x):
    e = torch.exp(x - x.amax(0, keepdim=True))
    return e / e.sum(0, keepdim=True)


register(Exercise(
    name="ch01.softmax",
    title="numerically stable softmax over the last axis",
    reference=_softmax_reference,
    edge_cases=_softmax_edge_cases,
    random_case=_softmax_random_case,
    points=1,
    hint="subtract the row maximum before exp (softmax(x) = softmax(x - c)); sum over dim=-1 with keepdim=True.",
    mistakes={"no max subtraction (exp overflows to inf, inf/inf = NaN)": _softmax_naive,
              "softmax over the wrong axis (dim 0 instead of the last)": _softmax_first_axis},
    forbidden=[(torch, "softmax"), (torch.nn.functional, "softmax"), (torch.Tensor, "softmax"),
               (torch.special, "softmax"), (torch, "log_softmax"), (torch.nn.functional, "log_softmax"),
               (torch.Tensor, "log_softmax"), (torch.nn.Softmax, "forward")],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch01.q_sharper_query",
    title="a 10 times larger query: what the attention output does",
    kind="choice", answer="D", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "the output is a weighted average of the values (the weights sum to 1): it cannot grow with the query": "A",
        "the softmax ignores adding the same number to every score, not multiplying them: larger scores give "
        "sharper weights": "B",
        "larger scores make the softmax sharper, not flatter: the weights move toward the best-matching key": "C",
    },
))

register(Question(
    name="ch01.q_score_variance",
    title="the variance of q.k for unit-variance entries, d_k = 64",
    kind="number", answer=64, points=1,
    mistakes={
        "8 is the standard deviation of q.k (sqrt(d_k)); the variance is its square": 8,
        "1 is the variance after dividing by sqrt(d_k); the question asks about the unscaled q.k": 1,
    },
    hint="q.k is a sum of d_k independent products q_i k_i, each of variance 1: the variances add up.",
))

register(Question(
    name="ch01.q_saturation",
    title="what unscaled scores do to the softmax as d_k grows",
    kind="choice", answer="A", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "large scores make the softmax sharper, not flatter: the unscaled entropy falls toward 0": "B",
        "the softmax Jacobian diag(p) - pp^T is nearly zero when p is nearly one-hot: larger scores give a "
        "smaller gradient, not a larger one": "C",
        "the softmax makes the weights sum to 1, it does not undo the scores' size: scores of size sqrt(d_k) "
        "saturate it": "D",
    },
))
