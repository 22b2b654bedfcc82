"""Answers that look alike: pairs of students whose function for an exercise is the same program once
names, comments, docstrings, type hints, whitespace and formatting are set aside (their ASTs compared),
and answers equal to the course's published solution. A report for the teacher, never a change of grade.
Questions are left out: their answers are values, which honest students share.

    answer_shapes   one notebook -> {exercise id: the normalized AST of the function handed to check}
    answers_of      a class -> what grades.json keeps of each answer (a hash of its shape, its size, stub?)
    flag_answers    those records -> {"pairs": [...], "reference": [...], "rule": ...}; `flag` does both

Not flagged: the untouched stub, answers too short to say anything (under MIN_NODES AST nodes: a one-line
mask is written the same way by honest students), and answers shared by more than COMMON of the students
who answered (the obvious solution). The published solutions are the functions of `notebooks/src/*.py`
next to the package; without them only the pairs are reported.
"""
from __future__ import annotations

import ast
import hashlib
import itertools
from collections import defaultdict
from pathlib import Path

from ..core import REGISTRY
from .notebooks import ROOT, check_calls, parse_cells, read_cells, released_notebooks

MIN_NODES = 30          # an answer shorter than this many AST nodes is not distinctive
COMMON = 0.2            # an answer shared by more than this share of the answering students (and > 2) is common
SOURCES = ROOT / "notebooks" / "src"                # the published solutions


class _Canon(ast.NodeTransformer):
    """Rename a function's own names (arguments, locals, inner functions) v0, v1, ... in order of first
    appearance; globals (torch, F, math) keep their names, since they change what the code does."""

    def __init__(self, own: set[str]):
        self.own, self.names = own, {}

    def _name(self, name: str) -> str:
        if name not in self.own:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node):
        node.arg, node.annotation = self._name(node.arg), None
        return node

    def visit_FunctionDef(self, node):
        node.name, node.returns = self._name(node.name), None
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:] or [ast.Pass()]                       # the docstring says nothing about the program
        node.body, node.decorator_list = body, []
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def _own_names(fn: ast.FunctionDef) -> set[str]:
    own = {fn.name}
    for node in ast.walk(fn):
        if isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own.add(node.name)
    return own


def shape(fn: ast.FunctionDef) -> tuple[str, int]:
    """(the function's normalized AST as text, its node count)."""
    fn = _Canon(_own_names(fn)).visit(ast.parse(ast.unparse(fn)).body[0])
    return ast.dump(fn, annotate_fields=False, include_attributes=False), sum(1 for _ in ast.walk(fn))


def graded_functions(sources: list[str]) -> dict[str, ast.FunctionDef]:
    """exercise id -> the function that was graded: the last top-level `def` of the name handed to check(...)
    in the cells before the first cell that calls that check (a redefinition after the check was not graded)."""
    trees = parse_cells(sources)                      # each cell parsed once, only those with `def ` or `check(`
    out = {}
    for ex, (at, name) in check_calls(sources, trees).items():
        if ex in REGISTRY and not REGISTRY[ex].takes_cases:
            continue                                  # a question's answer is a value, not a program
        for tree in reversed(trees[:at + 1]):
            defs = [n for n in (tree.body if tree else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.name == name]
            if defs:
                out[ex] = defs[-1]
                break
    return out


def _cells(path: Path) -> list[str]:
    try:
        return read_cells(path)
    except ValueError:                                # an unreadable notebook hands in nothing to compare
        return []


def answer_shapes(sources: list[str]) -> dict[str, tuple[str, int]]:
    """exercise id -> (normalized AST, nodes) of the function each check(...) call graded."""
    return {ex: shape(fn) for ex, fn in graded_functions(sources).items()}


def _published(stem: str, released: dict[str, list[str]]) -> tuple[dict, dict]:
    """(solution shapes, stub shapes) of a notebook: from notebooks/src and from the released notebooks."""
    solutions = {}
    src = SOURCES / f"{stem}.py"
    if src.exists():
        solutions = answer_shapes([src.read_text(encoding="utf-8")])
    return solutions, answer_shapes(released.get(stem, []))


def answers_of(subs, released_dirs: tuple[Path, ...] | None = None) -> dict[str, dict[str, dict]]:
    """student -> exercise -> {"shape": a hash of the normalized AST, "nodes", "stub", "reference"}: what
    grades.json keeps of each answer, enough to compare students across shards (`merge`)."""
    released: dict[str, list[str]] = defaultdict(list)
    for stem, paths in released_notebooks(released_dirs).items():
        for path in paths:
            released[stem] += _cells(path)
    published, out = {}, {}
    for sub in subs:
        mine = out.setdefault(sub.student, {})
        for stem, path in sorted(sub.notebooks.items()):
            if stem not in published:
                published[stem] = _published(stem, released)
            solutions, stubs = published[stem]
            for ex, (text, nodes) in sorted(answer_shapes(_cells(path)).items()):
                mine[ex] = {"shape": hashlib.sha256(text.encode()).hexdigest()[:16], "nodes": nodes,
                            "stub": ex in stubs and text == stubs[ex][0],
                            "reference": ex in solutions and text == solutions[ex][0]}
    return out


def flag_answers(answers: dict[str, dict[str, dict]]) -> dict:
    """Pairs of students with the same distinctive answer to an exercise, and answers equal to the published
    solution, from `answers_of`'s records (one class, or the shards of one merged)."""
    by_answer: dict[tuple[str, str], list[str]] = defaultdict(list)       # (exercise, shape) -> students
    answered: dict[str, int] = defaultdict(int)
    reference = []
    for student, exs in sorted(answers.items()):
        for ex, a in sorted(exs.items()):
            if a["stub"]:
                continue                                                 # untouched
            answered[ex] += 1
            if a["reference"]:
                reference.append({"exercise": ex, "student": student})
            if a["nodes"] >= MIN_NODES:
                by_answer[(ex, a["shape"])].append(student)
    pairs = []
    for (ex, _), students in sorted(by_answer.items(), key=lambda kv: (kv[0][0], kv[1])):
        if len(students) < 2 or len(students) > max(2, COMMON * answered[ex]):
            continue
        pairs += [{"exercise": ex, "students": [a, b]} for a, b in itertools.combinations(sorted(students), 2)]
    return {"pairs": pairs, "reference": sorted(reference, key=lambda r: (r["exercise"], r["student"])),
            "rule": (f"same AST after renaming the function's own names and dropping comments, docstrings and "
                     f"type hints; at least {MIN_NODES} nodes; not the stub; shared by at most "
                     f"{COMMON:.0%} of the students who answered (or 2)"),
            "published_solutions": SOURCES.is_dir()}


def flag(subs, released_dirs: tuple[Path, ...] | None = None) -> dict:
    """`flag_answers` of a class's submissions (`submissions.read_class`)."""
    return flag_answers(answers_of(subs, released_dirs))
