"""benchmarks/gpu_check.py --smoke: the GPU check script runs end to end on tiny CPU sizes."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_run_prints_every_part(tmp_path, capsys):
    gpu_check = _load()
    out = tmp_path / "rows.json"
    assert gpu_check.main(["--smoke", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    parts = [r["part"] for r in rows]
    assert parts.count("attention") == 4                        # flash and math at two lengths
    assert {"transformer-base", "MoE LM", "ViT"} <= set(parts)
    for r in rows:
        assert r["value"] is not None and r["value"] > 0, r
    assert all("kernels ['" in r["extra"] for r in rows if r["part"] == "MoE LM")   # SDPA ran (a kernel was seen)
    table = capsys.readouterr().out
    assert "images/s" in table and "target tokens/s" in table and "TFLOP/s" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_without_a_gpu_it_says_to_use_smoke(capsys):
    assert _load().main([]) == 2
    assert "--smoke" in capsys.readouterr().out
