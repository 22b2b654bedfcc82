"""Run-time switches shared by notebooks and scripts.

TFORMER_SMALL=1 makes every notebook run small and fast on a CPU (CI uses it); unset or 0, notebooks
use a GPU when present and the full-size data and models.

Threads. In small mode the models are tiny, and two torch threads on two busy cores are many times
slower than one (every matrix product waits for the slower thread); so importing tformer in small
mode sets torch to SMALL_THREADS threads (1; TFORMER_THREADS=N overrides it). This is the one place
that chooses it: notebooks do not call `torch.set_num_threads` themselves. Code that measures
parallel speed-ups (chapters 7 and 15, benchmarks/) asks for its thread count explicitly:

    with tformer.utils.runtime.threads(ALL_THREADS):      # every core torch would use by default
        ... time it ...
"""
from __future__ import annotations

import os
import random
from contextlib import contextmanager

import torch

SMALL: bool = os.environ.get("TFORMER_SMALL", "0").lower() not in ("0", "", "false", "no")

ALL_THREADS: int = torch.get_num_threads()      # torch's default (one per physical core), before any change


def _threads_from_env() -> int:
    raw = os.environ.get("TFORMER_THREADS", "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:                                   # a warning, not an error: every import of tformer reads it
        import sys
        print(f"warning: TFORMER_THREADS must be a positive integer (CPU threads for torch), got {raw!r}; "
              f"using 1", file=sys.stderr)
        n = 1
    return n


SMALL_THREADS: int = _threads_from_env()        # torch threads in small mode


def set_threads(n: int | None = None) -> int:
    """Set torch's CPU thread count: n, or ALL_THREADS for None. Returns the previous count."""
    n = ALL_THREADS if n is None else int(n)
    if n < 1:
        raise ValueError(f"set_threads: expected a thread count >= 1, got {n}")
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    return old


@contextmanager
def threads(n: int | None = None):
    """`with threads(4): ...` runs the block with n torch threads (None = ALL_THREADS), then restores."""
    old = set_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(old)


if SMALL:
    set_threads(SMALL_THREADS)


def seed_everything(seed: int = 0) -> None:
    """Seed Python, and torch (CPU and CUDA)."""
    random.seed(seed)
    torch.manual_seed(seed)
