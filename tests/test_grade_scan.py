"""scan.py: what the grader reads in a notebook's source itself, whatever its worker reports. The released stub
(compared by syntax tree, docstrings and its name aside) earns nothing; the cells that reach into the grader are
flagged, one line each; the course's own notebooks, released and solved, are neither."""
from __future__ import annotations

from pathlib import Path

import pytest

from tformer.grading import load_exercises
from tformer.grading.classroom import gradebook, lms, scan
from tformer.grading.classroom.notebooks import exercises_of, released_notebooks
from test_grade_cli import cells, write
from tools.notebooks import SRC

load_exercises()

FORGE = "import tformer.grading.core as C; C.run_learner = lambda ex, fn, cases: C.Outcome()"
STEMS = sorted(p.stem for p in SRC.glob("[0-9][0-9]*_*.py"))


def released(stem: str) -> list[Path]:
    return released_notebooks().get(stem, [])


@pytest.mark.parametrize("stem", STEMS)
def test_the_course_notebooks_are_stubs_or_solutions_and_never_flagged(stem):
    """Every released notebook (English and Chinese) is all stubs, every solved one none; no cell of either is
    flagged."""
    owed = {n for n in exercises_of(Path(stem + ".ipynb")) if not n.split(".")[1].startswith("q_")}
    assert released(stem), f"no released notebook of {stem}"
    for path in released(stem):
        from tformer.grading.classroom.notebooks import read_cells
        src = read_cells(path)
        stubs, found = scan.stub_exercises(src, stem, released(stem))
        assert found and stubs >= owed, (path, owed - stubs)
        assert scan.flags(src) == [], (path, scan.flags(src))
    sol = cells(stem, True)
    assert scan.stub_exercises(sol, stem, released(stem)) == (set(), True)
    assert scan.flags(sol) == []


def test_a_stub_is_a_stub_after_a_docstring_a_new_name_or_a_forgery():
    stub = cells("01_attention", False)
    both = {"ch01.softmax", "ch01.attention"}
    # the forged cell changes nothing of what the grader reads
    assert scan.stub_exercises(stub + [FORGE], "01_attention", released("01_attention"))[0] == both
    # a docstring added; the function renamed (the check cell hands in the new name)
    doc = [c.replace("def my_softmax(x):\n", 'def my_softmax(x):\n    """mine, honest"""\n') for c in stub]
    renamed = [c.replace("my_attention", "attn") for c in stub]
    for src in (doc, renamed):
        assert scan.stub_exercises(src, "01_attention", released("01_attention"))[0] == both
    # rebinding the name after its check cell does not change what check(...) handed in
    late = stub + ["my_softmax = lambda x: x.softmax(-1)"]
    assert "ch01.softmax" in scan.stub_exercises(late, "01_attention", released("01_attention"))[0]
    # a function that raises NotImplementedError is a stub even with no released notebook (the rule not applied)
    stubs, found = scan.stub_exercises(stub, "01_attention", [])
    assert found is False and stubs == both


def test_a_real_answer_is_never_a_stub():
    """What the scan cannot follow is graded as the worker reports: a solution, a name rebound before the check
    cell, a decorated stub, a name bound through globals()."""
    stub = cells("01_attention", False)
    at = next(i for i, c in enumerate(stub) if c.startswith('check("ch01.softmax"'))
    rebound = stub[:at] + ["my_softmax = lambda x: x.softmax(-1)"] + stub[at:]
    via_globals = stub[:at] + ["globals()['my_softmax'] = lambda x: x.softmax(-1)"] + stub[at:]
    one_cell = stub[:at] + ["def my_softmax(x):\n    return x.softmax(-1)\ncheck('ch01.softmax', my_softmax)"] + stub[at + 1:]
    for src in (rebound, via_globals, one_cell):
        assert "ch01.softmax" not in scan.stub_exercises(src, "01_attention", released("01_attention"))[0]
    # a check cell deleted: the released name's last binding in the notebook is graded
    gone = [c for c in stub if not c.startswith('check("ch01.softmax"')]
    assert "ch01.softmax" in scan.stub_exercises(gone, "01_attention", released("01_attention"))[0]
    fixed = gone + ["def my_softmax(x):\n    return x.softmax(-1)"]
    assert "ch01.softmax" not in scan.stub_exercises(fixed, "01_attention", released("01_attention"))[0]


def test_a_teachers_released_folder_is_read(tmp_path):
    """An assignment's `released` folder: a teacher's stub, compared as the course's are."""
    stub = ["from tformer.grading import check", "def double(x):\n    return x  # TODO", "check('w03.double', double)"]
    write(tmp_path / "released" / "w03_double.ipynb", stub)
    stubs, found = scan.stub_exercises(stub, "w03_double", [tmp_path / "released"])
    assert found and stubs == {"w03.double"}
    done = stub[:1] + ["def double(x):\n    return 2 * x"] + stub[2:]
    assert scan.stub_exercises(done, "w03_double", [tmp_path / "released"]) == (set(), True)


@pytest.mark.parametrize("cell, words", [
    (FORGE, ["imports tformer.grading.core", "assigns to C.run_learner"]),
    ("from tformer.grading.classroom.worker import write_frame", ["write_frame"]),
    ("from tformer.grading import check, core", ["imports core from tformer.grading"]),
    ("import gc\nfor o in gc.get_objects():\n    pass", ["gc.get_objects"]),
    ("from gc import get_referrers", ["gc.get_referrers"]),
    ("import sys\nsys.modules['tformer.grading.core'] = None", ["edits sys.modules"]),
    ("import sys\nsys.modules.pop('torch')", ["edits sys.modules"]),
    ("import tformer\ntformer.grading.core.run_learner = print", ["assigns to tformer.grading.core.run_learner"]),
    ("from tformer import attention\nsetattr(attention, 'softmax', max)", ["setattr"]),
    ("import sys\nf = sys._getframe(1).f_back", ["sys._getframe", ".f_back"]),
    ("exec('import tformer.grading.core as C')", ["exec(...) imports tformer.grading.core"]),
    ("exec(''.join(['imp', 'ort os']))", ["code built at run time"]),
    ("m = __import__('tformer.grading.core')", ["imports tformer.grading.core"]),
    ("%time import tformer.grading.core", ["imports tformer.grading.core"]),
    ("from tformer.grading import check\ng = check.__globals__", [".__globals__"]),
    ("import sys\nsys.settrace(lambda *a: None)", ["sys.settrace"]),
    ("import os\nfds = os.listdir('/proc/self/fd')", ["/proc/self/fd"]),
])
def test_cells_that_reach_into_the_grader_are_flagged(cell, words):
    out = scan.flags(["import torch", cell])
    assert len(out) == 1 and out[0].startswith("code cell 2: "), out
    assert all(w in out[0] for w in words), out


def test_ordinary_cells_are_not_flagged():
    ok = ["from tformer.grading import check", "import tformer\nblock = tformer.TransformerBlock", "model.eval()",
          "import gc\ngc.collect()", "judge = 3\nprint(judge)", "x = {'a': 1}\nx['a'] = 2", "import sys\nprint(sys.version)",
          "!pip install nothing", "def f(:", "class A:\n    def run(self):\n        self.x = 1"]
    assert scan.flags(ok) == []


def test_not_graded_is_blank_and_a_stub_row_earns_nothing():
    """gradebook.csv and the LMS files: an exercise whose notebook was not graded is blank, its chapter and the
    total too, never 0 (the stub rows: test_apply_reads_a_learners_report_as_a_class_run_does)."""
    grades = {"settings": {"notebooks": ["01_attention"]}, "exercises": [
        {"id": "ch01.softmax", "chapter": "ch01", "points": 1}, {"id": "ch01.attention", "chapter": "ch01", "points": 3}],
        "students": [
            {"student": "a", "total": 0, "possible": 4, "chapters": {"ch01": 0}, "not_graded": [
                {"notebook": "01_attention", "why": "the sandbox could not be built"}],
             "exercises": {"ch01.softmax": {"earned": 0, "status": "not graded"},
                           "ch01.attention": {"earned": 0, "status": "not graded"}},
             "notebooks": [{"notebook": "01_attention", "exercises": [], "flags": []}], "notebooks_with_errors": []},
            {"student": "b", "total": 1, "possible": 4, "chapters": {"ch01": 1},
             "exercises": {"ch01.softmax": {"earned": 1, "status": "passed"},
                           "ch01.attention": {"earned": 0, "status": "failed"}},
             "notebooks": [{"notebook": "01_attention", "exercises": [], "flags": ["code cell 3: uses gc.get_objects"],
                            "stopped": "stopped after 5 s (the notebook's time budget)"}],
             "notebooks_with_errors": []}]}
    book = gradebook.gradebook_rows(grades)
    assert book[1] == ["a", "", "", "", "", 4] and book[2] == ["b", 1, 0, 1, 1, 4]
    canvas = lms.canvas_csv(grades)[0].splitlines()
    assert canvas[2].endswith(",") and canvas[3].endswith(",1")
    moodle = lms.moodle_csv(grades)[0].splitlines()
    assert moodle[1] == "a,-" and moodle[2] == "b,1"
    text = gradebook.summary(grades)
    assert "not graded: a/01_attention: the sandbox could not be built" in text
    assert "flagged for review: b/01_attention: code cell 3: uses gc.get_objects" in text
    assert "b/01_attention: stopped after 5 s" in text


def test_apply_reads_a_learners_report_as_a_class_run_does():
    """scan.apply on a runner.NotebookReport (a class run's and one learner's `tformer grade PATH`): a forged
    "passed" stub row earns nothing, a row never run stays "not run", the forged cell is in report.flags."""
    from tformer.grading.classroom.runner import NotebookReport, Row
    stub = cells("01_attention", False) + [FORGE]
    rep = NotebookReport("01_attention.ipynb", "ch01", rows=[Row("ch01.softmax", 1, True, "passed", "passed all 0 cases"),
                                                             Row("ch01.attention", 3, False, "not run", "")])
    assert scan.apply(rep, stub, "01_attention") is True
    assert (rep.rows[0].passed, rep.rows[0].status) == (False, "not attempted") and rep.earned == 0
    assert "released stub" in rep.rows[0].message and rep.rows[0].stub is True and rep.rows[0].fraction is None
    assert rep.rows[1].status == "not run" and rep.rows[1].stub is False
    assert len(rep.flags) == 1 and "run_learner" in rep.flags[0]
