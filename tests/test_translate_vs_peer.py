"""benchmarks/translate_vs_peer.py: the capstone and its nn.Transformer peer follow one machine class's recipe
(the peer trains that class's preset), run side by side and land in one table; `--smoke` at the tiny size
(the `multi30k` folder: tests/conftest.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "translate_vs_peer.py"


def _script():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import translate_vs_peer
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return translate_vs_peer


@pytest.mark.parametrize("name, preset, alpha", [("cpu-avx2", "small-avx2", 1.0), ("cpu-bf16", "small", 0.6)])
def test_the_peer_trains_the_preset_of_the_capstones_recipe(name, preset, alpha, tmp_path):
    machine_class, config = _script().recipe(tmp_path / "tformer", 1, name)
    assert (machine_class, config["preset"], config["alpha"]) == (name, preset, alpha)


def test_a_resumed_run_keeps_the_class_it_recorded(tmp_path):
    """As the capstone does: without --recipe, the class an earlier session wrote in config.json, not the probe's."""
    out = tmp_path / "tformer"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"machine_class": "cpu-bf16"}))
    machine_class, config = _script().recipe(out, 1, None)
    assert (machine_class, config["preset"]) == ("cpu-bf16", "small")


def test_smoke_runs_both_and_prints_one_table(multi30k, tmp_path):
    out = tmp_path / "vs"
    r = subprocess.run([sys.executable, str(SCRIPT), "--data", str(multi30k), "--out", str(out), "--smoke",
                        "--recipe", "cpu-avx2", "--minutes", "1"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert "recipe cpu-avx2: preset tiny for both, length penalty 1" in r.stdout
    rows = json.loads((out / "result.json").read_text())
    assert set(rows) == {"tformer", "nn.Transformer"}
    for row in rows.values():
        assert row["steps"] == 4 and 0 <= row["test_2016_flickr beam4"] <= 100
    assert "tformer - nn.Transformer, beam 4, test_2016_flickr:" in r.stdout
    assert json.loads((out / "tformer" / "result.json").read_text())["machine_class"] == "cpu-avx2"
