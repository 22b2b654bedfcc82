"""Landlock (Linux 5.13+, no root needed), through ctypes: what a grading worker may read and write.

    landlock_abi()                 the kernel's Landlock ABI version (0: none)
    worker_paths(own, tmp, closed, shm)
                                   what a worker may read (Python, the package, the course's data, the system's
                                   folders, its own student's folder or files) and write (its temporary folder,
                                   and its private /dev/shm where it has one)
    landlock_ruleset(read, write, tcp)
                                   a ruleset's fd for those paths, handling only the rights the ABI knows;
                                   with `tcp`, every TCP bind and connect refused too (ABI 4+); from ABI 6 the
                                   worker is also scoped: no abstract Unix socket or signal outside its own domain
    landlock_allow(fd, read, write)
                                   more paths for a ruleset not yet enforced (the worker's private /proc, mounted
                                   after the keeper built the ruleset)
    landlock_enforce(fd)           restrict the calling thread, and all it starts, for good

The keeper (sandbox.py) builds the ruleset; the worker enforces it on itself before any learner code runs.
Another student's folder, a sibling of the worker's own, is neither readable nor writable. A rule holds the
folder it was opened on: a file system mounted over a path after its rule was added is outside the rule, so
the keeper mounts the worker's temporary folder and /dev/shm before it builds the ruleset.

A worker with a private /dev/shm (a file system of its own, sandbox.py) reads /dev and writes its /dev/shm. One
without reads /dev entry by entry, except /dev/shm and /dev/mqueue: it neither reads nor writes the machine's
shared memory (where another worker, or the teacher, could have left a file).

The TCP rules are the network's fallback, for a worker that got no network namespace of its own: they handle
TCP bind and connect and allow no port, so both fail with PermissionError (EACCES). They cover TCP only: UDP
(a DNS query, a datagram to any host) and path-named Unix sockets stay open under this fallback; abstract Unix
sockets are closed from ABI 6 (scoped to the worker's domain).
"""
from __future__ import annotations

import ctypes
import errno
import os
import sys
from pathlib import Path

_PR_SET_NO_NEW_PRIVS = 38
_SYS_LANDLOCK = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
# LANDLOCK_ACCESS_FS_*: ABI 1 knows the first 13 bits (EXECUTE .. MAKE_SYM)
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
_FS_FILE_ONLY = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
# LANDLOCK_ACCESS_NET_*: ABI 4 adds TCP bind and connect (a rule per allowed port; none is ever added here)
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
TCP_SINCE = 4
# LANDLOCK_SCOPE_*: ABI 6 scopes abstract Unix sockets and signals to the domain (and the domains it nests)
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
SCOPE_SINCE = 6

def libc():
    return ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> bool:
    try:
        return libc().prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, an old kernel, Landlock disabled)."""
    nrs = _SYS_LANDLOCK.get(os.uname().machine) if sys.platform.startswith("linux") else None
    if nrs is None:
        return 0
    try:
        lc = libc()
        lc.syscall.restype = ctypes.c_long
        abi = lc.syscall(ctypes.c_long(nrs[0]), None, ctypes.c_size_t(0),
                           ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(abi))                           # -1: ENOSYS, EOPNOTSUPP


def _fs_rights(abi: int) -> int:
    """Every filesystem access right the ABI knows (ABI 2 adds REFER, 3 TRUNCATE, 5 IOCTL_DEV)."""
    rights = (1 << 13) - 1
    for since, bit in ((2, _FS_REFER), (3, _FS_TRUNCATE), (5, _FS_IOCTL_DEV)):
        if abi >= since:
            rights |= bit
    return rights


class _RulesetAttr(ctypes.Structure):
    """struct landlock_ruleset_attr: handled_access_fs, handled_access_net (ABI 4), scoped (ABI 6). The kernel
    is told the size of the fields filled: 8 bytes with file rights only, 16 with network rights, 24 scoped."""
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1                                        # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_ruleset(read: list, write: list, abi: int | None = None, tcp: bool = False) -> int:
    """A Landlock ruleset's fd: `read` folders (or files) readable and executable, `write` ones fully usable,
    nothing else; with `tcp` (ABI 4+), no TCP bind or connect to any port (UDP stays open); from ABI 6, no
    abstract Unix socket or signal reaches outside the domain. Raises OSError where the kernel refuses. Paths
    that do not exist are left out."""
    abi = landlock_abi() if abi is None else abi
    if abi <= 0:
        raise OSError(errno.ENOSYS, "Landlock is not available")
    if tcp and abi < TCP_SINCE:
        raise OSError(errno.EINVAL, f"Landlock ABI {abi} has no TCP rules (ABI {TCP_SINCE}+)")
    create = _SYS_LANDLOCK[os.uname().machine][0]
    lc = libc()
    lc.syscall.restype = ctypes.c_long
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= SCOPE_SINCE else 0
    attr = _RulesetAttr(_fs_rights(abi), _NET_BIND_TCP | _NET_CONNECT_TCP if tcp else 0, scoped)
    size = (ctypes.sizeof(attr) if scoped else _RulesetAttr.scoped.offset if tcp
            else _RulesetAttr.handled_access_net.offset)
    fd = lc.syscall(ctypes.c_long(create), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock_create_ruleset: {os.strerror(e)}")
    try:
        landlock_allow(fd, read, write, abi)
    except BaseException:
        os.close(fd)
        raise
    return fd


def landlock_allow(fd: int, read: list, write: list = (), abi: int | None = None) -> None:
    """Add rules to the ruleset `fd` (not yet enforced): `read` readable and executable, `write` fully usable.
    Paths that do not exist are left out; raises OSError where the kernel refuses a rule."""
    abi = landlock_abi() if abi is None else abi
    add = _SYS_LANDLOCK[os.uname().machine][1]
    lc = libc()
    lc.syscall.restype = ctypes.c_long
    handled = _fs_rights(abi)
    for paths, rights in ((read, _FS_READ), (write, handled)):
        for path in paths:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                allowed = rights & handled
                if not os.path.isdir(path):
                    allowed &= _FS_FILE_ONLY
                rule = _PathBeneath(allowed, pfd)
                if lc.syscall(ctypes.c_long(add), ctypes.c_int(fd), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"landlock_add_rule {path}: {os.strerror(e)}")
            finally:
                os.close(pfd)


def landlock_enforce(ruleset_fd: int) -> None:
    """Restrict the calling thread (and all it starts) to the ruleset, for good; raises OSError on failure."""
    if not prctl(_PR_SET_NO_NEW_PRIVS, 1):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    lc = libc()
    lc.syscall.restype = ctypes.c_long
    if lc.syscall(ctypes.c_long(_SYS_LANDLOCK[os.uname().machine][2]), ctypes.c_int(ruleset_fd),
                    ctypes.c_uint32(0)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock_restrict_self: {os.strerror(e)}")


def worker_paths(own: list, tmp: Path, closed: Path | None = None,
                 shm: str | None = None) -> tuple[list[str], list[str]]:
    """What a worker may read (and execute) and what it may write: see the module's docstring. `own` is the
    student's folder (or files), `closed` the class folder (default: the parent of the first of `own`): a
    folder of Python's search path that holds the class (the grader started from it, say) is left out. `shm`:
    the worker's private /dev/shm (a file system of its own, mounted before this is called), writable; None:
    /dev/shm and /dev/mqueue are neither readable nor writable."""
    import site
    import tformer
    from tformer.data import sources
    own = [str(Path(p).resolve()) for p in own]
    cls = Path(closed).resolve() if closed else Path(own[0]).parent
    read = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
            site.getusersitepackages(), str(Path(tformer.__file__).resolve().parent), str(sources._CHECKOUT_DATA),
            str(sources.cache_dir()), "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/opt", "/proc",
            "/sys", "/run", str(Path(sys.executable).resolve().parent)}
    read |= {p for p in sys.path if p and os.path.isdir(p)}
    read = sorted(p for p in {str(Path(p).resolve()) for p in read if p}
                  if os.path.exists(p) and not cls.is_relative_to(p) and not Path(p).is_relative_to("/dev"))
    # with a /dev/shm of its own, /dev whole (its /dev/mqueue shows no queue's messages, and the worker's queues
    # are in an IPC namespace of its own); else entry by entry, without the machine's shared memory
    return read + (["/dev"] if shm else _dev()) + own, [str(tmp), "/dev/null", *([shm] if shm else [])]


def _dev() -> list[str]:
    """/dev's entries but its shared memory (shm, mqueue) and its links (a link is followed to a path of its own)."""
    try:
        names = sorted(os.listdir("/dev"))
    except OSError:
        return []
    return [f"/dev/{n}" for n in names if n not in ("shm", "mqueue") and not os.path.islink(f"/dev/{n}")]
