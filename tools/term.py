"""A teacher's term, replayed through the commands as typed: `python -m tools.term` (`make term`).

Every step runs the `tformer` entry point in a subprocess from a folder outside the checkout, as a teacher
would, and checks the one principle behind them all: every file in OUT is what the latest command computed,
and no command disagrees with another. The gradebook is compared cell for cell with a prediction made here from
how each student's work was written (not from any grader output), after every command that writes one.

    author     `tformer exercise new` writes a teacher's exercise (w09.twice), given 3 points
    hand out   `tformer handout`: the hand-out holds no reference and no solution
    grade      a class of four with answers typed as learners type them ("(D)", "６４", "Ａ"), Moodle's file
    again      the same OUT with Canvas, then Moodle: one LMS file each time, the same gradebook, nothing regraded
    verify     `tformer class verify`: every verdict again, with the recorded seeds
    shards     two shards with an override of the teacher's exercise, then `tformer class merge`: the one run's book
    --only     an edit of the teacher's file, then `--only w09.twice`: only its notebooks again, the same book

Exit 0 when every check held; each failed check is one line, and the exit is 1. It takes a few minutes (it
grades a class twice); `make test` does not run it: tests/ checks each command apart.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))
from tools.notebooks import SRC, build_notebook  # noqa: E402

POINTS = {"ch01.softmax": 2, "ch01.attention": 3, "ch01.q_sharper_query": 1, "ch01.q_score_variance": 1,
          "ch01.q_saturation": 1, "w09.twice": 3}
ANSWERS = {"ch01.q_sharper_query": "D", "ch01.q_score_variance": 64, "ch01.q_saturation": "A"}
NO_SCALE = ("def my_attention(q, k, v, mask=None):\n    s = q @ k.transpose(-2, -1)\n"
            "    if mask is not None:\n        s = s.masked_fill(~mask, float('-inf'))\n"
            "    w = torch.softmax(s, dim=-1)\n    return w @ v, w\n")
W09 = ["import torch\nfrom tformer.grading import check, load_exercises\nload_exercises('week9.py')",
       "def my_twice(x):\n    raise NotImplementedError", 'check("w09.twice", my_twice)']
# each student: (chapter 1: None = not handed in, else {"attention": source or None (stub), answers by question},
#                w09: the body of my_twice or None (stub)), and the points predicted for each exercise
CLASS = {
    "ada": ({"attention": "solution", "answers": {"ch01.q_sharper_query": "(D)", "ch01.q_score_variance": "６４",
                                                  "ch01.q_saturation": "Ａ"}}, "2 * x"),
    "bob": ({"attention": NO_SCALE, "answers": {"ch01.q_sharper_query": "D.", "ch01.q_score_variance": "64.0",
                                                "ch01.q_saturation": "B"}}, "x + 2"),
    "cy": ({"attention": None, "answers": {}}, None),
    "dee": (None, "x * 2"),
}
PREDICTED = {
    "ada": {"ch01.softmax": 2, "ch01.attention": 3, "ch01.q_sharper_query": 1, "ch01.q_score_variance": 1,
            "ch01.q_saturation": 1, "w09.twice": 3},
    "bob": {"ch01.softmax": 2, "ch01.attention": 0, "ch01.q_sharper_query": 1, "ch01.q_score_variance": 1,
            "ch01.q_saturation": 0, "w09.twice": 0},
    "cy": {n: 0 for n in POINTS},
    "dee": {**{n: 0 for n in POINTS}, "w09.twice": 3},
}
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("  ok      " if ok else "  FAILED  ") + what, flush=True)
    if not ok:
        FAILED.append(what)


def tformer(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TFORMER_LANG", "PYTHONPATH")}
    env["PYTHONPATH"] = str(CHECKOUT)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tformer", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1800)
    print(f"$ tformer {' '.join(str(a) for a in args)}   (exit {proc.returncode}, {time.perf_counter() - t0:.0f} s)")
    if proc.returncode not in (0, 1):
        print("    " + (proc.stderr.strip().splitlines() or [""])[-1])
    return proc


def write_notebook(path: Path, sources: list[str]) -> None:
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in sources],
                                  metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def chapter1(spec: dict) -> list[str]:
    """Chapter 1 as a student hands it in: the learner form, with their attention and their answers."""
    cells = [c.source for c in build_notebook(SRC / "01_attention.py", False).cells if c.cell_type == "code"]
    solved = [c.source for c in build_notebook(SRC / "01_attention.py", True).cells if c.cell_type == "code"]
    out = []
    for mine, right in zip(cells, solved):
        if spec["attention"] is not None and right.startswith(("def my_softmax", "def my_attention")):
            mine = right if right.startswith("def my_softmax") or spec["attention"] == "solution" else spec["attention"]
        for name, typed in spec["answers"].items():
            if f'check("{name}"' in mine:
                mine = f"answer = {typed!r}\ncheck({name!r}, answer)"
        out.append(mine)
    return out


def solved_functions(nb: Path) -> list[str]:
    """The functions `my_*` of a notebook whose body does not raise NotImplementedError (a stub does)."""
    import ast
    import nbformat
    names = []
    for cell in nbformat.read(str(nb), as_version=4).cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("my_") and "NotImplementedError" not in \
                    ast.unparse(fn):
                names.append(fn.name)
    return names


def book(out: Path) -> dict[str, dict[str, str]]:
    head, *rows = list(csv.reader((out / "gradebook.csv").open(encoding="utf-8")))
    return {r[0]: dict(zip(head, r)) for r in rows}


def book_is_predicted(out: Path, step: str, overrides: dict | None = None) -> None:
    got = book(out)
    want = {s: {**p, **(overrides or {}).get(s, {})} for s, p in PREDICTED.items()}
    bad = [f"{s} {n}: {got.get(s, {}).get(n)!r} (predicted {v})" for s, p in want.items() for n, v in p.items()
           if got.get(s, {}).get(n) != str(v)]
    check(not bad, f"{step}: gradebook.csv is the prediction, cell for cell" + (f" ({'; '.join(bad[:4])})" if bad else ""))


def lms_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("*.csv") if p.name != "gradebook.csv")


def journal_lines(out: Path) -> int:
    return len((out / "journal.jsonl").read_text(encoding="utf-8").splitlines())


def term(root: Path) -> None:
    work = root / "work"
    work.mkdir()
    print("author")
    proc = tformer("exercise", "new", "w09.twice", root / "week9.py", cwd=work)
    check(proc.returncode == 0 and (root / "week9.py").is_file(), "tformer exercise new writes week9.py")
    week9 = root / "week9.py"
    write_notebook(root / "released" / "w09_twice.ipynb", W09)
    points = "\n".join(f'"{n}" = {p}' for n, p in POINTS.items())
    (root / "term.toml").write_text(f'notebooks = ["01_attention", "w09_twice"]\nexercises = ["week9.py"]\n'
                                    f'released = "released/"\n\n[points]\n{points}\n', encoding="utf-8")
    print("hand out")
    proc = tformer("handout", "--out", root / "handout", "--assignment", root / "term.toml", cwd=work)
    names = sorted(p.name for p in (root / "handout").iterdir()) if proc.returncode == 0 else []
    check("week9.public.pt" in names and "week9.py" not in names, f"the hand-out holds the public file, not the "
          f"teacher's module ({', '.join(names)})")
    solved = [f"{nb.name}: {fn}" for nb in (root / "handout").glob("*.ipynb") for fn in solved_functions(nb)]
    check(not solved, f"every exercise function in the hand-out is a stub ({', '.join(solved) or 'none solved'})")

    cls = root / "class"
    for student, (ch1, body) in CLASS.items():
        if ch1 is not None:
            write_notebook(cls / student / "01_attention.ipynb", chapter1(ch1))
        write_notebook(cls / student / "w09_twice.ipynb",
                       W09 if body is None else [W09[0], f"def my_twice(x):\n    return {body}", W09[2]])
    (root / "moodle.csv").write_text("First name,Last name,Email address,ID number\n" + "".join(
        f"{s.title()},Learner,{s}@uni.edu,{s}\n" for s in CLASS), encoding="utf-8")
    (root / "canvas.csv").write_text("Student,ID,SIS User ID,SIS Login ID,Section\n    Points Possible,,,,\n" + "".join(
        f"\"Learner, {s.title()}\",{41 + i},S-{i},{s},A\n" for i, s in enumerate(CLASS)), encoding="utf-8")
    out = root / "out"
    grade = ("class", "grade", cls, "--assignment", root / "term.toml", "--workers", 2)
    print("grade")
    proc = tformer(*grade, "--out", out, "--lms", "moodle", "--roster", root / "moodle.csv", cwd=work)
    check(proc.returncode == 0, "the class is graded")
    book_is_predicted(out, "grade")
    check(lms_files(out) == ["moodle.csv"], f"OUT holds moodle.csv alone ({lms_files(out)})")
    graded = journal_lines(out)
    print("again")
    for lms, roster in (("canvas", "canvas.csv"), ("moodle", "moodle.csv")):
        proc = tformer(*grade, "--out", out, "--lms", lms, "--roster", root / roster, cwd=work)
        check(proc.returncode == 0 and lms_files(out) == [f"{lms}.csv"], f"--lms {lms}: OUT holds {lms}.csv alone "
              f"({lms_files(out)})")
        book_is_predicted(out, f"--lms {lms}")
    check(journal_lines(out) == graded, "the same OUT again grades nothing again")
    print("verify")
    proc = tformer("class", "verify", out / "grades.json", cls, "--workers", 2, cwd=work)
    check(proc.returncode == 0, "class verify: every verdict again with the recorded seeds")
    print("shards")
    (root / "overrides.csv").write_text("student,exercise,points,reason\nbob,w09.twice,1,right on paper\n")
    parts = [root / "part1", root / "part2"]
    for k, part in enumerate(parts, 1):
        proc = tformer(*grade, "--out", part, "--shard", f"{k}/2", "--overrides", root / "overrides.csv", cwd=work)
        check(proc.returncode == 0, f"shard {k}/2 graded")
    proc = tformer("class", "merge", *parts, "--out", root / "all", "--lms", "canvas", "--roster", root / "canvas.csv",
                   cwd=work)
    check(proc.returncode == 0, "class merge of the shards, with the teacher's exercise and its override")
    if proc.returncode == 0:
        book_is_predicted(root / "all", "merge", {"bob": {"w09.twice": 1}})
        check(lms_files(root / "all") == ["canvas.csv"], "the merge wrote canvas.csv alone")
    print("--only after an edit")
    text = week9.read_text(encoding="utf-8")
    week9.write_text(text + "\n# a clearer hint next term\n", encoding="utf-8")
    before = journal_lines(out)
    proc = tformer(*grade, "--out", out, "--only", "w09.twice", cwd=work)
    said = [line for line in proc.stdout.splitlines() if line.startswith("--only w09.twice:")]
    check(proc.returncode == 0 and journal_lines(out) - before == len(CLASS),
          f"--only w09.twice grades its {len(CLASS)} notebooks again, and nothing else "
          f"({journal_lines(out) - before} graded)")
    check(bool(said) and "kept" in said[0], f"--only says what it kept ({said[0] if said else 'nothing said'})")
    book_is_predicted(out, "--only")
    check(lms_files(out) == [], f"a run without --lms leaves no LMS file of an earlier run ({lms_files(out)})")
    proc = tformer("class", "merge", root / "part1", root / "part2", out, "--out", root / "mixed", cwd=work)
    check(proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1,
          "class merge refuses parts graded with other exercise files, in one line")


def main() -> int:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tformer-term-") as tmp:
        term(Path(tmp))
    print(f"\n{len(FAILED)} check(s) failed" if FAILED else "\nevery check held", f"({time.perf_counter() - t0:.0f} s)")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
