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


def imports(sources: list[str]) -> str:
    """A chapter's imports cell (the first code cell is the setup cell, which imports nothing here)."""
    return next(c for c in sources if c.startswith(("import ", "from ")))


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


def tformer(*args, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command as typed, from `cwd` (outside the checkout); `env`: variables set on top of this process's."""
    assert not Path(cwd).resolve().is_relative_to(CHECKOUT)
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if k not in ("TFORMER_LANG", "PYTHONPATH")}
    env.update(extra)
    env["PYTHONPATH"] = str(CHECKOUT)            # the checkout under test (what the editable install points to)
    return subprocess.run([sys.executable, "-m", "tformer", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def tformer_all(commands: list[tuple], cwd: Path, at_once: int = 4) -> list[subprocess.CompletedProcess]:
    """Several commands as typed, `at_once` at a time (each starts Python and imports torch: seconds)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(at_once) as pool:
        return list(pool.map(lambda args: tformer(*args, cwd=cwd), commands))


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
          "\"Cy, Young\",4103,S-003,cy,Sec B,\n"
          "\"Eve, Adams\",4105,S-005,eve,Sec B,\n"
          "\"Fay, Wray\",4106,fay,fay@uni.edu,Sec B,\n")
# a distinctive variant of attention: eve tried it after her check cell (it was not graded); fay handed it in
VARIANT = ("def my_attention(q, k, v, mask=None):\n"
           "    import math\n"
           "    d = q.shape[-1]\n"
           "    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d) * 1.0\n"
           "    if mask is not None:\n"
           "        scores = scores.masked_fill(mask == 0, -1e9)\n"
           "    weights = torch.nn.functional.softmax(scores, dim=-1)\n"
           "    return torch.matmul(weights, v), weights\n")


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    """A class of six, graded once with the teacher's knobs (OUT, the class folder, the working folder, the
    finished process):
    ada   solved chapters 1 and 2; her notebook also runs `!pip install`, `%%bash` and a cell that raises
    bob   left out the attention scale (a named mistake)
    cy    handed in the stub
    dan   deleted his softmax check cell (the function is right); two files for chapter 1 with the same
          modification time, the solved one `01_attention (1).ipynb`; not in the roster
    eve   solved attention, then tried VARIANT after the check cell
    fay   handed in VARIANT"""
    root = tmp_path_factory.mktemp("grade_cli")
    cls = root / "class"
    sol1, sol2, stub1 = cells("01_attention", True), cells("02_self_attention", True), cells("01_attention", False)
    server = Server()
    dial = f"import socket\nsocket.create_connection(('127.0.0.1', {server.port}), timeout=5).sendall(b'leak')"
    write(cls / "ada" / "01_attention.ipynb", sol1 + [dial, "!pip install nothing-at-all", "%%bash\necho hi", "1 / 0"])
    write(cls / "ada" / "02_self_attention.ipynb", sol2)
    write(cls / "bob" / "01_attention.ipynb", replace(sol1, "def my_attention", NO_SCALE))
    write(cls / "cy" / "01_attention.ipynb", stub1)
    when = 1_700_000_000
    write(cls / "dan" / "01_attention.ipynb", stub1, mtime=when)
    write(cls / "dan" / "01_attention (1).ipynb", [c for c in sol1 if not c.startswith('check("ch01.softmax"')],
          mtime=when)
    at = next(i for i, c in enumerate(sol1) if c.startswith('check("ch01.attention"')) + 1
    write(cls / "eve" / "01_attention.ipynb", sol1[:at] + [VARIANT] + sol1[at:])
    write(cls / "fay" / "01_attention.ipynb", replace(sol1, "def my_attention", VARIANT))
    (root / "weights.txt").write_text("# attention counts double\nch01.attention = 6\n", encoding="utf-8")
    (root / "overrides.csv").write_text("student,exercise,points,reason\n"
                                        "bob,ch01.attention,2,the scale is in the next cell\n", encoding="utf-8")
    (root / "roster.csv").write_text(ROSTER, encoding="utf-8")
    out = root / "out"
    proc = tformer("class", "grade", cls, "--out", out, "--workers", 2, "--timeout", 60, "--memory", "3G",
                   "--notebook-timeout", 900, "--weights", root / "weights.txt", "--overrides", root / "overrides.csv",
                   "--lms", "canvas", "--roster", root / "roster.csv", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    server.close()
    SERVERS[root] = server
    return root, cls, out, proc


SERVERS: dict[Path, "Server"] = {}


class Server:
    """A TCP server on 127.0.0.1 that records every connection it accepts."""

    def __init__(self):
        import socket
        import threading
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.accepted = self.sock.getsockname()[1], []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return
            self.accepted.append(addr)
            conn.close()

    def close(self):
        import socket
        with socket.create_connection(("127.0.0.1", self.port), timeout=5):   # the server was up all along
            pass
        self.sock.close()


def grades_of(out: Path) -> dict:
    return json.loads((out / "grades.json").read_text(encoding="utf-8"))


def notebook_of(grades: dict, student: str, stem: str = "01_attention") -> dict:
    s = next(s for s in grades["students"] if s["student"] == student)
    return next(nb for nb in s["notebooks"] if nb["notebook"] == stem)


def test_a_class_with_the_teachers_knobs(room):
    """--out, --workers, --timeout, --memory, --notebook-timeout, --weights and --overrides, as typed: what
    grades.json (each limit a worker had, the isolation it ran under), the gradebook and the feedback say."""
    root, cls, out, proc = room
    grades = grades_of(out)
    s = grades["settings"]
    assert (s["timeout"], s["workers"], s["memory"], s["notebook_timeout"]) == (60, 2, 3 << 30, 900)
    limits = s["limits"]
    assert (limits["memory"], limits["cell_timeout"], limits["notebook_timeout"]) == (3 << 30, 60, 900)
    assert limits["file_size"] == s["file_size"] > 0
    assert limits["processes"] == 64                                     # the sandbox's process cap
    assert s["isolation"]["network"] == s["network"] and s["isolation"]["landlock_abi"] == s["landlock_abi"]
    assert s["allow_network"] is False and s["network_warning"] is None and s["sandbox_failure"] is None
    assert s["stub_rule"] == {"applied": ["01_attention", "02_self_attention"], "not_applied": []}
    assert s["weights"] == {"ch01.attention": 6}
    b = book(out)
    assert list(b) == ["ada", "bob", "cy", "dan", "eve", "fay"]
    assert rows(out / "gradebook.csv")[0][:3] == ["student", "ch01.softmax", "ch01.attention"]   # notebook order
    assert b["ada"]["ch01.attention"] == "6" and b["ada"]["total"] == b["ada"]["possible"]
    assert b["bob"]["ch01.attention"] == "2"                             # the override wins over "failed"
    assert b["cy"]["total"] == "0"
    assert "the scale is in the next cell" in (out / "feedback" / "bob.html").read_text(encoding="utf-8")
    assert "wrote" in proc.stdout and "gradebook.csv" in proc.stdout
    # ch02 was handed in by one student of six: everyone's `possible` counts it, so the summary says so
    assert "02_self_attention was handed in by 1 of 6 students" in proc.stdout, proc.stdout
    assert "--assignment" in (out / "report.html").read_text(encoding="utf-8")


def test_canvas_rows_match_the_roster_and_a_chapter_not_handed_in_is_blank(room):
    """--lms canvas --roster on a class of one folder per student: rows matched by SIS Login ID (ada, bob, cy,
    eve) or SIS User ID (fay), each with Canvas's ID; dan matches none and is named on the terminal. A chapter
    none of whose notebooks a student handed in is blank in canvas.csv (0 in gradebook.csv)."""
    root, cls, out, proc = room
    head, possible, *body = rows(out / "canvas.csv")
    assert head == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "tformer ch01", "tformer ch02"]
    assert possible[0] == "Points Possible"
    canvas = {r[0]: r for r in body}
    assert canvas["Lovelace, Ada"][1:5] == ["4101", "S-001", "ada", "Sec A"]
    assert canvas["Fay, Wray"][1:3] == ["4106", "fay"]
    assert canvas["Babbage, Charles"][6] == "" and book(out)["bob"]["ch02"] == "0"
    assert canvas["Lovelace, Ada"][6] != ""
    assert "dan matches no row of" in proc.stdout, proc.stdout
    assert sum("matches no row" in line for line in proc.stdout.splitlines()) == 1


def test_two_files_for_one_notebook_are_decided_by_evidence(room):
    """dan's `01_attention.ipynb` and `01_attention (1).ipynb` have the same modification time: the download
    number decides, and the other file is listed."""
    _, _, out, _ = room
    nb = notebook_of(grades_of(out), "dan")
    assert nb["file"] == "01_attention (1).ipynb" and nb["ignored"] == ["01_attention.ipynb"]
    assert nb["chosen_by"] == "download number"
    assert "by its download number" in (out / "feedback" / "dan.html").read_text(encoding="utf-8")


def test_a_deleted_check_cell_still_grades_the_function(room):
    """dan deleted `check("ch01.softmax", my_softmax)`: his my_softmax is graded anyway, and he is told why."""
    _, _, out, _ = room
    rows_ = {x["exercise"]: x for x in notebook_of(grades_of(out), "dan")["exercises"]}
    assert rows_["ch01.softmax"]["status"] == "passed" and rows_["ch01.softmax"]["check_missing"] is True
    assert "No check(...) cell ran for this exercise" in rows_["ch01.softmax"]["message"]
    assert rows_["ch01.attention"]["check_missing"] is False


def test_similar_answers_compare_the_function_that_was_graded(room):
    """eve tried VARIANT after her check cell; fay handed VARIANT in. eve's graded answer is the solution, so
    she is not paired with fay."""
    _, _, out, _ = room
    similar = grades_of(out)["similar"]
    assert not any({"eve", "fay"} <= set(p["students"]) for p in similar["pairs"]), similar["pairs"]
    assert {"exercise": "ch01.attention", "student": "eve"} in similar["reference"], similar["reference"]


def test_cells_that_raised_carry_their_number_and_shell_commands_are_named(room):
    """ada's notebook ends with `!pip install ...`, a `%%bash` cell and `1 / 0`: each error names its code cell
    and first line; shell commands say they do not run while grading; her exercises are graded."""
    _, _, out, _ = room
    nb = notebook_of(grades_of(out), "ada")
    errors = nb["cell_errors"]
    n = nb["cells"]
    assert any(e.startswith(f"code cell {n - 3} (`import socket`): ") for e in errors), errors
    assert f"code cell {n} (`1 / 0`): ZeroDivisionError: division by zero" in errors, errors
    assert f"code cell {n - 2} (`!pip install nothing-at-all`): shell commands do not run while grading" in errors
    assert f"code cell {n - 1} (`%%bash`): shell commands do not run while grading" in errors
    assert all(x["status"] == "passed" for x in nb["exercises"])
    page = (out / "feedback" / "ada.html").read_text(encoding="utf-8")
    assert "shell commands do not run while grading" in page


def test_only_regrades_one_exercise(room, tmp_path):
    """--only EXERCISE, the README's example: that exercise graded again, every other verdict kept."""
    root, cls, out, _ = room
    again = tmp_path / "again"
    shutil.copytree(out, again)
    before = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    proc = tformer("class", "grade", cls, "--out", again, "--only", "ch01.attention", "--weights", root / "weights.txt",
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
    """--verify OUT/grades.json CLASS: the recorded cells, seeds, per-cell timeout (60 s, not the default) and
    notebook budget (900 s);
    exit 0 when every verdict is reproduced; exit 1 and the notebook named once one changed or is gone;
    exit 2 in one line when another grader version wrote grades.json."""
    root, cls, out, _ = room
    proc = tformer("class", "verify", out / "grades.json", cls, "--workers", 2, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 verdict(s) differ" in proc.stdout and "60 s per cell, 900 s per notebook" in proc.stdout, proc.stdout
    copy = tmp_path / "class"
    shutil.copytree(cls, copy, ignore=shutil.ignore_patterns("eve", "fay", "dan", "cy", "ada"))
    nb = copy / "bob" / "01_attention.ipynb"
    nb.write_text(nb.read_text(encoding="utf-8").replace("float('-inf')", "float('-1e9')"), encoding="utf-8")
    proc = tformer("class", "verify", out / "grades.json", copy, "--timeout", 90, "--memory", "3G",
                   "--notebook-timeout", 300, cwd=tmp_path)
    assert proc.returncode == 1 and "bob/01_attention: changed" in proc.stdout, proc.stdout[-3000:]
    assert "ada/01_attention: gone" in proc.stdout and "90 s per cell, 300 s per notebook" in proc.stdout
    other = grades_of(out)
    other["grader"] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(other), encoding="utf-8")
    one_line_error(tformer("class", "verify", tmp_path / "other.json", cls, cwd=tmp_path), "other grader code")


def test_shards_merge_to_the_single_run(room, tmp_path):
    """--shard K/N twice (each OUT seeded with the journal, so nothing is graded again), then --merge."""
    root, cls, out, _ = room
    parts = []
    for k in (1, 2):
        part = tmp_path / f"out_{k}"
        part.mkdir()
        shutil.copy(out / "journal.jsonl", part / "journal.jsonl")
        proc = tformer("class", "grade", cls, "--out", part, "--shard", f"{k}/2", "--weights", root / "weights.txt",
                       "--overrides", root / "overrides.csv", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        parts.append(part)
    merged = tmp_path / "merged"
    proc = tformer("class", "merge", *parts, "--out", merged, "--lms", "canvas", "--roster", root / "roster.csv",
                   "--lang", "zh", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert book(merged) == book(out)
    assert rows(merged / "canvas.csv") == rows(out / "canvas.csv")
    assert "得分" in (merged / "feedback" / "ada.html").read_text(encoding="utf-8")     # --lang zh: the pages


def test_every_cell_and_full_mode(room, tmp_path):
    """--every-cell runs every code cell; --full runs in full mode; both are recorded in grades.json."""
    root, cls, out, _ = room
    one = tmp_path / "one"
    shutil.copytree(cls / "cy", one / "cy")
    proc = tformer("class", "grade", one, "--out", tmp_path / "o", "--every-cell", "--full", "--workers", 1, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grades = json.loads((tmp_path / "o" / "grades.json").read_text(encoding="utf-8"))
    assert grades["settings"]["skip_released_cells"] is False and grades["settings"]["small"] is False
    nb = grades["students"][0]["notebooks"][0]
    assert nb["cells_run"] == list(range(nb["cells"]))


# --- one learner -------------------------------------------------------------------------------------------

def tiny(folder: Path, attention: str | None = None, drop: str = "") -> Path:
    """A short chapter-1 notebook: the imports, the two functions, their checks and the question cells (but a
    cell starting `drop`)."""
    sol = cells("01_attention", True)
    keep = [imports(sol)] + [c for c in sol if c.startswith(("def my_attention", "def my_softmax", 'check("ch01', "answer = "))]
    if attention is not None:
        keep = replace(keep, "def my_attention", attention)
    return write(folder / "01_attention.ipynb", [c for c in keep if not (drop and c.startswith(drop))])


def test_one_learner_json_require_all_and_lang(tmp_path):
    """--json, --require-all (exit 1 with points missing), --lang zh (Chinese labels, English JSON). The good
    notebook lost its softmax check cell: the function is graded all the same, as in a class."""
    good = tiny(tmp_path / "good", drop='check("ch01.softmax"')
    proc = tformer("grade", good, "--json", tmp_path / "good.json", "--require-all", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "good.json").read_text())
    assert report["total"]["earned"] == report["total"]["possible"] > 0
    softmax = next(x for x in report["notebooks"][0]["exercises"] if x["exercise"] == "ch01.softmax")
    assert softmax["check_missing"] is True and softmax["status"] == "passed"
    bad = tiny(tmp_path / "bad", NO_SCALE)
    proc = tformer("grade", bad, "--json", tmp_path / "bad.json", "--require-all", "--lang", "zh", cwd=tmp_path)
    assert proc.returncode == 1 and "not every exercise passed" in proc.stderr, proc.stderr[-3000:]
    assert "练习" in proc.stdout or "通过" in proc.stdout, proc.stdout[-2000:]
    report = json.loads((tmp_path / "bad.json").read_text())
    statuses = {x["exercise"]: x["status"] for nb in report["notebooks"] for x in nb["exercises"]}
    assert statuses == {"ch01.attention": "failed", "ch01.softmax": "passed",
                    **{q: "passed" for q in ("ch01.q_sharper_query", "ch01.q_score_variance", "ch01.q_saturation")}}


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
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "a.toml").write_text('notebooks = ["01_attention"]\n')
    (tmp_path / "typo.toml").write_text('notebooks = ["01_attention"]\nnotebook = ["02_self_attention"]\n')
    (tmp_path / "pts.toml").write_text('notebooks = ["01_attention"]\n[points]\n"ch01.attention" = 2.5\n')
    (tmp_path / "nb.toml").write_text('notebooks = ["01_atention"]\n')
    mixed = tmp_path / "mixed"
    write(mixed / "lovelaceada_4101_99001_01_attention.ipynb", ["x = 1"])
    write(mixed / "01_attention.ipynb", ["x = 1"])
    cases = [
        (("class", "grade", cls, "--out", out, "--only", "ch01.atention"), ("--only", "ch01.atention")),
        (("class", "grade", cls, "--out", out, "--weights", tmp_path / "w.txt"), ("ch01.atention",)),
        (("class", "grade", cls, "--out", out, "--overrides", tmp_path / "o.csv"), ("whole number",)),
        (("class", "grade", cls, "--out", out, "--memory", "1K"), ("--memory",)),
        (("class", "grade", cls, "--out", out, "--roster", tmp_path / "none.csv"), ("--roster",)),
        (("class", "grade", cls, "--out", out, "--require-all"), ("--require-all",)),
        (("class", "grade", cls, "--shard", "1/2"), ("--out", "required")),
        (("class", "grade", cls, "--out", out, "--roster", tmp_path / "w.txt", "--lms", "moodle"), ("--roster",)),
        (("class", "grade", cls, "--out", out, "--roster", tmp_path / "w.txt"), ("--roster", "--lms")),
        (("class", "grade", cls, "--out", out, "--shard", "3/2"), ("K/N",)),
        (("class", "merge", out), ("class merge", "--out")),
        (("class", "verify", tmp_path / "none.json", cls), ("class verify", "none.json")),
        (("class", "verify", tmp_path / "none.json"), ("CLASS",)),
        (("grade", cls, "--out", out), ("tformer class grade CLASS --out OUT",)),
        (("grade", "--merge", out, "--out", out), ("tformer class merge",)),
        (("class",), ("grade,verify,merge,gradescope",)),
        (("class", "grade", cls, "--out", out, "--lms", "blackboard"), ("--lms",)),
        (("class", "grade", cls, "--out", out, "--timeout", 0), ("--timeout",)),
        (("class", "grade", cls, "--out", out, "--notebook-timeout", 0), ("--notebook-timeout", "> 0")),
        (("class", "grade", cls, "--out", out, "--notebook-timeout", -1), ("--notebook-timeout",)),
        (("class", "grade", cls, "--out", out, "--notebook-timeout", "abc"), ("--notebook-timeout", "abc")),
        (("class", "grade", cls, "--out", out, "--workers", 0), ("--workers",)),
        (("grade", cls / "ada" / "01_attention.ipynb", "--json", tmp_path / "no" / "r.json"), ("--json",)),
        (("class", "grade", cls, "--lang", "fr"), ("--lang",)),
        (("class", "grade", cls, "--out", tmp_path / "file"), ("--out", "not a folder")),
        (("class", "grade", cls, "--out", out, "--assignment", tmp_path / "a.toml", "--weights", tmp_path / "w.txt"),
         ("--assignment", "--weights")),
        (("class", "grade", cls, "--out", out, "--assignment", tmp_path / "typo.toml"), ("unknown key 'notebook'",)),
        (("class", "grade", cls, "--out", out, "--assignment", tmp_path / "pts.toml"), ("whole number",)),
        (("class", "grade", cls, "--out", out, "--assignment", tmp_path / "nb.toml"), ("01_atention",)),
        (("class", "grade", cls, "--out", out, "--assignment", tmp_path / "none.toml"), ("none.toml",)),
        (("class", "grade", mixed, "--out", out), ("lovelaceada_4101_99001_01_attention.ipynb", "01_attention.ipynb")),
        (("handout", "--out", tmp_path / "file"), ("--out",)),
        (("handout", "--out", tmp_path / "h", "--assignment", tmp_path / "nb.toml"), ("01_atention",)),
    ]
    for (args, words), proc in zip(cases, tformer_all([c[0] for c in cases], cwd=tmp_path)):
        one_line_error(proc, *words)
    assert not out.exists() and not (tmp_path / "h").exists()              # nothing was graded or written


def test_debug_shows_the_traceback(tmp_path):
    proc = tformer("grade", tmp_path / "missing", "--debug", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" in proc.stderr, proc.stderr[-2000:]


def test_version_names_the_grader(tmp_path):
    """`tformer --version`: the version, and the grader's hash grades.json records."""
    proc = tformer("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("tformer "), proc.stdout + proc.stderr
    grader = proc.stdout.split("grader ")[1].split()[0]
    assert len(grader) == 64


def test_an_assignment_sets_what_is_graded(room, tmp_path):
    """--assignment FILE: the notebooks, their order, the points and the Canvas columns follow it; a notebook
    outside it is listed as extra and earns nothing. OUT starts from the class's journal, so nothing is graded
    again (the assignment changes no verdict)."""
    root, cls, out, _ = room
    (tmp_path / "week1.toml").write_text('notebooks = ["01_attention"]\n\n[points]\n"ch01.attention" = 5\n\n'
                                         '[lms]\ncanvas_column = "Week 1 ({chapter})"\n', encoding="utf-8")
    again = tmp_path / "out"
    again.mkdir()
    shutil.copy(out / "journal.jsonl", again / "journal.jsonl")
    proc = tformer("class", "grade", cls, "--out", again, "--assignment", tmp_path / "week1.toml", "--lms", "canvas",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    b = book(again)
    assert rows(again / "gradebook.csv")[0] == ["student", "ch01.softmax", "ch01.attention", "ch01.q_sharper_query", "ch01.q_score_variance", "ch01.q_saturation",
                                              "ch01", "total", "possible"]
    assert b["ada"]["possible"] == "9" and b["ada"]["total"] == "9"
    grades = grades_of(again)
    ada = next(s for s in grades["students"] if s["student"] == "ada")
    assert ada["extra_notebooks"] == ["02_self_attention"] and ada["missing_notebooks"] == []
    assert grades["settings"]["assignment"]["sha256"] and grades["settings"]["notebooks"] == ["01_attention"]
    assert rows(again / "canvas.csv")[0][5:] == ["Week 1 (ch01)"]
    assert "Notebooks not handed in" not in (again / "feedback" / "bob.html").read_text(encoding="utf-8")
    assert "not part of this assignment" in (again / "feedback" / "ada.html").read_text(encoding="utf-8")
    assert "handed in by 1 of 6" not in proc.stdout


def test_a_canvas_download_with_names_outside_ascii(tmp_path):
    """Canvas keeps Unicode letters in its names: müllerjürgen, 张伟 and an anonymous student are three
    students, each graded on their own file; a LATE mark is kept; a student's later upload (a higher file id)
    is graded over the earlier one."""
    dl = tmp_path / "submissions"
    good, bad = tiny(tmp_path / "g"), tiny(tmp_path / "b", NO_SCALE)
    dl.mkdir()
    shutil.copy(good, dl / "müllerjürgen_LATE_123_456_01_attention.ipynb")
    shutil.copy(bad, dl / "张伟_124_457_01_attention.ipynb")
    shutil.copy(good, dl / "张伟_124_999_01_attention-1.ipynb")                  # his later upload
    shutil.copy(bad, dl / "anon_Xq3Zp_460_01_attention.ipynb")
    proc = tformer("class", "grade", dl, "--out", tmp_path / "out", "--workers", 2, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grades = grades_of(tmp_path / "out")
    totals = {s["student"]: (s["canvas_id"], s["total"]) for s in grades["students"]}
    assert totals == {"müllerjürgen_123": ("123", 7), "张伟_124": ("124", 7), "anon_Xq3Zp": ("", 4)}, totals
    nb = notebook_of(grades, "müllerjürgen_123")
    assert nb["canvas_late"] is True and notebook_of(grades, "张伟_124")["chosen_by"] == "Canvas file id"
    assert "marked this submission late" in (tmp_path / "out" / "feedback" / "müllerjürgen_123.html").read_text()


def test_the_handout_holds_no_solution(tmp_path):
    """`tformer handout` (`make handout`): the assignment's learner notebooks, in the chosen edition, and no
    line of any exercise's solution."""
    (tmp_path / "a.toml").write_text('notebooks = ["01_attention", "03_multi_head_attention"]\n')
    proc = tformer("handout", "--out", tmp_path / "h", "--assignment", tmp_path / "a.toml", "--lang", "zh",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in (tmp_path / "h").iterdir())
    assert files == ["01_attention.ipynb", "03_multi_head_attention.ipynb"]
    for name in files:
        nb = json.loads((tmp_path / "h" / name).read_text(encoding="utf-8"))
        assert nb["metadata"].get("language", "").startswith("zh")
        code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
        src = (SRC / name.replace(".ipynb", ".py")).read_text(encoding="utf-8")
        blocks = [b.split("### END SOLUTION")[0].strip() for b in src.split("### BEGIN SOLUTION")[1:]]
        assert blocks and not any("SOLUTION" in c for c in code)
        for block in blocks:
            assert not any(block in c for c in code), (name, block)


def test_a_notebook_being_graded_reaches_no_network(room):
    """ada's notebook dials a server the test runs on 127.0.0.1: the server accepted only the test's own
    connection (made after grading, so it was up), the cell's error is the sandbox's refusal, and her
    exercises are graded."""
    root, _, out, _ = room
    grades = grades_of(out)
    network = grades["settings"]["network"]
    if network == "none":
        pytest.skip("no network namespace and no Landlock TCP rules on this machine (settings.network is none)")
    assert len(SERVERS[root].accepted) == 1, SERVERS[root].accepted
    nb = notebook_of(grades, "ada")
    dial = next(e for e in nb["cell_errors"] if "(`import socket`)" in e)
    assert ("Errno 101" in dial or "unreachable" in dial) if network == "netns" else "Errno 13" in dial, dial
    assert all(x["status"] == "passed" for x in nb["exercises"])



# --- what the grader decides from what it reads itself --------------------------------------------------------

FORGE = "import tformer.grading.core as C; C.run_learner = lambda ex, fn, cases: C.Outcome()"
HIDDEN = ("import torch\nfrom tformer.grading import Case, add_hidden_cases\n\n"
          "add_hidden_cases('ch01.softmax', lambda: [Case('large logits', (torch.full((2, 3), 1000.0),))])\n")


def test_each_command_has_its_own_flags_in_its_help(tmp_path):
    """`tformer class grade --help` names the notebook budget with its default; a learner's `tformer grade --help`
    shows no class flag, and `tformer class verify --help` no flag that sets what is graded."""
    helps = tformer_all([("class", "grade", "--help"), ("grade", "--help"), ("class", "verify", "--help")], tmp_path)
    assert all(p.returncode == 0 for p in helps), [p.stderr for p in helps]
    klass, learner, verify = (" ".join(p.stdout.split()) for p in helps)
    assert "--notebook-timeout S" in klass and "(default: 600;" in klass.split("--notebook-timeout S", 2)[2], klass
    assert "--allow-network" in klass and "--shard" in klass and "--lms" in klass
    assert not any(f in learner for f in ("--out", "--shard", "--lms", "--merge", "--verify", "--gradescope-zip"))
    assert "--assignment" not in verify and "--weights" not in verify and "--allow-network" in verify


def test_a_forged_stub_earns_nothing_and_a_notebook_not_graded_is_blank(tmp_path):
    """forger hands in the released stubs with one forged cell that makes every exercise's reply empty; honest
    solved chapter 1. forger's exercises read "not attempted" (the released stub) with 0 points, and the cell is
    flagged in grades.json and the summary. Then the same class with a sandbox that cannot be built: nothing is
    graded, every cell of gradebook.csv and canvas.csv that would be a grade is blank (never 0), the summary
    names each notebook and why, the settings hold the sandbox's failure."""
    cls = tmp_path / "class"
    stub = cells("01_attention", False)
    forged = write(cls / "forger" / "01_attention.ipynb", stub + [FORGE])
    tiny(cls / "honest")
    out = tmp_path / "out"
    proc = tformer("class", "grade", cls, "--out", out, "--workers", 2, "--timeout", 60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    b = book(out)
    assert b["forger"]["total"] == "0" and b["forger"]["ch01.attention"] == "0", b["forger"]
    assert b["honest"]["total"] == b["honest"]["possible"] == "7", b["honest"]
    grades = grades_of(out)
    nb = notebook_of(grades, "forger")
    rows_ = {x["exercise"]: x for x in nb["exercises"]}
    for name in ("ch01.softmax", "ch01.attention"):
        assert rows_[name]["status"] == "not attempted" and rows_[name]["stub"] is True, rows_[name]
        assert rows_[name]["passed"] is False and "released stub" in rows_[name]["message"]
    n = len(stub) + 1
    assert len(nb["flags"]) == 1 and nb["flags"][0].startswith(f"code cell {n}: "), nb["flags"]
    assert "run_learner" in nb["flags"][0] and "tformer.grading.core" in nb["flags"][0]
    assert f"flagged for review: forger/01_attention: code cell {n}: " in proc.stdout, proc.stdout[-3000:]
    assert notebook_of(grades, "honest")["flags"] == []
    assert not any(x["stub"] for x in notebook_of(grades, "honest")["exercises"])
    assert "Flagged for review" in (out / "report.html").read_text(encoding="utf-8")
    assert "run_learner" not in (out / "feedback" / "forger.html").read_text(encoding="utf-8")   # the teacher's

    from tformer.grading.classroom.landlock import landlock_abi
    if not landlock_abi():
        pytest.skip("no Landlock on this kernel: the sandbox's build cannot fail here")
    broken = tmp_path / "broken"
    proc = tformer("class", "grade", cls, "--out", broken, "--workers", 2, "--lms", "canvas", cwd=tmp_path,
                   env={"TFORMER_GRADE_BREAK_LANDLOCK": "build"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, *body = rows(broken / "gradebook.csv")
    for r in body:
        cells_ = dict(zip(head, r))
        assert all(cells_[c] == "" for c in head if c not in ("student", "possible")), cells_
        assert cells_["possible"] == "7"
    canvas = rows(broken / "canvas.csv")
    assert canvas[0][-1] == "tformer ch01" and all(r[-1] == "" for r in canvas[2:]), canvas
    grades = grades_of(broken)
    assert "broken on purpose" in grades["settings"]["sandbox_failure"], grades["settings"]
    for s in grades["students"]:
        assert s["not_graded"] and s["not_graded"][0]["notebook"] == "01_attention"
        assert all(x["status"] == "not graded" for x in s["exercises"].values()), s["exercises"]
    for who in ("forger", "honest"):
        assert f"not graded: {who}/01_attention: the sandbox could not be built" in proc.stdout, proc.stdout[-3000:]
    assert "the sandbox failed: " in proc.stdout
    assert forged.exists()


def test_hidden_cases_and_a_worker_network_need_allow_network(tmp_path):
    """An assignment with hidden cases, on a machine whose workers get no network namespace (the testing switch
    asks for Landlock's TCP rules, which leave UDP open): the run stops in one line, exit 2, before any notebook
    is graded; with --allow-network it goes on and says so at its start, in the summary and in grades.json."""
    from tformer.grading.classroom.landlock import TCP_SINCE, landlock_abi
    if landlock_abi() < TCP_SINCE:
        pytest.skip("no Landlock TCP rules on this kernel: the fallback network is none")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "hidden.py").write_text(HIDDEN, encoding="utf-8")
    (secret / "week1.toml").write_text('notebooks = ["01_attention"]\nhidden = ["hidden.py"]\n', encoding="utf-8")
    work = tmp_path / "work"
    cls = work / "class"
    tiny(cls / "ada")
    no_netns = {"TFORMER_GRADE_NO_NETNS": "1"}
    out = work / "out"
    refused = tformer("class", "grade", cls, "--out", out, "--assignment", secret / "week1.toml", cwd=work, env=no_netns)
    one_line_error(refused, "hidden cases", "--allow-network", "landlock-tcp")
    assert not (out / "gradebook.csv").exists()
    proc = tformer("class", "grade", cls, "--out", out, "--assignment", secret / "week1.toml", "--allow-network", cwd=work,
                   env=no_netns)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    warned = [i for i, line in enumerate(lines) if "no network namespace (network landlock-tcp" in line]
    assert len(warned) == 2 and lines[warned[0]].startswith("tformer class: warning:"), proc.stdout[-3000:]
    assert warned[0] < next(i for i, line in enumerate(lines) if line.startswith("wrote "))   # at the start
    s = grades_of(out)["settings"]
    assert s["allow_network"] is True and s["network"] == "landlock-tcp" and "UDP" in s["network_warning"]
    assert book(out)["ada"]["total"] == "7"
    recorded = grades_of(out)                         # as if graded where workers had a network namespace
    recorded["settings"]["allow_network"] = False
    (work / "netns.json").write_text(json.dumps(recorded), encoding="utf-8")
    one_line_error(tformer("class", "verify", work / "netns.json", cls, cwd=work, env=no_netns), "--allow-network")
    proc = tformer("class", "verify", work / "netns.json", cls, "--allow-network", cwd=work, env=no_netns)
    assert proc.returncode == 0 and "0 verdict(s) differ" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
