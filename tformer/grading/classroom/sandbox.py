"""Where a class's notebooks run: workers forked from a warm process, under limits, killed with all they spawned.

    python -m tformer.grading.classroom.sandbox FD    (started by tformer/grading/classroom/run.py, never by hand)

The worker and every byte it sends belong to the student: this module keeps what a worker can reach, keep and
spend small, and says which guarantees held (`WarmProcess.isolation()`); it decides no grade.

Starting Python and importing torch takes seconds, more than grading most notebooks does. So `tformer grade
CLASS` starts one *warm process* that imports torch, tformer, the course's own exercises, IPython and the
modules the course's notebooks import, and then only forks. It never runs a learner's code, never loads a
teacher's file (a teacher's exercise, its reference and hidden cases live in the grader's process alone) and
never holds an expected answer, so no worker inherits another student's state or a teacher's secret.

For each notebook the grader sends the warm process two pipe ends over a Unix socket (SCM_RIGHTS). It forks a
*keeper*, which starts a new session, sets the limits, enters its namespaces and mounts, and forks the
*worker*, which runs tformer/grading/classroom/worker.py's loop on the pipes. What each worker gets, in the
keeper's fixed-size report to the grader (each value weakest first; `isolation()` keeps the weakest any worker
had, None before the first; `probe()` forks a worker that runs nothing, to know before grading):

    landlock_abi   the Landlock ABI it runs under (0: none)
    network        "netns" (a network namespace: no interface but a loopback left down), "landlock-tcp" (no
                   TCP bind or connect; UDP open), "none"
    pid_namespace  True: the worker is init of a PID namespace (killing it kills everything the notebook
                   started, `setsid` or not); False: the keeper is a child subreaper and kills the orphans
    shm            "private": /dev/shm is the worker's own (on its tmpfs, below) and so are System V shared
                   memory and POSIX queues (an IPC namespace); "denied": no mount namespace, Landlock denies
                   /dev/shm (read and write; the course never uses it), IPC namespace; "shared": neither
    tmp            "tmpfs": TMPDIR and /dev/shm are one tmpfs of Limits.tmp_size bytes (default: the file-size
                   limit and 16 MiB, so that one file at that limit fits) in a mount namespace of
                   the keeper's (every mount private to it): a write past the cap fails (ENOSPC), and all of it
                   vanishes with the namespace; "watched": TMPDIR is a folder the keeper measures every 0.1 s,
                   killing the worker whose folder outgrows the cap, and removes afterwards
    proc           "private": the worker mounts a /proc of its PID namespace (it reads its own /proc/self, not
                   the grader's command line); "shared": the kernel refused (a container's /proc with masked
                   paths, Docker, Gradescope) or no mount namespace: the machine's processes are visible
    processes      at most Limits.processes (64) processes, threads included, per worker: "cgroup": a pids
                   cgroup of the keeper's (root; v1, or v2 with the pids controller), removed after; "rlimit-
                   userns": a normal user's RLIMIT_NPROC, set after the keeper's unshare(CLONE_NEWUSER), so it
                   counts that namespace's processes only; "uid": root where no cgroup can be made: the worker
                   runs under an unprivileged uid (nobody) with RLIMIT_NPROC (root is exempt from it, even in a
                   user namespace); "none": no cap (a normal user without user namespaces). As root on a kernel
                   without Landlock the worker runs under nobody's uid too (root's owns the machine's files)
    max_processes  that cap (0: none)

Gradescope: with TFORMER_GRADE_WORKER_USER=NAME in the warm process's environment and root, every worker runs
under NAME's uid and gid (its temporary folder its own), a pids cgroup as well where one can be made; a NAME
that does not exist, or is root, runs no worker. A worker under another uid reads only what that user may
(the checkout, Python, the student's files must be readable to it).

Before Landlock, the worker gives up every capability it had in its namespaces (the bounding set emptied,
no_new_privs): it cannot mount, unmount or remount anything (its /proc, its tmpfs's size) or change its uid.

Limits (setrlimit, inherited by everything the worker starts): address space (`memory`, default the
machine's memory shared among the parallel workers), file size (`file_size`), no core dumps, the processes
above; torch's threads at most a quarter of the process cap. A cell that allocates more raises MemoryError (or
torch's allocation error) in that cell; a file write past the limit fails. The worker's stdout and stderr are
/dev/null: a notebook that prints 100 MB costs only the printing.

Landlock (Linux 5.13+, no root needed): the keeper builds a ruleset, after its mounts (a rule holds the file
system it was opened on), and the worker enforces it on itself before any learner code runs. The worker may
read (and execute, map) only Python's prefixes and search path, the package, the course's data, the system's
folders (/usr, /lib, /etc, /proc, /sys, /dev, ...) and its own student's folder; it may write only into its
temporary folder ($TMPDIR, gone afterwards), /dev/null and its private /dev/shm. Another student's folder, a
sibling of its own, is neither readable nor writable. From ABI 6 no abstract Unix socket or signal reaches
outside the worker's domain. Only the access rights the running kernel's ABI knows are handled. Where the
kernel has no Landlock the worker runs as before and the grader says so once. Where it has Landlock but
building or enforcing the ruleset fails, no learner code runs: `WarmProcess.spawn` raises `SandboxFailed`, with
the reason in one line.

No network: each worker runs in a network namespace of its own, asked for as a second unshare after the user and
PID namespace (so that a kernel that refuses it keeps the PID namespace). Its loopback stays down, so a connect,
even to 127.0.0.1, fails with ENETUNREACH, never with the ECONNREFUSED of a server that is down. Where no network
namespace can be had, Landlock's TCP rules (ABI 4+) refuse every TCP bind and connect (EACCES); UDP stays open
under that fallback.

Not guaranteed here: what a worker sends is the student's (the grader checks it); a worker may use its CPU time
and memory up to the limits until the grader's deadline kills it; under "shared"/"watched"/"none" values the
weaker guarantee is the one stated above, and the grader reports it.

Testing switches, read by the keeper from the warm process's environment (never set them to grade a class):
    TFORMER_GRADE_NO_NETNS=1                 ask for no network namespace (the Landlock TCP fallback)
    TFORMER_GRADE_NO_MOUNTNS=1               ask for no mount namespace (TMPDIR watched, /dev/shm denied, /proc shared)
    TFORMER_GRADE_NO_CGROUP=1                make no pids cgroup (as root: the worker under nobody's uid)
    TFORMER_GRADE_KEEPER_USER=NAME           root's keeper takes NAME's uid first: a normal user's grader
    TFORMER_GRADE_BREAK_LANDLOCK=build       the ruleset's build fails (an OSError raised in its place)
    TFORMER_GRADE_BREAK_LANDLOCK=enforce     the worker enforces a file that is not a ruleset (the kernel refuses)
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .landlock import (TCP_SINCE, landlock_abi, landlock_allow, landlock_enforce, landlock_ruleset, libc, prctl,
                       worker_paths)

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91, "arm64": 91}.get(os.uname().machine, -1)
_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 12, 1 << 14, 1 << 18
_MNT_DETACH = 2
GiB = 1 << 30
TMP_ROOM = 16 << 20      # TMPDIR's room beyond one file at the file-size limit (IPython's and matplotlib's files)
# what a worker got, weakest first (WarmProcess.isolation() keeps the weakest any worker had)
NETWORK = ("none", "landlock-tcp", "netns")
SHM = ("shared", "denied", "private")
TMP = ("watched", "tmpfs")
PROC = ("shared", "private")
PROCESSES = ("none", "uid", "rlimit-userns", "cgroup")
ISOLATION = ("landlock_abi", "network", "pid_namespace", "shm", "tmp", "proc", "processes", "max_processes")
# the keeper's report to the grader, fixed-size: the worker's pid (0: none runs), 1 if in a PID namespace, the
# Landlock ABI it runs under (0: none), its network, /dev/shm, TMPDIR, /proc and process cap (indexes into
# NETWORK, SHM, TMP, PROC, PROCESSES), the most processes it may have (0: no cap), why it does not run ("": it does)
_HEAD = struct.Struct(">QBBBBBBBH200s")


class SandboxFailed(RuntimeError):
    """The kernel has Landlock, yet the worker's ruleset could not be built or enforced: no learner code ran."""


@dataclass
class Limits:
    memory: int          # bytes of address space per worker (RLIMIT_AS)
    file_size: int       # bytes per file written (RLIMIT_FSIZE)
    threads: int = 1     # torch's intra-op threads per worker
    processes: int = 64  # processes (threads included) per worker: a pids cgroup or RLIMIT_NPROC
    tmp_size: int = 0    # bytes in TMPDIR and /dev/shm together per worker (0: file_size + TMP_ROOM)

    def __post_init__(self):
        self.tmp_size = self.tmp_size or self.file_size + TMP_ROOM


def parse_size(text: str) -> int:
    """'4G', '512M', '2.5GiB', '1000000' -> bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if t[-1:] in "KMGT" else t) * mult
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 4G, 512M)") from None
    if value < 256 << 20:
        raise ValueError(f"{text}: a worker needs at least 256M (torch alone maps several hundred MB)")
    return int(value)


def machine_limits(workers: int, memory: int | None = None, cores: int | None = None) -> Limits:
    """Defaults that follow the machine: its memory shared among the workers (at least 2 GiB each), files up
    to 1 GiB or an eighth of the temporary folder's free space per worker, the cores shared among them."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 8 * GiB
    free = shutil.disk_usage(tempfile.gettempdir()).free
    cores = cores or available_cores()
    return Limits(memory=memory or max(2 * GiB, int(total * 0.9) // max(1, workers)),
                  file_size=max(16 << 20, min(GiB, free // (8 * max(1, workers)))),
                  threads=max(1, cores // max(1, workers)))


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def lost_guarantees(iso: dict) -> list[str]:
    """What the workers ran without, one short phrase each, from an isolation record (WarmProcess.isolation(),
    grades.json's settings.isolation): the guarantees of TEACHING.md's threat model that did not hold."""
    lost = []
    if iso.get("landlock_abi") == 0:
        lost.append("Landlock (a worker's files are limited by its user's permissions only)")
    if iso.get("network") == "landlock-tcp":
        lost.append("a network namespace (TCP is blocked by Landlock; UDP is open)")
    elif iso.get("network") == "none":
        lost.append("a network namespace and Landlock network rules (the network is open)")
    if iso.get("pid_namespace") is False:
        lost.append("a user/PID namespace (a subreaper kills what a notebook starts)")
    if iso.get("proc") == "shared":
        lost.append("a private /proc (a notebook can read other processes' command lines)")
    if iso.get("shm") == "shared":
        lost.append("a private /dev/shm")
    if iso.get("tmp") == "watched":
        lost.append("a private tmpfs for TMPDIR (its size is watched instead)")
    if iso.get("processes") == "none":
        lost.append("a limit on a notebook's processes")
    return lost


# --- the grader's side ----------------------------------------------------------------------------------------

class ForkedWorker:
    """A worker forked by the warm process: the grader's ends of its pipes, and how to kill it."""

    def __init__(self, pid: int, namespaced: bool, rfd: int, wfd: int):
        self.pid, self.namespaced, self.rfd = pid, namespaced, rfd
        self.wfile = os.fdopen(wfd, "wb")

    def kill(self) -> None:
        for kill in (os.kill, os.killpg):             # the worker (init of its PID namespace), then its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.wfile.close()
        with contextlib.suppress(OSError):
            os.close(self.rfd)


class WarmProcess:
    """The warm process (start it from the main thread: it dies with the thread that started it)."""

    def __init__(self, env: dict, limits: Limits, preload: list[str] = (), wait: bool = True):
        """Start it; `wait`: until it has imported what workers need (else call ready() before spawn: several
        warm processes, or other work, meanwhile)."""
        self.limits = limits
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "tformer.grading.classroom.sandbox", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env={**os.environ, **env},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
                                     start_new_session=True)
        theirs.close()
        self.lock = threading.Lock()
        self.tmp = tempfile.mkdtemp(prefix="tformer-grade-")   # the workers' temporary folders, removed by close()
        if os.geteuid() == 0:                         # a worker under an unprivileged uid reaches its own folder
            os.chmod(self.tmp, 0o711)                 # (traverse only: no listing)
        self._isolation: dict = dict.fromkeys(ISOLATION)   # the weakest any worker had; None before the first
        self._send({"preload": list(preload)})
        self._ready = False
        if wait:
            self.ready()

    def ready(self) -> "WarmProcess":
        """Wait until the warm process has imported what workers need (done once)."""
        with self.lock:                               # spawn's threads: one reads the socket
            if not self._ready:
                if not self._receive(300).get("ready"):
                    raise RuntimeError(f"the warm grading process did not start: {self.stderr()}")
                self._ready = True
        return self

    def isolation(self) -> dict:
        """The weakest isolation any worker had (None values before the first worker): {"landlock_abi": int,
        "network": NETWORK, "pid_namespace": bool, "shm": SHM, "tmp": TMP, "proc": PROC, "processes": PROCESSES,
        "max_processes": int (0: no cap)}. See the module's docstring for what each value guarantees."""
        with self.lock:
            return dict(self._isolation)

    def probe(self) -> dict:
        """Fork one worker that runs nothing, read the keeper's report, kill it: isolation() before any notebook
        (so that a class run can refuse or announce). Raises SandboxFailed as spawn does."""
        folder = Path(self.tmp) / "probe"
        folder.mkdir(exist_ok=True)
        self.spawn(folder).kill()
        return self.isolation()

    def _send(self, obj, fds=()) -> None:
        socket.send_fds(self.sock, [json.dumps(obj).encode()], list(fds))

    def _receive(self, seconds: float) -> dict:
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(1 << 16)
        except (socket.timeout, OSError):
            data = b""
        if not data:
            raise RuntimeError(f"the warm grading process stopped: {self.stderr()}")
        return json.loads(data)

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def spawn(self, cwd: Path, own: list[Path] | None = None, closed: Path | None = None) -> ForkedWorker:
        """A fresh worker, running in `cwd`, waiting for its cells on its pipe. Under Landlock it reads, of the class
        folder `closed` (default: the parent of `cwd`), only `own` (default: `cwd`), a student's folder or files."""
        self.ready()
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        try:
            with self.lock:
                self._send({"cwd": str(cwd), "own": [str(p) for p in own or [cwd]],
                            "closed": str(closed or Path(cwd).resolve().parent), "tmp": self.tmp,
                            "memory": self.limits.memory, "file_size": self.limits.file_size,
                            "threads": self.limits.threads, "processes": self.limits.processes,
                            "tmp_size": self.limits.tmp_size},
                           [to_worker_r, from_worker_w])
                self._receive(60)
        finally:
            os.close(to_worker_r)
            os.close(from_worker_w)
        pid, got, why = _read_head(from_worker_r)
        if not pid:
            os.close(from_worker_r)
            os.close(to_worker_w)
            raise SandboxFailed(why) if why else RuntimeError(
                f"the warm grading process could not start a worker: {self.stderr()}")
        with self.lock:
            self._record(got)
        return ForkedWorker(pid, got["pid_namespace"], from_worker_r, to_worker_w)

    def _record(self, got: dict) -> None:
        """Keep the weakest isolation any worker had: what the grader reports holds for every notebook."""
        order = {"network": NETWORK, "shm": SHM, "tmp": TMP, "proc": PROC, "processes": PROCESSES}
        had = self._isolation
        for key in ISOLATION:
            old, new = had[key], got[key]
            if old is None:
                had[key] = new
            elif key in order:
                had[key] = min(old, new, key=order[key].index)
            elif key == "pid_namespace":
                had[key] = old and new
            elif key == "max_processes":              # 0: no cap, the weakest
                had[key] = 0 if 0 in (old, new) else max(old, new)
            else:
                had[key] = min(old, new)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            self.log.close()
            _remove_cgroups(f"tformer-grade-{self.proc.pid}-")   # a keeper killed before removing its own
            shutil.rmtree(self.tmp, ignore_errors=True)


def _read_head(fd: int) -> tuple[int, dict, str]:
    """The keeper's report (_HEAD), first on the worker's pipe: the worker's pid (0 where it was cut short or no
    worker runs), its isolation (as WarmProcess.isolation()), why it does not run."""
    head, deadline = b"", time.monotonic() + 60
    while len(head) < _HEAD.size and time.monotonic() < deadline:
        chunk = os.read(fd, _HEAD.size - len(head))
        if not chunk:
            break
        head += chunk
    if len(head) < _HEAD.size:
        return 0, {}, ""
    pid, namespaced, abi, network, shm, tmp, proc, processes, most, why = _HEAD.unpack(head)
    try:
        got = {"landlock_abi": abi, "network": NETWORK[network], "pid_namespace": bool(namespaced),
               "shm": SHM[shm], "tmp": TMP[tmp], "proc": PROC[proc], "processes": PROCESSES[processes],
               "max_processes": most}
    except IndexError:
        return 0, {}, "the keeper's report does not parse"
    return pid, got, why.rstrip(b"\0").decode(errors="replace")


# --- the warm process's side ----------------------------------------------------------------------------------

def _enter_namespaces(user: tuple[int, int] | None = None) -> tuple[bool, bool]:
    """A new user and PID namespace (the next child is its init), then a network namespace, each False where
    the kernel refuses it. Two attempts: a kernel (or a policy such as AppArmor's on user namespaces) that
    refuses the network namespace does not also cost the PID namespace. `user`: the uid and gid the worker
    will take, mapped too."""
    if not sys.platform.startswith("linux"):
        return False, False
    return _unshare_user_and_pid(user), _unshare_net()


def _unshare_user_and_pid(user: tuple[int, int] | None = None) -> bool:
    uid, gid = os.getuid(), os.getgid()
    try:
        if uid == 0 and user:
            return _unshare_as_root(user)
        if libc().unshare(_CLONE_NEWUSER | _CLONE_NEWPID) != 0:
            # root where user namespaces are refused (a container's seccomp, say) may still have a PID namespace
            return uid == 0 and libc().unshare(_CLONE_NEWPID) == 0
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        return True
    except (OSError, AttributeError):
        return False


def _unshare_as_root(user: tuple[int, int] | None) -> bool:
    """Root's user and PID namespace where the worker takes the uid and gid `user`: root mapped to itself, and
    `user` too (with setgroups, to drop root's groups). A map of two ids takes CAP_SETUID in the parent
    namespace, so a helper forked before the unshare writes them. Where user namespaces are refused (a
    container's seccomp, say), a PID namespace alone (root needs no user namespace)."""
    maps = [f"0 0 1\n{user[0]} {user[0]} 1", f"0 0 1\n{user[1]} {user[1]} 1" if user[1] else "0 0 1"]
    go_r, go_w = os.pipe()
    helper = os.fork()
    if helper == 0:                                   # stays in this keeper's first namespaces
        code = 1
        try:
            os.close(go_w)
            if os.read(go_r, 1) == b"1":
                for name, text in zip(("uid_map", "gid_map"), maps):
                    with open(f"/proc/{os.getppid()}/{name}", "w") as f:
                        f.write(text)
                code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    unshared = libc().unshare(_CLONE_NEWUSER | _CLONE_NEWPID) == 0
    os.write(go_w, b"1" if unshared else b"0")
    os.close(go_w)
    mapped = os.waitpid(helper, 0)[1] == 0
    if not unshared:
        return libc().unshare(_CLONE_NEWPID) == 0
    return mapped


def _unshare_net() -> bool:
    """A network namespace of the keeper's own (the worker inherits it): no interface but a loopback left down.
    Works for root, and for anyone inside the user namespace just entered (it owns the new namespace)."""
    if os.environ.get("TFORMER_GRADE_NO_NETNS") == "1":        # a testing switch: see the module's docstring
        return False
    return _unshare(_CLONE_NEWNET)


def _unshare(flags: int) -> bool:
    try:
        return libc().unshare(flags) == 0
    except (OSError, AttributeError):
        return False


def _private_mounts(tmp: str, size: int, user: tuple[int, int] | None) -> tuple[bool, bool]:
    """A mount namespace of the keeper's own, every mount private to it, and a tmpfs of `size` bytes on `tmp`
    holding the worker's TMPDIR (tmp/tmp) and its /dev/shm (tmp/shm, bound there): (tmpfs mounted, /dev/shm
    private). Both vanish with the namespace. Nothing is mounted where the mounts could propagate out."""
    if os.environ.get("TFORMER_GRADE_NO_MOUNTNS") == "1" or not sys.platform.startswith("linux"):  # a testing switch
        return False, False
    try:
        lc = libc()
        if lc.unshare(_CLONE_NEWNS) != 0 or lc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            return False, False
        owner = f",uid={user[0]},gid={user[1]}" if user else ""
        if lc.mount(b"tmpfs", tmp.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                    f"size={size},mode=0700{owner}".encode()) != 0:
            return False, False
        shm = os.path.join(tmp, "shm")
        os.mkdir(shm, 0o700)
        if user:
            os.chown(shm, *user)
        return True, os.path.isdir("/dev/shm") and lc.mount(shm.encode(), b"/dev/shm", None, _MS_BIND, None) == 0
    except (OSError, AttributeError):
        return False, False


def _cgroup_base() -> tuple[str, bool] | None:
    """This process's cgroup folder in a hierarchy with the pids controller, and whether it is cgroup v2."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "pids" in controllers.split(",") and os.path.isdir(f"/sys/fs/cgroup/pids{path}"):
            return f"/sys/fs/cgroup/pids{path}".rstrip("/"), False
    for hid, _, path in lines:
        base = f"/sys/fs/cgroup{path}".rstrip("/")
        with contextlib.suppress(OSError):
            if hid == "0" and "pids" in open(f"{base}/cgroup.controllers").read().split():
                return base, True
    return None


def _make_cgroup(processes: int) -> str | None:
    """As root: a pids cgroup of this keeper's own (removed afterwards), pids.max the worker's processes plus
    the keeper, joined before any namespace, so that the worker and all it starts are in it. None where none
    can be made."""
    if os.environ.get("TFORMER_GRADE_NO_CGROUP") == "1":        # a testing switch
        return None
    found = _cgroup_base()
    if not found:
        return None
    base, v2 = found
    path = f"{base}/tformer-grade-{os.getppid()}-{os.getpid()}"     # the warm process's pid, this keeper's
    try:
        if v2:
            with contextlib.suppress(OSError), open(f"{base}/cgroup.subtree_control", "w") as f:
                f.write("+pids")
        os.mkdir(path)
    except OSError:
        return None
    try:
        for name, value in (("pids.max", processes + 1), ("cgroup.procs", 0)):
            with open(f"{path}/{name}", "w") as f:
                f.write(str(value))
        return path
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return None


def _leave_cgroup(path: str) -> None:
    """The keeper, its worker gone, back in its first cgroup, and its own removed (else the warm process's
    next sweep or WarmProcess.close removes it)."""
    with contextlib.suppress(OSError):
        with open(f"{os.path.dirname(path)}/cgroup.procs", "w") as f:
            f.write("0")
        for _ in range(20):
            try:
                os.rmdir(path)
                return
            except OSError as e:
                if e.errno != errno.EBUSY:
                    return
                time.sleep(0.01)


def _remove_cgroups(prefix: str, tries: int = 50) -> None:
    """Remove the empty pids cgroups named `prefix`... (of keepers gone), trying for up to a second while some
    are in use (`tries`: 1, once)."""
    found = _cgroup_base() if os.geteuid() == 0 else None
    if not found:
        return
    for _ in range(tries):
        with contextlib.suppress(OSError):
            left = [n for n in os.listdir(found[0]) if n.startswith(prefix)]
            for name in left:
                with contextlib.suppress(OSError):
                    os.rmdir(f"{found[0]}/{name}")
            if not any(os.path.isdir(f"{found[0]}/{n}") for n in left):
                return
        time.sleep(0.02)


def _worker_user(root: bool, cgroup: bool, landlock: bool) -> tuple[tuple[int, int] | None, str]:
    """The unprivileged (uid, gid) the worker runs under, None: the keeper's own, and why there is none to be
    had ("": fine). As root: TFORMER_GRADE_WORKER_USER's always (Gradescope), else nobody's where no pids
    cgroup could be made (root is exempt from RLIMIT_NPROC; a worker under an unprivileged uid is not) or where
    the kernel has no Landlock (root's uid, even in a user namespace, owns the machine's files)."""
    name = os.environ.get("TFORMER_GRADE_WORKER_USER")
    if not root or (cgroup and landlock and not name):
        return None, ""
    import pwd
    try:
        pw = pwd.getpwnam(name or "nobody")
    except KeyError:
        if name:
            return None, f"TFORMER_GRADE_WORKER_USER={name}: no such user"
        return (65534, 65534), ""
    if pw.pw_uid == 0:
        return None, f"TFORMER_GRADE_WORKER_USER={name}: not an unprivileged user"
    return (pw.pw_uid, pw.pw_gid), ""


def _cap_processes(n: int, root: bool, cgroup: bool, user, userns: bool) -> str:
    """The worker's process cap (PROCESSES): a pids cgroup, or RLIMIT_NPROC where it binds: on the worker's
    unprivileged uid (root), or, as a normal user, set after unshare(CLONE_NEWUSER), where it counts that
    namespace's processes only (this keeper among them). Set before, it would count all of this user's."""
    import resource
    if cgroup:
        return "cgroup"
    if not user and (root or not userns):
        return "none"
    n = n if user else n + 1
    try:
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        n = n if hard == resource.RLIM_INFINITY else min(n, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    except (ValueError, OSError):
        return "none"
    return "uid" if user else "rlimit-userns"


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                    found.append(int(entry))
    return found


def _set_limits(memory: int, file_size: int) -> None:
    import resource
    for what, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, file_size), (resource.RLIMIT_CORE, 0)):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(what, (value, value))


def _ruleset(req: dict, tmp: str, abi: int, tcp: bool, shm: str | None) -> tuple[int, str]:
    """In the keeper, its mounts made: the worker's Landlock ruleset fd (-1 on a kernel without Landlock), and
    why it could not be built ("" when it was)."""
    if not abi:
        return -1, ""
    try:
        if os.environ.get("TFORMER_GRADE_BREAK_LANDLOCK") == "build":   # a testing switch
            raise OSError(errno.EPERM, "broken on purpose (TFORMER_GRADE_BREAK_LANDLOCK=build)")
        paths = worker_paths(req.get("own") or [req["cwd"]], Path(tmp), req.get("closed"), shm)
        return landlock_ruleset(*paths, abi=abi, tcp=tcp), ""
    except Exception as e:                            # whatever it was, the worker must not run without it
        return -1, f"building the Landlock ruleset failed: {e}"


def _enforce(ruleset: int) -> str:
    """In the worker, before any learner code: its ruleset, for good. Returns why that failed ("": it did not)."""
    if ruleset < 0:
        return ""
    target = ruleset
    if os.environ.get("TFORMER_GRADE_BREAK_LANDLOCK") == "enforce":  # a testing switch: a file, not a ruleset
        target = os.open(os.devnull, os.O_RDONLY)
    try:
        landlock_enforce(target)
        return ""
    except OSError as e:
        return f"enforcing the Landlock ruleset failed: {e}"
    finally:
        os.close(ruleset)


def _mount_proc(ruleset: int) -> str:
    """In the worker, init of its PID namespace, in the keeper's mount namespace: a /proc of its own namespace
    (the grader's processes out of sight), readable under its ruleset: "private"; "shared" where the kernel
    refuses (a container's /proc with masked paths)."""
    try:
        lc = libc()
        if lc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
            return "shared"
        if ruleset >= 0:                              # the rule the keeper added holds the shared /proc only
            try:
                landlock_allow(ruleset, ["/proc"])
            except OSError:
                lc.umount2(b"/proc", _MNT_DETACH)
                return "shared"
        return "private"
    except (OSError, AttributeError):
        return "shared"


def _drop_bounding_set() -> None:
    """In the worker, before it changes its uid (which takes the capability to do this): no capability can be
    regained by an execve."""
    import ctypes
    if not sys.platform.startswith("linux"):
        return
    lc = libc()
    for cap in range(64):                             # past the kernel's last capability: EINVAL, the end
        if lc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break


def _drop_capabilities() -> str:
    """In the worker, its mounts, bounding set and uid done: no capability left, in any namespace, nor any to
    be regained (no_new_privs), so that even without Landlock it cannot mount, unmount or remount (its /proc,
    its tmpfs's size) or change its uid. "" or why that failed."""
    import ctypes
    if not sys.platform.startswith("linux"):
        return ""
    lc = libc()
    head = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()                    # effective, permitted, inheritable: none (two words each)
    lc.syscall.restype = ctypes.c_long
    if _SYS_CAPSET >= 0 and lc.syscall(ctypes.c_long(_SYS_CAPSET), ctypes.byref(head), ctypes.byref(data)) != 0:
        return f"dropping the worker's capabilities failed: {os.strerror(ctypes.get_errno())}"
    if not prctl(_PR_SET_NO_NEW_PRIVS, 1):
        return "prctl(PR_SET_NO_NEW_PRIVS) failed"
    return ""


def _become(user: tuple[int, int]) -> str:
    """In the worker: the unprivileged uid and gid, no supplementary groups; "" or why that failed."""
    try:
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])
    except OSError as e:
        return f"running the worker as uid {user[0]} failed: {e}"
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)        # a change of uid clears it
    prctl(_PR_SET_DUMPABLE, 1)                      # its own /proc/self stays its own (no core: RLIMIT_CORE 0)
    return ""


def _run_worker(req: dict, fd_in: int, fd_out: int, tmp: str | None = None) -> None:
    """In the worker, its ruleset enforced: quiet standard streams, its temporary folder, one thread count, the
    cwd; then the worker's loop."""
    with contextlib.suppress(OSError):
        os.chdir(req["cwd"])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    if tmp:                                           # where the worker may write: IPython's history too
        os.environ.update(TMPDIR=tmp, IPYTHONDIR=os.path.join(tmp, "ipython"), MPLCONFIGDIR=os.path.join(tmp, "mpl"))
        tempfile.tempdir = tmp
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    import torch
    # threads count against the process cap: leave most of it to the notebook
    torch.set_num_threads(max(1, min(int(req["threads"]), int(req.get("processes", 64)) // 4)))
    from .worker import serve
    rc = 1
    try:
        rc = serve(os.fdopen(fd_in, "rb"), os.fdopen(fd_out, "wb"))
    finally:
        os._exit(rc)


def _as_keeper_user(tmp: str) -> str:
    """A testing switch, TFORMER_GRADE_KEEPER_USER=NAME: a keeper started by root takes NAME's uid at once, as
    the keeper of a grader run by that (normal) user would be. "" or why it could not."""
    name = os.environ.get("TFORMER_GRADE_KEEPER_USER")
    if not name or os.geteuid() != 0:
        return ""
    import pwd
    try:
        pw = pwd.getpwnam(name)
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
    except (KeyError, OSError) as e:
        return f"TFORMER_GRADE_KEEPER_USER={name}: {e}"
    return _become((pw.pw_uid, pw.pw_gid))


def _keeper(req: dict, fd_in: int, fd_out: int) -> None:
    """Forked from the warm process: limits, a pids cgroup (root), namespaces (or a subreaper), private mounts,
    the process cap, the ruleset, the worker, then clean-up. The worker runs learner code only once its ruleset
    is enforced; else the keeper reports why and no worker."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)        # the warm process gone: so is this keeper
    _set_limits(int(req["memory"]), int(req["file_size"]))
    processes = max(1, min(int(req.get("processes") or 64), 65535))         # the report's field: 16 bits
    size = int(req.get("tmp_size") or req["file_size"])
    tmp = tempfile.mkdtemp(prefix="worker-", dir=req.get("tmp"))
    why = _as_keeper_user(tmp)
    root = os.geteuid() == 0
    cgroup = _make_cgroup(processes) if root and not why else None
    abi = landlock_abi()
    user, why = (None, why) if why else _worker_user(root, cgroup is not None, abi > 0)
    namespaced, netns = _enter_namespaces(user)
    ipc = _unshare(_CLONE_NEWIPC)                     # System V shared memory and POSIX queues of its own
    mounted, shm = _private_mounts(tmp, size, user)
    if not namespaced:
        prctl(_PR_SET_CHILD_SUBREAPER, 1)
    work = os.path.join(tmp, "tmp")                   # the worker's TMPDIR
    os.mkdir(work, 0o700)
    if user:
        for path in (tmp, work):
            os.chown(path, *user)
    tcp = not netns and abi >= TCP_SINCE             # the network's fallback: Landlock's TCP rules
    capped = _cap_processes(processes, root, cgroup is not None, user, namespaced and not root)
    got = {"landlock_abi": abi, "network": "netns" if netns else "landlock-tcp" if tcp else "none",
           "pid_namespace": namespaced,
           "shm": "private" if shm and ipc else "denied" if abi and ipc else "shared",
           "tmp": "tmpfs" if mounted else "watched", "proc": "shared", "processes": capped,
           "max_processes": 0 if capped == "none" else processes}
    ruleset, why = (-1, why) if why else _ruleset(req, tmp, abi, tcp, "/dev/shm" if shm else None)
    pid = 0
    if not why:
        pid, got["proc"], why = _fork_worker(req, fd_in, fd_out, ruleset, work, namespaced and mounted, user)
    _report(fd_out, 0 if why else pid, got, why)
    os.close(fd_in)
    os.close(fd_out)
    if pid:
        _wait(pid, None if mounted else tmp, size)
    if not namespaced:
        _kill_orphans()
    if mounted:
        with contextlib.suppress(OSError, AttributeError):
            libc().umount2(tmp.encode(), _MNT_DETACH)
    shutil.rmtree(tmp, ignore_errors=True)
    if cgroup:
        _leave_cgroup(cgroup)
    os._exit(0)


def _fork_worker(req: dict, fd_in: int, fd_out: int, ruleset: int, tmp: str, own_proc: bool,
                 user: tuple[int, int] | None) -> tuple[int, str, str]:
    """Fork the worker, which mounts its /proc (`own_proc`: it has a PID and a mount namespace of its own),
    takes `user`'s uid, enforces its ruleset and says so before any learner code runs: its pid, its /proc
    (PROC), and why it does not run ("" when it does; it has then exited)."""
    told_r, told_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(told_r)
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)    # this keeper gone: so is the worker (and its namespace)
        if not own_proc:
            with contextlib.suppress(OSError):
                os.setpgid(0, 0)
        proc = _mount_proc(ruleset) if own_proc else "shared"
        _drop_bounding_set()
        failed = (_become(user) if user else "") or _drop_capabilities() or _enforce(ruleset)
        os.write(told_w, (failed or f"ok {proc}").encode()[:_HEAD.size])
        if failed:
            os._exit(71)
        os.close(told_w)
        _run_worker(req, fd_in, fd_out, tmp)         # writes nothing before the grader's first frame
    os.close(told_w)
    if ruleset >= 0:
        os.close(ruleset)
    told = os.read(told_r, _HEAD.size).decode(errors="replace")
    os.close(told_r)
    if told.startswith("ok ") and told[3:] in PROC:
        return pid, told[3:], ""
    return pid, "shared", told or "the worker stopped before its sandbox was in place"


def _wait(pid: int, watched: str | None, cap: int) -> None:
    """Wait for the worker. `watched`: a temporary folder that is no file system of its own; the worker is
    killed (with its process group) once the folder holds more than `cap` bytes."""
    if watched is None:
        os.waitpid(pid, 0)
        return
    while os.waitpid(pid, os.WNOHANG)[0] == 0:
        if _usage(watched, cap) > cap:
            for kill in (os.kill, os.killpg):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _usage(folder: str, cap: int) -> int:
    """The bytes the files under `folder` take (a page for each entry too), counted until past `cap`."""
    total, todo = 0, [folder]
    while todo and total <= cap:
        with contextlib.suppress(OSError), os.scandir(todo.pop()) as entries:
            for e in entries:
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    total += 4096 + st.st_blocks * 512
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
    return total


def _report(fd: int, pid: int, got: dict, why: str) -> None:
    """The keeper's header to the grader (_HEAD); `why`'s first line, cut to its field on a character's boundary."""
    reason = why.splitlines()[0].encode()[:200].decode(errors="ignore").encode() if why else b""
    head = _HEAD.pack(pid, int(got["pid_namespace"]), got["landlock_abi"], NETWORK.index(got["network"]),
                      SHM.index(got["shm"]), TMP.index(got["tmp"]), PROC.index(got["proc"]),
                      PROCESSES.index(got["processes"]), got["max_processes"], reason)
    with contextlib.suppress(OSError):               # the grader is gone
        os.write(fd, head)


def _kill_orphans() -> None:
    """Kill the orphans that were handed to this keeper, a subreaper, until none is left."""
    for _ in range(1000):
        kids = _children(os.getpid())
        if not kids:
            break
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        time.sleep(0.01)


# what a worker's IPython shell imports as it starts and shows a cell's error: imported once here, not in each
# worker (where an unprivileged worker uid may not even read Python's library)
_SHELL = ("bdb", "sqlite3", "IPython.core.application", "IPython.core.completer", "IPython.core.completerlib",
          "IPython.core.crashhandler", "IPython.core.logger", "IPython.core.magics", "IPython.core.oinspect",
          "IPython.utils.generics", "IPython.utils.wildcard", "asttokens", "executing", "pure_eval", "stack_data",
          "pygments.console", "pygments.filters", "pygments.formatters", "pygments.formatters.html",
          "pygments.formatters.terminal256", "pygments.lexers", "pygments.lexers.python", "pygments.styles")


def _preload(modules: list[str]) -> None:
    """What every worker needs, imported once. The course's exercises only: the warm process holds no teacher's
    code (a teacher's exercise lives in the grader's process alone)."""
    import importlib
    import matplotlib
    matplotlib.use("Agg")
    from ..core import load_exercises
    load_exercises()
    for name in ["torch", "numpy", "matplotlib.pyplot", "tformer", "tformer.grading.classroom.worker",
                 "IPython.core.interactiveshell", *_SHELL, *modules]:
        with contextlib.suppress(Exception):          # an optional extra not installed: the notebook will say so
            importlib.import_module(name)


def main(argv: list[str]) -> int:
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)        # the grader gone: so is this process
    sock = socket.socket(fileno=int(argv[0]))
    first = json.loads(sock.recv(1 << 16) or b"{}")
    _preload(first.get("preload", []))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)     # keepers are reaped by the kernel
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 2)
        except OSError:
            return 0
        if not msg:
            return 0
        req = json.loads(msg)
        _remove_cgroups(f"tformer-grade-{os.getpid()}-", 1)   # those of keepers gone
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                _keeper(req, *fds)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
