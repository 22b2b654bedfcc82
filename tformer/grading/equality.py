"""Comparing a learner's output with the expected one: shape, dtype, then values within a tolerance, and a
message that says what differs (the largest difference, where, and both values with enough digits).

`compare` is the checker's (tformer/grading/core.py) and `tformer doctor`'s: one rule for "equal".
`structure_problem` comes first where the output is a worker's (anything its learner code sent): the output
must have the kinds, nesting, lengths and keys of the expected one before any value is compared.
"""
from __future__ import annotations

import torch

from .messages import _


def flatten_tensors(x) -> list[torch.Tensor]:
    """The tensors in x (a tensor, nested tuples or lists of them, plain numbers) in order; a list of ints is one."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list) and x and all(type(i) is int for i in x):   # a list of ids: one sequence (length, then
        return [torch.tensor(x)]                                         # the first differing position)
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in flatten_tensors(item)]
    if isinstance(x, (int, float, bool)):
        return [torch.tensor(x)]
    if isinstance(x, dict) and "tformer_unsupported" in x:       # a value a grading worker could not send
        raise TypeError(_("expected a tensor (or a tuple of tensors), got {got}").format(got=x['tformer_unsupported']))
    raise TypeError(_("expected a tensor (or a tuple of tensors), got {got}").format(got=type(x).__name__))


def _pair(e: float, g: float) -> str:
    """'expected E, got G' with as many digits as it takes for E and G to differ, and the relative error."""
    for digits in (5, 8, 12, 17):
        a, b = f"{e:.{digits}g}", f"{g:.{digits}g}"
        if a != b:
            break
    rel = abs(g - e) / abs(e) if e not in (0.0,) and abs(e) != float("inf") else None
    return (_("expected {expected}, got {got}").format(expected=a, got=b)
            + (_(", relative error {rel}").format(rel=f"{rel:.2g}") if rel is not None and rel == rel else ""))


def compare(got, expected, atol: float, rtol: float, nan_equal: bool = True) -> str | None:
    """None if `got` matches `expected`; otherwise what differs (shape, dtype, largest difference).
    Integer and bool outputs must have the expected dtype exactly and equal values; float outputs the
    expected dtype and values within atol + rtol * |expected| (NaN matches NaN if `nan_equal`)."""
    try:
        g_list = flatten_tensors(got)
    except TypeError as e:
        return str(e)
    e_list = flatten_tensors(expected)
    if len(g_list) != len(e_list):
        return _("expected {expected} output tensor(s), got {got}").format(expected=len(e_list), got=len(g_list))
    for i, (g, e) in enumerate(zip(g_list, e_list)):
        which = _("output {i}: ").format(i=i) if len(e_list) > 1 else ""
        if tuple(g.shape) != tuple(e.shape):
            return which + _("expected shape {expected}, got {got}").format(expected=tuple(e.shape), got=tuple(g.shape))
        if g.dtype != e.dtype:
            return which + _("expected dtype {expected}, got {got}").format(expected=e.dtype, got=g.dtype)
        if not e.is_floating_point():
            if not torch.equal(g, e):
                bad = tuple((g != e).nonzero()[0].tolist())
                return which + _("values differ, first at index {index}: expected {expected}, got {got}").format(
                    index=bad, expected=e[bad].item(), got=g[bad].item())
            continue
        g64, e64 = g.detach().double(), e.detach().double()
        both_nan = torch.isnan(g64) & torch.isnan(e64) & nan_equal  # NaN where NaN is expected counts as equal
        if (torch.isnan(g64) & ~both_nan).any():
            return which + _("got NaN where the expected output has none (shape {shape})").format(shape=tuple(e.shape))
        same_inf = torch.isinf(g64) & (g64 == e64)                # +-inf where the same inf is expected
        # an infinite difference stays inf (nan_to_num would make it the largest double, printed as 1.8e+308)
        diff = (g64 - e64).abs().nan_to_num(nan=float("inf"), posinf=float("inf")).masked_fill(both_nan | same_inf, 0.0)
        if not torch.all(diff <= atol + rtol * e64.abs().nan_to_num(nan=0.0, posinf=0.0)):
            idx = tuple(torch.unravel_index(diff.argmax(), diff.shape)) if diff.dim() else ()
            idx = tuple(int(j) for j in idx)
            return which + _("shape {shape} {dtype} ok, values differ: largest difference {diff} at index {index} "
                             "({pair})").format(shape=tuple(e.shape), dtype=e.dtype, diff=f"{diff.max().item():.3g}",
                                                index=idx, pair=_pair(e64[idx].item(), g64[idx].item()))
    return None


MAX_INT = 1 << 63            # a number a tensor can hold; larger ints are refused before torch sees them


def _ids(x) -> bool:
    return isinstance(x, list) and all(type(i) is int for i in x)


def describe(x) -> str:
    """What kind of output `x` is, in a few words: "a tensor", "a tuple of 2", "a dict", "a float"."""
    if isinstance(x, dict) and isinstance(x.get("tformer_unsupported"), str) and len(x) == 1:
        return _("a value of type {kind}").format(kind=x["tformer_unsupported"][:40])
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            return _("a {layout} tensor").format(layout=str(x.layout).replace("torch.", ""))
        if x.device.type != "cpu":
            return _("a tensor on {device} (return it on the CPU, where its inputs are)").format(device=x.device.type)
        return _("a tensor")
    if isinstance(x, (tuple, list)):
        return _("a {kind} of {n}").format(kind=type(x).__name__, n=len(x))
    return _("a value of type {kind}").format(kind=type(x).__name__[:40])


def structure_problem(got, expected, limit: int = 100_000) -> str | None:
    """None when `got` has the structure of `expected`: a plain CPU tensor where a tensor is expected, a number
    (bool, int within 64 bits, float) where a number is, None, a string, a list of ints or a 1-d tensor where a
    list of ids is (compare's rule), and tuples/lists of the same length and dicts of the same keys, item by item.
    Otherwise what differs, in one line. Walks `expected` (the grader's own value), so a forged `got` cannot make
    it long; shapes, dtypes and values are compare's."""
    seen = [0]

    def walk(g, e, where: str) -> str | None:
        seen[0] += 1
        if seen[0] > limit:
            return _("the output is too large to compare")
        at = _(" at {where}").format(where=where) if where else ""
        wrong = _("got {got}{at} where {expected} is expected").format(got=describe(g), at=at, expected=describe(e))
        if isinstance(e, torch.Tensor):
            if not (isinstance(g, torch.Tensor) and g.layout == torch.strided and g.device.type == "cpu"):
                return wrong
            return None
        if isinstance(e, (bool, int, float)):
            if isinstance(g, bool) or isinstance(g, float) or (isinstance(g, int) and -MAX_INT <= g < MAX_INT):
                return None
            return wrong
        if e is None or isinstance(e, str):
            return None if type(g) is type(e) else wrong
        if _ids(e):
            if isinstance(g, torch.Tensor) and g.layout == torch.strided and g.device.type == "cpu" and g.dim() == 1:
                return None
            if _ids(g) and all(-MAX_INT <= i < MAX_INT for i in g):
                return None
            return wrong
        if isinstance(e, (tuple, list)):
            if not isinstance(g, (tuple, list)) or len(g) != len(e):
                return wrong
            for i, (a, b) in enumerate(zip(g, e)):
                problem = walk(a, b, f"{where}[{i}]")
                if problem is not None:
                    return problem
            return None
        if isinstance(e, dict):
            if not isinstance(g, dict) or set(g) != set(e):
                return wrong
            for k in e:
                problem = walk(g[k], e[k], f"{where}[{k!r}]")
                if problem is not None:
                    return problem
            return None
        # another kind of expected output (an exercise's own compare judges it): plain data only
        if isinstance(g, (torch.Tensor, bool, int, float, str)) or g is None:
            return None if not isinstance(g, int) or -MAX_INT <= g < MAX_INT else wrong
        return wrong

    try:
        return walk(got, expected, "")
    except RecursionError:
        return _("the output is nested too deeply to compare")
