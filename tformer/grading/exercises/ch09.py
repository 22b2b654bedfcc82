"""Chapter 9: one step of the online softmax (FlashAttention's core), and the Sparse Transformer's strided pattern."""
import math

import torch

from ... import efficient, sparse
from ..core import Case, Exercise, register
from ..questions import Question


def _state(g, rows, d, seen: bool):
    if not seen:
        return (torch.full((rows, 1), -math.inf), torch.zeros(rows, 1), torch.zeros(rows, d))
    s = torch.randn(rows, 3, generator=g) * 2
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    return m, p.sum(-1, keepdim=True), p @ torch.randn(3, d, generator=g)


def _step_edges() -> list[Case]:
    g = torch.Generator().manual_seed(900)
    first = _state(g, 2, 3, seen=False)
    later = _state(g, 4, 2, seen=True)
    big = torch.tensor([[50.0, 60.0], [-3.0, 1.0], [0.0, 0.0], [200.0, -200.0]])   # a new, much larger max
    masked = torch.tensor([[-math.inf, -math.inf], [0.5, -math.inf], [-math.inf, 2.0], [1.0, 1.0]])
    return [
        Case("first block (m = -inf, l = 0, acc = 0)", (*first, torch.randn(2, 4, generator=g), torch.randn(4, 3, generator=g))),
        Case("block of one key", (*later, torch.randn(4, 1, generator=g), torch.randn(1, 2, generator=g))),
        Case("scores much larger than the running max (rescale, no overflow)", (*later, big, torch.randn(2, 2, generator=g))),
        Case("some keys masked (-inf)", (*later, masked, torch.randn(2, 2, generator=g))),
        Case("first block fully masked: nothing changes, no NaN",
             (*_state(g, 2, 3, seen=False), torch.full((2, 2), -math.inf), torch.randn(2, 3, generator=g))),
    ]


def _step_random(seed: int) -> Case:
    g = torch.Generator().manual_seed(910 + seed)
    b, h, t, bk, d = (int(torch.randint(1, n, (1,), generator=g)) for n in (3, 3, 7, 6, 9))
    m, l, acc = _state(g, b * h * t, d, seen=bool(seed % 3))
    shape = (b, h, t)
    return Case(f"random #{seed}: (B={b}, H={h}, T_q={t}), block of {bk} keys, d={d}",
                (m.view(*shape, 1), l.view(*shape, 1), acc.view(*shape, d), torch.randn(b, h, t, bk, generator=g) * 3,
                 torch.randn(b, h, bk, d, generator=g)), seed=910 + seed)


# The known mistakes keep the -inf guard, so each one is recognised on its own (not just "NaN").
def _safe(x):
    return x.masked_fill(x == -math.inf, 0.0)


def _no_rescale(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - _safe(m_new))
    return m_new, l + p.sum(-1, keepdim=True), acc + p @ v


def _rescale_inverted(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - _safe(m_new))
    alpha = torch.exp(_safe(m_new) - m).nan_to_num(0.0, posinf=0.0)
    return m_new, alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ v


def _block_max_only(m, l, acc, scores, v):
    mb = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - _safe(mb))
    alpha = torch.exp(m - _safe(mb))
    return mb, alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ v


register(Exercise(
    name="ch09.online_softmax_step",
    title="one block of the online softmax -> (m, l, acc)",
    reference=efficient.online_softmax_step,
    edge_cases=_step_edges,
    random_case=_step_random,
    points=3,
    hint="m_new = max(m, rowmax(scores)); p = exp(scores - m_new); alpha = exp(m - m_new); "
         "l = alpha * l + rowsum(p); acc = alpha * acc + p @ v. Where m_new is -inf (nothing seen yet), "
         "subtract 0 instead so exp gives 0, not NaN.",
    mistakes={"old l and acc not rescaled by exp(m - m_new)": _no_rescale,
              "rescaled by exp(m_new - m) (inverted)": _rescale_inverted,
              "new max taken from this block only, not max(m, block max)": _block_max_only},
    forbidden=[(efficient, "online_softmax_step"), (efficient, "tiled_attention")],
))


def _strided_reference(t, stride):
    return sparse.strided_pattern(t, stride)


def _strided_edges() -> list[Case]:
    return [Case("T=1", (1, 1)), Case("stride 1", (5, 1)), Case("stride larger than T", (4, 9)),
            Case("T=9, stride 3", (9, 3))]


def _strided_random(seed: int) -> Case:
    g = torch.Generator().manual_seed(920 + seed)
    t, s = int(torch.randint(1, 50, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g))
    return Case(f"random #{seed}: T={t} stride={s}", (t, s), seed=920 + seed)


def _strided_not_causal(t, stride):
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    return torch.stack([(i - j).abs() < stride, (i - j).remainder(stride) == 0])


def _strided_local_off_by_one(t, stride):
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    d = i - j
    return torch.stack([(d >= 0) & (d <= stride), (d >= 0) & (d.remainder(stride) == 0)])


register(Exercise(
    name="ch09.strided_pattern",
    title="Sparse Transformer strided pattern (2, T, T), causal",
    reference=_strided_reference,
    edge_cases=_strided_edges,
    random_case=_strided_random,
    points=2,
    hint="with d = i - j: head 0 keeps 0 <= d < stride (the last `stride` tokens), head 1 keeps d >= 0 with "
         "d % stride == 0; stack them into (2, T, T).",
    mistakes={"not causal (j > i allowed)": _strided_not_causal,
              "local head one token too wide (d <= stride)": _strided_local_off_by_one},
    forbidden=[(sparse, "strided_pattern")],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch09.q_strided_exponent",
    title="the strided pattern with stride sqrt(n): its cost grows as n^p, p = ?",
    kind="number", answer=1.5, rel_tol=0.04, points=1,
    mistakes={
        "2 is dense attention's exponent: the strided pattern scores about 2 sqrt(n) keys per query, not n": 2,
        "a cost linear in n needs a fixed number of keys per query, as a window's; here each query scores about "
        "2 sqrt(n) keys, which grows with n": 1,
        "sqrt(n) is the number of keys one query scores (p = 0.5); the n queries together score n sqrt(n)": 0.5,
    },
    hint="count per query: the local head keeps the last sqrt(n) tokens, the strided head every sqrt(n)-th one "
         "(about sqrt(n) of them); multiply by the n queries.",
))

register(Question(
    name="ch09.q_lookup_exact",
    title="on the one-layer key lookup, which attentions score exactly what exact attention scores",
    kind="choice", answer="B", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "Linformer and Performer approximate the softmax, and on this recall task they lose most of exact "
        "attention's accuracy (the table)": "A",
        "a window of 3 cannot reach an answer further back: the sliding window scores about chance on far "
        "answers": "C",
        "a sparse pattern is exact on the pairs it keeps; with one layer only the query's row matters, and "
        "Longformer's global query and BigBird's blocks keep all of that row": "D",
    },
))

register(Question(
    name="ch09.q_tiled_memory",
    title="the scores tiled_attention holds at once, per head: n queries, key blocks of b",
    kind="expr", answer="n * b", symbols=("n", "b"), points=1,
    mistakes={
        "n**2 is the full score matrix that explicit attention stores; the tiled loop holds one block of keys "
        "at a time": "n**2",
        "the GPU kernels also cut the queries into blocks, but tiled_attention keeps all n queries and scores "
        "them against one block of b keys, scores (T_q, B_k)": "b**2",
    },
    hint="look at the shape of scores in online_softmax_step: (..., T_q, B_k).",
))
