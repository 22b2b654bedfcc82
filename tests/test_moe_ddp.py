"""The MoE language model trains under torchrun (DistributedDataParallel, 2 CPU processes, gloo) with the
shared Trainer, unchanged: no unused-parameter errors (the experts are stacked in one tensor, so every
expert weight gets a gradient even when a rank routes no token to it) and both ranks end identical."""
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
    from tformer.data.text import LMBatches
    from tformer.training.losses import lm_loss
    from tformer.models import GPT, GPTConfig
    from tformer.moe import MoEConfig
    from tformer.training import Trainer, TrainConfig, setup_distributed

    rank, world, _ = setup_distributed("cpu")          # gloo even on a machine with a GPU
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, context_length=16, n_layers=2, n_heads=2, d_model=16,
                          moe=MoEConfig(n_experts=8, top_k=1, layers=(1,))))
    ids = torch.randint(0, 64, (2000,), generator=torch.Generator().manual_seed(0))
    batches = LMBatches(ids, batch_size=4, context_length=16, batches_per_epoch=3, rank=rank, world=world)
    tc = TrainConfig(max_steps=3, lr=1e-2, schedule="constant", warmup=1, progress=False)
    t = Trainer(model, lm_loss, batches, tc, device="cpu")
    assert t.world == world == 2
    t.fit()
    torch.save(t.module.state_dict(), f"{sys.argv[1]}.rank{rank}")
    torch.distributed.destroy_process_group()
""")


def test_moe_gpt_trains_under_torchrun_with_two_ranks(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script), str(tmp_path / "ddp")], env=env, capture_output=True, text=True, timeout=300)
    if ddp.returncode != 0 and "gloo" in ddp.stderr.lower() and "not available" in ddp.stderr.lower():
        pytest.skip("this torch build has no gloo backend")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    r0, r1 = torch.load(tmp_path / "ddp.rank0"), torch.load(tmp_path / "ddp.rank1")
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"ranks differ in {k}"
    from tformer.models import GPT, GPTConfig
    from tformer.moe import MoEConfig
    torch.manual_seed(0)
    init = GPT(GPTConfig(vocab_size=64, context_length=16, n_layers=2, n_heads=2, d_model=16,
                          moe=MoEConfig(n_experts=8, top_k=1, layers=(1,)))).state_dict()
    assert not torch.equal(init["blocks.1.ffn.experts.fc1"], r0["blocks.1.ffn.experts.fc1"])   # trained
    assert not torch.equal(init["blocks.1.ffn.router.weight"], r0["blocks.1.ffn.router.weight"])
