"""benchmarks/full_mode_t4.py: every chapter has a row; an estimate comes out positive, and says it is one.

One small chapter is traced (the script's own run of all of them takes ~20-40 s on a 2-core machine); every
chapter's coverage is checked without tracing.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACED = ("03_multi_head_attention",)


@pytest.mark.slow                  # a fresh interpreter imports torch: ~5 s of CPU
def test_every_chapter_has_a_row_and_the_estimate_is_positive(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "full_mode_t4.py"), "--json",
                          "--chapters", ",".join(TRACED)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert res["estimate"] is True and res["measured"] is False
    chapters = sorted(p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
    assert sorted(res["coverage"]) == chapters
    assert all(n >= 1 for n in res["coverage"].values()), res["coverage"]
    assert sorted(res["chapters"]) == list(TRACED)
    for ch, s in res["chapters"].items():
        lo, hi = s["minutes"]
        assert 0 < lo <= hi and s["gflop"] > 0 and s["fits"] in ("yes", "borderline", "no"), (ch, s)
        for row in s["rows"]:
            assert row["flops_step"] > 0 and row["kernels_step"] > 0 and row["minutes"][0] > 0, row
            assert ".py:" in row["src"], row                    # each row names the lines it was read from
