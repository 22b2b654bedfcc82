"""A teacher's own exercises, as typed: `tformer exercise new` writes one, a learner checks it, and a class run
grades it beside the course's, into the gradebook, the feedback, the report and the LMS file. Every command runs
the `tformer` entry point from a folder outside the checkout."""
from __future__ import annotations

import csv
import json

import pytest

from test_grade_cli import cells, one_line_error, tformer, write

RELEASED = ["import torch\nfrom tformer.grading import check, load_exercises\nload_exercises('week3.py')",
            "def my_double(x):\n    raise NotImplementedError",
            'check("w03.double", my_double)']


def notebook(answer: str | None) -> list[str]:
    return RELEASED if answer is None else [RELEASED[0], f"def my_double(x):\n    return {answer}", RELEASED[2]]


SECRET = 73421.5                  # a hidden case's value: it must appear in no message


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """week3.py from the template (3 points split over its edge, random and hidden cases), its released notebook
    in handout/, hidden cases in secret/, an assignment naming them beside chapter 1, and a class: ada doubles
    (and solved chapter 1), bob adds 2 (the template's named mistake), cy left the stub, dee doubles small
    values only (right on every public case, wrong on the hidden one) and tries to read the hidden file. The
    grader runs from work/, so neither secret/ nor the class is on its search path."""
    root = tmp_path_factory.mktemp("teacher")
    work = root / "work"
    work.mkdir()
    proc = tformer("exercise", "new", "w03.double", root / "week3.py", cwd=work)
    assert proc.returncode == 0 and (root / "week3.py").exists(), proc.stderr
    week3 = root / "week3.py"
    week3.write_text(week3.read_text().replace("    points=1,\n", '    points=3,\n    partial={"edge": 1, "random": 1, '
                                               '"hidden": 1},\n'))
    write(root / "handout" / "w03_double.ipynb", RELEASED)
    (root / "secret").mkdir()
    (root / "secret" / "week3_hidden.py").write_text(
        "import torch\nfrom tformer.grading import Case, add_hidden_cases\n\n"
        f"add_hidden_cases('w03.double', lambda: [Case('a big secret', (torch.full((3,), {SECRET}),))])\n")
    (root / "week3.toml").write_text('notebooks = ["01_attention", "w03_double"]\nexercises = ["week3.py"]\n'
                                     'released = "handout/"\nhidden = ["secret/week3_hidden.py"]\n', encoding="utf-8")
    cls = root / "class"
    sol = cells("01_attention", True)
    write(cls / "ada" / "01_attention.ipynb",
          [sol[0]] + [c for c in sol if c.startswith(("def my_softmax", "def my_attention", 'check("ch01', "answer = "))])
    write(cls / "ada" / "w03_double.ipynb", notebook("2 * x"))
    write(cls / "bob" / "w03_double (1).ipynb", notebook("x + 2"))
    write(cls / "cy" / "w03_double.ipynb", notebook(None))
    peek = f"print(open({str(root / 'secret' / 'week3_hidden.py')!r}).read())"
    write(cls / "dee" / "w03_double.ipynb", notebook("2 * x if x.abs().max() < 1000 else x") + [peek])
    out = root / "out"
    proc = tformer("grade", cls, "--out", out, "--assignment", root / "week3.toml", "--lms", "canvas",
                   "--workers", 2, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, cls, out


def test_a_teachers_exercise_is_graded_like_the_courses(course):
    root, cls, out = course
    head, *body = list(csv.reader((out / "gradebook.csv").open(encoding="utf-8")))
    assert head == ["student", "ch01.softmax", "ch01.attention", "ch01.q_sharper_query", "ch01.q_score_variance", "ch01.q_saturation", "w03.double", "ch01", "w03",
                    "total", "possible"]
    book = {r[0]: dict(zip(head, r)) for r in body}
    assert [book[s]["w03.double"] for s in ("ada", "bob", "cy", "dee")] == ["3", "0", "0", "2"]
    grades = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    assert len(grades["settings"]["exercises_hash"]) == 64
    bob = next(s for s in grades["students"] if s["student"] == "bob")
    row = bob["notebooks"][0]["exercises"][0]
    assert row["status"] == "failed" and row["mistakes"] == ["added 2 instead of doubling"], row
    assert "added 2 instead of doubling" in (out / "feedback" / "bob.html").read_text(encoding="utf-8")
    assert "w03.double: 1 of 4, added 2 instead of doubling" in (out / "report.html").read_text(encoding="utf-8")
    canvas = list(csv.reader((out / "canvas.csv").open(encoding="utf-8")))
    assert canvas[0][5:] == ["tformer ch01", "tformer w03"] and canvas[1][5:] == ["7", "3"]


def test_an_edit_to_the_teachers_file_regrades_and_verify_refuses_the_old_record(course, tmp_path):
    """The journal's key holds the teacher's files' hash: an edit regrades the notebooks (the grader's own hash
    is unchanged), and `--verify` refuses grades.json made with the old files."""
    root, cls, out = course
    old = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    lines = len((out / "journal.jsonl").read_text().splitlines())
    week3 = root / "week3.py"
    text = week3.read_text()
    try:
        week3.write_text(text + "\n# a clearer hint next year\n")
        proc = tformer("grade", cls, "--out", out, "--assignment", root / "week3.toml", "--workers", 2,
                       cwd=root / "work")
        assert proc.returncode == 0, proc.stderr[-3000:]
        new = json.loads((out / "grades.json").read_text(encoding="utf-8"))
        assert new["grader"] == old["grader"]
        assert new["settings"]["exercises_hash"] != old["settings"]["exercises_hash"]
        assert len((out / "journal.jsonl").read_text().splitlines()) == lines + 5      # every notebook again
        (tmp_path / "old.json").write_text(json.dumps(old), encoding="utf-8")
        one_line_error(tformer("grade", "--verify", tmp_path / "old.json", cls, cwd=root / "work"),
                       "other exercise files")
    finally:
        week3.write_text(text)


def test_a_learner_checks_a_teachers_exercise_and_the_template_names_its_mistake(course, tmp_path):
    """`tformer grade NOTEBOOK --exercises week3.py`: the right answer passes, the template's mistake is named."""
    root, cls, out = course
    for answer, status in (("2 * x", "passed"), ("x + 2", "failed")):
        folder = tmp_path / status
        write(folder / "w03_double.ipynb", notebook(answer))
        (folder / "week3.py").write_text((root / "week3.py").read_text())
        proc = tformer("grade", folder / "w03_double.ipynb", "--exercises", folder / "week3.py", "--json",
                       folder / "r.json", cwd=folder)
        assert proc.returncode == 0, proc.stderr[-3000:]
        row = json.loads((folder / "r.json").read_text())["notebooks"][0]["exercises"][0]
        assert (row["exercise"], row["status"]) == ("w03.double", status), row
        assert (row["mistakes"] == ["added 2 instead of doubling"]) == (status == "failed")


def test_the_handout_carries_the_teachers_notebook_and_module(course, tmp_path):
    root, _, _ = course
    proc = tformer("handout", "--out", tmp_path / "h", "--assignment", root / "week3.toml", cwd=root / "work")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["01_attention.ipynb", "w03_double.ipynb",
                                                                 "week3.py"]


def test_the_exercise_commands_errors(tmp_path):
    (tmp_path / "taken.py").write_text("x = 1\n")
    (tmp_path / "bad.py").write_text("raise RuntimeError('half written')\n")
    one_line_error(tformer("exercise", "new", "W3 double", tmp_path / "x.py", cwd=tmp_path), "w03.double")
    one_line_error(tformer("exercise", "new", "w03.double", tmp_path / "taken.py", cwd=tmp_path), "exists")
    write(tmp_path / "nb" / "w03_double.ipynb", notebook("2 * x"))
    one_line_error(tformer("grade", tmp_path / "nb", "--exercises", tmp_path / "bad.py", cwd=tmp_path),
                   "--exercises", "bad.py", "half written")
    one_line_error(tformer("grade", tmp_path / "nb", "--exercises", tmp_path / "none.py", cwd=tmp_path),
                   "--exercises", "none.py")


def test_hidden_cases_count_but_never_show(course):
    """dee's function passes every public case and fails the hidden one: 2 of 3 points (partial credit by group
    of cases), a message that says a hidden case failed and nothing of it, and her cell that tried to read the
    hidden file failed (under Landlock)."""
    root, cls, out = course
    grades = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    dee = next(s for s in grades["students"] if s["student"] == "dee")
    row = dee["notebooks"][0]["exercises"][0]
    assert row["status"] == "failed" and row["fraction"] == pytest.approx(2 / 3), row
    assert "1 of 1 hidden case(s) failed" in row["message"] and "passed the" in row["message"], row["message"]
    messages = [x["message"] for s in grades["students"] for nb in s["notebooks"] for x in nb["exercises"]]
    messages += [e for s in grades["students"] for nb in s["notebooks"] for e in nb["cell_errors"]]
    pages = [p.read_text(encoding="utf-8") for p in (out / "feedback").iterdir()] + [(out / "report.html").read_text()]
    for text in messages + pages:
        assert "big secret" not in text and str(int(SECRET)) not in text
    if grades["settings"]["landlock_abi"] == 0:
        pytest.skip("no Landlock on this kernel: a worker could read the hidden file (TEACHING.md says so)")
    peek = dee["notebooks"][0]["cell_errors"]
    assert any("PermissionError" in e and "week3_hidden.py" in e for e in peek), peek


def test_a_learners_check_runs_the_public_cases_only(course, tmp_path):
    """The learner's own check does not know the hidden cases: dee's function passes in her notebook."""
    root, _, _ = course
    folder = tmp_path / "dee"
    write(folder / "w03_double.ipynb", notebook("2 * x if x.abs().max() < 1000 else x"))
    (folder / "week3.py").write_text((root / "week3.py").read_text())
    proc = tformer("grade", folder / "w03_double.ipynb", "--exercises", folder / "week3.py", "--json",
                   folder / "r.json", "--require-all", cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_hidden_cases_on_the_search_path_are_refused(course):
    """Run from secret/ itself: that folder is then on Python's search path, which the workers read, so the
    grader refuses in one line before grading."""
    root, cls, _ = course
    one_line_error(tformer("grade", cls, "--out", root / "o2", "--assignment", root / "week3.toml",
                           cwd=root / "secret"), "week3_hidden.py", "grading workers can read")
    assert not (root / "o2").exists()
