"""tformer.utils.gpu: precision, attention kernel and distributed backend chosen from the device, tested on the CPU
with the GPU's compute capability (or GPU count) injected. Tests marked `gpu` run only on a CUDA machine."""
import pytest
import torch
from torch.nn.attention import SDPBackend

from tformer.utils import gpu
from tformer.utils import device as policy
from tformer.training import TrainConfig, Trainer, setup_distributed

T4, V100, A100, H200 = (7, 5), (7, 0), (8, 0), (9, 0)


@pytest.mark.parametrize("cap,dtype,backend", [(T4, torch.float16, SDPBackend.EFFICIENT_ATTENTION),
                                               (V100, torch.float16, SDPBackend.EFFICIENT_ATTENTION),
                                               (A100, torch.bfloat16, SDPBackend.FLASH_ATTENTION),
                                               (H200, torch.bfloat16, SDPBackend.FLASH_ATTENTION)])
def test_precision_and_attention_kernel_follow_compute_capability(cap, dtype, backend):
    assert policy.amp_dtype("cuda", capability=cap) == dtype
    assert policy.attention_backend("cuda", capability=cap) == backend
    assert policy.flash_available("cuda", capability=cap) == (backend == SDPBackend.FLASH_ATTENTION)
    assert gpu.grad_scaler(dtype, "cpu").is_enabled() == (dtype == torch.float16)
    why = gpu.why_no_flash("cuda", capability=cap)
    if cap < (8, 0):
        assert f"sm{cap[0]}{cap[1]}" in why and "sm80" in why and "memory-efficient" in why
    else:
        assert why is None


def test_cpu_means_fp32_and_the_cpu_flash_kernel():
    assert policy.amp_dtype("cpu") is None and policy.capability("cpu") is None
    assert policy.attention_backend("cpu") == SDPBackend.FLASH_ATTENTION and gpu.why_no_flash("cpu") is None


@pytest.mark.parametrize("cap,fast", [(T4, False), (V100, False), (A100, False), ((8, 6), False), (H200, True),
                                      ((10, 0), True), ((12, 0), False)])
def test_grouped_matmul_counts_as_one_kernel_only_on_sm90_and_sm100(cap, fast):
    assert gpu.grouped_mm_fast("cuda", capability=cap) is fast
    assert gpu.grouped_mm_fast("cpu") is True


def test_moe_auto_dispatch_pads_where_grouped_matmul_would_loop_with_a_sync(monkeypatch):
    from tformer.moe import MoE, MoEConfig
    from tformer.moe.dispatch import grouped_mm_available
    m = MoE(16, MoEConfig(d_ff=32, n_experts=4, top_k=2))
    x = torch.randn(8, 16)
    if not grouped_mm_available(x, 16, 32):
        pytest.skip("no grouped_mm in this PyTorch")
    assert m.choose_dispatch(x) == "grouped"                                 # a CPU: grouped_mm_fast
    seen = []
    monkeypatch.setattr(gpu, "grouped_mm_fast", lambda device: seen.append(device) or False)   # as an A100
    assert m.choose_dispatch(x) == "padded" and seen == [x.device]


def test_peak_flops_table():
    assert gpu.peak_flops(name="NVIDIA H200", dtype=torch.bfloat16) == 989e12
    assert gpu.peak_flops(name="NVIDIA H100 80GB HBM3") == 989e12
    assert gpu.peak_flops(name="Tesla T4", dtype=torch.float16) == 65e12
    assert gpu.peak_flops(name="NVIDIA L40S") == 362e12 and gpu.peak_flops(name="NVIDIA L4") == 121e12
    assert gpu.peak_flops(name="NVIDIA H200", dtype=torch.float32) is None
    assert gpu.peak_flops(name="Some Unknown GPU") is None and gpu.peak_flops("cpu") is None


def test_distributed_backend_follows_the_runs_device_not_the_machine():
    # a CPU run on a machine with one GPU: gloo, CPU device (this used to pick NCCL and cuda:1 -> crash)
    plan = gpu.dist_plan("cpu", local_rank=1, local_world=2, n_gpus=1)
    assert plan.backend == "gloo" and plan.device.type == "cpu"
    plan = gpu.dist_plan("cuda", local_rank=1, local_world=2, n_gpus=2)
    assert plan.backend == "nccl" and plan.device == torch.device("cuda", 1)
    assert gpu.dist_plan(None, 0, 2, n_gpus=0).backend == "gloo"            # no GPU: CPU by default
    assert gpu.dist_plan(None, 0, 1, n_gpus=1).backend == "nccl"
    with pytest.raises(RuntimeError) as e:                                   # 2 ranks, 1 GPU: refused at start
        gpu.dist_plan("cuda", local_rank=0, local_world=2, n_gpus=1)
    msg = str(e.value)
    assert "2 ranks" in msg and "1 CUDA GPU" in msg and "\n" not in msg


def test_setup_distributed_refuses_more_ranks_than_gpus_before_joining(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(RuntimeError, match="2 ranks on this machine but 1 CUDA GPU"):
        setup_distributed("cuda")


def _fit(amp16: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    data = [(torch.randn(4, 8, generator=torch.Generator().manual_seed(i)), torch.ones(4, 1)) for i in range(3)]

    def loss_fn(m, batch):
        return ((m(batch[0]).float() - batch[1]) ** 2).sum(), batch[1].numel()
    t = Trainer(model, loss_fn, data, TrainConfig(max_steps=3, lr=1e-2, warmup=1, schedule="constant",
                                                  progress=False), device="cpu", optimizer=None)
    assert t.amp_dtype is None and not t.scaler.is_enabled()               # CPU: fp32, no scaler
    if amp16:                                                              # what an sm75 GPU gets, on the CPU
        # (a small initial scale: at the default 65536 the first step overflows fp16 and is skipped, by design)
        t.amp_dtype, t.scaler = torch.float16, torch.amp.GradScaler("cpu", init_scale=256.0)
    t.fit()
    return t


def test_a_cpu_bf16_recipe_runs_its_steps_under_bf16_autocast_and_trains_like_fp32(monkeypatch):
    ref = _fit(False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)     # a CPU with AMX, injected
    seen = []
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    data = [(torch.randn(4, 8, generator=torch.Generator().manual_seed(i)), torch.ones(4, 1)) for i in range(3)]

    def loss_fn(m, batch):
        out = m(batch[0])
        seen.append(out.dtype)
        return ((out.float() - batch[1]) ** 2).sum(), batch[1].numel()
    t = Trainer(model, loss_fn, data, TrainConfig(max_steps=3, lr=1e-2, warmup=1, schedule="constant", cpu_bf16=True,
                                                  progress=False), device="cpu")
    assert t.amp_dtype == torch.bfloat16 and not t.scaler.is_enabled()    # bf16 has fp32's range: no scaler
    t.fit()
    assert seen == [torch.bfloat16] * 3
    for a, b in zip(ref.module.parameters(), t.module.parameters()):
        assert b.dtype == torch.float32                                    # the weights stay fp32 (autocast casts)
        torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-2)


def test_trainer_fp16_with_grad_scaler_trains_like_fp32():
    ref, half = _fit(False), _fit(True)
    assert half.scaler.get_scale() == 256.0                                # the loss was scaled, no step skipped
    assert half.state_dict()["scaler"]["scale"] == half.scaler.get_scale()
    for a, b in zip(ref.module.parameters(), half.module.parameters()):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)             # gradients unscaled before the step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_this_gpu_gets_a_kernel_that_runs():
    cap = policy.capability("cuda")
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=policy.amp_dtype("cuda"))
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel([policy.attention_backend("cuda")]):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert (policy.amp_dtype("cuda") == torch.bfloat16) == (cap >= (8, 0))


def test_gpu_translation_preset_is_the_measured_hand_made_recipe():
    # a development run measured `--preset base` with these `--set`s on one H200: 40.4 greedy sacreBLEU in 2.5 minutes
    from tformer.translate.presets import get_preset
    hand = get_preset("base", n_layers=3, dropout=0.3, vocab_size=8000, max_tokens=8000, warmup=400,
                      schedule="linear", lr=1e-3, grad_clip=1.0).to_dict()
    preset = get_preset("gpu").to_dict()
    differ = {k for k in hand if hand[k] != preset[k]}
    assert differ <= {"eval_every", "save_every", "snapshot_minutes"}, differ   # bookkeeping only
