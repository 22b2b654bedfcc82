"""Run folders: atomic checkpoints, a run lock, RNG state, checkpoint averaging.

A checkpoint is written to a temporary file then `os.replace`d, so a crash never leaves a torn file; the
previous full checkpoint stays beside the newest as last.prev.pt. `RunLock` keeps a second job out of a
run folder. One mechanism for every long job (the Trainer, `tformer translate`, the capstones).
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist


from .distributed import is_distributed


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read: truncated (a crash or a full disk while copying it),
    corrupt, or not a checkpoint of this model. The message names the file."""


class CheckpointWriteError(RuntimeError):
    """Saving a checkpoint failed (disk full, no permission); the message says whether the previous one survived."""


class RunInUseError(RuntimeError):
    """Another job holds the run folder's lock."""


# The function that writes a checkpoint's bytes to an open file: torch.save. A seam for fault injection:
# tests replace it with a writer that stops part-way (an interrupted save) or raises OSError(ENOSPC).
checkpoint_writer: Callable[[Any, Any], None] = torch.save


def previous_path(path: str | os.PathLike) -> Path:
    """Where `atomic_save(..., keep_previous=True)` keeps the checkpoint it replaces: last.pt -> last.prev.pt."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def atomic_save(obj: Any, path: str | os.PathLike, keep_previous: bool = False) -> None:
    """Write `obj` to a temporary file in the same folder, fsync it, then `os.replace` it onto `path`.

    Readers never see half a file: a crash, an interrupt or a full disk before the rename leaves the old
    `path` untouched (the temporary file is removed when Python still runs). keep_previous=True first
    moves the old file to `previous_path(path)`, so two complete checkpoints exist after a save.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            checkpoint_writer(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            kept = (f"the previous {path.name} in {path.parent} is intact" if path.exists()
                    else f"nothing was replaced: the checkpoints already in {path.parent} are intact")
            raise CheckpointWriteError(f"could not save {path}: {e.strerror or e}; {kept}. Free some space "
                                       f"(or fix the folder) and run the same command again to resume") from e
        raise
    if keep_previous and path.exists():
        os.replace(path, previous_path(path))
    os.replace(tmp, path)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Text (config.json, choice.json) written like `atomic_save`: whole or not at all."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | os.PathLike, weights_only: bool = False) -> Any:
    """`torch.load` on the CPU; a file that cannot be read raises `CheckpointError` naming it."""
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except FileNotFoundError:
        raise
    except Exception as e:                             # truncated zip, garbage, wrong pickle, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is unreadable (truncated or corrupt: {first[:120]})") from e


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files (`.NAME.tmpPID`) that a save killed outright (SIGKILL, power loss) left in
    `folder`, when process PID no longer runs; returns what it removed. `atomic_save` cleans up after itself
    whenever Python still runs; the run lock calls this once it holds the folder."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp*"):
        pid = tmp.name.rpartition(".tmp")[2]
        if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)                                 # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:                             # it exists, and belongs to another user
        pass
    return True


class RunLock:
    """An exclusive lock on a run folder (`fcntl.flock` on RUN/.lock), so that two jobs never train into
    the same folder at once. The kernel releases it when the process dies, however it dies. Under
    torchrun, rank 0 takes it for the whole job (see `acquire_run_lock`).

        lock = RunLock("runs/x"); lock.acquire()    # RunInUseError if another job holds it
        ...; lock.release()
    """

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / ".lock"
        self._f = None

    def acquire(self) -> "RunLock":
        import fcntl
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise RunInUseError(f"{self.path.parent} is in use by another training job ({holder}); wait for it "
                                f"to finish, or train into another --out folder") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        f.flush()
        self._f = f
        remove_stale_temporaries(self.path.parent)
        return self

    def release(self) -> None:
        if self._f is not None:
            self._f.close()                             # closing the file releases the flock
            self._f = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def acquire_run_lock(folder: str | os.PathLike) -> RunLock | None:
    """Rank 0 locks `folder` for the whole (torchrun) job; every rank raises RunInUseError if it is taken."""
    lock, msg = None, None
    rank = dist.get_rank() if is_distributed() else 0
    if rank == 0:
        try:
            lock = RunLock(folder).acquire()
        except RunInUseError as e:
            msg = str(e)
    if is_distributed():
        box = [msg]
        dist.broadcast_object_list(box, src=0)
        msg = box[0]
    if msg is not None:
        raise RunInUseError(msg)
    return lock


def average_checkpoints(paths: Iterable[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """Average the model weights of several checkpoints (the paper averages the last 5 or 20).

    Each file holds a model `state_dict`, or a dict with a "model" entry. Floating tensors are averaged
    (in float64, cast back); integer tensors (step counters, ...) are taken from the last file.
    """
    paths = list(paths)
    if not paths:
        raise ValueError("average_checkpoints: no checkpoint paths given")
    total: dict[str, torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}
    for p in paths:
        sd = load_checkpoint(p, weights_only=True)
        sd = sd.get("model", sd)
        if total and set(sd) != set(total):
            raise ValueError(f"average_checkpoints: {p} has different parameter names from {paths[0]}")
        for k, v in sd.items():
            if v.is_floating_point():
                total[k] = total[k] + v.double() if k in total else v.double()
            else:
                total.setdefault(k, v)
            last[k] = v
    return {k: (total[k] / len(paths)).to(last[k].dtype) if last[k].is_floating_point() else last[k] for k in total}


def rng_state() -> dict:
    """Every random generator's state (torch, Python, CUDA when present, NumPy when installed): what a
    checkpoint saves so that a resumed run draws the same numbers."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover
        pass
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])
