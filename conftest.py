"""Pytest set-up for the whole repository.

* Solution notebooks are regenerated from notebooks/src into build/solutions before collection.
* Notebooks run under nbval (--nbval-lax: every cell must run without error; outputs are not compared)
  in small mode; learner notebooks with TFORMER_GRADE=blank (each stub must fail gracefully),
  solution notebooks with TFORMER_GRADE=strict (each solution must pass).
* At the end, each notebook's total run time is listed.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
SOLUTIONS = ROOT / "build" / "solutions"
_times: dict[str, float] = defaultdict(float)

os.environ.setdefault("TFORMER_SMALL", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _build_solutions() -> None:
    # at import, before pytest resolves testpaths, so build/solutions exists to be collected
    from tformer.notebooks import build
    build(SOLUTIONS, solutions=True)


_build_solutions()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.path.suffix == ".ipynb":  # read by the kernel nbval starts for this notebook
        os.environ["TFORMER_GRADE"] = "strict" if SOLUTIONS in item.path.parents else "blank"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    t0 = time.perf_counter()
    yield
    if item.path.suffix == ".ipynb":
        _times[str(item.path.relative_to(ROOT))] += time.perf_counter() - t0


def pytest_terminal_summary(terminalreporter):
    if _times:
        terminalreporter.section("notebook run times (small mode)")
        for name, sec in sorted(_times.items()):
            terminalreporter.write_line(f"{sec:7.1f} s  {name}")
