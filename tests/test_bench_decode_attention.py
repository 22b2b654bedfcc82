"""benchmarks/bench_decode_attention.py: it refuses to time a kernel that disagrees with float64 math, and the
kernel's wrapper hands it the block tables and lengths the step's index was built from (no compiler needed)."""
import importlib.util
from pathlib import Path

import pytest
import torch

from tformer.inference.paged_cache import DecodeIndex, paged_decode_attention

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_decode_attention",
                                                  ROOT / "benchmarks" / "bench_decode_attention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_package_attention_passes_the_agreement_check(bench, dtype):
    assert bench.check(paged_decode_attention, dtype) < (1e-5 if dtype == torch.float32 else 2e-2)


def test_a_kernel_off_by_one_percent_is_refused(bench):
    def wrong(q, k, v, idx):
        return paged_decode_attention(q * 1.01, k, v, idx)          # a softmax temperature slightly off
    with pytest.raises(SystemExit, match="differs from float64 math"):
        bench.check(wrong, torch.float32)


def test_fused_wrapper_passes_the_index_tables_and_keeps_shapes(bench):
    class Ext:                                          # a stand-in with the kernel's signature, in eager PyTorch
        @staticmethod
        def paged_decode(q3, k, v, table, lengths):
            idx = DecodeIndex.build(table, lengths, q3.shape[1], k.shape[1], k.shape[2], k.shape[3])
            return paged_decode_attention(q3[:, :, None], k, v, idx)[:, :, 0]
    gen = torch.Generator().manual_seed(0)
    k, v = bench.random_pool(32, 2, 16, 8, torch.float64, gen)
    idx = bench.random_index(3, 4, 2, 16, 8, 32, 100, gen)
    q = torch.randn(3, 4, 1, 16, generator=gen, dtype=torch.float64)
    out = bench.fused(Ext)(q, k, v, idx)
    assert out.shape == q.shape
    torch.testing.assert_close(out, paged_decode_attention(q, k, v, idx), rtol=0, atol=0)
