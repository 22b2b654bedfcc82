"""Pytest set-up for the whole repository.

* Solution notebooks are regenerated from notebooks/src into build/solutions, only when this run
  collects notebooks (`pytest` from the root, `pytest notebooks/ build/solutions/`, a path to an .ipynb);
  `pytest tests/test_moe.py` builds nothing and needs neither jupytext nor nbval.
* Notebooks run under nbval (--nbval-lax: every cell must run without error; outputs are not compared)
  in small mode; learner notebooks with TFORMER_GRADE=blank (each stub must fail gracefully),
  solution notebooks with TFORMER_GRADE=strict (each solution must pass).
* With TFORMER_REUSE_BOOK=1 (`make test` sets it after `make book`), a learner notebook whose exact code
  ran without error in the site's build, against the same tformer sources (tools/book.py's jupyter-cache),
  is not run a second time; the summary lists them. The solution notebooks always run here.
* Without nbval installed (a machine with only the runtime dependencies), its options in pyproject's
  addopts are accepted and ignored, and no notebook is collected.
* At the end, each notebook's total run time is listed.
* `make test` runs two pytest-xdist workers (`-n 2 --dist loadfile`: a notebook's cells stay in one worker, in
  order); the controller builds the solutions before the workers start, and sums the notebooks' times.
"""
from __future__ import annotations

import importlib.util
import os
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = ROOT / "build" / "solutions"
HAVE_NBVAL = importlib.util.find_spec("nbval") is not None
_times: dict[str, float] = defaultdict(float)
_reused: list[str] = []

os.environ.setdefault("TFORMER_SMALL", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def pytest_addoption(parser):
    if not HAVE_NBVAL:  # keep pyproject's addopts valid; nothing runs notebooks then
        group = parser.getgroup("nbval", "nbval is not installed: notebooks are not collected")
        group.addoption("--nbval-lax", action="store_true")
        group.addoption("--nbval-current-env", action="store_true")
        group.addoption("--nbval-cell-timeout", default=None)


def _collects_notebooks(args: list[str]) -> bool:
    """Does one of these collection arguments reach a notebook (learner or solution)?"""
    for arg in args:
        path = Path(arg.split("::")[0]).resolve()
        if path.suffix == ".ipynb" or path in (NOTEBOOKS, SOLUTIONS):
            return True
        if path in SOLUTIONS.parents or path in NOTEBOOKS.parents:
            return True
        if SOLUTIONS in path.parents or NOTEBOOKS in path.parents:
            return True
    return False


def _worker(config) -> bool:
    """Is this a pytest-xdist worker (`pytest -n 2`)? The controller has built the solutions before it starts."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    if not HAVE_NBVAL or _worker(config) or not _collects_notebooks(config.args):
        return
    from tools.notebooks import build
    existed = SOLUTIONS.exists()
    build(SOLUTIONS, solutions=True)
    # testpaths drops folders that do not exist yet: add the one just written
    if not existed and config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        config.args.append(str(SOLUTIONS.relative_to(ROOT)))


def _executed_by_book(path: Path) -> bool:
    """Did `make book` run this learner notebook's code, against today's tformer, without an error?
    The site's copy (build/book_src/chapters) adds figure captions as cell metadata, which jupyter-cache
    hashes too: match that copy, after checking that its code is this notebook's code."""
    try:
        import nbformat
        from jupyter_cache import get_cache
        from tools.book import STAGE, cache_dir
    except ImportError:
        return False
    cache, staged = cache_dir(), STAGE / "chapters" / path.name
    if not (cache / "global.db").exists() or not staged.exists():
        return False
    ours, site = (nbformat.read(p, as_version=4) for p in (path, staged))
    code = lambda nb: [c.source for c in nb.cells if c.cell_type == "code"]   # noqa: E731
    if code(ours) != code(site):
        return False
    try:
        get_cache(str(cache)).match_cache_notebook(site)
    except KeyError:
        return False
    return True


def pytest_ignore_collect(collection_path, config):
    if (os.environ.get("TFORMER_REUSE_BOOK") == "1" and collection_path.suffix == ".ipynb"
            and collection_path.parent == NOTEBOOKS and _executed_by_book(collection_path)):
        _reused.append(collection_path.name)
        return True
    return None


_GRADE = os.environ.get("TFORMER_GRADE")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.path.suffix == ".ipynb":  # read by the kernel nbval starts for this notebook
        os.environ["TFORMER_GRADE"] = "strict" if SOLUTIONS in item.path.parents else "blank"


def pytest_runtest_teardown(item, nextitem):
    """Put TFORMER_GRADE back after each notebook cell: the tests an xdist worker runs next, in the same
    process, must not inherit a notebook's grading mode (their subprocesses would raise where they print)."""
    if item.path.suffix == ".ipynb":
        if _GRADE is None:
            os.environ.pop("TFORMER_GRADE", None)
        else:
            os.environ["TFORMER_GRADE"] = _GRADE


def pytest_runtest_logreport(report):
    """Each notebook's run time, summed over its cells: in the process that reports (xdist's controller)."""
    path = report.nodeid.split("::")[0]
    if report.when == "call" and path.endswith(".ipynb"):
        _times[path] += report.duration


def pytest_terminal_summary(terminalreporter, config):
    if not _reused and os.environ.get("TFORMER_REUSE_BOOK") == "1" and getattr(config.option, "numprocesses", None):
        # with xdist (`-n 2`) the workers collected, not this process: ask the same question here
        _reused.extend(p.name for p in sorted(NOTEBOOKS.glob("*.ipynb")) if _executed_by_book(p))
    if _reused:
        terminalreporter.section("learner notebooks not rerun")
        terminalreporter.write_line(f"{len(_reused)} ran without error in `make book` (same code, same tformer; "
                                    f"build/book_cache): {', '.join(sorted(_reused))}")
    if _times:
        terminalreporter.section("notebook run times (small mode)")
        for name, sec in sorted(_times.items()):
            terminalreporter.write_line(f"{sec:7.1f} s  {name}")
