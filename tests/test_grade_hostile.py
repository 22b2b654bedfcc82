"""The class grader under attack. Every notebook here is a student's attempt to raise its own grade, see a hidden
case, reach a classmate or stall the class run, graded through `tformer grade` as typed (a subprocess from a folder
outside the checkout). Each test asserts the property TEACHING.md promises ("What a student's code can and cannot
do"), not the attack's mechanics: a forgery earns nothing, or is flagged where it rides on the course's public
references; no secret digit reaches OUT; nothing outlives a worker or passes between two; a worker holds at most
64 processes; the grader's memory stays bounded; a notebook stops within its budget. Every attack is bounded
(forks, bytes, seconds) so that a grader without the defence cannot harm the test machine either.

An honest student in each class proves the defences did not simply zero everyone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from test_grade_cli import CHECKOUT, book, cells, imports, tformer, write
from test_grade_teacher import RELEASED, hidden_file, shows_secret

MARK = f"tformer-hostile-{uuid.uuid4().hex[:12]}"      # this run's files in /dev/shm: unique, removed afterwards
SHM = Path("/dev/shm")
BUDGET = 12                                             # --notebook-timeout of the chapter-1 class, seconds
CELL = 5                                                # --timeout (per cell)

# the right softmax, returned only when an attack worked: a pass would prove the attack got through
RIGHT_IF = "def my_softmax(x):\n    return torch.softmax(x, dim=-1) if {cond} else torch.zeros_like(x)\n"


def _minimal(sources: list[str]) -> list[str]:
    """The cells of chapter 1 a graded notebook needs: imports, the exercises' cells and the questions' cells."""
    return [imports(sources)] + [c for c in sources if c.startswith(("def my_softmax", "def my_attention", 'check("ch01',
                                                                "answer = "))]


def _with(sources: list[str], starts: str, new: str) -> list[str]:
    return [new if c.startswith(starts) else c for c in sources]


STUB, SOLVED = _minimal(cells("01_attention", False)), _minimal(cells("01_attention", True))

FORGE_LEARNER = ("import tformer.grading.core as C\n"
                 "from tformer.grading.core import REGISTRY\n"
                 "C.run_learner = lambda ex, fn, cases: C.Outcome()\n"
                 "for q in ('ch01.q_sharper_query', 'ch01.q_score_variance', 'ch01.q_saturation'):\n"
                 "    check(q, REGISTRY[q].answer)\n")
# whatever the worker replies to an exercise, it becomes "ok" with nothing in it
FORGE_FRAME = ("import tformer.grading.classroom.worker as W\n"
               "_orig = W.write_frame\n"
               "def _forged(f, obj):\n"
               "    if isinstance(obj, dict) and 'status' in obj:\n"
               "        obj = {k: ([] if isinstance(v, list) else v) for k, v in obj.items()}\n"
               "        obj.update(status='ok', error='')\n"
               "    return _orig(f, obj)\n"
               "W.write_frame = _forged\n")
SHM_WRITE = (f"open('/dev/shm/{MARK}', 'w').write('from a classmate')\n"
             f"with open('/dev/shm/{MARK}-big', 'wb') as f:\n"        # 8 x 8 MB: bounded, capped or not
             f"    for _ in range(8):\n"
             f"        try:\n"
             f"            f.write(b'x' * (8 << 20))\n"
             f"        except OSError:\n"
             f"            break\n")
SHM_READ = RIGHT_IF.format(cond=f"__import__('os').path.exists('/dev/shm/{MARK}')")
FORK = ("import os, time\n"
        "FORKED = 0\n"
        "for _ in range(150):\n"                                  # bounded: 150 children that sleep 20 s
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(20)\n"
        "        os._exit(0)\n"
        "    FORKED += 1\n")
FORKED = RIGHT_IF.format(cond="FORKED > 64")
CMDLINE = RIGHT_IF.format(cond="any(b'--out' in open(f'/proc/{p}/cmdline', 'rb').read() "
                               "for p in __import__('os').listdir('/proc') if p.isdigit() "
                               "and __import__('os').access(f'/proc/{p}/cmdline', __import__('os').R_OK))")
# a frame header claiming 512 MiB on every pipe the worker may write, then 16 MiB of it
FLOOD = ("import os, struct\n"
         "for fd in os.listdir('/proc/self/fd'):\n"
         "    try:\n"
         "        if os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:'):\n"
         "            os.write(int(fd), struct.pack('>Q', 512 << 20))\n"
         "            for _ in range(16):\n"
         "                os.write(int(fd), b'\\0' * (1 << 20))\n"
         "    except OSError:\n"
         "        pass\n")
SLOW = ["import time\ntime.sleep(4.5)"] * 2
DISARM = ("def my_attention(q, k, v, mask=None):\n"
          "    import signal, time\n"
          "    signal.setitimer(signal.ITIMER_REAL, 0)\n"           # the exercise's own alarm, disarmed
          "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
          "    time.sleep(60)\n")


def _peak_rss(pid: int, stop: threading.Event, peak: list) -> None:
    while not stop.is_set():
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak[0] = max(peak[0], int(line.split()[1]) << 10)
        except OSError:
            return
        time.sleep(0.05)


def _descendants(pid: int) -> int:
    """How many processes descend from `pid` now (the grader's warm process, keepers, workers and what they
    started: a worker's PID namespace still shows its processes here, under their global pids)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    children: dict[int, list[int]] = {}
    for child, ppid in parent.items():
        children.setdefault(ppid, []).append(child)
    count, todo = 0, list(children.get(pid, []))
    while todo:
        count += 1
        todo.extend(children.get(todo.pop(), []))
    return count


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """Chapter 1 graded for a class of attackers, one worker at a time (so the shm writer runs before the reader),
    with a 5 s cell limit and a 12 s notebook budget. Returns (OUT, its output, the grader's peak RSS, the most
    processes that descended from the grader at once, the wall seconds, the test's folder)."""
    root = tmp_path_factory.mktemp("hostile")
    cls, out, work = root / "class", root / "out", root / "work"
    work.mkdir()
    write(cls / "a_honest" / "01_attention.ipynb", SOLVED)
    write(cls / "b_forge_learner" / "01_attention.ipynb", STUB + [FORGE_LEARNER])
    write(cls / "c_forge_frame" / "01_attention.ipynb",
          _with(STUB, "def my_softmax", "def my_softmax(x):\n    return x * 0\n") + [FORGE_FRAME])
    write(cls / "d_shm_write" / "01_attention.ipynb", STUB + [SHM_WRITE])
    write(cls / "e_shm_read" / "01_attention.ipynb", _with(STUB, "def my_softmax", SHM_READ))
    write(cls / "f_fork" / "01_attention.ipynb", [STUB[0], FORK] + _with(STUB[1:], "def my_softmax", FORKED))
    write(cls / "g_cmdline" / "01_attention.ipynb", _with(STUB, "def my_softmax", CMDLINE))
    write(cls / "h_flood" / "01_attention.ipynb", SOLVED + [FLOOD])
    write(cls / "z_slow" / "01_attention.ipynb", [SOLVED[0], *SLOW] + _with(SOLVED[1:], "def my_attention", DISARM))
    env = {k: v for k, v in os.environ.items() if k not in ("TFORMER_LANG", "PYTHONPATH")}
    env["PYTHONPATH"] = str(CHECKOUT)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tformer", "class", "grade", str(cls), "--out", str(out), "--workers", "1",
                             "--timeout", str(CELL), "--notebook-timeout", str(BUDGET)],
                            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop, peak, most = threading.Event(), [0], [0]
    watch = threading.Thread(target=_peak_rss, args=(proc.pid, stop, peak), daemon=True)
    watch.start()

    def count():
        while not stop.is_set():
            most[0] = max(most[0], _descendants(proc.pid))
            time.sleep(0.05)
    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    try:
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        stop.set()
        proc.kill()
        for f in SHM.glob(f"{MARK}*"):                  # whatever happens, leave /dev/shm as it was
            leftover = f.exists()
            f.unlink(missing_ok=True)
            if leftover:
                (root / "shm-leftover").write_text(f.name)
    assert proc.returncode == 0, stderr[-3000:]
    return out, stdout + stderr, peak[0], most[0], time.perf_counter() - t0, root


def _rows(out: Path, student: str) -> dict[str, dict]:
    grades = json.loads((out / "grades.json").read_text())
    st = next(s for s in grades["students"] if s["student"] == student)
    return {x["exercise"]: x for nb in st["notebooks"] for x in nb.get("exercises", [])}


def _notebook(out: Path, student: str) -> dict:
    grades = json.loads((out / "grades.json").read_text())
    return next(s for s in grades["students"] if s["student"] == student)["notebooks"][0]


def test_the_honest_student_still_earns_every_point(attacked):
    out = attacked[0]
    rows = _rows(out, "a_honest")
    assert all(r["passed"] for r in rows.values()), {k: r["status"] for k, r in rows.items()}
    assert not _notebook(out, "a_honest").get("flags")


def test_a_forged_run_learner_earns_no_exercise_point_and_is_flagged(attacked):
    out, log = attacked[0], attacked[1]
    rows = _rows(out, "b_forge_learner")
    assert not rows["ch01.softmax"]["passed"] and not rows["ch01.attention"]["passed"]
    assert book(out)["b_forge_learner"]["ch01.softmax"] == "0"
    flags = _notebook(out, "b_forge_learner").get("flags")
    assert flags and any("tformer.grading" in f for f in flags), flags
    assert "b_forge_learner" in log               # the summary names the flagged notebook


def test_a_forged_reply_frame_earns_nothing(attacked):
    out = attacked[0]
    rows = _rows(out, "c_forge_frame")
    assert not rows["ch01.softmax"]["passed"] and rows["ch01.softmax"]["status"] == "error", rows["ch01.softmax"]
    assert _notebook(out, "c_forge_frame").get("flags")


def test_nothing_passes_between_workers_through_dev_shm_and_nothing_is_left(attacked):
    out, root = attacked[0], attacked[5]
    iso = json.loads((out / "grades.json").read_text())["settings"]["isolation"]
    if iso["shm"] == "shared":                      # no mount namespace and no Landlock: the run names it
        assert "a private /dev/shm" in attacked[1], attacked[1][-2000:]
        pytest.skip("workers share /dev/shm here (no mount namespace, no Landlock); the run said so")
    assert not _rows(out, "e_shm_read")["ch01.softmax"]["passed"]      # the reader never saw the writer's file
    assert not (root / "shm-leftover").exists(), (root / "shm-leftover").read_text()


def test_a_fork_storm_is_capped_at_64_processes(attacked):
    out, most = attacked[0], attacked[3]
    iso = json.loads((out / "grades.json").read_text())["settings"]["isolation"]
    if iso["processes"] == "none":                  # no pids cgroup, no RLIMIT_NPROC that binds, no other uid
        assert "a limit on a notebook's processes" in attacked[1], attacked[1][-2000:]
        pytest.skip("no process cap can be had here; the run said so")
    assert not _rows(out, "f_fork")["ch01.softmax"]["passed"]            # it never held more than 64 children
    assert iso["max_processes"] == 64
    expected = "cgroup" if os.getuid() == 0 else "rlimit-userns"
    assert iso["processes"] in (expected, "uid"), iso                   # the limit path this user took
    assert most <= 64 + 8, most     # + the warm process, a keeper, and the last notebook's processes being reaped


def test_a_worker_cannot_read_the_graders_command_line(attacked):
    out = attacked[0]
    iso = json.loads((out / "grades.json").read_text())["settings"]["isolation"]
    if iso["proc"] != "private":                    # a masked /proc (Docker): the run names the guarantee lost
        assert "a private /proc" in attacked[1], attacked[1][-2000:]
        pytest.skip("the kernel refuses workers a private /proc here; the run said so")
    assert not _rows(out, "g_cmdline")["ch01.softmax"]["passed"]


def test_a_frame_flood_leaves_the_graders_memory_bounded(attacked):
    out, peak = attacked[0], attacked[2]
    nb = _notebook(out, "h_flood")
    assert any("protocol" in e and "cell 9" in e for e in nb["cell_errors"]), nb["cell_errors"]   # refused unread
    assert all(r["passed"] for r in _rows(out, "h_flood").values())  # the rest of its notebook ran again, graded
    assert peak < 1_000 << 20, f"the grader's peak RSS was {peak >> 20} MB"


def test_a_stalling_notebook_stops_within_its_budget(attacked):
    out, log, wall = attacked[0], attacked[1], attacked[4]
    nb = _notebook(out, "z_slow")
    report = nb.get("report") or nb
    rows = _rows(out, "z_slow")
    assert rows["ch01.attention"]["status"] == "timeout" and not rows["ch01.attention"]["passed"]
    assert rows["ch01.softmax"]["passed"] and rows["ch01.q_saturation"]["passed"]    # what finished is graded
    assert any(f"{BUDGET}" in r["message"] and "budget" in r["message"] for r in rows.values()), rows
    assert nb.get("seconds", report.get("seconds", 0)) <= BUDGET + 3
    assert wall < 9 * BUDGET, wall                  # nine notebooks, none past its budget (56.7 s for one before)


# --- a teacher's exercise with a hidden case -----------------------------------------------------------------

KEEP = ("_kept = []\n"
        "def my_double(x):\n"                        # keeps its first output, writes every later input into it
        "    y = 2 * x\n"
        "    if _kept:\n"
        "        k = _kept[0].view(-1)\n"
        "        n = min(k.numel(), x.numel())\n"
        "        k[:n] = x.reshape(-1)[:n]\n"
        "    else:\n"
        "        _kept.append(y)\n"
        "    return y\n")
REFERENCE = ("import tformer.grading.core as C\n"
             "def _fake(ex, fn, cases):\n"
             "    ref = ex.reference or C.REGISTRY[ex.name].reference\n"
             "    return C.Outcome(outputs=[ref(*c.args, **c.kwargs) for c in cases],\n"
             "                     inputs_after=[(c.args, c.kwargs) for c in cases])\n"
             "C.run_learner = _fake\n")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """week3.py from the template with a hidden case, an assignment naming it, and three students: `ok` doubles,
    `keep` doubles but keeps its first output to carry the hidden input out, `ref` leaves the stub and makes the
    worker return the reference's outputs."""
    root = tmp_path_factory.mktemp("hostile_teacher")
    work = root / "work"
    work.mkdir()
    assert tformer("exercise", "new", "w03.double", root / "week3.py", cwd=work).returncode == 0
    write(root / "handout" / "w03_double.ipynb", RELEASED)
    hidden_file(root)
    (root / "week3.toml").write_text('notebooks = ["w03_double"]\nexercises = ["week3.py"]\nreleased = "handout/"\n'
                                     'hidden = ["secret/week3_hidden.py"]\n', encoding="utf-8")
    cls, out = root / "class", root / "out"
    write(cls / "ok" / "w03_double.ipynb", [RELEASED[0], "def my_double(x):\n    return 2 * x", RELEASED[2]])
    write(cls / "keep" / "w03_double.ipynb", [RELEASED[0], KEEP, RELEASED[2]])
    write(cls / "ref" / "w03_double.ipynb", RELEASED + [REFERENCE])
    proc = tformer("class", "grade", cls, "--out", out, "--assignment", root / "week3.toml", "--allow-network", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout + proc.stderr


def test_a_hidden_input_never_reaches_out(teacher):
    out, log = teacher
    for f in out.rglob("*"):
        if f.is_file():
            text = f.read_bytes().decode("utf-8", errors="replace")
            assert not shows_secret(text), f"{f.name} carries the hidden input"
    assert not shows_secret(log), log
    rows = _rows(out, "keep")
    assert rows["w03.double"]["status"] in ("passed", "failed")        # judged, pass or fail only


def test_the_teachers_reference_is_not_in_the_worker(teacher):
    out = teacher[0]
    assert _rows(out, "ok")["w03.double"]["passed"]
    assert not _rows(out, "ref")["w03.double"]["passed"]
    assert book(out)["ref"]["w03.double"] == "0"
