"""Graded exercises: `check("ch01.attention", my_fn)` in a notebook; `tformer grade PATH` for a teacher."""
from .core import REGISTRY, Case, Exercise, Result, check, compare, get_mode, register, set_mode

__all__ = ["check", "Case", "Exercise", "Result", "REGISTRY", "register", "compare", "set_mode", "get_mode"]
