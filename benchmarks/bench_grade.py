"""How long `tformer class grade CLASS --out OUT` takes for a class, and whether its verdicts equal a full run.

    python benchmarks/bench_grade.py --students 60                 # 60 students x every chapter notebook
    python benchmarks/bench_grade.py --students 60 --realistic     # a fifth of them edited a heavy experiment cell
    python benchmarks/bench_grade.py --students 4 --sample 3       # a quick look

It builds a class in a temporary folder from the solution notebooks (`python -m tools.notebooks build
--solutions`) and the learner notebooks (`notebooks/`): student k hands in, by k mod 4, the solutions, the
untouched learner notebooks, the solutions with one known mistake per exercise injected (the definition cell
replaced by the exercise's registered mistake, so the checker must name it), or a mix of the three drawn with
seed k. With --realistic, every fifth student also edited one heavy experiment cell of one notebook (the
longest released cell the exercises do not need, one chapter per student in turn), so that cell and what it
needs run. It grades the class (the fast path, workers forked from a warm process), prints the seconds per
notebook by chapter and the total wall time, then grades a sample of the notebooks again the way `tformer grade
NOTEBOOK` does (every cell, a fresh process each) with the seeds recorded in grades.json, and prints how many
verdicts (status and named mistake, per exercise) agree.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from tformer.grading import REGISTRY  # noqa: E402
from tformer.grading.classroom import cells as cellplan, gradebook, notebooks, run  # noqa: E402
from tformer.grading import load_exercises  # noqa: E402
from tformer.grading.classroom.runner import run_notebook  # noqa: E402
from tformer.grading.classroom.settings import Run, RunSettings  # noqa: E402
from tools.notebooks import build  # noqa: E402

load_exercises()                                   # registers every chapter

CHECK = re.compile(r"""check\(\s*["']([\w.]+)["']\s*,\s*(\w+)\s*\)""")


def _code(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def _inject(nb, name: str, mistake: str) -> bool:
    """Replace the definition cell of the function checked as `name` by the registered mistake."""
    cells = _code(nb)
    fn = next((m.group(2) for c in cells for m in CHECK.finditer(c.source) if m.group(1) == name), None)
    cell = next((c for c in cells if fn and re.search(rf"^def {fn}\(", c.source, re.M)), None)
    if cell is None:
        return False
    cell.source = (f"from tformer.grading.core import REGISTRY as _R\n"
                   f"{fn} = _R[{name!r}].mistakes[{mistake!r}]   # a known mistake, injected\n")
    return True


def cell_times(sol_dir: Path, root: Path) -> dict[str, dict[int, float]]:
    """Seconds each code cell of the solution notebooks takes (every cell run once, in the warm workers;
    kept in ROOT/cell-times.json for the next run with the same --keep)."""
    cached = root / "cell-times.json"
    if cached.exists():
        return {stem: {int(i): s for i, s in t.items()} for stem, t in json.loads(cached.read_text()).items()}
    one = root / "timing" / "teacher"
    one.mkdir(parents=True, exist_ok=True)
    for nb in sol_dir.glob("*.ipynb"):
        (one / nb.name).write_bytes(nb.read_bytes())
    t0 = time.perf_counter()
    run.grade_class(one.parent, root / "timing-out", Run(settings=RunSettings(skip=False)), progress=False,
                    log=lambda *a: None)
    journal = gradebook.Journal(root / "timing-out" / "journal.jsonl")
    journal.close()
    times = {stem: {int(i): s for i, s in rec["report"]["cell_seconds"].items()} for (_, stem), rec in journal.records.items()}
    cached.write_text(json.dumps(times))
    print(f"timed every cell of the solution notebooks in {time.perf_counter() - t0:.0f} s "
          f"(the whole course, every cell, warm workers)")
    return times


def _heavy_cell(stem: str, nb, times: dict[int, float]) -> int | None:
    """The slowest released cell of a notebook that the exercises do not need (the fast path skips it)."""
    sources = [c.source for c in _code(nb)]
    plan = cellplan.plan(sources, cellplan.released_cells().get(stem))
    return max(plan.skipped, key=lambda i: (times.get(i, 0.0), len(sources[i])), default=None)


def build_class(root: Path, students: int, realistic: bool) -> tuple[Path, dict]:
    sol_dir = root / "solutions"
    if not sol_dir.exists():
        build(sol_dir, solutions=True)
    stems = sorted(p.stem for p in sol_dir.glob("*.ipynb"))
    times = cell_times(sol_dir, root) if realistic else {}
    learner_dir = ROOT / "notebooks"
    cls = root / "class"
    shutil.rmtree(cls, ignore_errors=True)
    kinds = {}
    for k in range(students):
        kind = ("solutions", "blank", "mistakes", "mixed")[k % 4]
        rng = random.Random(k)
        student = f"s{k:03d}"
        edited_stem = stems[(k // 5) % len(stems)] if realistic and k % 5 == 0 else None
        note = ""
        for j, stem in enumerate(stems):
            pick = kind if kind != "mixed" else rng.choice(["solutions", "blank", "mistakes"])
            src = learner_dir if pick == "blank" else sol_dir
            nb = nbformat.read(str(src / f"{stem}.ipynb"), as_version=4)
            if pick == "mistakes":
                for name in notebooks.exercises_of(Path(stem + ".ipynb")):
                    if REGISTRY[name].mistakes:
                        _inject(nb, name, rng.choice(sorted(REGISTRY[name].mistakes)))
            if stem == edited_stem:
                i = _heavy_cell(stem, nb, times.get(stem, {}))
                if i is not None:
                    _code(nb)[i].source += "\n# my own note on this experiment\n"
                    note = f" (cell {i + 1}, {times.get(stem, {}).get(i, 0.0):.1f} s with every cell run)"
            name = f"{stem} (1).ipynb" if (k + j) % 7 == 0 else f"{stem}.ipynb"     # a few LMS-style names
            (cls / student).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(cls / student / name))
        kinds[student] = kind + (f", edited {edited_stem}{note}" if edited_stem else "")
    if realistic:
        print("edited heavy cells: " + "; ".join(f"{s} {k}" for s, k in kinds.items() if "edited" in k))
    return cls, kinds


def _named(message: str) -> str:
    return message.split("known mistake: ")[1].split(" (on every case)")[0] if "known mistake: " in message else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--students", type=int, default=60)
    p.add_argument("--realistic", action="store_true", help="a fifth of the students edited one heavy experiment cell")
    p.add_argument("--sample", type=int, default=8, help="notebooks graded again with every cell run (0: none)")
    p.add_argument("--workers", type=int, default=None, help="default: the number of cores")
    p.add_argument("--keep", type=Path, default=None, help="build the class and write OUT here (default: a temporary folder)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        t0 = time.perf_counter()
        cls, kinds = build_class(root, args.students, args.realistic)
        print(f"built a class of {args.students} students in {time.perf_counter() - t0:.0f} s ({cls})")
        shutil.rmtree(root / "out", ignore_errors=True)          # a fresh run, not a resumed one
        t0 = time.perf_counter()
        grades = run.grade_class(cls, root / "out", Run(settings=RunSettings(workers=args.workers)))
        wall = time.perf_counter() - t0
        per_stem: dict[str, list[float]] = {}
        for s in grades["students"]:
            for nb in s["notebooks"]:
                per_stem.setdefault(nb["notebook"], []).append(nb["seconds"])
        n = sum(len(v) for v in per_stem.values())
        print(f"\n{'notebook':<28} {'n':>4} {'median s':>9} {'max s':>7}  (seconds in its workers, per notebook)")
        for stem, secs in sorted(per_stem.items()):
            print(f"{stem:<28} {len(secs):>4} {statistics.median(secs):>9.2f} {max(secs):>7.2f}")
        print(f"\ntotal: {n} notebooks of {args.students} students in {wall:.0f} s wall "
              f"({wall / max(1, n):.2f} s per notebook, {grades['settings']['workers']} workers"
              f"{', realistic' if args.realistic else ''})")
        if args.sample:
            rng = random.Random(0)
            chosen = []
            by_student = {s["student"]: s for s in grades["students"]}
            edited = [(s, nb) for s, kind in kinds.items() if "edited" in kind for nb in by_student[s]["notebooks"]
                      if kind.split("edited ")[1].startswith(nb["notebook"] + " ")]
            chosen += edited[: args.sample // 2]               # realistic: half the sample is edited notebooks
            for s in rng.sample(sorted(by_student), min(args.sample - len(chosen), len(by_student))):
                nb = rng.choice(by_student[s]["notebooks"])
                chosen.append((s, nb))
            agree = total = 0
            t0 = time.perf_counter()
            for student, nb in chosen:
                seeds = {e["exercise"]: {"cases": e["seeds"], "torch_seed": e["torch_seed"]}
                         for e in nb["exercises"] if e.get("torch_seed") is not None}
                full = {r.exercise: r for r in run_notebook(cls / student / nb["file"], timeout=600, seeds=seeds).rows}
                for e in nb["exercises"]:
                    r = full[e["exercise"]]
                    same = (r.status, _named(r.message)) == (e["status"], _named(e["message"]))
                    agree += same
                    total += 1
                    if not same:
                        print(f"  DIFFERENT {student} {e['exercise']}: fast {e['status']} {_named(e['message'])!r}"
                              f" / full {r.status} {_named(r.message)!r}")
                print(f"  {student} ({kinds[student]}) {nb['notebook']}: "
                      + ", ".join(f"{e['exercise']} {e['status']}" for e in nb["exercises"]))
            print(f"verdicts equal to a full run: {agree}/{total} exercises in {len(chosen)} sampled notebooks "
                  f"({time.perf_counter() - t0:.0f} s)")
            if agree != total:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
