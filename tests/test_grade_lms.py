"""Grades where the course is run: `tformer grade CLASS --out OUT --lms moodle` (Moodle's CSV grade import), the
LMS files of runs into one OUT (only the last run's stays), and `tformer grade --gradescope-zip ZIP --assignment
FILE` (Gradescope's autograder), each through the command as typed (a subprocess started in a folder outside the
checkout), checked by the files it wrote and its exit code.

The autograder's layout and results.json follow Gradescope's specification (github.com/gradescope/
autograder_samples, docs/specs.md: ROOT/source holds the unzipped zip, ROOT/submission the submission,
ROOT/results/results.json the results, with `score`, `output` and `tests` of `name`, `score`, `max_score`,
`output` and `visibility`), the fields gradescope-utils' JSONTestRunner (gradescope_utils/autograder_utils/
json_test_runner.py, `buildResult`) writes. The tests run the zip's own run_autograder in a temporary ROOT
(TFORMER_AUTOGRADER_ROOT) with this checkout's Python as `python3`; they never run setup.sh."""
from __future__ import annotations

import csv
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from test_grade_cli import CHECKOUT, NO_SCALE, one_line_error, tformer, tformer_all, tiny, write

HIDDEN = ("import torch\nfrom tformer.grading import Case, add_hidden_cases\n\n"
          "add_hidden_cases('ch01.softmax', lambda: [Case('large logits', (torch.full((2, 3), 1000.0),))])\n")


# --- Moodle ------------------------------------------------------------------------------------------------

MOODLE_EXPORT = ("First name,Last name,ID number,Institution,Department,Email address,"
                 "Assignment: Week 1 (Real),Last downloaded from this course\n"
                 "Ada,Lovelace,S-001,,,ada@uni.edu,-,1700000000\n"
                 "Bob,Babbage,S-002,,,bob@uni.edu,-,1700000000\n"
                 "Eve,Adams,S-005,,,eve@uni.edu,-,1700000000\n")


def test_moodle_csv_with_a_matched_and_an_unmatched_student(tmp_path):
    """--lms moodle --roster (a Moodle grades export): S-001 is matched by ID number, Bob's Moodle download folder
    by the name in it; both are identified by the roster's email. cy matches no row: listed on the terminal in
    one line and left out of moodle.csv (Moodle aborts a whole import on a row it cannot match). Nobody handed
    in chapter 2: "-", Moodle's no grade. A roster with no email or ID number column is one line and exit 2."""
    cls = tmp_path / "class"
    tiny(cls / "S-001")
    tiny(cls / "Bob Babbage_4102_assignsubmission_file_", NO_SCALE)
    tiny(cls / "cy")
    (tmp_path / "week1.toml").write_text('notebooks = ["01_attention", "02_self_attention"]\n', encoding="utf-8")
    (tmp_path / "moodle.csv").write_text(MOODLE_EXPORT, encoding="utf-8")
    (tmp_path / "canvas.csv").write_text("Student,ID,SIS User ID,SIS Login ID,Section\n", encoding="utf-8")
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(tformer, "class", "grade", cls, "--out", tmp_path / "bad", "--lms", "moodle", "--roster",
                          tmp_path / "canvas.csv", cwd=tmp_path)
        proc = tformer("class", "grade", cls, "--out", tmp_path / "out", "--assignment", tmp_path / "week1.toml",
                       "--lms", "moodle", "--roster", tmp_path / "moodle.csv", "--workers", 2, cwd=tmp_path)
    one_line_error(bad.result(), "--roster", "canvas.csv", "Email address", "ID number")
    assert not (tmp_path / "bad").exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.reader((tmp_path / "out" / "moodle.csv").open(encoding="utf-8")))
    assert rows == [["Email address", "tformer ch01", "tformer ch02"],
                    ["bob@uni.edu", "4", "-"],
                    ["ada@uni.edu", "7", "-"]], rows
    said = [line for line in proc.stdout.splitlines() if "moodle.csv" in line and "cy" in line]
    assert len(said) == 1 and "matches no row" in said[0], proc.stdout[-3000:]
    assert not [line for line in proc.stdout.splitlines() if "left out of moodle.csv" in line and "cy" not in line]
    assert "moodle.csv" in proc.stdout and not (tmp_path / "out" / "canvas.csv").exists()


# --- Gradescope ---------------------------------------------------------------------------------------------

def unzip(zip_path: Path, source: Path) -> dict[str, int]:
    """The autograder zip unzipped into `source` as Gradescope does, its files' modes kept; the modes."""
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(source)
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    for name, mode in modes.items():                  # zipfile drops the modes; Gradescope's unzip keeps them
        (source / name).chmod(stat.S_IMODE(mode))
    return modes


def autograde(source: Path, root: Path, notebooks: dict[str, list[str] | str], worker_user: str | None = None) -> dict:
    """Lay out Gradescope's ROOT (source/ = the unzipped zip, submission/, results/) and run the zip's
    run_autograder there with this checkout's Python as `python3` (`worker_user`: TFORMER_GRADE_WORKER_USER, the
    user setup.sh makes, for a run as root); return results.json."""
    for name, content in notebooks.items():
        if isinstance(content, str):
            (root / "submission").mkdir(parents=True, exist_ok=True)
            (root / "submission" / name).write_text(content, encoding="utf-8")
        else:
            write(root / "submission" / name, content)
    (root / "bin").mkdir(parents=True)
    (root / "source").symlink_to(source, target_is_directory=True)
    (root / "bin" / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (root / "bin" / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("TFORMER_LANG", "PYTHONPATH")}
    env.update(PATH=f"{root / 'bin'}:{env['PATH']}", PYTHONPATH=str(CHECKOUT), TFORMER_AUTOGRADER_ROOT=str(root))
    if worker_user:
        env["TFORMER_GRADE_WORKER_USER"] = worker_user
    proc = subprocess.run([str(root / "source" / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def gradescope(tmp_path_factory):
    """The autograder zip of an assignment of chapter 1 (attention worth 2 points, the course's 3) with a hidden
    case for ch01.softmax, built once with `tformer grade --gradescope-zip`, unzipped as Gradescope does; then three
    submissions run through it at once: a right one, one without the attention scale, and one with no notebook."""
    root = tmp_path_factory.mktemp("gradescope")
    (root / "secret").mkdir()
    (root / "secret" / "week1_hidden.py").write_text(HIDDEN, encoding="utf-8")
    (root / "week1.toml").write_text('notebooks = ["01_attention"]\nhidden = ["secret/week1_hidden.py"]\n\n'
                                     '[points]\n"ch01.attention" = 2\n', encoding="utf-8")
    proc = tformer("class", "gradescope", root / "autograder.zip", "--assignment", root / "week1.toml",
                   cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = root / "source"
    modes = unzip(root / "autograder.zip", source)
    good, bad = tiny(root / "good"), tiny(root / "bad", NO_SCALE)
    runs = {"good": {"01_attention.ipynb": _cells(good)}, "bad": {"01_attention (1).ipynb": _cells(bad)},
            "crash": {"01_attention.py": "def my_attention(q, k, v):\n    return q\n"}}
    with ThreadPoolExecutor(3) as pool:
        done = {k: pool.submit(autograde, source, root / k, nbs) for k, nbs in runs.items()}
        results = {k: f.result() for k, f in done.items()}
    return root, proc, modes, results


def _cells(path: Path) -> list[str]:
    import nbformat
    return [c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


def test_the_autograder_zip_holds_what_gradescope_runs(gradescope):
    """The zip: setup.sh (torch's CPU build, then the wheel), run_autograder (executable), a wheel of this
    checkout, the assignment with its paths rewritten into the zip, the released notebook, the hidden cases."""
    root, proc, modes, _ = gradescope
    wheels = [n for n in modes if n.startswith("tformer-") and n.endswith(".whl")]
    assert len(wheels) == 1, sorted(modes)
    assert {"setup.sh", "run_autograder", "assignment.toml", "released/01_attention.ipynb",
            "hidden/week1_hidden.py"} <= set(modes), sorted(modes)
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    with zipfile.ZipFile(root / "source" / wheels[0]) as w:
        assert "tformer/grading/classroom/gradescope.py" in w.namelist()
    setup = (root / "source" / "setup.sh").read_text()
    cpu, wheel = setup.index("download.pytorch.org/whl/cpu"), setup.index(wheels[0])
    assert cpu < wheel, setup
    assigned = (root / "source" / "assignment.toml").read_text()
    assert 'hidden = ["hidden/week1_hidden.py"]' in assigned and 'released = "released"' in assigned, assigned
    assert '"ch01.attention" = 2' in assigned and str(root) not in assigned, assigned
    assert "autograder.zip" in proc.stdout and "student(s) graded" not in proc.stdout, proc.stdout   # grades nothing


def test_run_autograder_scores_a_right_and_a_wrong_submission(gradescope):
    """results.json: one test per exercise with name, score, max_score, output and visibility (the exercise
    with hidden cases after_published), and the overall score. The wrong one names its mistake; its notebook,
    under a download's name, is still chapter 1's."""
    *_, results = gradescope
    good, bad = results["good"], results["bad"]
    for r in (good, bad):
        assert [t["name"] for t in r["tests"]] == ["ch01.softmax", "ch01.attention", "ch01.q_sharper_query", "ch01.q_score_variance", "ch01.q_saturation"], r
        assert all(set(t) == {"name", "score", "max_score", "output", "visibility"} for t in r["tests"]), r
        assert [(t["max_score"], t["visibility"]) for t in r["tests"]] == [(1, "after_published"), (2, "visible")] + [
            (1, "visible")] * 3
    assert good["score"] == 6 and [t["score"] for t in good["tests"]] == [1, 2, 1, 1, 1], good
    assert all(t["output"].startswith("passed") for t in good["tests"]), good
    assert bad["score"] == 4 and [t["score"] for t in bad["tests"]] == [1, 0, 1, 1, 1], bad
    assert "1/sqrt(d_k)" in bad["tests"][1]["output"] and "01_attention (1).ipynb" in bad["output"], bad


def test_run_autograder_writes_results_when_grading_fails(gradescope):
    """A submission with no notebook: the grader refuses it, and results.json still says so, each exercise at
    0 of its points, the error in `output`."""
    *_, results = gradescope
    crash = results["crash"]
    assert crash["score"] == 0 and crash["output"].startswith("The autograder could not grade"), crash
    assert "no student folders with notebooks" in crash["output"] and "tformer-gradescope" not in crash["output"]
    assert [(t["name"], t["score"], t["max_score"]) for t in crash["tests"]] == [("ch01.softmax", 0, 1),
                                                                                  ("ch01.attention", 0, 2)] + [
        (q, 0, 1) for q in ("ch01.q_sharper_query", "ch01.q_score_variance", "ch01.q_saturation")], crash


def test_gradescope_zip_errors_are_one_line_before_anything_is_built(tmp_path):
    (tmp_path / "a.toml").write_text('notebooks = ["01_attention"]\n')
    (tmp_path / "class").mkdir()
    cases = [
        (("class", "gradescope", tmp_path / "ag.zip"), ("class gradescope", "--assignment")),
        (("grade", "--gradescope-zip", tmp_path / "ag.zip", "--assignment", tmp_path / "a.toml"),
         ("tformer class gradescope ZIP",)),
        (("class", "gradescope", tmp_path / "ag.tar", "--assignment", tmp_path / "a.toml"), (".zip",)),
    ]
    for proc, (_, words) in zip(tformer_all([c for c, _ in cases], tmp_path), cases):
        one_line_error(proc, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.toml", "class"]


def test_gradescope_output_states_the_assignments_points(gradescope):
    """The assignment makes attention worth 2 points, the course 3: the test's max_score and the points its output
    states are 2, not 3."""
    *_, results = gradescope
    attention = next(t for t in results["good"]["tests"] if t["name"] == "ch01.attention")
    assert attention["max_score"] == 2 and attention["output"].endswith(" 2 point(s)."), attention
    assert not any("3 point(s)" in t["output"] for t in results["good"]["tests"]), results["good"]


# --- every LMS export into one OUT -----------------------------------------------------------------------------

NOBODY = "First name,Last name,ID number,Email address\nZed,Zorn,S-999,zed@uni.edu\n"


def _csv_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("*.csv"))


@pytest.fixture(scope="module")
def one_out(tmp_path_factory):
    """A class of two (S-001 right, S-002 without the attention scale), an assignment of chapter 1 with attention
    worth 2 points, graded into one OUT with --lms moodle --roster, then --lms canvas, then no --lms (the later
    runs reuse the journal: nothing is graded again); and a copy of the first OUT graded again with a Moodle
    roster that matches nobody. Each run's process and the CSV files OUT held after it."""
    root = tmp_path_factory.mktemp("one_out")
    cls, out, nobody = root / "class", root / "out", root / "nobody"
    tiny(cls / "S-001")
    tiny(cls / "S-002", NO_SCALE)
    (root / "week1.toml").write_text('notebooks = ["01_attention"]\n\n[points]\n"ch01.attention" = 2\n',
                                     encoding="utf-8")
    (root / "moodle.csv").write_text(MOODLE_EXPORT, encoding="utf-8")
    (root / "nobody.csv").write_text(NOBODY, encoding="utf-8")
    grade = ("class", "grade", cls, "--assignment", root / "week1.toml", "--workers", 2, "--out")
    runs = {"moodle": tformer(*grade, out, "--lms", "moodle", "--roster", root / "moodle.csv", cwd=root)}
    files = {"moodle": _csv_files(out)}
    shutil.copytree(out, nobody)
    with ThreadPoolExecutor(2) as pool:
        none = pool.submit(tformer, *grade, nobody, "--lms", "moodle", "--roster", root / "nobody.csv", cwd=root)
        runs["canvas"] = tformer(*grade, out, "--lms", "canvas", cwd=root)
        files["canvas"] = _csv_files(out)
        runs["plain"] = tformer(*grade, out, cwd=root)
        files["plain"] = _csv_files(out)
        runs["nobody"] = none.result()
    files["nobody"] = _csv_files(nobody)
    for name, proc in runs.items():
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
    return out, runs, files


def _lines(proc: subprocess.CompletedProcess, *words: str) -> list[str]:
    return [line for line in proc.stdout.splitlines() if all(w in line for w in words)]


def test_each_run_leaves_only_its_own_lms_file(one_out):
    """Moodle, then Canvas, then no LMS into one OUT: after each run OUT holds that run's LMS file alone, and the
    run says in one line which file of an earlier run it removed."""
    out, runs, files = one_out
    assert files["moodle"] == ["gradebook.csv", "moodle.csv"], files
    assert files["canvas"] == ["canvas.csv", "gradebook.csv"], files
    assert files["plain"] == ["gradebook.csv"], files
    assert not _lines(runs["moodle"], "removed"), runs["moodle"].stdout[-3000:]
    assert len(_lines(runs["canvas"], "removed", "moodle.csv")) == 1, runs["canvas"].stdout[-3000:]
    assert not _lines(runs["canvas"], "removed", "canvas.csv")
    assert len(_lines(runs["plain"], "removed", "canvas.csv")) == 1, runs["plain"].stdout[-3000:]
    assert not _lines(runs["plain"], "removed", "moodle.csv")
    assert [line for line in runs["plain"].stdout.splitlines() if line.startswith("wrote")] == [
        f"wrote gradebook.csv, grades.json, report.html, feedback/ in {out}"], runs["plain"].stdout[-3000:]


def test_a_roster_that_matches_nobody_writes_no_moodle_file(one_out):
    """A Moodle roster that matches none of the class: no moodle.csv (the earlier run's is removed), one line says
    why and no line per student. The exit is 0: the grades are written, and the line says the Moodle file is not."""
    _, runs, files = one_out
    proc = runs["nobody"]
    assert files["nobody"] == ["gradebook.csv"], files
    said = _lines(proc, "moodle.csv", "not written")
    assert len(said) == 1 and "none of the 2 student(s)" in said[0], proc.stdout[-3000:]
    assert not _lines(proc, "left out of moodle.csv"), proc.stdout[-3000:]
    assert len(_lines(proc, "removed", "moodle.csv")) == 1, proc.stdout[-3000:]
    assert not [line for line in proc.stdout.splitlines() if line.startswith("wrote") and "moodle.csv" in line]


def test_feedback_states_the_assignments_points(one_out):
    """The assignment makes attention worth 2 points, the course 3: S-001's page shows 2/2 and "2 point(s)" for
    it, and no message states 3."""
    out, *_ = one_out
    page = (out / "feedback" / "S-001.html").read_text(encoding="utf-8")
    row = next(r for r in page.split("<tr>") if r.startswith("<td>ch01.attention"))
    assert "<td>2/2</td>" in row and "2 point(s).</pre>" in row, row
    assert "3 point(s)" not in page, page
