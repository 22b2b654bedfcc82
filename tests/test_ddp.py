"""DistributedDataParallel under torchrun: 2 CPU processes, gloo backend.

Ranks keep identical weights, and with dropout off one step on two ranks (each with its half of a
token batch) equals a single-process step on the whole batch.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

WORKER = textwrap.dedent("""
    import sys
    import torch
    torch.set_num_threads(1)
    from tformer.training import Trainer, TrainConfig, setup_distributed
    from tformer.data import TokenBatcher
    from tformer.models import Transformer, TransformerConfig
    from tformer.translate.pipeline import Seq2SeqLoss

    def data():
        g = torch.Generator().manual_seed(0)
        lens = torch.randint(2, 9, (40, 2), generator=g).tolist()
        src = [torch.randint(4, 50, (a,), generator=g).tolist() for a, _ in lens]
        tgt = [torch.randint(4, 50, (b,), generator=g).tolist() for _, b in lens]
        return src, tgt

    def run(out, rank, world):
        torch.manual_seed(0)
        cfg = TransformerConfig(src_vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
                                n_decoder_layers=2, dropout=0.0, context_length=32)
        model = Transformer(cfg)
        src, tgt = data()
        batches = TokenBatcher(src, tgt, max_tokens=200, shuffle=False, rank=rank, world=world)
        tc = TrainConfig(max_steps=2, lr=1e-3, warmup=1, grad_clip=1.0, progress=False)
        # plain SGD: Adam divides by sqrt(v), which blows float noise in zero-gradient entries (the key
        # bias gets no gradient: softmax ignores a constant added to every score) up to full-size steps
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        t = Trainer(model, Seq2SeqLoss(0.1, 0), batches, tc, optimizer=opt, device="cpu")
        assert t.world == world
        t.fit()
        torch.save(t.module.state_dict(), out)

    if __name__ == "__main__":
        if sys.argv[1] == "single":
            run(sys.argv[2], 0, 1)
        else:
            rank, world, _ = setup_distributed("cpu")      # gloo even on a machine with a GPU
            run(f"{sys.argv[2]}.rank{rank}", rank, world)
            torch.distributed.destroy_process_group()
""")


def test_two_gloo_ranks_equal_one_process(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    single = subprocess.run([sys.executable, str(script), "single", str(tmp_path / "single.pt")], env=env,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script), "ddp", str(tmp_path / "ddp")], env=env, capture_output=True, text=True,
                         timeout=300)
    if ddp.returncode != 0 and "gloo" in ddp.stderr.lower() and "not available" in ddp.stderr.lower():
        pytest.skip("this torch build has no gloo backend")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    ref = torch.load(tmp_path / "single.pt")
    r0, r1 = torch.load(tmp_path / "ddp.rank0"), torch.load(tmp_path / "ddp.rank1")
    for k in ref:
        assert torch.equal(r0[k], r1[k]), f"ranks differ in {k}"
        torch.testing.assert_close(r0[k], ref[k], atol=2e-6, rtol=1e-5, msg=f"DDP != single process in {k}")
    # and training moved the weights (the comparison is not between two untouched copies)
    torch.manual_seed(0)
    from tformer.models import Transformer, TransformerConfig
    init = Transformer(TransformerConfig(src_vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
                                         n_decoder_layers=2, dropout=0.0, context_length=32)).state_dict()
    assert not torch.equal(init["head.weight"], ref["head.weight"])
