"""benchmarks/bench_serve.py: a steady load keeps every client's request in the batch; the ceiling's sum."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tformer.models.gpt import GPT, GPTConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "benchmarks" / "bench_serve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=257, context_length=64, n_layers=2, n_heads=2, d_model=32)).eval()


def test_sustained_load_keeps_every_client_in_the_batch_and_drain_does_not(bench, model):
    work = bench.Workload(0, prompt=(4, 20), out=(2, 12))
    _, ttft, steady = bench.run_continuous(model, work, clients=3, rounds=4)
    assert steady["mean_running"] == 3, steady                     # a finished request is replaced at once
    assert len(ttft) >= 12                                         # at least clients x rounds requests began
    _, ttft, drained = bench.run_continuous(model, work, clients=3, rounds=4, sustained=False)
    assert len(ttft) == 12 and drained["mean_running"] < 3         # the end runs with fewer clients


def test_one_at_a_time_counts_the_keys_each_decoding_step_reads(bench, model):
    work = bench.Workload(1, prompt=(4, 20), out=(2, 12))
    _, _, one = bench.run_one(model, work, clients=2, rounds=1)
    reqs = [work.request(c, 0) for c in range(2)]
    assert one["tokens"] == sum(n for _, n in reqs)
    assert one["kv_tokens"] == sum(sum(len(p) + i for i in range(1, n)) for p, n in reqs)
    assert 0 < one["prefill_s"] < one["wall_s"]


def test_ceiling_adds_prefill_batched_weight_work_and_streamed_reads(bench):
    one = {"wall_s": 10.0, "prefill_s": 1.0, "tokens": 1000, "kv_tokens": 10**6}
    cap = bench.ceiling(one, step_s=0.016, clients=16, token_bytes=512, bandwidth=1e9)
    weights, kv = 1000 * 0.016 / 16, 10**6 * 512 / 1e9
    assert cap["weights_s"] == pytest.approx(weights) and cap["kv_s"] == pytest.approx(kv)
    assert cap["ratio"] == pytest.approx(10.0 / (1.0 + weights + kv))
    assert cap["overlap"] == pytest.approx(10.0 / (1.0 + max(weights, kv)))


def test_bf16_runs_one_at_a_time_in_float32_beside_it(bench, tmp_path):
    """In bf16 the baseline is also run in float32 (same weights), and the ratio to it is reported."""
    out = tmp_path / "serve.json"
    bench.main(["--quick", "--rounds", "1", "--clients", "2", "--one-cap", "1", "--dtype", "bfloat16",
                "--json", str(out)])
    d = json.loads(out.read_text())
    assert {r["scheme"] for r in d["throughput"]} == {"one", "one-fp32", "static", "continuous"}
    assert {s["vs"] for s in d["ratios"] if "vs" in s} == {"one", "one-fp32", "static"}
    (cap,) = [s for s in d["ratios"] if "ceiling" in s]                    # the bound against the faster baseline too
    tps = {r["scheme"]: r["tokens_per_s"] for r in d["throughput"]}
    assert cap["ceiling_vs_one_fp32"] == pytest.approx(cap["ceiling"][0] * tps["one"] / tps["one-fp32"])
