"""benchmarks/capstone_peak.py: one row per capstone's step with its FLOPs and fraction of the matmul peak
(--tiny, in seconds), and the FLOPs of the MoE experts' grouped matmul, which FlopCounterMode does not know."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("capstone_peak", ROOT / "benchmarks" / "capstone_peak.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["capstone_peak"] = mod                  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("capstone_peak", None)


def test_tiny_run_prints_and_writes_a_row_per_capstone(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        bench.main(["--tiny", "--threads", "1", "--steps", "1", "--warmup", "0", "--json", "peak.json"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    d = json.loads((tmp_path / "peak.json").read_text())
    rows = {r["row"]: r for r in d["rows"]}
    for name in bench.CAPSTONES:                        # translate, vit, clip, moe, grpo
        assert any(r == name or r.startswith(name + "-") for r in rows), (name, list(rows))
    assert {"moe-dense", "moe-moe", "grpo-rollout", "grpo-update", "grpo-iter"} <= rows.keys()
    for r in rows.values():
        assert r["row"] in out
        assert r["gflop_step"] > 0 and r["tok_s"] > 0 and r["step_ms"] > 0
        assert 0 < r["frac_peak"] == pytest.approx(r["gflop_s"] / r["peak_gflop_s"])
        assert r["dtype"] in ("float32", "bfloat16", "float16")
    assert d["peak"]["float32"] >= d["probe_before"]["float32"] and d["load_average_at_start"] is not None
    # equal active parameters: the MoE's experts (torch._grouped_mm on a CPU) count about the dense FFN's FLOPs
    assert rows["moe-moe"]["gflop_step"] >= 0.9 * rows["moe-dense"]["gflop_step"]


def test_grouped_mm_flops_are_the_sum_of_the_groups_products(bench):
    from torch.utils.flop_counter import FlopCounterMode
    if not hasattr(torch.ops.aten, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    e, k, n = 3, 8, 4                                            # strides of 16 bytes, as the kernel needs
    offs = torch.tensor([4, 10, 16], dtype=torch.int32)          # groups of 4, 6 and 6 rows
    a, b = torch.randn(16, k), torch.randn(e, k, n)
    try:
        with FlopCounterMode(display=False, custom_mapping=bench._custom_flops()) as fc:
            torch._grouped_mm(a, b, offs=offs)                   # (16, k) x (e, k, n) -> (16, n)
            torch._grouped_mm(a.t(), torch.randn(16, n), offs=offs)   # the weight gradient: (e, k, n)
    except RuntimeError as err:                                  # a build without the CPU kernel
        pytest.skip(f"_grouped_mm does not run here: {err}")
    assert fc.get_total_flops() == 2 * 16 * k * n + 2 * 16 * k * n
