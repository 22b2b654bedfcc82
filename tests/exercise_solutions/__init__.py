"""Independent solutions to every graded exercise, one module per chapter (`chNN.py` defines `SOLUTIONS`,
a dict exercise name -> function). They are written from the formulas, not from tformer, and
tests/test_exercises.py runs each through the checker. A new exercise slots in by adding its solution to
its chapter's module (or a new `chNN.py`): the suite fails for any registered exercise without one."""
from __future__ import annotations

import importlib
import pkgutil

SOLUTIONS: dict = {}
for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    for _name, _fn in importlib.import_module(f"{__name__}.{_m.name}").SOLUTIONS.items():
        if _name in SOLUTIONS:
            raise ValueError(f"two independent solutions for {_name!r}")
        SOLUTIONS[_name] = _fn
