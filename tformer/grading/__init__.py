"""Graded exercises: `check("ch01.attention", my_fn)` in a notebook; `tformer grade PATH` for a teacher.

core.py (the checker), exercises/ (each chapter's exercises), inputs.py (shared seeded inputs), cli.py
(`tformer grade`: one learner's notebooks, the grading loop), worker.py (the process that runs a notebook),
classroom.py (`tformer grade CLASS --out OUT`: a whole class), cells.py (the cells a class's notebooks must
run), sandbox.py (the warm process, the workers' limits), feedback.py (feedback pages, the class report,
the Canvas file).
"""
from .core import REGISTRY, Case, Exercise, Result, check, compare, get_mode, register, set_mode

__all__ = ["check", "Case", "Exercise", "Result", "REGISTRY", "register", "compare", "set_mode", "get_mode"]
