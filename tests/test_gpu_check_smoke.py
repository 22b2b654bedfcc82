"""benchmarks/gpu_check.py --smoke: the GPU check script runs every part end to end on tiny CPU sizes."""
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


def test_smoke_run_gives_rows_for_every_part(tmp_path, capsys):
    gpu_check = _load()
    out = tmp_path / "rows.json"
    assert gpu_check.main(["--smoke", "--json", str(out)]) == 0, capsys.readouterr().out[-3000:]
    rows = json.loads(out.read_text())
    assert all(set(r) == {"part", "what", "value", "unit", "extra"} for r in rows)
    parts = [r["part"] for r in rows]
    assert set(parts) == set(gpu_check.PARTS) and [p for p in gpu_check.PARTS if p in parts] == list(dict.fromkeys(parts))
    assert parts.count("attention") == 4                        # flash and math at two lengths
    assert parts.count("moe") == 3 and parts.count("rnn-vs-transformer") == 4
    for r in rows:
        if r["value"] is None:                                   # only what --smoke leaves out on purpose
            assert r["what"] == "tformer + torch.compile" and r["extra"].startswith("skipped"), r
        elif r["part"] not in ("tests", "translate"):              # 10 steps of translation may score 0 BLEU
            assert r["value"] > 0, r
    tests = {r["what"]: r for r in rows if r["part"] == "tests"}
    assert tests["distributed and device"]["value"] > 0                     # tests/test_gpu.py ran and passed
    assert all(r["extra"].startswith("failed 0, errors 0") for r in tests.values()), tests
    assert all("kernels ['" in r["extra"] for r in rows if r["part"] == "moe")   # SDPA ran (a kernel was seen)
    assert 0 <= next(r["value"] for r in rows if r["part"] == "translate") <= 100
    table = capsys.readouterr().out
    assert "images/s" in table and "target tokens/s" in table and "TFLOP/s" in table and "sacreBLEU" in table


def test_only_and_a_translate_part_without_data(tmp_path, capsys):
    gpu_check = _load()
    out = tmp_path / "rows.json"
    assert gpu_check.main(["--smoke", "--only", "vit", "--json", str(out)]) == 0
    assert [r["part"] for r in json.loads(out.read_text())] == ["vit"]
    _, plan = gpu_check.plan_for(smoke=False, data=None)      # the GPU plan: translate needs --data
    assert plan["translate"] is None and set(plan) == set(gpu_check.PARTS)
    with pytest.raises(SystemExit):
        gpu_check.main(["--smoke", "--only", "nonsense"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_without_a_gpu_it_says_to_use_smoke(capsys):
    assert _load().main([]) == 2
    assert "--smoke" in capsys.readouterr().out


def test_rows_are_written_after_every_part_so_a_run_cut_off_keeps_them(tmp_path, monkeypatch):
    gpu_check = _load()
    out = tmp_path / "rows.json"
    real = gpu_check.plan_for

    def cut_after_vit(smoke, data):
        dev, plan = real(smoke, data)
        plan["attention"] = lambda: (_ for _ in ()).throw(KeyboardInterrupt())   # the time limit strikes here
        return dev, plan
    monkeypatch.setattr(gpu_check, "plan_for", cut_after_vit)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--smoke", "--only", "vit", "attention", "--json", str(out)])
    assert [r["part"] for r in json.loads(out.read_text())] == ["vit"]
