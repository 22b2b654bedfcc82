"""`tformer grade PATH`: run notebooks headless and score their exercises.

    tformer grade notebooks/                  # every NN_*.ipynb in the folder, in order
    tformer grade notebooks/01_attention.ipynb --json report.json

Each notebook runs in a fresh kernel (nbclient) in learner mode, so a failing exercise or a cell that
raises does not stop the run (later cells still run). Every `check(...)` appends its result to the
JSON-lines file named by the environment variable TFORMER_GRADE_REPORT; this command sets it, reads it
back, and prints one table per chapter (exercise, points, passed) with a total. Exercises registered for
a chapter that never reached `check` (a cell above raised, or the check cell was deleted) are listed as
"not run". The same table is written as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

_CHAPTER = re.compile(r"^(\d\d)[a-z]?_")


@dataclass
class Row:
    exercise: str
    points: int
    passed: bool
    status: str        # passed / failed / not attempted / error / timeout / not run
    message: str = ""


@dataclass
class NotebookReport:
    notebook: str
    chapter: str | None                    # "ch01" from "01_attention.ipynb"
    rows: list[Row] = field(default_factory=list)
    cell_errors: list[str] = field(default_factory=list)   # cells that raised (first line of each)
    seconds: float = 0.0

    @property
    def earned(self) -> int:
        return sum(r.points for r in self.rows if r.passed)

    @property
    def possible(self) -> int:
        return sum(r.points for r in self.rows)


def find_notebooks(path: Path) -> list[Path]:
    """A notebook, or every `NN_*.ipynb` directly in a folder (sorted by chapter)."""
    if path.is_file():
        if path.suffix != ".ipynb":
            raise ValueError(f"tformer grade: {path} is not a notebook (.ipynb)")
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.glob("*.ipynb") if _CHAPTER.match(p.name))
        if not found:
            raise ValueError(f"tformer grade: no chapter notebooks (NN_name.ipynb) in {path}")
        return found
    raise FileNotFoundError(f"tformer grade: {path} does not exist")


def _chapter(nb_path: Path) -> str | None:
    m = _CHAPTER.match(nb_path.name)
    return f"ch{m.group(1)}" if m else None


def exercises_of(nb_path: Path) -> list[str]:
    """The exercises a notebook owes, in registration (= notebook) order: those registered with its stem as
    `notebook`, else those of its chapter (name prefix chNN.) that name no notebook."""
    from .core import REGISTRY
    from . import exercises  # noqa: F401  (registers every chapter's exercises)
    stem, chapter = Path(nb_path).stem, _chapter(Path(nb_path))
    return [n for n, ex in REGISTRY.items()
            if ex.notebook == stem or (not ex.notebook and chapter and n.startswith(chapter + "."))]


def run_notebook(nb_path: Path, timeout: int = 600, small: bool = True) -> NotebookReport:
    """Execute one notebook headless; collect the `check` results it recorded."""
    try:
        import nbclient
        import nbformat
    except ImportError as e:
        raise ValueError(f"tformer grade needs nbclient, nbformat and ipykernel ({e}); install them with "
                         "`pip install -e '.[dev]'` (or `make install`)") from None

    from .core import REGISTRY
    from . import exercises  # noqa: F401  (registers every chapter's exercises)

    nb = nbformat.read(nb_path, as_version=4)
    chapter = _chapter(nb_path)
    report = NotebookReport(str(nb_path), chapter)
    with tempfile.TemporaryDirectory() as tmp:
        results_file = Path(tmp) / "results.jsonl"
        env = {"TFORMER_GRADE_REPORT": str(results_file), "TFORMER_GRADE": "learner",
               "TFORMER_SMALL": "1" if small else "0", "MPLBACKEND": "Agg", "TQDM_DISABLE": "1"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)                     # the kernel inherits this process's environment
        t0 = time.perf_counter()
        try:
            client = nbclient.NotebookClient(nb, timeout=timeout, allow_errors=True,
                                             resources={"metadata": {"path": str(nb_path.parent.resolve())}})
            client.execute()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        report.seconds = time.perf_counter() - t0
        recorded = []
        if results_file.exists():
            recorded = [json.loads(line) for line in results_file.read_text().splitlines() if line.strip()]
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                report.cell_errors.append(f"{out.get('ename')}: {out.get('evalue', '')}".splitlines()[0][:200])
    latest = {r["exercise"]: r for r in recorded}   # a check run twice counts once (the last run)
    expected = exercises_of(nb_path)
    for name in expected + [n for n in latest if n not in expected]:
        r = latest.get(name)
        if r is None:
            report.rows.append(Row(name, REGISTRY[name].points, False, "not run",
                                   "check(...) never ran for this exercise"))
        else:
            report.rows.append(Row(name, r["points"], r["passed"], r["status"], r["message"]))
    return report


def format_table(reports: list[NotebookReport]) -> str:
    lines = []
    for rep in reports:
        lines.append(f"{rep.chapter or '?'}  {Path(rep.notebook).name}  ({rep.seconds:.0f} s)")
        lines.append(f"  {'exercise':<28} {'points':>6}  {'passed':<6}  status")
        for r in rep.rows:
            lines.append(f"  {r.exercise:<28} {r.points:>6}  {'yes' if r.passed else 'no':<6}  {r.status}")
        for err in rep.cell_errors:
            lines.append(f"  cell error: {err}")
        lines.append(f"  {'chapter total':<28} {rep.earned:>3}/{rep.possible:<3}")
        lines.append("")
    earned, possible = sum(r.earned for r in reports), sum(r.possible for r in reports)
    lines.append(f"TOTAL {earned}/{possible} points")
    return "\n".join(lines)


def to_json(reports: list[NotebookReport]) -> dict:
    return {
        "total": {"earned": sum(r.earned for r in reports), "possible": sum(r.possible for r in reports)},
        "notebooks": [{"notebook": r.notebook, "chapter": r.chapter, "seconds": round(r.seconds, 1),
                       "earned": r.earned, "possible": r.possible, "cell_errors": r.cell_errors,
                       "exercises": [asdict(row) for row in r.rows]} for r in reports],
    }


def grade(path: Path, json_path: Path | None = None, timeout: int = 600, small: bool = True) -> dict:
    """Run every notebook under `path`, print the table, write JSON (if json_path); return the JSON dict."""
    reports = [run_notebook(p, timeout, small) for p in find_notebooks(Path(path))]
    print(format_table(reports))
    data = to_json(reports)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {json_path}")
    return data


def _main(args: argparse.Namespace) -> int:
    try:
        data = grade(args.path, args.json, args.timeout, small=not args.full)
    except (FileNotFoundError, ValueError) as e:
        print(e)
        return 2
    t = data["total"]
    return 1 if args.require_all and t["earned"] < t["possible"] else 0


def add_cli(sub) -> None:
    p = sub.add_parser("grade", help="run notebooks headless and score their exercises",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a notebook, or a folder of NN_name.ipynb notebooks")
    p.add_argument("--json", type=Path, default=Path("grade-report.json"),
                   help="where to write the JSON report (default: grade-report.json)")
    p.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    p.add_argument("--full", action="store_true", help="run in full mode (default: small mode, TFORMER_SMALL=1)")
    p.add_argument("--require-all", action="store_true", help="exit 1 unless every exercise passed")
    p.set_defaults(func=_main)
