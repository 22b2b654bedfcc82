"""A teacher's own exercises, as typed: `tformer exercise new` writes one, a learner checks it, and a class run
grades it beside the course's, into the gradebook, the feedback, the report and the LMS file. Every command runs
the `tformer` entry point from a folder outside the checkout."""
from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import re

import pytest

from test_grade_cli import CHECKOUT, cells, imports, one_line_error, tformer, tformer_all, write
from test_grade_lms import autograde, unzip

RELEASED = ["import torch\nfrom tformer.grading import check, load_exercises\nload_exercises('week3.py')",
            "def my_double(x):\n    raise NotImplementedError",
            'check("w03.double", my_double)']


def notebook(answer: str | None) -> list[str]:
    return RELEASED if answer is None else [RELEASED[0], f"def my_double(x):\n    return {answer}", RELEASED[2]]


SECRET = 73421.5                  # a hidden case's value: it must appear in no message
NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?(?!\w)")


def shows_secret(text: str) -> bool:
    """Whether `text` writes SECRET as a number, exactly or rounded to 3 significant digits or more (73421.5,
    73,421, 7.34e+04). A digit run inside a seed, a hash or a byte count is not a number that could be SECRET:
    matching substrings flagged a random seed that happened to hold 7342 (one CI run in fifty, about)."""
    return any(abs(float(m.replace(",", "")) - SECRET) <= 5e-3 * SECRET for m in NUMBER.findall(text))


@pytest.mark.parametrize("text, shows", [
    ("73421.5", True), ("x=73421.5,", True), ("7.342e+04", True), ("73,421", True), ("[1,73421.5]", True),
    ("seed 187342199", False), ("0.7342", False), ("sha a73421b", False), ("1073741824", False), ("7.3e4", False)])
def test_the_secret_is_found_as_a_number_not_as_digits_inside_another(text, shows):
    assert shows_secret(text) is shows


def hidden_file(root: Path) -> Path:
    """root/secret/week3_hidden.py: one hidden case of w03.double, an input of SECRET (outside the class and the
    folder the grader runs from)."""
    (root / "secret").mkdir()
    path = root / "secret" / "week3_hidden.py"
    path.write_text("import torch\nfrom tformer.grading import Case, add_hidden_cases\n\n"
                    f"add_hidden_cases('w03.double', lambda: [Case('a big secret', (torch.full((3,), {SECRET}),))])\n")
    return path


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
    hidden_file(root)
    (root / "week3.toml").write_text('notebooks = ["01_attention", "w03_double"]\nexercises = ["week3.py"]\n'
                                     'released = "handout/"\nhidden = ["secret/week3_hidden.py"]\n', encoding="utf-8")
    cls = root / "class"
    sol = cells("01_attention", True)
    write(cls / "ada" / "01_attention.ipynb",
          [imports(sol)] + [c for c in sol if c.startswith(("def my_softmax", "def my_attention", 'check("ch01', "answer = "))])
    write(cls / "ada" / "w03_double.ipynb", notebook("2 * x"))
    write(cls / "bob" / "w03_double (1).ipynb", notebook("x + 2"))
    write(cls / "cy" / "w03_double.ipynb", notebook(None))
    peek = f"print(open({str(root / 'secret' / 'week3_hidden.py')!r}).read())"
    write(cls / "dee" / "w03_double.ipynb", notebook("2 * x if x.abs().max() < 1000 else x") + [peek])
    out = root / "out"
    proc = tformer("class", "grade", cls, "--out", out, "--assignment", root / "week3.toml", "--lms", "canvas",
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
    is unchanged), and `tformer class verify` refuses grades.json made with the old files."""
    import shutil
    root, cls, graded = course
    out = tmp_path / "out"                                 # a copy: the class's own OUT stays as graded
    shutil.copytree(graded, out)
    old = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    lines = len((out / "journal.jsonl").read_text().splitlines())
    week3 = root / "week3.py"
    text = week3.read_text()
    try:
        week3.write_text(text + "\n# a clearer hint next year\n")
        proc = tformer("class", "grade", cls, "--out", out, "--assignment", root / "week3.toml", "--workers", 2,
                       cwd=root / "work")
        assert proc.returncode == 0, proc.stderr[-3000:]
        new = json.loads((out / "grades.json").read_text(encoding="utf-8"))
        assert new["grader"] == old["grader"]
        assert new["settings"]["exercises_hash"] != old["settings"]["exercises_hash"]
        assert len((out / "journal.jsonl").read_text().splitlines()) == lines + 5      # every notebook again
        (tmp_path / "old.json").write_text(json.dumps(old), encoding="utf-8")
        one_line_error(tformer("class", "verify", tmp_path / "old.json", cls, cwd=root / "work"),
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


def test_the_handout_carries_the_teachers_notebook_and_its_public_file(course, tmp_path):
    """The teacher's module stays with the teacher: the hand-out has its public file in its place."""
    root, _, _ = course
    proc = tformer("handout", "--out", tmp_path / "h", "--assignment", root / "week3.toml", cwd=root / "work")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["01_attention.ipynb", "w03_double.ipynb",
                                                                 "week3.public.pt"]


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
    (tmp_path / "week3.public.pt").write_bytes(b"")     # a hand-out's public file grades nothing (no reference)
    one_line_error(tformer("grade", tmp_path / "nb", "--exercises", tmp_path / "week3.public.pt", cwd=tmp_path),
                   "--exercises", "week3.public.pt", "cannot grade")


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
        assert "big secret" not in text and not shows_secret(text), text
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
    one_line_error(tformer("class", "grade", cls, "--out", root / "o2", "--assignment", root / "week3.toml",
                           cwd=root / "secret"), "week3_hidden.py", "grading workers can read")
    assert not (root / "o2").exists()


# --- the teacher's secrets stay with the teacher: the hand-out and the Gradescope zip --------------------------

REFERENCE_LINE = "return torch.mul(x, 2.0)  # the teacher's reference, line 7731"
ANSWER = 49960                    # a question's answer: a number
EXPR_ANSWER = "n**3 * d / 7"      # a question's answer: an expression
QUESTIONS = f"""
from tformer.grading import Question
register(Question(name="w03.q_value", title="the value asked", kind="number", answer={ANSWER},
                  mistakes={{"off by one": {ANSWER + 1}}}, notebook="w03_double"))
register(Question(name="w03.q_cost", title="the cost asked", kind="expr", answer={EXPR_ANSWER!r},
                  symbols=("n", "d"), notebook="w03_double"))
"""
HANDED = [*RELEASED, "answer = ...\ncheck('w03.q_value', answer)", "answer = ...\ncheck('w03.q_cost', answer)"]
KERNEL = """import sys, nbformat
ns = {}
for cell in nbformat.read(sys.argv[1], as_version=4).cells:
    if cell.cell_type == "code":
        exec(compile(cell.source, "<cell>", "exec"), ns)
"""


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """A teacher's week3.py from the template, with a reference of its own line and two questions (a number, an
    expression), hidden cases, an assignment of w03_double only; its hand-out and its Gradescope zip (unzipped
    as Gradescope does, the zip's modes kept), each made by the command as typed."""
    root = tmp_path_factory.mktemp("secrets")
    work = root / "work"
    work.mkdir()
    proc = tformer("exercise", "new", "w03.double", root / "week3.py", cwd=work)
    assert proc.returncode == 0, proc.stderr
    text = (root / "week3.py").read_text()
    assert "    return 2 * x\n" in text
    (root / "week3.py").write_text(text.replace("    return 2 * x\n", f"    {REFERENCE_LINE}\n", 1) + QUESTIONS)
    write(root / "released" / "w03_double.ipynb", HANDED)
    hidden_file(root)
    (root / "week3.toml").write_text('notebooks = ["w03_double"]\nexercises = ["week3.py"]\nreleased = "released/"\n'
                                     'hidden = ["secret/week3_hidden.py"]\n', encoding="utf-8")
    proc = tformer("handout", "--out", root / "handout", "--assignment", root / "week3.toml", cwd=work)
    assert proc.returncode == 0, proc.stderr
    proc = tformer("class", "gradescope", root / "autograder.zip", "--assignment", root / "week3.toml", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, unzip(root / "autograder.zip", root / "source")


def _secrets_in(data: bytes) -> list[str]:
    found = [s for s in (REFERENCE_LINE, REFERENCE_LINE.split("  #")[0], "line 7731", str(ANSWER), EXPR_ANSWER,
                         str(SECRET), "big secret") if s.encode() in data]
    return found


def _values(x):
    """Every leaf of a public file's data."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from _values(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _values(v)
    else:
        yield x


def test_the_handout_and_the_zips_worker_readable_files_hold_no_secret(secrets):
    """Neither the hand-out nor what a worker may read of the Gradescope zip (every entry but its PRIVATE ones,
    the wheel's files included) holds the reference's source, a question's answer or a hidden case; the PRIVATE
    entries are root's only (mode 600); the public file holds no answer either as a value."""
    import torch

    from tformer.grading.classroom.gradescope import PRIVATE
    root, modes = secrets
    handed = sorted(p.name for p in (root / "handout").iterdir())
    assert handed == ["w03_double.ipynb", "week3.public.pt"], handed
    for p in (root / "handout").iterdir():
        assert not _secrets_in(p.read_bytes()), (p.name, _secrets_in(p.read_bytes()))
    data = torch.load(root / "handout" / "week3.public.pt", weights_only=True)
    leaves = list(_values(data))
    plain = [x for x in leaves if not isinstance(x, torch.Tensor)]
    assert ANSWER not in plain and ANSWER + 1 not in plain and EXPR_ANSWER not in plain
    assert not any(bool((t.double() == ANSWER).any()) for t in leaves if isinstance(t, torch.Tensor))
    assert [e["name"] for e in data["exercises"]] == ["w03.double", "w03.q_value", "w03.q_cost"]
    readable = [n for n in modes if not n.startswith(PRIVATE)]
    assert {"exercises/week3.py", "hidden/week3_hidden.py", "assignment.toml"} == set(modes) - set(readable)
    assert all(stat.S_IMODE(modes[n]) == 0o600 for n in set(modes) - set(readable)), modes
    assert REFERENCE_LINE in (root / "source" / "exercises" / "week3.py").read_text()    # the grader's, in the zip
    for name in readable:
        blob = (root / "source" / name).read_bytes()
        assert not _secrets_in(blob), (name, _secrets_in(blob))
        if name.endswith(".whl"):
            with zipfile.ZipFile(root / "source" / name) as w:
                for inner in w.namelist():
                    assert not _secrets_in(w.read(inner)), (inner, _secrets_in(w.read(inner)))


def _kernel(folder: Path, sources: list[str]) -> str:
    """Run a notebook's code cells in `folder` as a learner's kernel does; what it printed."""
    nb = write(folder / "mine.ipynb", sources)
    env = {k: v for k, v in os.environ.items() if k not in ("TFORMER_LANG", "PYTHONPATH", "TFORMER_GRADE_WORKER")}
    env["PYTHONPATH"] = str(CHECKOUT)
    proc = subprocess.run([sys.executable, "-c", KERNEL, str(nb)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_learner_checks_the_handout_against_its_public_file(secrets, tmp_path):
    """In the hand-out's folder (week3.public.pt, no week3.py), the notebook's `load_exercises("week3.py")` and
    `check`: the right function passes, the template's mistake is named, the stub is not attempted, and a
    teacher's question says the value is well formed and graded by the teacher (or why it is not well formed)."""
    import shutil
    root, _ = secrets
    folder = tmp_path / "handout"
    shutil.copytree(root / "handout", folder)
    mine = [HANDED[0], "def my_double(x):\n    return 2 * x", HANDED[2], "answer = 6\ncheck('w03.q_value', answer)",
            "answer = 'n * d'\ncheck('w03.q_cost', answer)",
            "def my_double(x):\n    return x + 2", HANDED[2], "answer = 'six'\ncheck('w03.q_value', answer)",
            "answer = 'import os'\ncheck('w03.q_cost', answer)", HANDED[1], HANDED[2]]
    out = _kernel(folder, mine).splitlines()
    checks = [line for line in out if line.startswith("[")]
    assert len(checks) == 7, out
    assert checks[0].startswith("[PASS] w03.double") and "passed all 7 cases" in checks[0], checks
    for line in checks[1:3]:
        assert "well formed" in line and "graded by your teacher" in line, line
    assert checks[3].startswith("[FAIL] w03.double"), checks
    assert "Your output equals a known mistake: added 2 instead of doubling" in "\n".join(out)
    assert checks[4].startswith("[FAIL] w03.q_value") and "expected a number" in checks[4], checks
    assert checks[5].startswith("[FAIL] w03.q_cost") and "graded by your teacher" not in checks[5], checks
    assert checks[6].startswith("[TODO] w03.double"), checks
    assert sorted(p.name for p in folder.iterdir()) == ["mine.ipynb", "w03_double.ipynb", "week3.public.pt"]


def _run_autograder(root, ag, cells: list[str]) -> dict:
    """The zip's run_autograder, as Gradescope runs it (as root, the workers as `nobody` standing for
    tformer-worker), on a submission of `cells` laid out under `ag`; its results.json."""
    return autograde(root / "source", ag, {"w03_double.ipynb": cells}, worker_user="nobody")


def test_run_autograder_as_root_runs_the_worker_as_another_user(secrets, tmp_path):
    """As root, run_autograder runs the workers under TFORMER_GRADE_WORKER_USER (here `nobody`, as Gradescope's
    tformer-worker): a cell that reports its uid sees that user's, and the submission's cells cannot read the
    zip's source/; results.json is written and names what the workers ran without."""
    if os.geteuid() != 0:
        pytest.skip("not root: run_autograder runs the workers as this user (Gradescope runs it as root)")
    import pwd
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user `nobody` here to stand for tformer-worker")
    root, _ = secrets
    ag = tmp_path / "ag"
    cells = [HANDED[0], "def my_double(x):\n    return 2 * x", HANDED[2],
             "import os\nraise RuntimeError(f'worker uid {os.getuid()}')",
             f"s = open({str(ag / 'source' / 'exercises' / 'week3.py')!r}).read()\n"
             "raise RuntimeError('read: ' + s[s.index('line 77'):][:20])",
             f"open({str(ag / 'results' / 'forged.json')!r}, 'w').write('{{}}')"]
    results = _run_autograder(root, ag, cells)
    assert stat.S_IMODE((ag / "results").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "source").stat().st_mode) == 0o700
    assert not (ag / "results" / "forged.json").exists()
    assert [t["name"] for t in results["tests"]] == ["w03.double", "w03.q_value", "w03.q_cost"], results
    assert results["tests"][0]["output"].startswith(("passed", "failed")), results
    assert "line 7731" not in results["output"] and "PermissionError" in results["output"], results["output"]
    assert "worker uid" in results["output"], results["output"]
    assert f"worker uid {nobody}" in results["output"], results["output"]
    assert "ran as root" not in results["output"], results["output"]


def test_run_autograder_gives_a_forged_stub_nothing(secrets, tmp_path):
    """A forged submission through the zip's run_autograder: the untouched stub, then a cell that makes the worker
    answer every request "ok" with the right outputs, computed outside the function the check cell names.
    results.json gives the exercise 0 of its points: the stub earns nothing, whatever the worker sends."""
    if os.geteuid() != 0:
        pytest.skip("not root: run_autograder's worker user needs root (Gradescope runs it as root)")
    root, _ = secrets
    forge = ("import tformer.grading.core as C\n"
             "def forged(ex, fn, cases, keep=lambda got, after: (got, after)):\n"
             "    kept = [keep(c.args[0] * 2, (c.args, c.kwargs)) for c in cases]\n"
             "    return C.Outcome(outputs=[k[0] for k in kept], inputs_after=[k[1] for k in kept])\n"
             "C.run_learner = forged\n")
    results = _run_autograder(root, tmp_path / "ag", [*HANDED, forge])
    double = next(x for x in results["tests"] if x["name"] == "w03.double")
    assert double["score"] == 0, double
    assert results["score"] == 0, results


def test_a_grading_worker_never_runs_a_teachers_module(secrets, tmp_path):
    """With TFORMER_GRADE_WORKER set (a grading worker), load_exercises of a teacher's module, or of a public
    file, registers nothing and runs nothing of it: the course's exercises only."""
    root, _ = secrets
    marker = tmp_path / "ran"
    (tmp_path / "week3.py").write_text((root / "week3.py").read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    (tmp_path / "week3.public.pt").write_bytes((root / "handout" / "week3.public.pt").read_bytes())
    code = ("from tformer.grading import REGISTRY, load_exercises\n"
            "load_exercises('week3.py', 'week3.public.pt')\n"
            "print(sorted(n for n in REGISTRY if n.startswith('w03')))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TFORMER_LANG", "PYTHONPATH")}
    env.update(PYTHONPATH=str(CHECKOUT), TFORMER_GRADE_WORKER="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", (proc.stdout, proc.stderr[-2000:])
    assert not marker.exists()


def test_results_name_each_guarantee_the_workers_ran_without():
    """results.json's `output` names what the sandbox reported missing (grades.json's settings: "isolation",
    else the older landlock_abi/network keys), and nothing when all was there."""
    from tformer.grading.classroom.gradescope import lost_guarantees
    full = {"landlock_abi": 6, "network": "netns", "pid_namespace": True, "shm": "private", "tmp": "tmpfs",
            "proc": "private", "processes": "uid", "max_processes": 64}
    assert lost_guarantees({"isolation": full}, "tformer-worker") == []
    weak = {**full, "landlock_abi": 0, "network": "landlock-tcp", "pid_namespace": False, "proc": "shared",
            "shm": "shared", "processes": "none"}
    lost = "; ".join(lost_guarantees({"isolation": weak, "landlock_abi": 0, "network": "landlock-tcp"}, "tformer-worker"))
    for words in ("Landlock (", "a network namespace", "UDP", "a user/PID namespace", "a private /proc",
                  "/dev/shm", "processes"):
        assert words in lost, (words, lost)
    older = "; ".join(lost_guarantees({"landlock_abi": 0, "network": "none"}, "tformer-worker"))
    assert "Landlock (" in older and "the network is open" in older, older
    assert lost_guarantees({"landlock_abi": None, "network": None}, "tformer-worker") == []
    if os.geteuid() == 0:                             # as root: the workers' own uid is a guarantee too
        assert any("ran as root" in x for x in lost_guarantees({"isolation": {**full, "processes": "cgroup"}}, ""))
        assert lost_guarantees({"isolation": full}, "") == []      # "uid": the keeper gave them another user


def test_an_exercise_the_public_file_cannot_hold_is_one_line_and_nothing_is_written(tmp_path):
    """A reference whose output is not data (a set here) cannot be frozen: `tformer handout` says which exercise
    and case in one line, and writes nothing."""
    proc = tformer("exercise", "new", "w04.odd", tmp_path / "week4.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "week4.py").read_text().replace("    return 2 * x\n", "    return set(x.tolist())\n", 1)
    (tmp_path / "week4.py").write_text(text)
    write(tmp_path / "released" / "w04_odd.ipynb", ["from tformer.grading import check, load_exercises\n"
                                                   "load_exercises('week4.py')"])
    (tmp_path / "a.toml").write_text('notebooks = ["w04_odd"]\nexercises = ["week4.py"]\nreleased = "released/"\n')
    one_line_error(tformer("handout", "--out", tmp_path / "h", "--assignment", tmp_path / "a.toml", cwd=tmp_path),
                   "w04.odd", "a single zero", "set")
    assert not (tmp_path / "h").exists()


def test_only_after_an_edit_then_shards_merged_with_a_teachers_exercise(course, tmp_path):
    """After an edit of week3.py, `--only w03.double` grades that exercise again in the four notebooks that owe it,
    keeps ada's chapter-1 verdicts, and says so. Two shards of the class, with an override of the teacher's
    exercise, merge into the one run's gradebook: merge loads the files the shards recorded. A shard graded
    with other files is refused in one line."""
    import shutil
    root, cls, out = course
    work, toml = root / "work", root / "week3.toml"
    week3 = root / "week3.py"
    text = week3.read_text()
    again = tmp_path / "again"
    shutil.copytree(out, again)
    lines = len((again / "journal.jsonl").read_text().splitlines())
    try:
        week3.write_text(text + "\n# a clearer hint next year\n")
        proc = tformer("class", "grade", cls, "--out", again, "--assignment", toml, "--only", "w03.double",
                       "--workers", 2, cwd=work)
        assert proc.returncode == 0, proc.stderr[-3000:]
        said = [line for line in proc.stdout.splitlines() if line.startswith("--only w03.double:")]
        assert said and "graded again in 4 notebook(s); 1 other notebook(s) kept" in said[0], proc.stdout[-3000:]
        assert "1 of them graded before the teacher's files changed" in said[0], said
        assert len((again / "journal.jsonl").read_text().splitlines()) == lines + 4
        assert (again / "gradebook.csv").read_text() == (out / "gradebook.csv").read_text()
        refused = tformer("class", "merge", out, again, "--out", tmp_path / "mixed", cwd=work)
        one_line_error(refused, "other exercise files")
    finally:
        week3.write_text(text)
    (tmp_path / "overrides.csv").write_text("student,exercise,points,reason\nbob,w03.double,1,right on paper\n")
    parts = []
    for k in (1, 2):
        part = tmp_path / f"part{k}"
        part.mkdir()
        shutil.copy(out / "journal.jsonl", part / "journal.jsonl")       # graded already: nothing runs again
        parts.append(part)
    procs = tformer_all([("class", "grade", cls, "--out", part, "--shard", f"{k}/2", "--assignment", toml,
                          "--overrides", tmp_path / "overrides.csv", "--workers", 1) for k, part in enumerate(parts, 1)],
                        work, at_once=2)
    assert all(p.returncode == 0 for p in procs), [p.stderr[-2000:] for p in procs]
    merged = tformer("class", "merge", *parts, "--out", tmp_path / "all", cwd=work)
    assert merged.returncode == 0, merged.stderr[-3000:]
    book = {r[0]: r for r in csv.reader((tmp_path / "all" / "gradebook.csv").open(encoding="utf-8"))}
    single = {r[0]: r for r in csv.reader((out / "gradebook.csv").open(encoding="utf-8"))}
    head = book["student"]
    assert head == single["student"] and book["bob"][head.index("w03.double")] == "1"
    assert all(book[s] == single[s] for s in ("ada", "cy", "dee"))


# --- a teacher's term: the notebook `tformer exercise new` writes, a quoted due date, an error on a hidden case ---

STUB_LINE = '    raise NotImplementedError("Exercise: replace this line with your code")'


def test_exercise_new_writes_the_notebook_and_it_grades_as_typed(tmp_path):
    """`tformer exercise new w09.top_k week9.py` writes week9.py (partial credit and a hidden-case file shown in
    comments) and w09_top_k.ipynb beside it: a setup cell that loads week9.py, the stub, the check cell. Graded
    with `tformer grade NB --exercises week9.py`, the stub is "not attempted" (0 points) and the stub filled in
    with the reference earns every point; the printed report names the chapter, w09. An exercise whose
    notebook exists beside its file is refused, and nothing is written."""
    import ast
    work = tmp_path / "work"
    work.mkdir()
    proc = tformer("exercise", "new", "w09.top_k", tmp_path / "week9.py", cwd=work)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "week9.py").read_text()
    assert '    # partial={"edge": 1, "random": 1, "hidden": 1},' in text and 'hidden = ["week9_hidden.py"]' in text
    block = text.split("# Cases students never see")[1].splitlines()
    hidden = [line[6:] for line in block if line.startswith("#     ")]
    assert 'add_hidden_cases("w09.top_k", lambda:' in "\n".join(hidden), text
    ast.parse("\n".join(hidden))                      # the commented hidden-case file is Python as it stands
    ast.parse(text.replace("    # partial=", "    partial=", 1))
    sources = cells_of(tmp_path / "w09_top_k.ipynb")
    assert sources == ['import torch\n\nfrom tformer.grading import check, load_exercises\n\n'
                       'load_exercises("week9.py")   # your teacher\'s exercises: week9.py, or week9.public.pt from '
                       'the hand-out', f"def my_top_k(x):\n{STUB_LINE}", 'check("w09.top_k", my_top_k)'], sources
    mine = tmp_path / "mine"
    write(mine / "w09_top_k.ipynb", [s.replace(STUB_LINE, "    return 2 * x") for s in sources])
    stub, solved = tmp_path / "w09_top_k.ipynb", mine / "w09_top_k.ipynb"
    procs = tformer_all([("grade", nb, "--exercises", tmp_path / "week9.py", "--json", nb.with_suffix(".json"))
                         for nb in (stub, solved)], cwd=work, at_once=2)
    for proc, nb, status, earned in zip(procs, (stub, solved), ("not attempted", "passed"), (0, 1)):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.startswith("w09  w09_top_k.ipynb"), proc.stdout
        report = json.loads(nb.with_suffix(".json").read_text())
        row = report["notebooks"][0]["exercises"][0]
        assert (row["exercise"], row["status"]) == ("w09.top_k", status), row
        assert report["total"] == {"earned": earned, "possible": 1}, report["total"]
    from tformer.grading.classroom.template import new_exercise
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "w09_top_k.ipynb").write_text("{}")
    with pytest.raises(ValueError, match="w09_top_k.ipynb exists"):
        new_exercise("w09.top_k", tmp_path / "again" / "week9.py")
    assert not (tmp_path / "again" / "week9.py").exists()


def cells_of(path: Path) -> list[str]:
    """The sources of a notebook's code cells, read as a learner's Jupyter reads them."""
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_an_error_on_a_hidden_case_reads_as_a_failure_and_a_quoted_due_is_a_due(course, tmp_path):
    """eve's function raises on the hidden case that dee's gets wrong (the course's class): her row says what
    dee's says, the public cases passed and the partial credit, and nothing of the case or the error, and earns
    what dee's earns. Her one-student class is graded with `due` given as a quoted string, which counts as TOML's
    date and time does; a quoted due without its offset is refused in one line."""
    root, _, out = course
    cls = tmp_path / "class"
    write(cls / "eve" / "w03_double.ipynb", notebook("2 * x if x.abs().max() < 1000 else 1 / 0"))
    where = (f'exercises = ["{root / "week3.py"}"]\nreleased = "{root / "handout"}"\n'
             f'hidden = ["{root / "secret" / "week3_hidden.py"}"]\nnotebooks = ["w03_double"]\n')
    (tmp_path / "naive.toml").write_text(where + 'due = "2026-12-01T23:59:00"\n', encoding="utf-8")
    one_line_error(tformer("class", "grade", cls, "--out", tmp_path / "o", "--assignment", tmp_path / "naive.toml",
                           cwd=root / "work"), "due", "offset", "2026-12-01T23:59:00+01:00")
    (tmp_path / "term.toml").write_text(where + 'due = "2026-12-01T23:59:00+01:00"\n', encoding="utf-8")
    proc = tformer("class", "grade", cls, "--out", tmp_path / "out", "--assignment", tmp_path / "term.toml", cwd=root / "work")
    assert proc.returncode == 0, proc.stderr[-3000:]
    grades = json.loads((tmp_path / "out" / "grades.json").read_text(encoding="utf-8"))
    assert grades["settings"]["late"]["due"] == "2026-12-01T23:59:00+01:00", grades["settings"]["late"]
    eve = grades["students"][0]["notebooks"][0]["exercises"][0]
    course_grades = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    dee = next(s for s in course_grades["students"] if s["student"] == "dee")["notebooks"][0]["exercises"][0]
    assert (eve["status"], dee["status"]) == ("error", "failed")
    assert eve["fraction"] == dee["fraction"] == pytest.approx(2 / 3)
    first, last = dee["message"].split(". ")[0], dee["message"].splitlines()[-1]
    assert first == "passed the 7 public cases" and last == "Partial credit: 67% of the points.", dee["message"]
    assert eve["message"].startswith(first + ". ") and eve["message"].splitlines()[-1] == last, eve["message"]
    assert "raised an error on a hidden case" in eve["message"]
    for text in (eve["message"], (tmp_path / "out" / "feedback" / "eve.html").read_text(encoding="utf-8")):
        assert "ZeroDivision" not in text and "1 / 0" not in text and "big secret" not in text
    head, row = list(csv.reader((tmp_path / "out" / "gradebook.csv").open(encoding="utf-8")))
    assert dict(zip(head, row))["w03.double"] == "2" and "final" in head, (head, row)
