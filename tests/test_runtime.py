"""tformer.utils.runtime: the one thread switch of small mode."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _threads(**env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("TFORMER_SMALL", "TFORMER_THREADS")}
    e.update(env, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", "import torch, tformer; print(torch.get_num_threads(), "
                        "tformer.utils.runtime.ALL_THREADS)"], env=e, capture_output=True, text=True)
    return r


def test_small_mode_uses_one_thread_and_an_override():
    n, all_ = map(int, _threads(TFORMER_SMALL="1").stdout.split())
    assert n == 1
    n2, _ = map(int, _threads(TFORMER_SMALL="1", TFORMER_THREADS="2").stdout.split())
    assert n2 == 2
    n0, all0 = map(int, _threads(TFORMER_SMALL="0").stdout.split())
    assert n0 == all0                                  # full mode leaves torch's default alone
    bad = _threads(TFORMER_SMALL="1", TFORMER_THREADS="many")
    assert bad.returncode == 0 and bad.stdout.split()[0] == "1"
    assert "TFORMER_THREADS must be a positive integer" in bad.stderr


def test_threads_context_restores():
    import torch
    from tformer.utils.runtime import set_threads, threads
    before = torch.get_num_threads()
    with threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match=">= 1"):
        set_threads(0)


def test_notebooks_do_not_set_threads_themselves():
    """Small mode's thread count is chosen in one place (tformer.utils.runtime); chapters that time parallel
    code ask for theirs explicitly with tformer.utils.runtime.threads(...)."""
    offenders = [p.name for p in sorted((ROOT / "notebooks" / "src").glob("*.py"))
                 if re.search(r"torch\.set_num_threads\(", p.read_text(encoding="utf-8"))]
    assert offenders == []
    for ch in ("07_", "15_"):
        src = next((ROOT / "notebooks" / "src").glob(f"{ch}*.py")).read_text(encoding="utf-8")
        assert "tformer.utils.runtime.threads(" in src, ch
