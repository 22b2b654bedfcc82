"""`tformer grade` as a teacher types it: every option of `tformer grade --help`, run through the entry point
(`python -m tformer grade ...`, a subprocess started in a folder outside the checkout), checked by the files it
wrote and its exit code. The flag tests share one graded class (a module-scoped OUT); the error paths exit
before any grading."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools.notebooks import SRC, build_notebook

CHECKOUT = Path(__file__).resolve().parents[1]
NO_SCALE = ("def my_attention(q, k, v, mask=None):\n"
            "    s = q @ k.transpose(-2, -1)\n"
            "    if mask is not None:\n"
            "        s = s.masked_fill(~mask, float('-inf'))\n"
            "    w = torch.softmax(s, dim=-1)\n"
            "    return w @ v, w\n")


def cells(stem: str, solutions: bool) -> list[str]:
    return [c.source for c in build_notebook(SRC / f"{stem}.py", solutions).cells if c.cell_type == "code"]


def write(path: Path, sources: list[str], mtime: float | None = None) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in sources],
                                  metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def replace(sources: list[str], starts: str, new: str) -> list[str]:
    i = next(i for i, c in enumerate(sources) if c.startswith(starts))
    return sources[:i] + [new] + sources[i + 1:]


def tformer(*args, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """The command as typed, from `cwd` (outside the checkout)."""
    assert not Path(cwd).resolve().is_relative_to(CHECKOUT)
    env = {k: v for k, v in os.environ.items() if k not in ("TFORMER_LANG", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "tformer", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The command failed with exit 2 and one line on stderr naming `words`."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    return err


def rows(path: Path) -> list[list[str]]:
    return list(csv.reader(Path(path).open(encoding="utf-8")))


def book(out: Path) -> dict[str, dict[str, str]]:
    """gradebook.csv as {student: {column: value}}."""
    head, *body = rows(out / "gradebook.csv")
    return {r[0]: dict(zip(head, r)) for r in body}


# --- the class every flag test shares ----------------------------------------------------------------------

ROSTER = ("Student,ID,SIS User ID,SIS Login ID,Section,Assignment 1\n"
          "    Points Possible,,,,,10\n"
          "\"Lovelace, Ada\",4101,S-001,ada,Sec A,\n"
          "\"Babbage, Charles\",4102,S-002,bob,Sec A,\n"
          "\"Cy, Young\",4103,S-003,cy,Sec B,\n")


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    """A class of three (ada solved chapters 1 and 2, bob left out the attention scale, cy handed in the stub),
    graded once with the teacher's knobs: OUT, the class folder and the working folder."""
    root = tmp_path_factory.mktemp("grade_cli")
    cls = root / "class"
    sol1, sol2 = cells("01_attention", True), cells("02_self_attention", True)
    write(cls / "ada" / "01_attention.ipynb", sol1)
    write(cls / "ada" / "02_self_attention.ipynb", sol2)
    write(cls / "bob" / "01_attention.ipynb", replace(sol1, "def my_attention", NO_SCALE))
    write(cls / "cy" / "01_attention.ipynb", cells("01_attention", False))
    (root / "weights.txt").write_text("# attention counts double\nch01.attention = 6\n", encoding="utf-8")
    (root / "overrides.csv").write_text("student,exercise,points,reason\n"
                                        "bob,ch01.attention,2,the scale is in the next cell\n", encoding="utf-8")
    (root / "roster.csv").write_text(ROSTER, encoding="utf-8")
    out = root / "out"
    proc = tformer("grade", cls, "--out", out, "--workers", 2, "--timeout", 60, "--memory", "3G",
                   "--weights", root / "weights.txt", "--overrides", root / "overrides.csv",
                   "--lms", "canvas", "--roster", root / "roster.csv", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, cls, out, proc


def test_a_class_with_the_teachers_knobs(room):
    """--out, --workers, --timeout, --memory, --weights, --overrides, --lms canvas and --roster, as typed."""
    root, cls, out, proc = room
    grades = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    s = grades["settings"]
    assert (s["timeout"], s["workers"], s["memory"]) == (60, 2, 3 << 30)
    assert s["weights"] == {"ch01.attention": 6}
    b = book(out)
    assert b["ada"]["ch01.attention"] == "6" and b["ada"]["possible"] == str(int(b["ada"]["total"]))
    assert b["bob"]["ch01.attention"] == "2"                             # the override wins over "failed"
    assert b["cy"]["total"] == "0"
    page = (out / "feedback" / "bob.html").read_text(encoding="utf-8")
    assert "the scale is in the next cell" in page
    canvas = rows(out / "canvas.csv")
    assert canvas[1][0] == "Points Possible"
    assert "wrote" in proc.stdout and "gradebook.csv" in proc.stdout


def test_only_regrades_one_exercise(room, tmp_path):
    """--only EXERCISE, the README's example: that exercise graded again, every other verdict kept."""
    root, cls, out, _ = room
    again = tmp_path / "again"
    shutil.copytree(out, again)
    before = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    proc = tformer("grade", cls, "--out", again, "--only", "ch01.attention", "--weights", root / "weights.txt",
                   "--overrides", root / "overrides.csv", "--workers", 2, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = json.loads((again / "grades.json").read_text(encoding="utf-8"))
    seeds = {(s["student"], x["exercise"]): x["seeds"] for s in before["students"] for nb in s["notebooks"]
             for x in nb["exercises"]}
    for s in after["students"]:
        for nb in s["notebooks"]:
            for x in nb["exercises"]:
                same = seeds[(s["student"], x["exercise"])] == x["seeds"]
                assert same != (x["exercise"] == "ch01.attention"), (s["student"], x["exercise"])
    assert (again / "gradebook.csv").read_text() == (out / "gradebook.csv").read_text()


def test_verify_with_the_recorded_settings(room, tmp_path):
    """--verify OUT/grades.json CLASS: exit 0 when every verdict is reproduced; exit 1 and the notebook named
    once one changed."""
    root, cls, out, _ = room
    proc = tformer("grade", "--verify", out / "grades.json", cls, "--workers", 2, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 verdict(s) differ" in proc.stdout
    copy = tmp_path / "class"
    shutil.copytree(cls, copy)
    nb = copy / "bob" / "01_attention.ipynb"
    nb.write_text(nb.read_text(encoding="utf-8").replace("float('-inf')", "float('-1e9')"), encoding="utf-8")
    proc = tformer("grade", "--verify", out / "grades.json", copy, "--timeout", 90, cwd=tmp_path)
    assert proc.returncode == 1 and "bob/01_attention: changed" in proc.stdout, proc.stdout[-3000:]


def test_shards_merge_to_the_single_run(room, tmp_path):
    """--shard K/N twice (each OUT seeded with the journal, so nothing is graded again), then --merge."""
    root, cls, out, _ = room
    parts = []
    for k in (1, 2):
        part = tmp_path / f"out_{k}"
        part.mkdir()
        shutil.copy(out / "journal.jsonl", part / "journal.jsonl")
        proc = tformer("grade", cls, "--out", part, "--shard", f"{k}/2", "--weights", root / "weights.txt",
                       "--overrides", root / "overrides.csv", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        parts.append(part)
    merged = tmp_path / "merged"
    proc = tformer("grade", "--merge", *parts, "--out", merged, "--lms", "canvas", "--roster", root / "roster.csv",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert book(merged) == book(out)
    assert rows(merged / "canvas.csv") == rows(out / "canvas.csv")


def test_every_cell_and_full_mode(room, tmp_path):
    """--every-cell runs every code cell; --full runs in full mode; both are recorded in grades.json."""
    root, cls, out, _ = room
    one = tmp_path / "one"
    shutil.copytree(cls / "cy", one / "cy")
    proc = tformer("grade", one, "--out", tmp_path / "o", "--every-cell", "--full", "--workers", 1, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grades = json.loads((tmp_path / "o" / "grades.json").read_text(encoding="utf-8"))
    assert grades["settings"]["skip_released_cells"] is False and grades["settings"]["small"] is False
    nb = grades["students"][0]["notebooks"][0]
    assert nb["cells_run"] == list(range(nb["cells"]))


# --- one learner -------------------------------------------------------------------------------------------

def tiny(folder: Path, attention: str | None = None) -> Path:
    """A short chapter-1 notebook: the imports, the two functions, their checks."""
    sol = cells("01_attention", True)
    keep = [sol[0]] + [c for c in sol if c.startswith(("def my_attention", "def my_softmax", 'check("ch01'))]
    if attention is not None:
        keep = replace(keep, "def my_attention", attention)
    return write(folder / "01_attention.ipynb", keep)


def test_one_learner_json_require_all_and_lang(tmp_path):
    """--json, --require-all (exit 1 with points missing), --lang zh (Chinese labels, English JSON)."""
    good = tiny(tmp_path / "good")
    proc = tformer("grade", good, "--json", tmp_path / "good.json", "--require-all", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "good.json").read_text())
    assert report["total"]["earned"] == report["total"]["possible"] > 0
    bad = tiny(tmp_path / "bad", NO_SCALE)
    proc = tformer("grade", bad, "--json", tmp_path / "bad.json", "--require-all", "--lang", "zh", cwd=tmp_path)
    assert proc.returncode == 1 and "not every exercise passed" in proc.stderr, proc.stderr[-3000:]
    assert "练习" in proc.stdout or "通过" in proc.stdout, proc.stdout[-2000:]
    report = json.loads((tmp_path / "bad.json").read_text())
    statuses = {x["exercise"]: x["status"] for nb in report["notebooks"] for x in nb["exercises"]}
    assert statuses == {"ch01.attention": "failed", "ch01.softmax": "passed"}


def test_a_learners_folder_with_its_chinese_edition_is_one_learner(tmp_path):
    """`make grade` runs `tformer grade notebooks/`: the course's own folder holds notebooks/zh/, which is not a
    student. The chapter notebooks directly inside are graded; the subfolder is left alone."""
    folder = tmp_path / "notebooks"
    tiny(folder)
    tiny(folder / "zh", NO_SCALE)
    proc = tformer("grade", folder, "--json", tmp_path / "r.json", "--timeout", 300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert [Path(nb["notebook"]).parent.name for nb in report["notebooks"]] == ["notebooks"]
    assert report["total"]["earned"] == report["total"]["possible"]


# --- errors: one line, exit 2, before anything is graded ---------------------------------------------------

def test_bad_input_is_one_line_and_exit_2(tmp_path):
    cls = tmp_path / "class"
    write(cls / "ada" / "01_attention.ipynb", ["x = 1"])
    out = tmp_path / "out"
    (tmp_path / "w.txt").write_text("ch01.atention = 3\n")
    (tmp_path / "o.csv").write_text("student,exercise,points,reason\nada,ch01.attention,x,typo\n")
    one_line_error(tformer("grade", cls, "--out", out, "--only", "ch01.atention", cwd=tmp_path), "--only", "ch01.atention")
    one_line_error(tformer("grade", cls, "--out", out, "--weights", tmp_path / "w.txt", cwd=tmp_path), "ch01.atention")
    one_line_error(tformer("grade", cls, "--out", out, "--overrides", tmp_path / "o.csv", cwd=tmp_path), "whole number")
    one_line_error(tformer("grade", cls, "--out", out, "--memory", "1K", cwd=tmp_path), "--memory")
    one_line_error(tformer("grade", cls, "--out", out, "--roster", tmp_path / "none.csv", cwd=tmp_path), "--roster")
    one_line_error(tformer("grade", cls, "--out", out, "--require-all", cwd=tmp_path), "--require-all")
    one_line_error(tformer("grade", cls, "--shard", "1/2", cwd=tmp_path), "--shard", "--out")
    one_line_error(tformer("grade", cls, "--out", out, "--shard", "3/2", cwd=tmp_path), "K/N")
    one_line_error(tformer("grade", "--merge", out, cwd=tmp_path), "--merge", "--out")
    one_line_error(tformer("grade", "--verify", tmp_path / "none.json", cls, cwd=tmp_path), "--verify")
    one_line_error(tformer("grade", cls, "--out", out, "--lms", "moodle", cwd=tmp_path), "--lms")
    one_line_error(tformer("grade", cls, "--out", out, "--timeout", 0, cwd=tmp_path), "--timeout")
    one_line_error(tformer("grade", cls, "--out", out, "--workers", 0, cwd=tmp_path), "--workers")
    one_line_error(tformer("grade", cls / "ada" / "01_attention.ipynb", "--json", tmp_path / "no" / "r.json",
                           cwd=tmp_path), "--json")
    one_line_error(tformer("grade", cls, "--lang", "fr", cwd=tmp_path), "--lang")
    (tmp_path / "file").write_text("not a folder")
    one_line_error(tformer("grade", cls, "--out", tmp_path / "file", cwd=tmp_path), "--out", "not a folder")
    assert not out.exists()                                               # nothing was graded


def test_debug_shows_the_traceback(tmp_path):
    proc = tformer("grade", tmp_path / "missing", "--debug", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" in proc.stderr, proc.stderr[-2000:]
