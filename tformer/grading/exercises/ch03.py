"""Chapter 3: multi-head attention: split into heads, merge them back, and the whole forward pass."""
import math

import torch
import torch.nn.functional as F

from ... import attention
from ...attention import MultiHeadAttention, merge_heads, split_heads
from ..core import Case, Exercise, register
from ..questions import Question
from .ch02 import FORBIDDEN as _ATTENTION_FORBIDDEN

FORBIDDEN = _ATTENTION_FORBIDDEN + [(attention, "split_heads"), (attention, "merge_heads")]


# --- split and merge -------------------------------------------------------------------------------------

def _split_edge_cases() -> list[Case]:
    g = torch.Generator().manual_seed(30)
    x = torch.randn(2, 6, 4, generator=g)
    return [
        Case("length 1, one head", (torch.randn(1, 1, 3, generator=g), 1)),
        Case("one feature per head", (torch.randn(1, 3, 4, generator=g), 4)),
        Case("batch of 2, 2 heads", (x, 2)),
        Case("non-contiguous input", (x.transpose(0, 1).contiguous().transpose(0, 1), 2)),
    ]


def _split_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(5000 + seed)
    b, t, h, hd = (int(torch.randint(1, n, (1,), generator=g)) for n in (4, 9, 5, 6))
    return Case(f"random #{seed}: B={b} T={t} heads={h} d_head={hd}",
                (torch.randn(b, t, h * hd, generator=g), h), seed=5000 + seed)


def _split_reshape_only(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, n_heads, t, d // n_heads)


def _split_strided(x, n_heads):             # head i takes features i, i + h, i + 2h, ... (wrong grouping)
    b, t, d = x.shape
    return x.view(b, t, d // n_heads, n_heads).permute(0, 3, 1, 2)


register(Exercise(
    name="ch03.split_heads",
    title="split heads: (B, T, h * d_head) -> (B, h, T, d_head)",
    reference=split_heads,
    edge_cases=_split_edge_cases,
    random_case=_split_random_case,
    points=1,
    hint="view the features as (B, T, h, d_head), then swap T and h: head i gets features i*d_head ... "
         "(i+1)*d_head - 1 of every position.",
    mistakes={"heads split by a reshape without the transpose (positions mixed into heads)": _split_reshape_only,
              "features dealt out to heads round-robin (view as (d_head, h) instead of (h, d_head))": _split_strided},
    forbidden=FORBIDDEN,
))


def _merge_edge_cases() -> list[Case]:
    """Contiguous (B, h, T, d_head) tensors, as attention's output `weights @ v` is (so `.view` after the
    transpose fails, as it does in real use), and one non-contiguous view (split_heads's own output)."""
    cases = [Case(c.name, (split_heads(*c.args).contiguous(),)) for c in _split_edge_cases()[:3]]
    return cases + [Case("a non-contiguous view (split_heads's output)", (split_heads(*_split_edge_cases()[2].args),))]


def _merge_random_case(seed: int) -> Case:
    c = _split_random_case(seed)
    return Case(c.name, (split_heads(*c.args).contiguous(),), seed=c.seed)


def _merge_reshape_only(x):
    b, h, t, hd = x.shape
    return x.reshape(b, t, h * hd)


register(Exercise(
    name="ch03.merge_heads",
    title="merge heads (concatenate): (B, h, T, d_head) -> (B, T, h * d_head)",
    reference=merge_heads,
    edge_cases=_merge_edge_cases,
    random_case=_merge_random_case,
    points=1,
    hint="the inverse of split_heads: transpose back to (B, T, h, d_head), then reshape (not view: the "
         "transposed tensor is not contiguous).",
    mistakes={"heads merged by a reshape without the transpose": _merge_reshape_only},
    forbidden=FORBIDDEN,
))


# --- the whole multi-head attention forward ----------------------------------------------------------

def _mha_case(name: str, seed: int, b: int, t: int, h: int, hd: int, random: bool = False) -> Case:
    g = torch.Generator().manual_seed(seed)
    d = h * hd
    s = d ** -0.5
    return Case(name, (torch.randn(b, t, d, generator=g), torch.randn(3 * d, d, generator=g) * s,
                       torch.randn(3 * d, generator=g) * 0.1, torch.randn(d, d, generator=g) * s,
                       torch.randn(d, generator=g) * 0.1, h), seed=seed if random else None)


def _mha_edge_cases() -> list[Case]:
    return [
        _mha_case("length 1, one head", 40, 1, 1, 1, 4),
        _mha_case("batch of 1, 2 heads", 41, 1, 3, 2, 4),
        _mha_case("4 heads of size 2", 42, 2, 5, 4, 2),
    ]


def _mha_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(6000 + seed)
    b, t, h, hd = (int(torch.randint(1, n, (1,), generator=g)) for n in (4, 9, 5, 6))
    return _mha_case(f"random #{seed}: B={b} T={t} heads={h} d_head={hd}", 6000 + seed, b, t, h, hd, random=True)


def mha_reference(x, w_qkv, b_qkv, w_o, b_o, n_heads):
    """tformer.MultiHeadAttention (reference path) with these weights."""
    d = x.shape[-1]
    mha = MultiHeadAttention(d, n_heads, fast=False)
    with torch.no_grad():
        mha.qkv.weight.copy_(w_qkv), mha.qkv.bias.copy_(b_qkv), mha.out.weight.copy_(w_o), mha.out.bias.copy_(b_o)
    return mha(x)


def _mha_math(x, w_qkv, b_qkv, w_o, b_o, n_heads, split, merge, scale_by_model=False):
    d = x.shape[-1]
    q, k, v = (split(z, n_heads) for z in F.linear(x, w_qkv, b_qkv).split(d, dim=-1))
    scale = math.sqrt(d if scale_by_model else d // n_heads)
    y = torch.softmax(q @ k.transpose(-2, -1) / scale, dim=-1) @ v
    return F.linear(merge(y), w_o, b_o)


def _split_ok(x, h):
    b, t, d = x.shape
    return x.view(b, t, h, d // h).transpose(1, 2)


def _merge_ok(y):
    b, h, t, hd = y.shape
    return y.transpose(1, 2).reshape(b, t, h * hd)


def _mha_reshape_split(*a):
    return _mha_math(*a, split=_split_reshape_only, merge=_merge_ok)


def _mha_reshape_both(*a):
    return _mha_math(*a, split=_split_reshape_only, merge=_merge_reshape_only)


def _mha_reshape_merge(*a):
    return _mha_math(*a, split=_split_ok, merge=_merge_reshape_only)


def _mha_scale_d_model(*a):
    return _mha_math(*a, split=_split_ok, merge=_merge_ok, scale_by_model=True)


def _mha_no_out_proj(x, w_qkv, b_qkv, w_o, b_o, n_heads):
    d = x.shape[-1]
    q, k, v = (_split_ok(z, n_heads) for z in F.linear(x, w_qkv, b_qkv).split(d, dim=-1))
    return _merge_ok(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // n_heads), dim=-1) @ v)


register(Exercise(
    name="ch03.mha_forward",
    title="multi-head self-attention forward with given weights",
    reference=mha_reference,
    edge_cases=_mha_edge_cases,
    random_case=_mha_random_case,
    points=2,
    hint="qkv = x @ w_qkv.T + b_qkv, split into q, k, v (each d_model wide), split each into heads, "
         "attention per head scaled by 1/sqrt(d_head), merge the heads, then the output projection w_o, b_o.",
    mistakes={"heads split by a reshape without the transpose": _mha_reshape_split,
              "heads split and merged by reshapes without the transpose": _mha_reshape_both,
              "heads merged by a reshape without the transpose": _mha_reshape_merge,
              "scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head)": _mha_scale_d_model,
              "output projection W_o missing": _mha_no_out_proj},
    forbidden=FORBIDDEN,
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch03.q_params",
    title="the parameters of multi-head attention with d_model = 512 and 4 heads",
    kind="number", answer=4 * 512 * 512 + 4 * 512, points=1,
    mistakes={
        "each head is a d_model/h slice of the same W_q, W_k, W_v: h heads are not h full-width copies":
            4 * (4 * 512 * 512 + 4 * 512),
        "cutting the matrices into h blocks keeps every parameter: the heads together span the full width":
            (4 * 512 * 512 + 4 * 512) // 4,
    },
    hint="W_q, W_k, W_v and W_o are each d_model x d_model, with a bias of d_model each, whatever h is.",
))

register(Question(
    name="ch03.q_one_head",
    title="what one head of the same size does on the two-lookup task",
    kind="choice", answer="B", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "one head solves the task too (its accuracy is printed): it can still read two positions, by blending "
        "them": "A",
        "its weight on t-3 is printed too, well above zero: it needs both tokens and reads both": "C",
        "one head has one pattern per query: it can only split its weight, and the printed weights are less "
        "sharp than the four heads'": "D",
    },
))
