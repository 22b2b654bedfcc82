"""Chapter 1: scaled dot-product attention."""
import math

import torch

from ... import attention
from ...attention import scaled_dot_product_attention
from ..core import Exercise, register
from ..inputs import attention_edge_cases, attention_random_case


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
