"""A teacher's exercises as the hand-out ships them: data, no code.

`tformer handout` writes, in place of a teacher's module `week3.py`, its public file `week3.public.pt` beside
the notebooks (`public_path`). A learner's `load_exercises("week3.py")` finds no week3.py there and registers
the public exercises instead; `check` then judges the learner's function against the outputs frozen in the
file, by the same `judge` and `compare` as everywhere (the public Exercise's reference returns the frozen
output of the case it is given). The reference's code, the hidden cases and a question's answer stay with
the teacher: the class grader, which loads the teacher's module, alone holds them, and it grades the random
cases with fresh seeds, so the frozen ones are no answer key.

The file is a `torch.save` of builtins and tensors only, read with `torch.load(weights_only=True)`:

    {"format": "tformer-public", "version": 1,
     "exercises": [
       {"kind": "exercise", "name": "w03.double", "title": ..., "points": 3, "notebook": "w03_double",
        "hint": ..., "time_limit": 10.0, "atol": 1e-05, "rtol": 0.0001, "n_random": 5,
        "partial": {"edge": 1.0, ...}, "params": ["x"],            # the reference's parameter names
        "forbidden": ["torch.nn.functional.softmax", ...],          # disabled while the function runs
        "generic_compare": False,      # True: the teacher's own `compare` is code, left out; `compare` decides
        "cases": [{"name": "a single zero", "group": "edge", "seed": None,
                   "args": (tensor([0.]),), "kwargs": {},
                   "expected": tensor([0.]),                     # the reference's output
                   "mistakes": {"added 2 instead of doubling": tensor([2.])}},   # each named mistake's output
                  ...]},                # the edge cases, then the random ones at seeds 0 .. n_random - 1
       {"kind": "question", "name": "w03.q_double", "title": ..., "points": 1, "notebook": "w03_double",
        "question_kind": "number", "choices": ["A", "B", "C", "D"], "symbols": []}]}   # no answer, no mistakes

A mistake that raises or returns something the file cannot hold on some case is left out (it could not be
named on every case anyway). A question's check says whether the value is well formed (a number, one of the
letters, an expression of the declared symbols) and that it is graded by the teacher.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import torch

from .guards import dotted, resolve
from .questions import Question

FORMAT = "tformer-public"
VERSION = 1
SUFFIX = ".public.pt"


def public_path(module: str | Path) -> Path:
    """Where the public file of a teacher's module goes: week3.py -> week3.public.pt, beside it."""
    module = Path(module)
    return module.with_name(module.stem + SUFFIX)


# --- writing -----------------------------------------------------------------------------------------

class NotPublic(ValueError):
    """Something of an exercise the public file cannot hold (the message names the exercise and what)."""


def _frozen(x, what: str):
    """`x` as the file holds it (CPU tensors, numbers, strings, None, tuples, lists, dicts of str keys);
    NotPublic(`what`) for anything else."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        return torch.Tensor.as_subclass(t.cpu().clone(), torch.Tensor).requires_grad_(x.requires_grad and x.is_leaf)
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if type(x) in (tuple, list):
        return type(x)(_frozen(v, what) for v in x)
    if type(x) is dict and all(isinstance(k, str) for k in x):
        return {k: _frozen(v, what) for k, v in x.items()}
    return _not(x, what)


def _not(x, what: str):
    raise NotPublic(f"{what} is a {type(x).__name__}: a public file holds tensors, numbers, strings and "
                    f"tuples, lists and dicts of them")


def _exercise_entry(ex) -> dict:
    from .core import clone_args, exercise_cases
    cases = exercise_cases(ex)                 # the edge cases and the random ones at the learner's seeds
    entries = []
    for case in cases:
        where = f"{ex.name}, case {case.name!r}"
        args, kwargs = clone_args(case)
        with torch.no_grad():
            expected = ex.reference(*args, **kwargs)
        entries.append({"name": case.name, "group": case.group, "seed": case.seed,
                        "args": _frozen(tuple(case.args), f"{where}: an input"),
                        "kwargs": _frozen(dict(case.kwargs), f"{where}: an input"),
                        "expected": _frozen(expected, f"{where}: the reference's output"), "mistakes": {}})
    for mistake, buggy in ex.mistakes.items():
        try:
            outputs = []
            for case in cases:
                args, kwargs = clone_args(case)
                outputs.append(_frozen(buggy(*args, **kwargs), ""))
        except Exception:                       # it can never be named on every case: left out
            continue
        for entry, out in zip(entries, outputs):
            entry["mistakes"][mistake] = out
    try:
        params = list(inspect.signature(ex.reference).parameters)
    except (TypeError, ValueError):
        params = []
    return {"kind": "exercise", "name": ex.name, "title": ex.title, "points": int(ex.points),
            "notebook": ex.notebook, "hint": ex.hint, "time_limit": float(ex.time_limit), "atol": float(ex.atol),
            "rtol": float(ex.rtol), "n_random": int(ex.n_random),
            "partial": {str(k): float(v) for k, v in ex.partial.items()}, "params": params,
            "forbidden": dotted(ex.forbidden), "generic_compare": ex.compare is not None, "cases": entries}


def _question_entry(q) -> dict:
    return {"kind": "question", "name": q.name, "title": q.title, "points": int(q.points), "notebook": q.notebook,
            "question_kind": q.kind, "choices": list(q.choices), "symbols": list(q.symbols)}


def public_data(names: list[str]) -> dict:
    """The public file's content for the registered exercises and questions `names`."""
    from .core import REGISTRY
    return {"format": FORMAT, "version": VERSION,
            "exercises": [_question_entry(REGISTRY[n]) if isinstance(REGISTRY[n], Question)
                          else _exercise_entry(REGISTRY[n]) for n in names]}


def public_bytes(names: list[str]) -> bytes:
    """The public file of the registered exercises and questions `names`, as bytes, checked to read back with
    weights_only (as a learner's kernel reads it). NotPublic when an exercise's inputs or its reference's
    outputs are not plain data."""
    import io
    buf = io.BytesIO()
    torch.save(public_data(names), buf)
    try:
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    except Exception as e:                    # pragma: no cover (_frozen admits what weights_only reads)
        raise NotPublic(f"the public file does not read back with weights_only: {e}") from None
    return buf.getvalue()


def write_public(path: str | Path, names: list[str]) -> Path:
    """Write the public file of the registered exercises and questions `names` to `path` (public_bytes)."""
    path = Path(path)
    data = public_bytes(names)
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    part.replace(path)
    return path


# --- reading -----------------------------------------------------------------------------------------

def fingerprint(x):
    """A hashable key of `x` equal for equal inputs (a tensor by its dtype, shape and bytes: NaN included)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        return ("tensor", str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes())
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(fingerprint(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((str(k), fingerprint(v)) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))))
    return ("value", type(x).__name__, repr(x))


class _Frozen:
    """A public exercise's cases and the outputs frozen on them, found by their inputs."""

    def __init__(self, entries: list[dict]):
        self.index = {}
        for i, c in enumerate(entries):
            self.index.setdefault(fingerprint((tuple(c["args"]), dict(c["kwargs"]))), i)

    def lookup(self, outputs: list, args: tuple, kwargs: dict):
        """A copy of the output in `outputs` of the case whose inputs are `args`, `kwargs`."""
        i = self.index.get(fingerprint((tuple(args), dict(kwargs))))
        if i is None:
            raise KeyError("this input is not one of the public file's cases")
        return copy.deepcopy(outputs[i])


def _signature(params: list[str]) -> inspect.Signature:
    return inspect.Signature([inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params
                              if p.isidentifier()])


def _exercise(entry: dict):
    from .core import Case, Exercise, clone_args
    cases = [Case(c["name"], tuple(c["args"]), dict(c["kwargs"]), c["seed"], c["group"]) for c in entry["cases"]]
    frozen = _Frozen(entry["cases"])
    expected = [c["expected"] for c in entry["cases"]]
    mistakes = {m: [c["mistakes"][m] for c in entry["cases"]]
                for m in (entry["cases"][0]["mistakes"] if entry["cases"] else {})}

    def fresh(case):
        args, kwargs = clone_args(case)
        return dataclasses.replace(case, args=args, kwargs=kwargs)

    def reference(*args, **kwargs):
        return frozen.lookup(expected, args, kwargs)

    def random_case(seed):
        for case in cases:
            if case.group == "random" and case.seed == seed:
                return fresh(case)
        raise KeyError(f"{entry['name']}: the public file holds the random cases of seeds "
                       f"{[c.seed for c in cases if c.group == 'random']} only")

    def mistake(outputs):
        return lambda *args, **kwargs: frozen.lookup(outputs, args, kwargs)

    reference.__signature__ = _signature(entry.get("params", []))
    ex = Exercise(name=entry["name"], title=entry["title"], reference=reference,
                  edge_cases=lambda: [fresh(c) for c in cases if c.group == "edge"], random_case=random_case,
                  points=entry["points"], n_random=entry["n_random"], atol=entry["atol"], rtol=entry["rtol"],
                  hint=entry["hint"], mistakes={m: mistake(o) for m, o in mistakes.items()},
                  forbidden=resolve(entry["forbidden"]), time_limit=entry["time_limit"],
                  notebook=entry["notebook"], partial=dict(entry["partial"]))
    ex.forbidden.append((ex, "reference"))      # as a chapter's: calling the reference does not pass
    return ex


@dataclasses.dataclass
class PublicQuestion(Question):
    """A teacher's question as the hand-out ships it, without its answer (None) or its mistakes:
    `judge_question` says whether a value is well formed and that the teacher grades it."""
    answer: Any = None

    def __post_init__(self):
        self.choices = tuple(str(c).upper() for c in self.choices)
        self.symbols = tuple(self.symbols)


def _question(entry: dict) -> PublicQuestion:
    return PublicQuestion(name=entry["name"], title=entry["title"], kind=entry["question_kind"],
                          points=entry["points"], notebook=entry["notebook"], choices=tuple(entry["choices"]),
                          symbols=tuple(entry["symbols"]))


def load_public(path: str | Path) -> list[str]:
    """Register the exercises and questions of the public file `path` (read with weights_only: no code runs);
    return their names. ValueError on a file that is not one."""
    from .core import register
    data = torch.load(Path(path), weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tformer public exercise file (what `tformer handout` writes)")
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: public file version {data.get('version')!r}; this tformer reads {VERSION} "
                         f"(update tformer, or ask your teacher for a new hand-out)")
    names = []
    for entry in data["exercises"]:
        register(_question(entry) if entry["kind"] == "question" else _exercise(entry))
        names.append(entry["name"])
    return names
