"""The exercise checker.

An exercise is a function the learner writes. `check(name, fn)` runs it on fixed edge cases (smallest
first), then on seeded random cases, compares each result with tformer's reference in float64, and
reports either "passed" or the *smallest* failing case: its name and seed, expected vs got (shape,
dtype, largest difference) and a hint. When the wrong answer equals a known mistake (missing
1/sqrt(d_k), softmax over the wrong axis, ...) the report names the mistake. A question (questions.py) is an
exercise whose answer is a value: `check("ch01.q_scale", answer)` judges the value, calling nothing.

Modes (environment variable TFORMER_GRADE, or `set_mode`):
    learner (default)  never raises, so "Run All" always finishes
    strict             raises AssertionError on any failure (CI runs solution notebooks this way)
    blank              raises unless the exercise is still the untouched stub (CI runs learner
                       notebooks this way, proving every stub fails gracefully)
A learner's function that runs longer than the exercise's time limit is stopped with a message (one that
swallows the stop with a bare `except:` is stopped again and again, and the learner is told how to
interrupt the kernel). While the learner's function runs, the references it is compared with are
disabled, so calling them does not pass the check. A function that modifies its inputs in place fails.

A check has two halves: `run_learner` calls the learner's function on every case and keeps what it
returned (and its inputs afterwards); `judge` computes the expected answers and compares. In a notebook
both run in the learner's process. `tformer grade` runs `run_learner` in a worker process that executes the
notebook and `judge` in its own process, which alone holds the expected answers and the points.

What `judge` guarantees, whoever built the Outcome (a worker's is the student's to forge): it passes an
exercise only when the status is "ok" and there is exactly one output and one `inputs_after` per case, each
output with the structure of the reference's on that case (compare.structure_problem: kinds, nesting,
lengths, keys) and equal to it within the tolerance; a status outside STATUSES, counts that do not fit the
status, or a wrong structure is an "error" with one line, never "passed all 0 cases". A hidden case's result
is pass/fail only: no value, case name or error text of it reaches a message (a mistake is named on it only
with `show_hidden`).
"""
from __future__ import annotations

import inspect
import os
import re
import sys
import sysconfig
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from .equality import compare, describe, flatten_tensors, structure_problem  # noqa: F401  (the exercise API)
from .guards import REFERENCE_CALLED, TimeLimit, forbid, time_limit
from .messages import N_, _, language  # noqa: F401  (N_, language: the exercises' messages)
from .questions import Question, judge_question, plain  # noqa: F401  (plain: the grading worker's)
from .result import Result

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
    group: str = ""          # "edge", "random" or "hidden" (set by exercise_cases / add_hidden_cases)


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
    compare: Callable[..., str | None] | None = None  # (got, expected, case, atol, rtol) -> problem;
                                                # None: the generic `compare` below
    notebook: str = ""                          # the notebook it belongs to, by stem ("11_pretraining");
                                                # "" = the notebook whose name starts with the chapter number
    partial: dict[str, float] = field(default_factory=dict)   # points per group of cases ("edge", "random",
                                                # "hidden", or a case's name); {} = all or nothing

    # What an exercise and a question (questions.Question) both answer, so the class run never asks which it holds
    takes_cases = True                          # judged on cases the grader sends (a question: on its value)
    NOT_RUN = N_("check(...) never ran for this exercise")

    def entry(self) -> dict:
        """grades.json's entry: its id, chapter and points."""
        return {"id": self.name, "chapter": self.name.split(".")[0], "points": self.points}

    def code(self) -> tuple:
        """The functions whose modules the grader's hash covers."""
        return tuple(f for f in (self.reference, self.edge_cases, self.random_case, self.compare,
                                 *self.mistakes.values()) if f is not None)


REGISTRY: dict[str, Exercise | Question] = {}


def register(ex: Exercise | Question) -> Exercise | Question:
    """Add an exercise or a question (tformer.grading.questions.Question) to the registry."""
    if ex.name in REGISTRY:
        raise ValueError(f"exercise {ex.name!r} registered twice")
    REGISTRY[ex.name] = ex
    return ex


TEACHER_FILES: dict[str, str] = {}     # a teacher's exercise file (resolved path) -> the module it was loaded as
TEACHER_NAMES: dict[str, list[str]] = {}   # a teacher's exercise file (resolved path) -> the names it registered
PUBLIC_FILES: dict[str, list[str]] = {}    # a public file (public.py, resolved path) -> the names it registered


def _import_file(path: Path, kind: str, loaded: dict[str, str], missing: str) -> None:
    """Import the module at `path` once (`loaded`: path -> module name), under a name no other file shares;
    FileNotFoundError(`missing`) where there is no such file. A module that raises is not counted as loaded."""
    import hashlib
    import importlib.util
    if str(path) in loaded:
        return
    if not path.is_file():
        raise FileNotFoundError(missing)
    name = f"tformer_{kind}_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name], loaded[str(path)] = module, name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name], loaded[str(path)]
        raise


def load_exercises(*files: str | os.PathLike) -> dict[str, Exercise]:
    """Register every chapter's exercises (tformer/grading/exercises/), and the exercises of a teacher's own
    `files` (a module that calls `register(Exercise(...))` as a chapter's does), and return the registry: the one
    way the grader and the tools load them. A file already loaded is not loaded again.

    Where a hand-out has no `week3.py` but its public file `week3.public.pt` (what `tformer handout` writes in
    its place, tformer/grading/public.py), `load_exercises("week3.py")` registers the public exercises: a
    learner's `check` judges against the outputs frozen in it. A `.pt` file is read as a public file.

    In a grading worker (TFORMER_GRADE_WORKER set) loading a file does nothing: the worker runs the student's
    notebook and never a teacher's module (whose reference and answers would then be in the student's
    process); the grader's requests carry what the worker needs."""
    import importlib

    from . import exercises
    exercises.load()
    if os.environ.get("TFORMER_GRADE_WORKER"):
        return REGISTRY
    # public.py builds Exercises from this module's classes: imported by name, as exercises.load() imports the
    # chapters, so that core does not import a module that imports it
    public = importlib.import_module(f"{__package__}.public")
    for f in files:
        path = Path(f).expanduser().resolve()
        if path.suffix == ".pt" or (not path.exists() and public.public_path(path).is_file()):
            data = path if path.suffix == ".pt" else public.public_path(path)
            if str(data) not in PUBLIC_FILES:
                if not data.is_file():
                    raise FileNotFoundError(f"no public exercise file {f} (what `tformer handout` writes)")
                PUBLIC_FILES[str(data)] = public.load_public(data)
            continue
        before = set(REGISTRY)
        loaded = str(path) in TEACHER_FILES
        _import_file(path, "exercises", TEACHER_FILES, f"no exercise file {f} (a module of register(Exercise(...)) calls)")
        if not loaded:
            TEACHER_NAMES[str(path)] = [n for n in REGISTRY if n not in before]
    return REGISTRY


def _compare(ex: Exercise, got, expected, case: Case, nan_equal: bool = True) -> str | None:
    if ex.compare is not None:
        return ex.compare(got, expected, case, ex.atol, ex.rtol)
    return compare(got, expected, ex.atol, ex.rtol, nan_equal)


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    return x


def clone_args(case: Case) -> tuple[tuple, dict]:
    """Fresh copies of a case's inputs, so an in-place edit by one function cannot leak into the next."""
    return tuple(_clone(a) for a in case.args), {k: _clone(v) for k, v in case.kwargs.items()}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and torch.equal(a.nan_to_num(0.0, 1.0, -1.0), b.nan_to_num(0.0, 1.0, -1.0))
                and torch.equal(a.isnan(), b.isnan()))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    try:
        return bool(a == b) or (a != a and b != b)       # ints, floats, None (NaN equals NaN here)
    except Exception:
        return True


def _modified_inputs(ex: Exercise, case: Case, after: tuple[tuple, dict]) -> str | None:
    """Which of the case's inputs the learner's function changed in place (None: none)."""
    try:
        params = list(inspect.signature(ex.reference).parameters)
    except (TypeError, ValueError):
        params = []
    args, kwargs = after
    names = [f"`{params[i]}`" if i < len(params) else _("argument {n}").format(n=i + 1)
             for i, (a, b) in enumerate(zip(case.args, args)) if not _same(a, b)]
    names += [f"`{k}`" for k, v in case.kwargs.items() if k in kwargs and not _same(v, kwargs[k])]
    if not names:
        return None
    return _("your function modified its input {names} in place (the caller's tensor changed); "
             "work on new tensors (y = x + 1, x.clone(), masked_fill instead of masked_fill_)").format(names=", ".join(names))


_LIBRARY_DIRS = tuple({str(Path(p).resolve()) + os.sep for p in (
    Path(__file__).resolve().parents[1],                 # tformer (the grader, the references)
    Path(torch.__file__).resolve().parent, sysconfig.get_paths()["stdlib"],
    sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])})


def _learner_line(tb) -> str:
    """'line N: `code`' of the deepest frame that is the learner's (not torch's, tformer's or Python's)."""
    frames = traceback.extract_tb(tb)
    mine = [f for f in frames if not f.filename.startswith("<frozen")
            and not os.path.realpath(f.filename).startswith(_LIBRARY_DIRS)]
    f = (mine or frames)[-1] if frames else None
    if f is None:
        return ""
    where = _("your line {n}") if mine else _("line {n}")
    return f" ({where.format(n=f.lineno)}: `{(f.line or '').strip()}`)"


STATUSES = ("ok", "not attempted", "error", "timeout", "reference")   # what run_learner says of a run


@dataclass
class Outcome:
    """What the learner's function did on the cases: its outputs (and inputs afterwards, to see in-place
    edits) for every case it finished, or why it stopped. Built in the learner's process or a worker's."""
    outputs: list = field(default_factory=list)
    inputs_after: list = field(default_factory=list)      # (args, kwargs) per finished case
    status: str = "ok"              # ok / not attempted / error / timeout / reference
    error: str = ""                 # for "error": "ZeroDivisionError: division by zero (your line 3: `1 / 0`)"
    ignored_limit: bool = False     # for "timeout": the function swallowed the first stop


def run_learner(ex: Exercise, fn: Callable, cases: list[Case],
                keep: Callable[[Any, tuple], tuple[Any, Any]] | None = None) -> Outcome:
    """Call `fn` on every case (fresh copies of the inputs), with the exercise's references disabled and its
    time limit; never raises for anything the learner's code does (KeyboardInterrupt aside). `keep(output,
    (args, kwargs))` -> (what `outputs` keeps, what `inputs_after` keeps), called as each call returns (the
    grading worker copies both there, so a later call cannot change an earlier output); default: the
    objects themselves."""
    out, i = Outcome(), 0
    keep = keep or (lambda got, after: (got, after))
    with time_limit(ex.time_limit) as clock:
        try:
            for i, case in enumerate(cases):
                args, kwargs = clone_args(case)
                with forbid(ex.forbidden):
                    try:
                        clock.armed = True
                        got = fn(*args, **kwargs)
                    finally:
                        clock.armed = False
                if clock.fired:                      # the stop was swallowed, yet the function returned
                    raise TimeLimit()
                got, after = keep(got, (args, kwargs))
                out.outputs.append(got)
                out.inputs_after.append(after)
        except TimeLimit:
            out.status = "timeout"
        except NotImplementedError as e:
            if i == 0:
                out.status = "not attempted"
            else:
                out.status, out.error = "error", f"NotImplementedError: {e}{_learner_line(e.__traceback__)}"
        except (Exception, SystemExit) as e:         # SystemExit: exit() in the learner's code
            if str(e) == REFERENCE_CALLED:
                out.status = "reference"
            else:
                out.status = "error"
                what = _("called exit()") if isinstance(e, SystemExit) else _("raised {error}").format(
                    error=f"{type(e).__name__}: {e}")
                out.error = f"{what}{_learner_line(e.__traceback__)}"
        out.ignored_limit = clock.stops > 1
    return out


def named_mistakes(ex: Exercise, cases: list[Case], outputs: list) -> list[str]:
    """The known mistakes the learner's function behaves exactly like on every case it finished. Naming one
    on the smallest failing case alone would mislead: a degenerate case (one key, one row) or a NaN can make
    several different functions agree there."""
    names = []
    for name, buggy in ex.mistakes.items():
        try:
            for case, got in zip(cases, outputs):
                args, kwargs = clone_args(case)
                if _compare(ex, got, buggy(*args, **kwargs), case) is not None:
                    break
            else:
                names.append(name)
        except Exception:
            continue
    return names


def exercise_cases(ex: Exercise, seeds: Iterable[int] | None = None) -> list[Case]:
    """The fixed edge cases, then one random case per seed (0 .. n_random - 1 unless given)."""
    seeds = range(ex.n_random) if seeds is None else seeds
    randoms = [ex.random_case(s) for s in seeds]
    for i, case in enumerate(randoms, 1):             # "random #3: ...": numbered 1, 2, 3 (the seeds are recorded)
        case.name = re.sub(r"^random #\d+", f"random #{i}", case.name)
        case.group = case.group or "random"
    edges = list(ex.edge_cases())
    for case in edges:
        case.group = case.group or "edge"
    return edges + randoms


HIDDEN: dict[str, list[Callable[[], list[Case]]]] = {}    # exercise -> makers of its hidden cases (grader only)
HIDDEN_FILES: dict[str, str] = {}                           # a hidden-cases file (resolved path) -> its module


def load_hidden(*files: str | os.PathLike) -> None:
    """Import files of hidden cases (`add_hidden_cases(...)` calls) into this process only: the class grader's.
    They are never named to a worker (unlike `load_exercises`' files), so no worker imports them."""
    for f in files:
        _import_file(Path(f).expanduser().resolve(), "hidden", HIDDEN_FILES, f"no file of hidden cases {f}")


def add_hidden_cases(name: str, make: Callable[[], list[Case]]) -> None:
    """Cases for exercise `name` that only the class grader runs: `make()` returns them. Call it from a file of
    hidden cases (an assignment's `hidden = [...]`), which only the grader's process imports."""
    HIDDEN.setdefault(name, []).append(make)


def hidden_cases(name: str) -> list[Case]:
    """The hidden cases of exercise `name`, each in the group "hidden"."""
    cases = [c for make in HIDDEN.get(name, []) for c in make()]
    for c in cases:
        c.group = "hidden"
    return cases


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
    return f"'{case.name}'"


def _partial(ex: Exercise, cases: list[Case], failed: set[int], n_done: int) -> float | None:
    """The share of the points earned when the exercise splits them over groups of cases (a case's name, else
    its group): a group earns its points when every one of its cases passed; None without `partial`."""
    if not ex.partial:
        return None
    total = sum(ex.partial.values()) or 1.0
    earned = 0.0
    for key, points in ex.partial.items():
        members = [i for i, c in enumerate(cases) if (c.name == key if key in {x.name for x in cases} else c.group == key)]
        if members and all(i < n_done and i not in failed for i in members):
            earned += points
    return earned / total


def malformed(outcome: Outcome, n_cases: int) -> str | None:
    """Why `outcome` cannot be judged (None: it can): a status outside STATUSES, or counts that do not fit its
    status and the `n_cases` cases sent ("ok": one output and one inputs_after per case; "error", "timeout",
    "reference": one per case before the one that stopped it; "not attempted": none)."""
    n = len(outcome.outputs) if isinstance(outcome.outputs, list) else -1
    if n_cases == 0:
        return _("the exercise has no cases to run")
    if outcome.status not in STATUSES:
        return _("the notebook's process sent an unknown status")
    if not isinstance(outcome.inputs_after, list) or len(outcome.inputs_after) != n:
        return _("the notebook's process sent {n} outputs and {m} inputs for {total} cases").format(
            n=n, m=len(outcome.inputs_after) if isinstance(outcome.inputs_after, list) else -1, total=n_cases)
    fits = {"ok": n == n_cases, "not attempted": n == 0}.get(outcome.status, 0 <= n < n_cases)
    if not fits:
        return _("the notebook's process sent {n} outputs for {total} cases (status {status})").format(
            n=n, total=n_cases, status=outcome.status)
    return None


def _inputs_problem(case: Case, after) -> str | None:
    """None when `after` is (args, kwargs) with the structure of the case's inputs (see structure_problem)."""
    if not isinstance(after, (tuple, list)) or len(after) != 2:
        return _("its inputs afterwards are missing")
    args, kwargs = after
    return structure_problem(args, tuple(case.args)) or structure_problem(kwargs, dict(case.kwargs))


def judge(ex: Exercise, cases: list[Case], outcome: Outcome, show_hidden: bool = False) -> Result:
    """Compare what the learner's function returned with the reference on each case; report the smallest
    failing case (by input size, then order), naming a known mistake where the function behaves like it.
    Hidden cases (group "hidden") are counted, never shown: their names, values and errors stay out of the
    message, and a mistake is named on them only with `show_hidden`."""
    problem = malformed(outcome, len(cases))
    if problem is not None:
        return Result(ex.name, ex.points, False, "error", problem, 0)
    n_done = len(outcome.outputs)
    n_hidden = sum(c.group == "hidden" for c in cases)
    if outcome.status == "not attempted":
        return Result(ex.name, ex.points, False, "not attempted",
                      _("not attempted yet: replace `raise NotImplementedError` with your code."), 1)
    if outcome.status == "reference":
        return Result(ex.name, ex.points, False, "error", _("your function called the reference implementation it "
                      "is compared with; write it yourself from torch operations."), n_done + 1)
    failed: set[int] = set()
    failures: list[tuple[int, int, Case, str]] = []
    for i, (case, got, after) in enumerate(zip(cases, outcome.outputs, outcome.inputs_after)):
        args, kwargs = clone_args(case)
        with torch.no_grad():
            expected = ex.reference(*args, **kwargs)
        shape = structure_problem(got, expected) or _inputs_problem(case, after)
        if shape is not None:                         # not the reference's kind of output: nothing to compare
            if case.group == "hidden":                # pass/fail only: not even the kind of output
                msg = _("your function's output on a hidden case is not what the exercise returns (hidden cases "
                        "are not shown).")
            else:
                msg = _("your function's output on case {case} is not what the exercise returns: {problem}.").format(
                    case=_where(case), problem=shape)
            return Result(ex.name, ex.points, False, "error", msg, i + 1)
        try:
            problem = _compare(ex, got, expected, case) or _modified_inputs(ex, case, after)
        except Exception as e:                        # an exercise's own compare meeting an odd (well-formed) output
            problem = _("the output could not be compared ({error})").format(error=type(e).__name__)
        if problem is not None:
            failures.append((_size(case), i, case, problem))
            failed.add(i)
    fraction = _partial(ex, cases, failed, n_done)
    if outcome.status == "timeout":
        msg = _("stopped after {seconds} s (an infinite loop, or a Python loop over every element?).").format(
            seconds=f"{ex.time_limit:g}")
        if outcome.ignored_limit:
            msg += _(" Your function kept running after the first stop: a bare `except:` (or `except "
                     "BaseException`) swallows it; catch only the exceptions you expect.")
        return Result(ex.name, ex.points, False, "timeout", msg, n_done + 1, fraction)
    if outcome.status == "error" and cases[n_done].group != "hidden":
        msg = _("your function {error} on case {case}.").format(error=outcome.error, case=_where(cases[n_done]))
        return Result(ex.name, ex.points, False, "error", msg, n_done + 1, fraction)
    # an error on a hidden case (every public case ran before it: they are sent first) reads as a failed hidden
    # case does: the public cases' verdict, then the partial credit; nothing of the case or of the error
    raised = outcome.status == "error"
    public = [f for f in failures if f[2].group != "hidden"]
    hidden = len(failures) - len(public)
    if failures or raised:
        n_public = len(cases) - n_hidden
        if public:
            case, problem = min(public, key=lambda f: (f[0], f[1]))[2:]
            msg = _("FAILED {failed} of {total} cases. Smallest failing case {case}: {problem}.").format(
                failed=len(public), total=n_public, case=_where(case), problem=problem)
        else:
            msg = _("passed the {total} public cases.").format(total=n_public)
        if hidden:
            msg += " " + _("{failed} of {total} hidden case(s) failed (hidden cases are not shown).").format(
                failed=hidden, total=n_hidden)
        if raised:
            said = _("your function raised an error on a hidden case (hidden cases are not shown).")
            msg += " " + said[:1].upper() + said[1:]
        shown = bool(public) or (show_hidden and hidden > 0)     # a mistake or hint only where a failure shows
        mistakes = named_mistakes(ex, cases, outcome.outputs) if shown else []
        if mistakes:
            msg += "\n" + _("Your output equals a known mistake: {mistakes} (on every case).").format(
                mistakes=_("; or ").join(_(m) for m in mistakes))
        if ex.hint and shown:
            msg += "\n" + _("Hint: {hint}").format(hint=_(ex.hint))
        if fraction:
            msg += "\n" + _("Partial credit: {share} of the points.").format(share=f"{fraction:.0%}")
        return Result(ex.name, ex.points, False, "error" if raised else "failed", msg, n_done + int(raised), fraction,
                      mistakes=mistakes)
    return Result(ex.name, ex.points, True, "passed", _("passed all {total} cases. {points} point(s).").format(
        total=n_done, points=ex.points), n_done, fraction)


def exercise(name: str) -> Exercise | Question:
    """The registered exercise `name` (importing every chapter's exercises first if needed)."""
    if name not in REGISTRY:
        load_exercises()
    if name not in REGISTRY:
        raise KeyError(_("no exercise named {name}; known: {known}").format(name=repr(name), known=sorted(REGISTRY)))
    return REGISTRY[name]


def check(name: str, fn: Callable | Any) -> Result:
    """Grade `fn` against exercise `name` (or the value `fn` against question `name`), print the verdict, and
    return a `Result`."""
    try:
        ex = exercise(name)
    except KeyError as e:
        msg = e.args[0]
        if get_mode() != "learner":
            raise
        print(f"[{_('FAIL')}] {msg}")                       # learner mode: never raise, so "Run All" finishes
        return Result(name, 0, False, "error", msg)
    t0 = time.perf_counter()
    if isinstance(ex, Question):
        result = judge_question(ex, plain(fn))
    else:
        cases = exercise_cases(ex)
        result = judge(ex, cases, run_learner(ex, fn, cases))
    mark = _("PASS") if result.passed else (_("TODO") if result.status == "not attempted" else _("FAIL"))
    print(f"[{mark}] {ex.name} ({_(ex.title)}): {result.message} [{time.perf_counter() - t0:.1f}s]")
    mode = get_mode()
    if mode == "strict" and not result.passed:
        raise AssertionError(f"{name}: {result.message}")
    if mode == "blank" and result.status != "not attempted":
        raise AssertionError(f"{name}: expected the untouched stub (not attempted), got {result.status}: {result.message}")
    return result


