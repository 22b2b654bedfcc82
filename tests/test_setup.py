"""The set-up a newcomer relies on: one dependency list, notebooks in sync with their sources."""
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower()


def test_environment_yml_installs_what_pyproject_lists():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():   # lab, dev, book
        wanted |= set(extra)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {r for r in pip if not r.startswith("-e")}
    assert listed == wanted, f"only in environment.yml: {listed - wanted}; only in pyproject: {wanted - listed}"
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert python.replace(" ", "") == "python" + project["requires-python"]


def test_no_exact_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for v in project["optional-dependencies"].values() for r in v]
    assert not [r for r in reqs if "==" in r], "use version ranges, not exact pins"
    assert len({_name(r) for r in project["dependencies"]}) == len(project["dependencies"])


def test_learner_notebooks_are_generated_from_their_sources():
    pytest.importorskip("jupytext", reason="jupytext (the `dev` extra) builds notebooks from their sources")
    from tools.notebooks import stale
    assert stale() == [], "run `make notebooks` (python -m tools.notebooks build) and commit the result"


def test_learner_notebooks_have_no_solutions_and_no_outputs():
    import nbformat
    from tools.notebooks import sources
    for src in sources():
        nb = nbformat.read(ROOT / "notebooks" / f"{src.stem}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), src.stem
        text = "".join(c.source for c in code)
        assert "BEGIN SOLUTION" not in text
        first = nb.cells[0]
        assert first.cell_type == "markdown" and first.source.startswith("# Chapter"), src.stem
        if "### BEGIN SOLUTION" in src.read_text():
            assert "raise NotImplementedError" in text
            assert "check(" in first.source, f"{src.stem}: the first cell must say how to check an exercise"


def test_cli_runs():
    out = subprocess.run([sys.executable, "-m", "tformer", "--help"], capture_output=True, text=True, check=True)
    assert "tformer" in out.stdout
