"""The exercise checker.

An exercise is a function the learner writes. `check(name, fn)` runs it on fixed edge cases (smallest
first), then on seeded random cases, compares each result with tformer's reference in float64, and
reports either "passed" or the *smallest* failing case: its name and seed, expected vs got (shape,
dtype, largest difference) and a hint. When the wrong answer equals a known mistake (missing
1/sqrt(d_k), softmax over the wrong axis, ...) the report names the mistake.

Modes (environment variable TFORMER_GRADE, or `set_mode`):
    learner (default)  never raises, so "Run All" always finishes
    strict             raises AssertionError on any failure (CI runs solution notebooks this way)
    blank              raises unless the exercise is still the untouched stub (CI runs learner
                       notebooks this way, proving every stub fails gracefully)
A learner's function that runs longer than the exercise's time limit is stopped with a message.
While the learner's function runs, the references it is compared with are disabled, so calling them
does not pass the check.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

MODES = ("learner", "strict", "blank")
_mode: str | None = None


def set_mode(mode: str | None) -> None:
    """Override TFORMER_GRADE for this process (None goes back to the environment variable)."""
    global _mode
    if mode is not None and mode not in MODES:
        raise ValueError(f"grading mode must be one of {MODES}, got {mode!r}")
    _mode = mode


def get_mode() -> str:
    mode = _mode or os.environ.get("TFORMER_GRADE", "learner")
    if mode not in MODES:
        raise ValueError(f"TFORMER_GRADE must be one of {MODES}, got {mode!r}")
    return mode


@dataclass
class Case:
    """One input to an exercise: positional args and a description (with its seed if random)."""
    name: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    seed: int | None = None


@dataclass
class Exercise:
    name: str                                   # "ch01.attention"
    title: str                                  # what the learner writes
    reference: Callable[..., Any]               # tformer's implementation: the expected answer
    edge_cases: Callable[[], list[Case]]        # fixed cases, smallest first
    random_case: Callable[[int], Case]          # seeded random case
    points: int = 1
    n_random: int = 10
    atol: float = 1e-5
    rtol: float = 1e-4
    hint: str = ""
    mistakes: dict[str, Callable[..., Any]] = field(default_factory=dict)  # name -> buggy version
    forbidden: list[tuple[Any, str]] = field(default_factory=list)         # (owner, attribute) disabled while fn runs
    time_limit: float = 10.0                    # seconds for the whole check
    notebook: str = ""                          # the notebook it belongs to, by stem ("11_pretraining");
                                                # "" = the notebook whose name starts with the chapter number


@dataclass
class Result:
    exercise: str
    points: int
    passed: bool
    status: str          # "passed", "failed", "not attempted", "error", "timeout"
    message: str
    cases_run: int = 0

    def __bool__(self) -> bool:
        return self.passed

    def _repr_markdown_(self) -> str:  # shown in Jupyter when the result is the cell's last value
        return f"**{self.exercise}**: {self.message}".replace("\n", "  \n")


REGISTRY: dict[str, Exercise] = {}


def register(ex: Exercise) -> Exercise:
    if ex.name in REGISTRY:
        raise ValueError(f"exercise {ex.name!r} registered twice")
    REGISTRY[ex.name] = ex
    return ex


_REFERENCE_CALLED = "tformer-grading: the reference was called"


class _TimeLimit(BaseException):  # BaseException: a learner's `except Exception` cannot swallow it
    pass


def _raise_reference_called(*args, **kwargs):
    # only builtins here: this code object is also swapped into functions living in other modules
    raise RuntimeError("tformer-grading: the reference was called")


@contextlib.contextmanager
def _forbid(pairs: list[tuple[Any, str]], exercise: str):
    """Replace each owner.attribute by a function that raises; for plain Python functions swap the code
    object too, so aliases imported earlier (`from tformer import f`) are caught as well."""
    saved = []
    try:
        for owner, attr in pairs:
            original = getattr(owner, attr, None)
            if original is None:                    # not in this torch version: nothing to forbid
                continue
            code = getattr(original, "__code__", None)
            swap = code is not None and not getattr(original, "__closure__", None)
            saved.append((owner, attr, original, code if swap else None))
            setattr(owner, attr, _raise_reference_called)
            if swap:
                original.__code__ = _raise_reference_called.__code__
        yield
    finally:
        for owner, attr, original, code in reversed(saved):
            setattr(owner, attr, original)
            if code is not None:
                original.__code__ = code


@contextlib.contextmanager
def _time_limit(seconds: float):
    """SIGALRM-based limit (main thread on Unix, where Jupyter runs cells); elsewhere no limit."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise _TimeLimit()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _flatten(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list) and x and all(type(i) is int for i in x):   # a list of ids: one sequence (length, then
        return [torch.tensor(x)]                                         # the first differing position)
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _flatten(item)]
    if isinstance(x, (int, float, bool)):
        return [torch.tensor(x)]
    raise TypeError(f"expected a tensor (or a tuple of tensors), got {type(x).__name__}")


def compare(got, expected, atol: float, rtol: float) -> str | None:
    """None if `got` matches `expected`; otherwise what differs (shape, dtype, largest difference)."""
    try:
        g_list = _flatten(got)
    except TypeError as e:
        return str(e)
    e_list = _flatten(expected)
    if len(g_list) != len(e_list):
        return f"expected {len(e_list)} output tensor(s), got {len(g_list)}"
    for i, (g, e) in enumerate(zip(g_list, e_list)):
        which = f"output {i}: " if len(e_list) > 1 else ""
        if tuple(g.shape) != tuple(e.shape):
            return f"{which}expected shape {tuple(e.shape)}, got {tuple(g.shape)}"
        if (e.is_floating_point() or e.dtype == torch.bool) and g.dtype != e.dtype:
            return f"{which}expected dtype {e.dtype}, got {g.dtype}"
        if not e.is_floating_point():
            if not torch.equal(g.to(e.dtype), e):
                bad = (g.to(e.dtype) != e).nonzero()[0].tolist()
                return f"{which}values differ, first at index {tuple(bad)}: expected {e[tuple(bad)].item()}, got {g[tuple(bad)].item()}"
            continue
        g64, e64 = g.detach().double(), e.detach().double()
        both_nan = torch.isnan(g64) & torch.isnan(e64)            # NaN where NaN is expected counts as equal
        if (torch.isnan(g64) & ~both_nan).any():
            return f"{which}got NaN where the expected output has none (shape {tuple(e.shape)})"
        same_inf = torch.isinf(g64) & (g64 == e64)                # +-inf where the same inf is expected
        diff = (g64 - e64).abs().nan_to_num(nan=float("inf")).masked_fill(both_nan | same_inf, 0.0)
        if not torch.all(diff <= atol + rtol * e64.abs().nan_to_num(nan=0.0, posinf=0.0)):
            idx = tuple(torch.unravel_index(diff.argmax(), diff.shape)) if diff.dim() else ()
            idx = tuple(int(j) for j in idx)
            return (f"{which}shape {tuple(e.shape)} {e.dtype} ok, values differ: largest difference "
                    f"{diff.max().item():.3g} at index {idx} (expected {e64[idx].item():.5g}, got {g64[idx].item():.5g})")
    return None


def _clone_args(case: Case) -> tuple[tuple, dict]:
    """Fresh copies of a case's inputs, so an in-place edit by one function cannot leak into the next."""
    def c(x):
        if isinstance(x, torch.Tensor):
            return x.clone()
        if isinstance(x, dict):
            return {k: c(v) for k, v in x.items()}
        return x
    return tuple(c(a) for a in case.args), {k: c(v) for k, v in case.kwargs.items()}


def _matches_mistake(ex: Exercise, case: Case, got) -> str | None:
    """The names of the known mistakes whose output equals `got` on this case (None if none does)."""
    names = []
    for name, buggy in ex.mistakes.items():
        try:
            args, kwargs = _clone_args(case)
            if compare(got, buggy(*args, **kwargs), ex.atol, ex.rtol) is None:
                names.append(name)
        except Exception:
            continue
    return "; or ".join(names) if names else None


def _cases(ex: Exercise) -> Iterable[Case]:
    yield from ex.edge_cases()
    for seed in range(ex.n_random):
        yield ex.random_case(seed)


def _size(case: Case) -> int:
    """How big a case is: elements of its tensor inputs plus its integer inputs (for "smallest")."""
    total = 0
    for x in (*case.args, *case.kwargs.values()):
        if isinstance(x, torch.Tensor):
            total += x.numel()
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            total += abs(int(x))
    return total


def _where(case: Case) -> str:
    return f"'{case.name}'" + (f" (seed {case.seed})" if case.seed is not None else "")


def _run(ex: Exercise, fn: Callable) -> Result:
    """Run every case; on failures report the smallest failing one (by input size, then order)."""
    n = 0
    failures: list[tuple[int, int, Case, str, Any]] = []      # (size, order, case, problem, got)
    try:
        with _time_limit(ex.time_limit):
            for case in _cases(ex):
                args, kwargs = _clone_args(case)
                with torch.no_grad():
                    expected = ex.reference(*args, **kwargs)
                args, kwargs = _clone_args(case)
                n += 1
                try:
                    with _forbid(ex.forbidden, ex.name):
                        got = fn(*args, **kwargs)
                except NotImplementedError:
                    if n == 1:
                        return Result(ex.name, ex.points, False, "not attempted",
                                      "not attempted yet: replace `raise NotImplementedError` with your code.", n)
                    raise
                except Exception as e:
                    e.tformer_case = case   # type: ignore[attr-defined]  (named in the report below)
                    raise
                problem = compare(got, expected, ex.atol, ex.rtol)
                if problem is not None:
                    failures.append((_size(case), n, case, problem, got))
    except _TimeLimit:
        return Result(ex.name, ex.points, False, "timeout",
                      f"stopped after {ex.time_limit:g} s (an infinite loop, or a Python loop over every element?).", n)
    except Exception as e:  # the learner's code raised: show where, never crash the notebook
        if str(e) == _REFERENCE_CALLED:
            return Result(ex.name, ex.points, False, "error",
                          "your function called the reference implementation it is compared with; write it "
                          "yourself from torch operations.", n)
        tb = traceback.extract_tb(e.__traceback__)[-1]
        case = getattr(e, "tformer_case", None)
        on = f"case {_where(case)}" if case is not None else f"case {n}"
        return Result(ex.name, ex.points, False, "error",
                      f"your function raised {type(e).__name__}: {e} (line {tb.lineno}: {tb.line}) on {on}.", n)
    if failures:
        _, _, case, problem, got = min(failures, key=lambda f: (f[0], f[1]))
        msg = f"FAILED {len(failures)} of {n} cases. Smallest failing case {_where(case)}: {problem}."
        mistake = _matches_mistake(ex, case, got)
        if mistake:
            msg += f"\nYour output equals a known mistake: {mistake}."
        if ex.hint:
            msg += f"\nHint: {ex.hint}"
        return Result(ex.name, ex.points, False, "failed", msg, n)
    return Result(ex.name, ex.points, True, "passed", f"passed all {n} cases. {ex.points} point(s).", n)


def check(name: str, fn: Callable) -> Result:
    """Grade `fn` against exercise `name`, print the verdict, and return a `Result`."""
    if name not in REGISTRY:
        from . import exercises  # noqa: F401  (registers every chapter's exercises)
    if name not in REGISTRY:
        msg = f"no exercise named {name!r}; known: {sorted(REGISTRY)}"
        if get_mode() != "learner":
            raise KeyError(msg)
        print(f"[FAIL] {msg}")                       # learner mode: never raise, so "Run All" finishes
        return Result(name, 0, False, "error", msg)
    ex = REGISTRY[name]
    t0 = time.perf_counter()
    result = _run(ex, fn)
    mark = "PASS" if result.passed else ("TODO" if result.status == "not attempted" else "FAIL")
    print(f"[{mark}] {ex.name} ({ex.title}): {result.message} [{time.perf_counter() - t0:.1f}s]")
    _record(result)
    mode = get_mode()
    if mode == "strict" and not result.passed:
        raise AssertionError(f"{name}: {result.message}")
    if mode == "blank" and result.status != "not attempted":
        raise AssertionError(f"{name}: expected the untouched stub (not attempted), got {result.status}: {result.message}")
    return result


def _record(result: Result) -> None:
    path = os.environ.get("TFORMER_GRADE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(result.__dict__) + "\n")
