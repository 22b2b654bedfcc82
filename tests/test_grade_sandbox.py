"""The sandbox of `tformer grade CLASS`: a worker reads its own student's folder and the course, never another
student's folder, writes only into its own temporary folder, reaches no network, and runs no learner code when its
Landlock ruleset fails (tformer/grading/classroom/sandbox.py, landlock.py)."""
from __future__ import annotations

import errno
import json
import os
import socket
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from tformer.grading.classroom import landlock, run, sandbox
from tformer.grading.classroom.runner import grade_cells
from tformer.grading.classroom.settings import Run, RunSettings

needs_landlock = pytest.mark.skipif(landlock.landlock_abi() == 0,
                              reason="this kernel has no Landlock (Linux 5.13+ with Landlock enabled)")


def test_only_the_rights_the_abi_knows_are_handled():
    assert landlock._fs_rights(1) == (1 << 13) - 1                     # EXECUTE .. MAKE_SYM
    assert landlock._fs_rights(2) == (1 << 14) - 1                     # + REFER
    assert landlock._fs_rights(3) == landlock._fs_rights(4) == (1 << 15) - 1   # + TRUNCATE (4 adds network rights)
    assert landlock._fs_rights(5) == landlock._fs_rights(7) == (1 << 16) - 1   # + IOCTL_DEV


def _tries(ruleset: int, tries: list) -> list[str]:
    """Each (path, mode) opened in a forked child under the ruleset: 'ok' or 'refused'."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                      # the child: enforce, then try each access, report in one line
        code = 70
        try:
            os.close(r)
            landlock.landlock_enforce(ruleset)
            got = []
            for path, mode in tries:
                try:
                    open(path, mode).close()
                    got.append("ok")
                except PermissionError:
                    got.append("refused")
            os.write(w, json.dumps(got).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.close(ruleset)
    got = os.read(r, 1000)
    os.close(r)
    assert os.waitpid(pid, 0)[1] == 0
    return json.loads(got)


@needs_landlock
def test_the_ruleset_holds_in_a_forked_child(tmp_path):
    mine, theirs, tmp = tmp_path / "cls" / "a", tmp_path / "cls" / "b", tmp_path / "tmp"
    for d in (mine, theirs, tmp):
        d.mkdir(parents=True)
    (mine / "mine.txt").write_text("mine")
    (theirs / "secret.txt").write_text("secret")
    got = _tries(landlock.landlock_ruleset(*landlock.worker_paths([mine], tmp)),
                 [(mine / "mine.txt", "r"), (theirs / "secret.txt", "r"), (mine / "new.txt", "w"),
                  (tmp_path / "cls" / "new.txt", "w"), (tmp / "scratch.txt", "w")])
    assert got == ["ok", "refused", "refused", "refused", "ok"]
    assert not (mine / "new.txt").exists() and not (tmp_path / "cls" / "new.txt").exists()


@needs_landlock
def test_a_canvas_student_reads_only_their_own_files(tmp_path):
    """A Canvas download is one flat folder: the worker gets its student's files, not the folder."""
    flat, tmp = tmp_path / "canvas", tmp_path / "tmp"
    for d in (flat, tmp):
        d.mkdir()
    mine, theirs = flat / "ann_11_101_01_attention.ipynb", flat / "bob_12_102_01_attention.ipynb"
    for f in (mine, theirs):
        f.write_text("{}")
    got = _tries(landlock.landlock_ruleset(*landlock.worker_paths([mine], tmp, closed=flat)),
                 [(mine, "r"), (theirs, "r"), (flat / "new.txt", "w")])
    assert got == ["ok", "refused", "refused"]


@needs_landlock
def test_a_notebook_cannot_read_another_student_or_write_outside_its_temporary_folder(tmp_path):
    from test_grade_class import _cells, _write
    sol = _cells("01_attention", True)
    cls = tmp_path / "class"
    _write(cls / "bob" / "01_attention.ipynb", sol)
    spy = [f"open({str(cls / 'bob' / '01_attention.ipynb')!r}).read()",
           f"open({str(cls / 'eve' / 'copied.txt')!r}, 'w').write('x')",
           f"open({str(cls / 'planted.txt')!r}, 'w').write('x')",
           "import tempfile\nwith tempfile.NamedTemporaryFile() as f:\n    f.write(b'fine')"]
    _write(cls / "eve" / "01_attention.ipynb", sol[:1] + spy + sol[1:])
    grades = run.grade_class(cls, tmp_path / "out", Run(settings=RunSettings(timeout=30, workers=2)), progress=False,
                            log=lambda *a: None)
    assert grades["settings"]["landlock_abi"] == landlock.landlock_abi()
    st = {s["student"]: s for s in grades["students"]}
    errors = st["eve"]["notebooks"][0]["cell_errors"]
    assert sum("PermissionError" in e for e in errors) == 3, errors   # the read and both writes; the temp file worked
    assert not (cls / "eve" / "copied.txt").exists() and not (cls / "planted.txt").exists()
    for s in ("bob", "eve"):                          # the exercises are graded as without the sandbox
        statuses = {n: e["status"] for n, e in st[s]["exercises"].items()}
        assert {"ch01.attention", "ch01.softmax"} <= set(statuses) and set(statuses.values()) == {"passed"}, (s, statuses)
    assert st["bob"]["notebooks_with_errors"] == []


# --- no network, and no learner code without the sandbox -------------------------------------------------------

# what a connect to a listening server meets in the worker: the sandbox's refusal, never ECONNREFUSED (server down)
REFUSED = {"netns": f"[Errno {errno.ENETUNREACH}]", "landlock-tcp": f"[Errno {errno.EACCES}]"}
SOFTMAX = ("def sm(x):\n    e = torch.exp(x - x.amax(-1, keepdim=True))\n    return e / e.sum(-1, keepdim=True)\n"
           "check('ch01.softmax', sm)")


@pytest.fixture
def server():
    """A TCP server on 127.0.0.1, in a thread: (its port, the peers of the connections it accepted)."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.05)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, peer = srv.accept()
            except TimeoutError:
                continue
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    thread.join()
    srv.close()


def _grade(cwd: Path, cells: list, env: dict | None = None):
    """The cells graded as chapter 1 in workers forked from a warm process started with `env`: (report, warm)."""
    warm = sandbox.WarmProcess({"TFORMER_GRADE": "learner", "MPLBACKEND": "Agg", **(env or {})},
                               sandbox.Limits(memory=4 << 30, file_size=1 << 20))
    try:
        return grade_cells(Path("01_attention.ipynb"), cells, lambda: warm.spawn(cwd), 60), warm
    finally:
        warm.close()


@pytest.mark.parametrize("no_netns", [False, True], ids=["as-graded", "landlock-tcp-fallback"])
def test_a_notebook_cannot_connect_to_a_server_on_this_machine(tmp_path, server, no_netns):
    """A cell and an exercise function connect to a listening server on 127.0.0.1: both are refused by the sandbox
    (a network namespace, or Landlock's TCP rules when the namespace is switched off), the server receives
    nothing, and the notebook's other exercise is graded."""
    if no_netns and landlock.landlock_abi() < landlock.TCP_SINCE:
        pytest.skip(f"Landlock's TCP rules need ABI {landlock.TCP_SINCE}+ (this kernel: {landlock.landlock_abi()})")
    port, accepted = server
    connect = f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()"
    cells = [(0, "import socket, torch\nfrom tformer.grading import check"),
             (1, connect),
             (2, f"def my_attention(q, k, v, mask=None):\n    {connect}\n    raise AssertionError('connected')\n"
                 "check('ch01.attention', my_attention)"),
             (3, SOFTMAX)]
    rep, warm = _grade(tmp_path, cells, {"TFORMER_GRADE_NO_NETNS": "1"} if no_netns else None)
    iso = warm.isolation()
    if iso["network"] == "none":
        pytest.skip("network isolation is 'none' here: no network namespace, and no Landlock TCP rules (ABI 4+)")
    assert iso["network"] == "landlock-tcp" if no_netns else iso["network"] in REFUSED
    assert iso["landlock_abi"] == landlock.landlock_abi()
    refused = REFUSED[iso["network"]]
    assert len(rep.cell_errors) == 1 and refused in rep.cell_errors[0], rep.cell_errors
    rows = {r.exercise: r for r in rep.rows}
    assert rows["ch01.attention"].status == "error" and refused in rows["ch01.attention"].message, rows
    assert rows["ch01.softmax"].status == "passed"
    assert accepted == []
    socket.create_connection(("127.0.0.1", port), timeout=5).close()   # the server was up all along
    for _ in range(100):
        if accepted:
            break
        time.sleep(0.05)
    assert len(accepted) == 1


@needs_landlock
@pytest.mark.parametrize("step,doing", [("build", "building"), ("enforce", "enforcing")])
def test_a_worker_whose_ruleset_fails_runs_no_learner_code(tmp_path, step, doing):
    """On a kernel with Landlock, a ruleset that cannot be built (in the keeper) or enforced (in the worker, by the
    kernel) stops the notebook before its first cell: spawn raises SandboxFailed, with the reason in one line."""
    ran = tmp_path / "ran.txt"                       # writable by a worker without its ruleset, by no other
    cells = [(0, f"open({str(ran)!r}, 'w').write('learner code ran')"),
             (1, "import torch\nfrom tformer.grading import check\n" + SOFTMAX)]
    warm = sandbox.WarmProcess({"TFORMER_GRADE": "learner", "MPLBACKEND": "Agg",
                                "TFORMER_GRADE_BREAK_LANDLOCK": step}, sandbox.Limits(4 << 30, 1 << 20))
    try:
        with pytest.raises(sandbox.SandboxFailed, match=f"^{doing} the Landlock ruleset failed: ") as e:
            grade_cells(Path("01_attention.ipynb"), cells, lambda: warm.spawn(tmp_path), 60)
        assert "\n" not in str(e.value)
        with pytest.raises(sandbox.SandboxFailed):
            warm.spawn(tmp_path)                        # every worker, not just the first; the warm process goes on
    finally:
        warm.close()
    assert not ran.exists()
    assert set(warm.isolation().values()) == {None}        # no worker ran: nothing to report


# --- nothing outlives a worker, nothing passes between workers, at most 64 processes -----------------------------

# The warm processes below, one per path the sandbox can take, started at once for this module (a start costs
# seconds): as graded here, without a mount namespace and pids cgroup (TMPDIR watched, /dev/shm denied, the
# worker under an unprivileged uid), with a keeper of a normal user's (RLIMIT_NPROC in its user namespace), and
# Gradescope's (root, every worker under TFORMER_GRADE_WORKER_USER's uid).
PATHS = {"as-graded": {},
         "no-mountns-no-cgroup": {"TFORMER_GRADE_NO_MOUNTNS": "1", "TFORMER_GRADE_NO_CGROUP": "1"},
         "normal-user": {"TFORMER_GRADE_KEEPER_USER": "nobody"},
         "gradescope": {"TFORMER_GRADE_WORKER_USER": "nobody"}}
TMP_SIZE = 8 << 20


def _nobody() -> bool:
    import pwd
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return False
    return True


@pytest.fixture(scope="module")
def warms():
    """name -> a warm process of that path, all started at once (in this, the main thread) and closed at the end."""
    names = list(PATHS) if os.geteuid() == 0 and _nobody() else ["as-graded"]
    started = {name: sandbox.WarmProcess({"TFORMER_GRADE": "learner", "MPLBACKEND": "Agg", **PATHS[name]},
                                         sandbox.Limits(4 << 30, 4 << 20, tmp_size=TMP_SIZE), wait=False)
               for name in names}

    def get(name: str) -> sandbox.WarmProcess:
        if name not in started:
            pytest.skip("this path is simulated by root (testing switches that take the user nobody)")
        return started[name].ready()

    try:
        yield get
    finally:
        for warm in started.values():
            warm.close()


def _said(warm, cwd: Path, cells: list[str], timeout: float = 20) -> list[str]:
    """The cells run as one notebook in a worker of `warm`: each cell's error line (a cell reports by raising)."""
    rep = grade_cells(Path("01_attention.ipynb"), list(enumerate(cells)), lambda: warm.spawn(cwd), timeout)
    return rep.cell_errors


def _expected_processes() -> str:
    """The process cap this machine gives as graded: a pids cgroup where root can make one, else the worker
    under an unprivileged uid (root), else RLIMIT_NPROC in the keeper's user namespace."""
    if os.geteuid() != 0:
        return "rlimit-userns"
    return "cgroup" if sandbox._cgroup_base() else "uid"


def test_isolation_says_which_path_each_worker_took(warms):
    """probe() forks a worker that runs nothing and reports; isolation() holds the weakest any worker had."""
    warm = warms("as-graded")
    got = warm.probe()
    assert set(got) == set(sandbox.ISOLATION)
    assert got["landlock_abi"] == landlock.landlock_abi() and got["max_processes"] == 64
    assert got["processes"] == _expected_processes(), got
    if got["tmp"] == "tmpfs":                         # a mount namespace: everything private
        assert (got["shm"], got["proc"]) in {("private", "private"), ("private", "shared")}, got
    if os.geteuid() == 0 and _nobody():
        assert warms("no-mountns-no-cgroup").probe() == {
            **got, "shm": "denied" if got["landlock_abi"] else "shared", "tmp": "watched", "proc": "shared",
            "processes": "uid"}
        normal = warms("normal-user").probe()
        assert normal["processes"] == ("rlimit-userns" if normal["pid_namespace"] else "none"), normal


def _secret(tmp_path: Path) -> tuple[str, list[str], list[str]]:
    """A file name, the cells that write it into /dev/shm and TMPDIR, and those that look for it."""
    name = f"tformer-test-{os.getpid()}-{tmp_path.name}"
    write = [f"import os\nopen('/dev/shm/{name}', 'w').write('secret')",
             f"open(os.path.join(os.environ['TMPDIR'], '{name}'), 'w').write('secret')\n"
             f"raise RuntimeError('TMPDIR ' + os.environ['TMPDIR'])"]
    look = [f"import glob, os\nraise RuntimeError('SEEN ' + repr(glob.glob('/dev/shm/*{name}*') + "
            f"glob.glob(os.path.join(os.environ['TMPDIR'], '*{name}*')) + glob.glob('/tmp/**/*{name}*', recursive=True)))"]
    return name, write, look


@pytest.mark.parametrize("path", ["as-graded", "no-mountns-no-cgroup"])
def test_a_workers_dev_shm_and_tmpdir_are_its_own_and_gone_after(tmp_path, warms, path):
    """A worker's file in /dev/shm and TMPDIR: invisible to the next worker, gone from the machine afterwards. In
    a mount namespace both are a tmpfs of the worker's; without one, /dev/shm is denied (Landlock) and the keeper
    removes TMPDIR."""
    warm = warms(path)
    name, write, look = _secret(tmp_path)
    first = _said(warm, tmp_path, write)
    iso = warm.isolation()
    if iso["shm"] == "private":
        assert len(first) == 1, first                 # both written; the second cell reports
    else:
        assert iso["shm"] in ("denied", "shared")
        if iso["shm"] == "denied":
            assert "PermissionError" in first[0], first
    tmpdir = first[-1].split("RuntimeError: TMPDIR ")[1]
    second = _said(warm, tmp_path, look)
    assert second == [second[0].split("RuntimeError")[0] + "RuntimeError: SEEN []"], second
    deadline = time.monotonic() + 5                   # the keeper removes TMPDIR once its worker is gone
    while os.path.exists(tmpdir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(tmpdir) and not os.path.exists(f"/dev/shm/{name}")
    assert not list(Path(warm.tmp).rglob(f"*{name}*"))


FILL = ("import os, time\nwhere = [os.environ['TMPDIR'], '/dev/shm']\nwrote = 0\n"
        "for i in range(12):                       # 12 MiB at most, in files of 1 MiB (the cap: 8 MiB)\n"
        "    try:\n"
        "        with open(os.path.join(where[i % 2 if SHM else 0], f'fill{i}'), 'wb') as f:\n"
        "            f.write(b'x' * (1 << 20))\n"
        "    except OSError as e:\n"
        "        raise RuntimeError(f'STOPPED {wrote} {e.errno}')\n"
        "    wrote += 1\n"
        "time.sleep(5)\n"
        "raise RuntimeError(f'WROTE {wrote}')")


@pytest.mark.parametrize("path", ["as-graded", "no-mountns-no-cgroup"])
def test_filling_tmpdir_and_dev_shm_past_the_cap_fails_or_ends_the_worker(tmp_path, warms, path):
    """TMPDIR and /dev/shm together hold at most Limits.tmp_size: on a tmpfs of the worker's a write past it
    fails (ENOSPC); a TMPDIR that the keeper watches ends the worker that outgrows it."""
    warm = warms(path)
    warm.probe()
    shm = warm.isolation()["shm"] == "private"
    errors = _said(warm, tmp_path, [f"SHM = {shm}", FILL], timeout=15)
    assert len(errors) == 1, errors
    if warm.isolation()["tmp"] == "tmpfs":
        wrote, code = errors[0].split("RuntimeError: STOPPED ")[1].split()
        assert int(code) == errno.ENOSPC and 4 <= int(wrote) < 8, errors
    else:
        assert "ended the notebook's process" in errors[0], errors


STORM = ("import os, time\nkids, failed = [], None\n"
         "for _ in range(200):                      # 200 at most, each gone within 10 s (or with the worker)\n"
         "    try:\n"
         "        pid = os.fork()\n"
         "    except OSError as e:\n"
         "        failed = e.errno\n"
         "        break\n"
         "    if pid == 0:\n"
         "        time.sleep(10)\n"
         "        os._exit(0)\n"
         "    kids.append(pid)\n"
         "seen = len([p for p in os.listdir('/proc') if p.isdigit()])\n"
         "raise RuntimeError(f'STORM {len(kids)} {failed} {seen} {os.getuid()}')")


@pytest.mark.parametrize("path", ["as-graded", "no-mountns-no-cgroup", "normal-user", "gradescope"])
def test_a_fork_storm_is_capped_at_64_processes(tmp_path, warms, path):
    """A cell forks until refused (200 at most): it gets fewer than 64 children (threads count too), the fork
    fails with EAGAIN, the worker's PID namespace never holds more than 64 processes; each path the cap takes
    (a pids cgroup, RLIMIT_NPROC on an unprivileged worker uid, RLIMIT_NPROC in a normal user's namespace), and
    the worker's uid (Gradescope's worker user: nobody's, in a pids cgroup where root can make one)."""
    import pwd
    warm = warms(path)
    root = _expected_processes()
    expected = {"as-graded": root, "no-mountns-no-cgroup": "uid", "normal-user": "rlimit-userns",
                "gradescope": root}
    start = time.monotonic()
    errors = _said(warm, tmp_path, [STORM])
    assert time.monotonic() - start < 15
    iso = warm.isolation()
    assert iso["processes"] == expected[path] and iso["max_processes"] == 64, iso
    assert "RuntimeError: STORM " in errors[0], errors
    kids, failed, seen, uid = errors[0].split("RuntimeError: STORM ")[1].split()
    assert 16 <= int(kids) < 64 and failed == str(errno.EAGAIN), errors
    nobody = path != "as-graded" or root == "uid"
    assert int(uid) == (pwd.getpwnam("nobody").pw_uid if nobody else os.getuid()), errors
    if iso["proc"] == "private":                      # the worker's /proc shows its namespace only
        assert int(seen) <= 64, errors
    if iso["processes"] == "cgroup":                  # and its cgroup is gone with it
        base = sandbox._cgroup_base()[0]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(n.startswith(f"tformer-grade-{warm.proc.pid}-")
                                                  for n in os.listdir(base)):
            time.sleep(0.05)
        assert not [n for n in os.listdir(base) if n.startswith(f"tformer-grade-{warm.proc.pid}-")]


def test_the_process_cap_as_a_normal_user(tmp_path):
    """The grader started by a normal user (su nobody): RLIMIT_NPROC set in the keeper's user namespace caps the
    fork storm. Needs root to switch users, and Python and this checkout readable by nobody."""
    import shutil
    import subprocess
    here = Path(__file__).resolve().parent.parent
    if os.geteuid() != 0 or not shutil.which("su") or not _nobody():
        pytest.skip("needs root, su and the user nobody to run the grader as a normal user")
    runs = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", f"{sys.executable} -c 'import torch, tformer' "
                           f"&& test -r {here}/tests/test_grade_sandbox.py"], capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(here)})
    if runs.returncode:
        pytest.skip(f"nobody cannot run {sys.executable} with this checkout (not readable by nobody): "
                    f"{(runs.stderr.decode(errors='replace').strip().splitlines() or [''])[-1]}")
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(out, 0o777)
    script = (f"import json, sys; sys.path.insert(0, {str(here / 'tests')!r})\n"
              "from pathlib import Path\nfrom tformer.grading.classroom import sandbox\n"
              "from test_grade_sandbox import STORM, _said\n"
              "warm = sandbox.WarmProcess({'TFORMER_GRADE': 'learner', 'MPLBACKEND': 'Agg'}, "
              "sandbox.Limits(4 << 30, 4 << 20))\n"
              f"errors = _said(warm, Path({str(out)!r}), [STORM])\n"
              f"open({str(out / 'got.json')!r}, 'w').write(json.dumps([warm.isolation(), errors]))\nwarm.close()")
    subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", f"cd /tmp && {sys.executable} -c \"$0\"", script],
                   timeout=120, check=True, env={**os.environ, "PYTHONPATH": str(here)})
    iso, errors = json.loads((out / "got.json").read_text())
    assert iso["processes"] == "rlimit-userns" and iso["max_processes"] == 64, iso
    kids, failed, _, _ = errors[0].split("RuntimeError: STORM ")[1].split()
    assert int(kids) < 64 and failed == str(errno.EAGAIN), errors


def test_the_limits_defaults():
    """64 processes; TMPDIR and /dev/shm together: one file at the file-size limit and room for IPython's own."""
    limits = sandbox.Limits(4 << 30, 1 << 20)
    assert (limits.processes, limits.tmp_size) == (64, (1 << 20) + sandbox.TMP_ROOM)
    assert sandbox.Limits(4 << 30, 1 << 20, tmp_size=5 << 20).tmp_size == 5 << 20


def test_the_worker_user(monkeypatch):
    """Whose uid a worker runs under: a normal user's keeper, its own; root, its own only in a pids cgroup under
    Landlock, else nobody's; TFORMER_GRADE_WORKER_USER's always (Gradescope), never root's or a user that
    does not exist (then no worker runs)."""
    import pwd
    if not _nobody():
        pytest.skip("no user nobody here")
    nobody = pwd.getpwnam("nobody")
    monkeypatch.delenv("TFORMER_GRADE_WORKER_USER", raising=False)
    assert sandbox._worker_user(False, False, True) == (None, "")
    assert sandbox._worker_user(True, True, True) == (None, "")
    for cgroup, abi in ((False, True), (True, False)):
        assert sandbox._worker_user(True, cgroup, abi) == ((nobody.pw_uid, nobody.pw_gid), "")
    monkeypatch.setenv("TFORMER_GRADE_WORKER_USER", "nobody")
    assert sandbox._worker_user(True, True, True) == ((nobody.pw_uid, nobody.pw_gid), "")
    assert sandbox._worker_user(False, False, True) == (None, "")      # a normal user cannot switch
    for name, why in (("root", "not an unprivileged user"), ("no-such-user-tformer", "no such user")):
        monkeypatch.setenv("TFORMER_GRADE_WORKER_USER", name)
        assert sandbox._worker_user(True, True, True) == (None, f"TFORMER_GRADE_WORKER_USER={name}: {why}")


PROC = ("import glob, os, torch\n"
        "mine = [open(f'/proc/self/{f}').read() for f in ('status', 'maps', 'cmdline', 'stat')]\n"
        "assert os.listdir('/proc/self/fd') and open('/proc/cpuinfo').read() and open('/proc/meminfo').read()\n"
        "assert float(torch.ones(3).sum()) == 3.0\n"
        "caps = {l.split()[0]: int(l.split()[1], 16) for l in mine[0].splitlines() if l.startswith('Cap')}\n"
        "assert caps['CapEff:'] == caps['CapPrm:'] == caps['CapBnd:'] == 0, caps   # no capability, none to regain\n"
        "seen = []\n"
        "for f in glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n"
        "        seen.append(open(f, 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
        "raise RuntimeError(f'PROC {os.getpid()} {len(seen)} {any(b\"pytest\" in c for c in seen)}')")


@pytest.mark.parametrize("path", ["as-graded", "no-mountns-no-cgroup"])
def test_a_worker_reads_its_own_proc_and_not_the_graders(tmp_path, warms, path):
    """The worker, init of its PID namespace, mounts a /proc of its own: it reads /proc/self (torch and IPython
    need it) and sees no process of the grader's (whose command line names the class, OUT and the assignment).
    Where it has none ("shared"), isolation() says so. Either way it runs with no capability left."""
    warm = warms(path)
    errors = _said(warm, tmp_path, [PROC])
    assert "RuntimeError: PROC " in errors[0], errors
    pid, n, grader = errors[0].split("RuntimeError: PROC ")[1].split()
    iso = warm.isolation()
    if iso["proc"] == "private":
        assert pid == "1" and grader == "False" and int(n) <= 3, errors
    else:
        assert path != "as-graded" or iso["tmp"] == "watched", iso    # a mount namespace brings its /proc
        assert grader == "True", errors               # the weaker guarantee, as reported


def _iso(namespaced=True, abi=7, network="netns", shm="private", tmp="tmpfs", proc="private", processes="cgroup",
         most=64) -> dict:
    return {"landlock_abi": abi, "network": network, "pid_namespace": namespaced, "shm": shm, "tmp": tmp,
            "proc": proc, "processes": processes, "max_processes": most}


def test_the_grader_records_the_weakest_isolation_any_worker_had():
    """isolation() keeps, for each guarantee, the weakest any worker had, not the last worker's: the lowest ABI,
    the weakest network (netns > landlock-tcp > none), /dev/shm, TMPDIR, /proc and process cap."""
    warm = types.SimpleNamespace(_isolation=dict.fromkeys(sandbox.ISOLATION))
    assert set(warm._isolation) == set(_iso())
    seen = []
    for worker in [_iso(), _iso(False, 4, "landlock-tcp", "denied", "watched", "shared", "rlimit-userns"), _iso(),
                   _iso(abi=0, network="none", shm="shared", processes="none", most=0), _iso()]:
        sandbox.WarmProcess._record(warm, worker)
        seen.append(dict(warm._isolation))
    assert seen[0] == _iso()
    assert seen[1] == seen[2] == _iso(False, 4, "landlock-tcp", "denied", "watched", "shared", "rlimit-userns")
    assert seen[3] == seen[4] == _iso(False, 0, "none", "shared", "watched", "shared", "none", 0)
    warm = types.SimpleNamespace(_isolation=dict.fromkeys(sandbox.ISOLATION))
    for worker in [_iso(processes="uid"), _iso(processes="cgroup")]:
        sandbox.WarmProcess._record(warm, worker)
    assert warm._isolation["processes"] == "uid"


def test_the_keepers_report_is_fixed_size_with_a_one_line_reason():
    """The keeper's header: pid, the worker's isolation and why it does not run, cut to one line and to its
    field on a character's boundary."""
    r, w = os.pipe()
    try:
        weak = _iso(False, 4, "landlock-tcp", "denied", "watched", "shared", "uid", 64)
        sandbox._report(w, 1234, weak, "")
        sandbox._report(w, 0, _iso(), "enforcing failed: /tmp/" + "é" * 200 + "\nsecond line")
        assert len(os.read(r, 1000)) == 2 * sandbox._HEAD.size
        sandbox._report(w, 1234, weak, "")
        assert sandbox._read_head(r) == (1234, weak, "")
        sandbox._report(w, 0, _iso(), "enforcing failed: /tmp/" + "é" * 200 + "\nsecond line")
        assert sandbox._read_head(r) == (0, _iso(), "enforcing failed: /tmp/" + "é" * 88)
        os.close(w)
        assert sandbox._read_head(r) == (0, {}, "")   # cut short: no worker
    finally:
        os.close(r)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
