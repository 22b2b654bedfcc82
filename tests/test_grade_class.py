"""`tformer grade CLASS --out OUT`: a small class (chapters 1-3) with known verdicts and every broken case.

The class is built in a temporary folder from the solution and learner notebooks (tools/notebooks.py):
ace hands in solutions under LMS names, blank the untouched learner notebooks, mistakes two named mistakes
and no chapter 2, broken a notebook that is not JSON, a deleted definition cell, infinite loops inside and
outside an exercise, an os._exit, a process that outlives its cell, 100 MB of output and a huge allocation."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tformer.grading import REGISTRY, Question, load_exercises
from tformer.grading.classroom import cells as cellplan, gradebook, lms, notebooks, run, submissions
from tformer.grading.classroom.runner import run_notebook
from tformer.grading.classroom.settings import Run, RunSettings
from test_grade_cli import NO_SCALE, cells as _cells, imports as _imports, replace as _replace, write as _write
from tools.notebooks import SRC

load_exercises()                                        # registers every chapter

STEMS = ("01_attention", "02_self_attention", "03_multi_head_attention")
SLEEPER = "3071.5"                    # the seconds of the process a broken notebook leaves behind
HEADER = ["student", "ch01.softmax", "ch01.attention", "ch01.q_sharper_query", "ch01.q_score_variance",
          "ch01.q_saturation", "ch02.self_attention", "ch02.cross_attention", "ch02.q_cross_weights",
          "ch02.q_path_length", "ch03.split_heads", "ch03.merge_heads", "ch03.mha_forward", "ch03.q_params",
          "ch03.q_one_head", "ch01", "ch02", "ch03", "total", "possible"]
EXPECTED = {                                        # the gradebook, cell for cell, in notebook order
    "ace": [1, 3, 1, 1, 1, 2, 1, 1, 1, 1, 1, 2, 1, 1, 7, 5, 6, 18, 18],
    "blank": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 18],
    "broken": [0, 3, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 6, 3, 0, 9, 18],   # questions after the broken cells: graded
    "mistakes": [1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 4, 0, 3, 7, 18],
}
NO_TRANSPOSE = ("def my_split_heads(x, n_heads):\n"
                "    b, t, d = x.shape\n"
                "    return x.reshape(b, n_heads, t, d // n_heads)\n")


def build_class(root: Path) -> Path:
    sol = {s: _cells(s, True) for s in STEMS}
    blank = {s: _cells(s, False) for s in STEMS}
    cls = root / "class"
    old = time.time() - 3600
    _write(cls / "ace" / "01_attention.ipynb", blank["01_attention"], mtime=old)     # an older file: listed, not graded
    _write(cls / "ace" / "01_attention (1).ipynb", sol["01_attention"])
    _write(cls / "ace" / "02_self_attention-1.ipynb", sol["02_self_attention"])
    _write(cls / "ace" / "sub" / "03_multi_head_attention copy.ipynb", sol["03_multi_head_attention"])
    for s in STEMS:
        _write(cls / "blank" / f"{s}.ipynb", blank[s])
    _write(cls / "mistakes" / "01_attention.ipynb", _replace(sol["01_attention"], "def my_attention", NO_SCALE))
    _write(cls / "mistakes" / "03_multi_head_attention.ipynb",
           _replace(sol["03_multi_head_attention"], "def my_split_heads", NO_TRANSPOSE))
    # broken: chapter 1 loops inside an exercise, exits the process, spawns a process that outlives it,
    # prints 100 MB and allocates more than its memory limit; chapter 2 lost a definition cell and loops
    # outside any exercise; chapter 3 is not JSON
    c1 = _replace(sol["01_attention"], "def my_softmax", "def my_softmax(x):\n    while True:\n        pass\n")
    at = next(i for i, c in enumerate(c1) if c.startswith('check("ch01.softmax"')) + 1
    c1[at:at] = ["import os\nos._exit(3)"]
    after = c1.index(_imports(c1)) + 1                     # after the imports cell (the setup cell comes first)
    c1[after:after] = [f"import subprocess\nsubprocess.Popen(['setsid', 'sleep', '{SLEEPER}'])",
               "print('x' * 100_000_000)", "big = torch.ones(2 ** 31)"]
    _write(cls / "broken" / "01_attention.ipynb", c1)
    c2 = [c for c in sol["02_self_attention"] if not c.startswith("def my_self_attention")]
    after = c2.index(_imports(c2)) + 1
    c2[after:after] = ["while True:\n    pass"]
    _write(cls / "broken" / "02_self_attention.ipynb", c2)
    (cls / "broken" / "03_multi_head_attention.ipynb").write_text('{"cells": [')
    return cls


def _sleepers() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and SLEEPER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("grade_class")
    cls = build_class(root)
    out = root / "out"
    grades = run.grade_class(cls, out, Run(settings=RunSettings(timeout=8, workers=2, memory=3 << 30)), progress=False)
    return cls, out, grades


def _mistakes_named(message: str) -> str:
    return message.split("known mistake: ")[1].split(" (on every case)")[0] if "known mistake: " in message else ""


def test_gradebook_cell_for_cell(graded):
    _, out, _ = graded
    rows = list(csv.reader((out / "gradebook.csv").open()))
    assert rows[0] == HEADER
    assert {r[0]: [int(x) for x in r[1:]] for r in rows[1:]} == EXPECTED
    assert [r[0] for r in rows[1:]] == sorted(EXPECTED)                  # one row per student, no duplicates


def test_grades_json_has_hashes_seeds_statuses_and_the_file_not_graded(graded):
    cls, out, grades = graded
    data = json.loads((out / "grades.json").read_text())
    assert data["grader"] == run.grader_hash() and len(data["grader"]) == 64
    st = {s["student"]: s for s in data["students"]}
    ace = {nb["notebook"]: nb for nb in st["ace"]["notebooks"]}
    assert ace["01_attention"]["file"] == "01_attention (1).ipynb" and ace["01_attention"]["ignored"] == ["01_attention.ipynb"]
    assert ace["03_multi_head_attention"]["file"] == os.path.join("sub", "03_multi_head_attention copy.ipynb")
    assert len(ace["01_attention"]["sha256"]) == 64
    att = next(e for e in ace["01_attention"]["exercises"] if e["exercise"] == "ch01.attention")
    assert att["status"] == "passed" and len(att["seeds"]) == REGISTRY["ch01.attention"].n_random and att["torch_seed"] is not None
    # the fast path ran the import cell and the exercises' cells only
    assert len(ace["01_attention"]["cells_run"]) < ace["01_attention"]["cells"]
    # what the grader read itself: the untouched stubs earn nothing as stubs; no cell reaches into the grader
    for nb in st["blank"]["notebooks"]:
        for e in nb["exercises"]:
            question = isinstance(REGISTRY[e["exercise"]], Question)
            assert e["stub"] is not question and e["status"] in ("not attempted", "failed"), e
        assert nb["flags"] == [] and nb["stub_rule"] == "applied"
    assert not any(e["stub"] for nb in st["ace"]["notebooks"] for e in nb["exercises"])
    assert all(nb["flags"] == [] for s in st.values() for nb in s["notebooks"])
    settings = data["settings"]
    assert settings["notebook_timeout"] == run.NOTEBOOK_TIMEOUT and settings["limits"]["cell_timeout"] == 8
    assert settings["isolation"]["landlock_abi"] == settings["landlock_abi"] and settings["sandbox_failure"] is None
    assert st["mistakes"]["missing_notebooks"] == ["02_self_attention"]
    mis = st["mistakes"]["exercises"]
    assert mis["ch02.self_attention"]["status"] == "missing" and mis["ch01.attention"]["status"] == "failed"
    msg = next(e for nb in st["mistakes"]["notebooks"] for e in nb["exercises"] if e["exercise"] == "ch01.attention")["message"]
    assert _mistakes_named(msg) == "missing 1/sqrt(d_k) scale", msg
    msg = next(e for nb in st["mistakes"]["notebooks"] for e in nb["exercises"] if e["exercise"] == "ch03.split_heads")["message"]
    assert "reshape without the transpose" in _mistakes_named(msg), msg


def test_broken_cases_each_get_a_status_and_the_rest_is_graded(graded):
    _, _, grades = graded
    st = {s["student"]: s for s in grades["students"]}
    broken = st["broken"]
    ex = broken["exercises"]
    assert ex["ch01.softmax"]["status"] == "timeout"                       # an infinite loop inside an exercise
    assert ex["ch01.attention"]["status"] == "passed"                      # collected before os._exit, graded after it
    assert ex["ch02.self_attention"]["status"] == "not run"                # its definition cell deleted
    assert ex["ch02.cross_attention"]["status"] == "passed"                # after a loop outside any exercise
    assert ex["ch03.split_heads"]["status"] == "not run"                   # not a notebook
    nbs = {nb["notebook"]: nb for nb in broken["notebooks"]}
    assert nbs["03_multi_head_attention"]["status"] == "invalid"
    errors1 = " | ".join(nbs["01_attention"]["cell_errors"])
    assert "ended the notebook's process" in errors1 and "ran again without it" in errors1, errors1
    assert "allocate" in errors1 or "MemoryError" in errors1, errors1     # the memory limit held in that cell
    errors2 = " | ".join(nbs["02_self_attention"]["cell_errors"])
    assert "ran longer than 8 s" in errors2 and "NameError" in errors2, errors2
    assert sorted(broken["notebooks_with_errors"]) == list(STEMS)
    assert not _sleepers(), "a process the notebook started outlived its worker"
    assert st["ace"]["notebooks_with_errors"] == [] and st["ace"]["total"] == 18


def test_fast_path_verdicts_equal_a_full_run(graded):
    """The same seeds, every cell run in a fresh worker (today's `tformer grade`): the same status and the same
    named mistake for every exercise."""
    cls, _, grades = graded
    st = {s["student"]: s for s in grades["students"]}
    for student, stem in (("mistakes", "01_attention"), ("mistakes", "03_multi_head_attention")):
        nb = next(n for n in st[student]["notebooks"] if n["notebook"] == stem)
        seeds = {e["exercise"]: {"cases": e["seeds"], "torch_seed": e["torch_seed"]} for e in nb["exercises"]}
        full = {r.exercise: r for r in run_notebook(cls / student / nb["file"], timeout=120, seeds=seeds).rows}
        for e in nb["exercises"]:
            r = full[e["exercise"]]
            assert (r.status, _mistakes_named(r.message)) == (e["status"], _mistakes_named(e["message"])), (e, r)
            assert r.message == e["message"]


def test_resume_after_kill_and_regrade_after_a_checker_change(tmp_path, monkeypatch):
    cls = tmp_path / "class"
    for student in ("a", "b", "c"):
        for s in STEMS[:2]:
            _write(cls / student / f"{s}.ipynb", _cells(s, student != "b"))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tformer.cli", "class", "grade", str(cls), "--out", str(out), "--workers", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    journal = out / "journal.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (journal.exists() and journal.read_text().count("\n") >= 2):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)                                  # kill -9, mid-class
    proc.wait()
    before = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    assert 2 <= len(before) < 6, len(before)
    with journal.open("a") as f:                                         # a line cut short by the kill
        f.write('{"student": "a", "notebook": "02_self_att')
    grades = run.grade_class(cls, out, Run(settings=RunSettings(workers=2)), progress=False)
    after = [json.loads(line) for line in journal.read_text().splitlines()[len(before) + 1:]]
    keys = [(r["student"], r["notebook"]) for r in before + after]
    assert len(keys) == len(set(keys)) == 6                              # nothing graded twice, nothing lost
    assert [(s["student"], s["total"]) for s in grades["students"]] == [("a", 12), ("b", 0), ("c", 12)]
    rows = list(csv.reader((out / "gradebook.csv").open()))
    assert [r[0] for r in rows[1:]] == ["a", "b", "c"]
    # the same command again grades nothing; a changed checker grades everything again
    run.grade_class(cls, out, Run(settings=RunSettings(workers=2)), progress=False)
    assert len(journal.read_text().splitlines()) == 7                    # the six, and the cut line
    monkeypatch.setattr(run, "grader_hash", lambda: "0" * 64)
    run.grade_class(cls, out, Run(settings=RunSettings(workers=2)), progress=False)
    assert len(journal.read_text().splitlines()) == 13


def test_lms_names_and_class_folder_errors(tmp_path, capsys):
    from tformer.cli import main
    known = notebooks.known_stems()
    assert notebooks.notebook_stem("04_positional_encoding (1).ipynb", known) == "04_positional_encoding"
    assert notebooks.notebook_stem("11_llms (1).ipynb", known) == "11_llms"
    assert notebooks.notebook_stem("11_llms-2.ipynb", known) == "11_llms"
    assert notebooks.notebook_stem("01_tiny copy.ipynb", known) == "01_tiny"
    assert notebooks.notebook_stem("notes.ipynb", known) is None
    _write(tmp_path / "mixed" / "01_attention.ipynb", ["x = 1"])
    _write(tmp_path / "mixed" / "alice" / "01_attention.ipynb", ["x = 1"])
    assert main(["class", "grade", str(tmp_path / "mixed"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "both chapter notebooks" in err and len(err.splitlines()) == 1, err
    _write(tmp_path / "cls" / "alice" / "01_attention.ipynb", ["x = 1"])
    with pytest.raises(SystemExit) as stop:                                         # a class needs --out
        main(["class", "grade", str(tmp_path / "cls")])
    assert stop.value.code == 2
    assert "--out" in capsys.readouterr().err


def test_cell_plan_rule():
    """A cell that differs from every released cell always runs; released cells run only when needed."""
    released = frozenset(cellplan.normalize(c) for c in ["import torch", "x = torch.ones(3)", "y = 2", "heavy = 1",
                                                          "def f(a):\n    raise NotImplementedError",
                                                          "check('ch01.softmax', f)"])
    cells = ["import torch", "x = torch.ones(3)", "y = 2  ", "heavy = 1",
             "def f(a):\n    return a * y", "check('ch01.softmax', f)", "print(x)"]
    plan = cellplan.plan(cells, released)
    assert plan.edited == [4, 6] and plan.run == [0, 1, 2, 4, 5, 6] and plan.skipped == [3]


def test_every_exercise_on_the_fast_path(tmp_path):
    """Every chapter through the class's fast path: the solution notebooks pass every exercise, the learner
    notebooks read "not attempted", and each registered mistake injected into a notebook is named."""
    from tformer.grading.classroom.notebooks import exercises_of
    stems = sorted(p.stem for p in SRC.glob("[0-9][0-9]*_*.py"))
    rounds = max(len(ex.mistakes) for ex in REGISTRY.values())
    want: dict[tuple[str, str], tuple[str, str]] = {}
    for stem in stems:
        sol, blank = _cells(stem, True), _cells(stem, False)
        _write(tmp_path / "class" / "solutions" / f"{stem}.ipynb", sol)
        _write(tmp_path / "class" / "blank" / f"{stem}.ipynb", blank)
        for name in exercises_of(Path(stem + ".ipynb")):
            want[("solutions", name)] = ("passed", "")
            want[("blank", name)] = ("not attempted", "")
        for k in range(rounds):
            cells = list(sol)
            for name in exercises_of(Path(stem + ".ipynb")):
                mistakes = sorted(REGISTRY[name].mistakes)
                if not mistakes:
                    continue
                mistake = mistakes[k % len(mistakes)]
                if isinstance(REGISTRY[name], Question):         # a question: its cell answers the mistake's value
                    i = next(i for i, c in enumerate(cells) if f'check("{name}"' in c)
                    cells[i] = f"answer = {REGISTRY[name].mistakes[mistake]!r}\ncheck({name!r}, answer)\n"
                    want[(f"mistakes{k}", name)] = ("failed", mistake)
                    continue
                fn = next(c.split(",")[1].strip(" )\n") for c in cells if c.startswith(f'check("{name}"'))
                i = next(i for i, c in enumerate(cells) if c.startswith(f"def {fn}("))
                cells[i] = (f"from tformer.grading.core import REGISTRY as _R\n"
                            f"{fn} = _R[{name!r}].mistakes[{mistake!r}]\n")
                want[(f"mistakes{k}", name)] = ("failed", mistake)
            _write(tmp_path / "class" / f"mistakes{k}" / f"{stem}.ipynb", cells)
    grades = run.grade_class(tmp_path / "class", tmp_path / "out", progress=False)
    got = {}
    for s in grades["students"]:
        for nb in s["notebooks"]:
            assert nb["status"] == "graded", (s["student"], nb["notebook"], nb["cell_errors"])
            for e in nb["exercises"]:
                got[(s["student"], e["exercise"])] = (e["status"], _mistakes_named(e["message"]))
    bad = {k: (got.get(k), v) for k, v in want.items()
           if got.get(k) is None or got[k][0] != v[0] or v[1] not in got[k][1]}
    assert not bad, bad


def test_feedback_pages_and_report(graded, monkeypatch):
    from tformer.grading.classroom import feedback
    _, out, grades = graded
    pages = {p.stem: p.read_text() for p in (out / "feedback").glob("*.html")}
    assert sorted(pages) == sorted(EXPECTED)
    for text in pages.values():                                          # self-contained, offline
        assert "<script" not in text and "src=" not in text and "<link" not in text
    assert "ch01.attention" in pages["ace"] and "18 of 18 points" in pages["ace"]
    assert "01_attention.ipynb" in pages["ace"]                          # the older file, listed
    assert "missing 1/sqrt(d_k) scale" in pages["mistakes"] and "Notebooks not handed in: 02_self_attention" in pages["mistakes"]
    assert "Cells that raised" in pages["broken"] and "ended the notebook&#x27;s process" in pages["broken"]
    assert "could not be graded" in pages["broken"]
    report = (out / "report.html").read_text()
    assert "<svg" in report and "Score distribution" in report
    assert "ch01.attention: 1 of 4, missing 1/sqrt(d_k) scale" in report, report
    errored = report.split("Students whose notebooks errored or timed out")[1]
    assert "broken" in errored and "ace" not in errored.split("</ul>")[0]
    assert "Answers that look alike" in report and set(grades["similar"]) >= {"pairs", "reference", "rule"}
    monkeypatch.setenv("TFORMER_LANG", "zh")
    zh = feedback.feedback_page(next(s for s in grades["students"] if s["student"] == "ace"), grades["exercises"])
    assert '<html lang="zh-CN">' in zh and "练习" in zh and "通过" in zh


CANVAS_EXPORT = """Student,ID,SIS User ID,SIS Login ID,Section,Attention quiz (1017),Current Points,Final Points
    Points Possible,,,,,10.00,(read only),(read only)
"Lovelace, Ada",4101,S-001,ada@uni.edu,Transformers 101,8.00,8.00,8.00
"Turing, Alan",4102,S-002,alan@uni.edu,Transformers 101,9.00,9.00,9.00
"Student, Test",,,,,,,
"""


def test_canvas_download_roster_and_gradebook_import(tmp_path):
    cls = tmp_path / "submissions"                                       # Canvas's bulk download: one flat folder
    _write(cls / "lovelaceada_4101_99001_01_attention.ipynb", _cells("01_attention", True))
    _write(cls / "turingalan_LATE_4102_99002_01_attention-1.ipynb", _cells("01_attention", False))
    roster = tmp_path / "canvas-export.csv"
    roster.write_text(CANVAS_EXPORT)
    assert sorted(lms.read_roster(roster)) == ["4101", "4102"]
    grades = run.grade_class(cls, tmp_path / "out", Run(settings=RunSettings(lms="canvas", roster=roster)), progress=False)
    assert [(s["student"], s["canvas_id"], s["total"]) for s in grades["students"]] == [
        ("lovelaceada_4101", "4101", 7), ("turingalan_4102", "4102", 0)]
    rows = list(csv.reader((tmp_path / "out" / "canvas.csv").open()))
    sample = list(csv.reader(CANVAS_EXPORT.splitlines()))
    assert rows[0][:5] == sample[0][:5] and rows[0][5:] == ["tformer ch01"]   # Canvas's identifying columns
    assert rows[1][0].strip() == sample[1][0].strip() == "Points Possible" and rows[1][5:] == ["7"]
    assert rows[2] == ["Lovelace, Ada", "4101", "S-001", "ada@uni.edu", "Transformers 101", "7"]
    assert rows[3] == ["Turing, Alan", "4102", "S-002", "alan@uni.edu", "Transformers 101", "0"]


def test_a_worker_cannot_write_a_file_past_its_limit(tmp_path):
    """The file-size limit: the write (into the worker's temporary folder, the one it may write to) fails in its
    cell (Python ignores SIGXFSZ), the notebook goes on."""
    from tformer.grading.classroom.runner import grade_cells
    from tformer.grading.classroom.sandbox import Limits, WarmProcess
    warm = WarmProcess({"TFORMER_GRADE": "learner", "MPLBACKEND": "Agg"}, Limits(memory=4 << 30, file_size=1 << 20))
    try:
        cells = [(0, "import torch\nfrom tformer.grading import check"),
                 (1, "import os, tempfile\nbig = os.path.join(tempfile.gettempdir(), 'big.bin')\n"
                     "open(big, 'wb').write(b'x' * (2 << 20))"),
                 (2, "assert os.path.getsize(big) <= 1 << 20, 'the file outgrew the limit'"),
                 (3, "def sm(x):\n    e = torch.exp(x - x.amax(-1, keepdim=True))\n    return e / e.sum(-1, keepdim=True)\n"
                     "check('ch01.softmax', sm)")]
        rep = grade_cells(Path("01_attention.ipynb"), cells, lambda: warm.spawn(tmp_path), 60)
    finally:
        warm.close()
    assert any("File too large" in e or "Errno 27" in e for e in rep.cell_errors), rep.cell_errors
    assert not any("outgrew" in e for e in rep.cell_errors), rep.cell_errors
    assert {r.exercise: r.status for r in rep.rows}["ch01.softmax"] == "passed"


def test_verify_reproduces_the_verdicts_and_names_a_changed_notebook(graded, tmp_path):
    """--verify grades again with the recorded seeds: the same status and named mistakes for every exercise
    of the notebooks still as graded; an edited notebook is reported by its sha256; exit 1 then."""
    import shutil
    from tformer.cli import main
    cls, out, _ = graded
    copy = tmp_path / "class"
    for who in ("ace", "mistakes"):                                  # two students: the others are "gone"
        shutil.copytree(cls / who, copy / who)
    res = run.verify(out / "grades.json", copy, timeout=8, workers=2, log=lambda *a: None)
    assert res["differ"] == [] and res["changed"] == [] and res["checked"] >= 4, res
    assert any(g.startswith("blank/") for g in res["gone"])
    nb = copy / "mistakes" / "01_attention.ipynb"
    nb.write_text(nb.read_text().replace("float('-inf')", "float('-1e9')"))
    assert main(["class", "verify", str(out / "grades.json"), str(copy), "--timeout", "8"]) == 1


def test_weights_and_overrides(graded, tmp_path):
    """A teacher's weights rescale the points a passed exercise earns; an override wins over the autograde,
    and the student's feedback shows its reason; unknown names are one-line errors."""
    import copy
    from tformer.grading.classroom import feedback
    _, _, grades = graded
    g = copy.deepcopy(grades)
    (tmp_path / "w.txt").write_text("# heavier attention\nch01.attention = 10\n")
    (tmp_path / "o.csv").write_text("student,exercise,points,reason\nmistakes,ch01.attention,2,the scale is in "
                                    "a comment below the cell\n")
    gradebook.score(g, gradebook.read_weights(tmp_path / "w.txt"), gradebook.read_overrides(tmp_path / "o.csv"))
    ace = next(s for s in g["students"] if s["student"] == "ace")
    old_ace = next(s for s in grades["students"] if s["student"] == "ace")
    assert ace["exercises"]["ch01.attention"]["earned"] == 10 and ace["total"] == old_ace["total"] + 10 - 3
    assert ace["possible"] == old_ace["possible"] + 7
    mis = next(s for s in g["students"] if s["student"] == "mistakes")
    assert mis["exercises"]["ch01.attention"]["earned"] == 2 and mis["exercises"]["ch01.attention"]["status"] == "failed"
    page = feedback.feedback_page(mis, g["exercises"])
    assert "Set by your teacher: the scale is in a comment below the cell" in page and "2/10" in page
    (tmp_path / "bad.txt").write_text("ch01.atention = 3\n")
    with pytest.raises(submissions.ClassError, match="ch01.atention"):
        gradebook.read_weights(tmp_path / "bad.txt")


def test_the_grader_hash_covers_every_module_of_the_grader_but_the_pages(tmp_path):
    """A checker fix regrades: changing the bytes of any module of tformer/grading (the checker, the runner and
    the worker in classroom/ included) changes the hash; the feedback pages' module does not."""
    import shutil
    import tformer.grading
    copy = tmp_path / "grading"
    shutil.copytree(Path(tformer.grading.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__", "locale"))
    base = run.grader_hash(copy)
    assert base == run.grader_hash(copy) and len(base) == 64
    for rel in ("core.py", "equality.py", "classroom/runner.py", "classroom/worker.py", "exercises/ch01.py"):
        f = copy / rel
        text = f.read_text()
        f.write_text(text + "\n# a fix\n")
        assert run.grader_hash(copy) != base, rel
        f.write_text(text)
    (copy / "classroom" / "feedback.py").write_text("# other pages\n")
    assert run.grader_hash(copy) == base
