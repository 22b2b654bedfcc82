"""What guards a learner's function while a check runs it: the references it is compared with raise when
called, by any name, and a time limit stops it, whatever it catches.

    forbid(pairs)          owner.attribute pairs replaced by a function that raises REFERENCE_CALLED (their
                           code objects swapped too, so aliases imported earlier raise; torch's built-ins by any
                           name through a TorchFunctionMode)
    time_limit(seconds)    SIGALRM that raises TimeLimit, again every 0.25 s if the first stop is swallowed
    dotted(pairs)          the pairs as dotted names ("tformer.attention.scaled_dot_product_attention"), which
                           is how the class grader sends them to a worker; resolve(names) turns them back into
                           pairs there (by import and getattr), skipping a name the worker cannot find
"""
from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

from torch.overrides import TorchFunctionMode

from .messages import N_, _


REFERENCE_CALLED = "tformer-grading: the reference was called"


class TimeLimit(BaseException):  # BaseException: a learner's `except Exception` cannot swallow it
    pass


def raise_reference_called(*args, **kwargs):
    # only builtins here: this code object is also swapped into functions living in other modules
    raise RuntimeError("tformer-grading: the reference was called")


class ForbidTorch(TorchFunctionMode):
    """Raises when a forbidden torch function is called by any name: an alias imported earlier
    (`from torch import softmax`), a `torch._C` path (`torch._C._nn.scaled_dot_product_attention`)."""

    def __init__(self, funcs: list):
        super().__init__()
        self.ids = {id(f) for f in funcs}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if id(func) in self.ids:
            raise RuntimeError(REFERENCE_CALLED)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def forbid(pairs: list[tuple[Any, str]]):
    """Replace each owner.attribute by a function that raises; for plain Python functions swap the code
    object too, so aliases imported earlier (`from tformer import f`) are caught as well; torch's own
    functions are caught by any name through a TorchFunctionMode."""
    saved, builtins = [], []
    # every original first, then the swaps: a lazily loaded name (tformer's __getattr__) read after its module's
    # function was swapped would be the raising stand-in, and "restored" as it
    originals = [(owner, attr, getattr(owner, attr, None)) for owner, attr in pairs]
    try:
        for owner, attr, original in originals:
            if original is None:                    # not in this torch version: nothing to forbid
                continue
            code = getattr(original, "__code__", None)
            swap = code is not None and not getattr(original, "__closure__", None)
            saved.append((owner, attr, original, code if swap else None))
            if code is None:
                builtins.append(original)
            setattr(owner, attr, raise_reference_called)
            if swap:
                original.__code__ = raise_reference_called.__code__
        with ForbidTorch(builtins) if builtins else contextlib.nullcontext():
            yield
    finally:
        for owner, attr, original, code in reversed(saved):
            setattr(owner, attr, original)
            if code is not None:
                original.__code__ = code


def dotted(pairs: list[tuple[Any, str]]) -> list[str]:
    """(owner, attribute) pairs as dotted names: a module's `__name__`, a class's `__module__.__qualname__`,
    then the attribute. A pair whose owner is neither is left out (no worker could find it by name)."""
    names = []
    for owner, attr in pairs:
        if isinstance(owner, type(sys)):
            base = owner.__name__
        elif isinstance(owner, type):
            base = f"{owner.__module__}.{owner.__qualname__}"
        else:
            continue
        names.append(f"{base}.{attr}")
    return names


def resolve(names) -> list[tuple[Any, str]]:
    """Dotted names back into (owner, attribute) pairs: the longest importable module prefix, then getattr for
    the rest of the owner's path. A name that is not a string or cannot be found is skipped (nothing to forbid)."""
    pairs = []
    for name in names if isinstance(names, (list, tuple)) else []:
        if not isinstance(name, str) or name.count(".") < 1:
            continue
        *path, attr = name.split(".")
        for k in range(len(path), 0, -1):
            try:
                owner = importlib.import_module(".".join(path[:k]))
                for part in path[k:]:
                    owner = getattr(owner, part)
            except Exception:
                continue
            pairs.append((owner, attr))
            break
    return pairs


IGNORED_LIMIT = N_("tformer-grading: your function keeps running after the time limit (a bare `except:` or "
                 "`except BaseException` swallows the stop); the checker keeps trying. If it does not stop, "
                 "interrupt the kernel (the stop button, or Kernel > Interrupt; Kernel > Restart if that is "
                 "swallowed too), then catch only the exceptions you expect.")


@dataclass
class Clock:
    armed: bool = False          # the learner's code is running: the alarm may raise
    fired: int = 0               # alarms so far (the limit has passed once there is one)
    stops: int = 0               # alarms raised inside the learner's code (more than 1: one was swallowed)


@contextlib.contextmanager
def time_limit(seconds: float):
    """SIGALRM-based limit (main thread on Unix, where Jupyter runs cells); elsewhere no limit. After the
    limit the alarm repeats every 0.25 s, so a function that swallows one stop meets the next; it raises
    only while `clock.armed` (the learner's code runs), never inside the grader's own clean-up."""
    clock = Clock()
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield clock
        return

    def on_alarm(signum, frame):
        clock.fired += 1
        if clock.armed:
            clock.stops += 1
            if clock.stops == 2:                    # the first stop was swallowed: tell the learner what to do
                print(_(IGNORED_LIMIT), file=sys.stderr, flush=True)
            raise TimeLimit()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.25)
    try:
        yield clock
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
