"""Mixture of experts (tformer.moe, GPT's MoE layers) and the flash-attention path (tformer.measure.flash).

References: the naive per-token loop, Hugging Face's Qwen3-MoE block and Mixtral balancing loss (random
init, no download), hand-made routings with hand-computed answers, float64.
"""
import math

import pytest
import torch

from tformer.utils import gpu
from tformer.attention import capture_attention
from tformer.measure.flash import force_flash, lm_throughput, run_with_flash, sdpa_backends_used
from tformer.models import GPT, GPTConfig
from tformer.measure.timing import profiled
from tformer.moe import MoE, MoEConfig, collect_aux_loss, load_balancing_loss, router_z_loss, top_k_route
from tformer.moe.dispatch import expert_capacity, grouped_mm_available, make_plan
from tformer.moe.params import (DEEPSEEK_V3, MIXTRAL_8X7B, QWEN3_235B_A22B, deepseek_v3_param_counts,
                                moe_lm_param_counts)



def cuda(test):
    """A test that means a CUDA GPU: marked `gpu` (`pytest -m gpu` selects them) and skipped without one."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


def _moe(seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    model = {n: kw.pop(n) for n in ("activation", "bias") if n in kw}     # the model's, not MoEConfig's
    cfg = dict(d_ff=24, n_experts=4, top_k=2)
    cfg.update(kw)
    m = MoE(16, MoEConfig(**cfg), **model).to(dtype)
    with torch.no_grad():                       # spread the router so routing is far from ties
        m.router.weight.mul_(4.0)
    return m


def _run(m, x, path, with_aux=False):
    """Output, input gradient and parameter gradients of a fixed random objective."""
    m.zero_grad()
    x = x.clone().requires_grad_()
    y = m(x, dispatch=path)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(y.device, y.dtype)
    obj = (y * w).sum() + (m.aux_loss * 10 if with_aux else 0)
    obj.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return y.detach(), x.grad, grads, m.last_experts.clone()


@pytest.mark.parametrize("activation,bias", [("gelu", False), ("swiglu", True), ("relu", True)])
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("capacity_factor", [None, 1.0, 0.5])
def test_padded_dispatch_equals_naive_forward_and_gradients(activation, bias, top_k, capacity_factor):
    m = _moe(activation=activation, bias=bias, top_k=top_k, capacity_factor=capacity_factor)
    x = torch.randn(3, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = _run(m, x, "naive", with_aux=True)
    got = _run(m, x, "padded", with_aux=True)
    assert torch.equal(ref[3], got[3])                                    # same routing
    torch.testing.assert_close(got[0], ref[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-12, atol=1e-12)
    assert ref[2].keys() == got[2].keys() and "router.weight" in ref[2]
    for name in ref[2]:
        torch.testing.assert_close(got[2][name], ref[2][name], rtol=1e-12, atol=1e-12, msg=name)
    if capacity_factor == 0.5:
        assert m.last_dropped > 0                                          # the test does exercise dropping


@pytest.mark.skipif(not grouped_mm_available(torch.zeros(1), 16, 24), reason="no grouped_mm in this PyTorch")
@pytest.mark.parametrize("activation,bias", [("gelu", False), ("swiglu", True)])
@pytest.mark.parametrize("capacity_factor", [None, 0.75])
def test_grouped_dispatch_equals_naive_forward_and_gradients(activation, bias, capacity_factor):
    # grouped_mm takes fp32/bf16 (not float64): compare in float32
    m = _moe(dtype=torch.float32, activation=activation, bias=bias, capacity_factor=capacity_factor)
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(2))
    ref = _run(m, x, "naive")
    got = _run(m, x, "grouped")
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
    for name in ref[2]:
        torch.testing.assert_close(got[2][name], ref[2][name], rtol=1e-5, atol=1e-6, msg=name)


def test_an_expert_nobody_picks_and_a_single_token():
    m = _moe()
    with torch.no_grad():
        m.router.weight[3] = 0.0                                          # expert 3's logit: -1000 x[:, 0]
        m.router.weight[3, 0] = -1e3
    x = torch.randn(5, 16, dtype=torch.float64)
    x[:, 0] = x[:, 0].abs() + 1                                           # so expert 3's logit is very low
    for path in ("padded", "naive"):
        y = m(x, dispatch=path)
        assert m.last_counts[3] == 0
    torch.testing.assert_close(m(x, dispatch="padded"), m(x, dispatch="naive"))
    one = x[:1]
    torch.testing.assert_close(m(one, dispatch="padded"), m(one, dispatch="naive"))


def test_matches_hugging_face_qwen3_moe_block():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    for norm in (True, False):
        hf_cfg = transformers.Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=12, num_experts=6,
                                             num_experts_per_tok=2, norm_topk_prob=norm, hidden_act="silu")
        torch.manual_seed(0)
        hf = Qwen3MoeSparseMoeBlock(hf_cfg).double()
        for p in hf.parameters():
            torch.nn.init.normal_(p, 0, 0.3)
        ours = MoE(16, MoEConfig(d_ff=12, n_experts=6, top_k=2, normalize_top_k=norm), activation="swiglu").double()
        with torch.no_grad():
            ours.router.weight.copy_(hf.gate.weight)
            gate_proj, up_proj = hf.experts.gate_up_proj.chunk(2, dim=1)  # (E, ff, d) each; silu(gate) * up
            ours.experts.fc1.copy_(gate_proj)
            ours.experts.gate.copy_(up_proj)
            ours.experts.fc2.copy_(hf.experts.down_proj)
        x = torch.randn(2, 5, 16, dtype=torch.float64)
        expected = hf(x)
        expected = expected[0] if isinstance(expected, tuple) else expected
        for path in ("padded", "naive"):
            # HF takes the router softmax in float32 even for float64 input: compare at float32 precision
            torch.testing.assert_close(ours(x, dispatch=path), expected, rtol=1e-5, atol=1e-6)


def test_capacity_drops_exactly_the_tokens_over_capacity_hand_made():
    # 6 tokens, k=2, 3 experts, capacity 2. Priority: all first choices in token order, then second choices.
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0], [2, 0], [0, 1]])
    gates = torch.rand(6, 2, dtype=torch.float64)
    plan = make_plan(gates, experts, 3, capacity=2)
    # first choices: e0 <- t0, t1 (kept), t2, t5 (dropped); e1 <- t3; e2 <- t4
    # second choices: t0 -> e1 (2nd slot, kept), t1 -> e2 (kept), t2 -> e1 (full), t3, t4 -> e0 (full), t5 -> e1
    expected_keep = torch.tensor([[1, 1], [1, 1], [0, 0], [1, 0], [1, 0], [0, 0]], dtype=torch.bool)
    assert torch.equal(plan.keep, expected_keep)
    assert plan.counts.tolist() == [6, 4, 2] and plan.kept_counts.tolist() == [2, 2, 2]
    assert plan.expert_sorted.tolist() == [0, 0, 1, 1, 2, 2]
    assert plan.token_sorted.tolist() == [0, 1, 3, 0, 4, 1]
    assert plan.slot_sorted.tolist() == [0, 1, 0, 1, 0, 1]
    assert torch.equal(plan.gate_sorted, gates[[0, 1, 3, 0, 4, 1], [0, 0, 0, 1, 0, 1]])
    nodrop = make_plan(gates, experts, 3, capacity=None)
    assert bool(nodrop.keep.all()) and nodrop.token_sorted.numel() == 12


def _kept_by_counting(experts, capacity):
    n, k = experts.shape
    keep, used = torch.zeros(n, k, dtype=torch.bool), {}
    for j in range(k):
        for t in range(n):
            e = int(experts[t, j])
            used[e] = used.get(e, 0) + 1
            keep[t, j] = used[e] <= capacity
    return keep


@pytest.mark.parametrize("top_k,factor", [(1, 1.0), (2, 1.0), (2, 0.6)])
def test_capacity_in_the_layer(top_k, factor):
    m = _moe(top_k=top_k, capacity_factor=factor, dispatch="padded")
    x = torch.randn(40, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    m.train()
    y = m(x)
    cap = expert_capacity(40, 4, top_k, factor)
    keep = _kept_by_counting(m.last_experts, cap)
    plan = make_plan(torch.ones(40, top_k), m.last_experts, 4, cap)
    assert torch.equal(plan.keep, keep)
    assert int(keep.sum()) < 40 * top_k                                   # something was dropped
    gates, experts = top_k_route(m.router(x), top_k, True)
    for t in range(40):                                                   # each token: its kept choices only
        expected = sum((gates[t, j] * m.experts.expert(int(experts[t, j]), x[t]) for j in range(top_k) if keep[t, j]),
                       torch.zeros(16, dtype=torch.float64))
        torch.testing.assert_close(y[t], expected, rtol=1e-12, atol=1e-12)
    if factor < 1:
        gone = ~keep.any(dim=1)                                           # every choice dropped: exactly 0
        assert bool(gone.any()) and torch.equal(y[gone], torch.zeros_like(y[gone]))
    m.eval()                                                              # evaluation: no dropping by default
    m(x)
    assert float(m.last_dropped) == 0.0


def test_expert_capacity_formula():
    assert expert_capacity(100, 8, 2, 1.25) == math.ceil(1.25 * 100 * 2 / 8) == 32
    assert expert_capacity(3, 8, 1, 1.0) == 1
    assert expert_capacity(100, 8, 2, None) is None
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(10, 2, 1, 0.0)


def test_balancing_loss_equals_its_formula_on_hand_made_routings():
    e = 4
    uniform = torch.full((8, e), 1 / e, dtype=torch.float64)
    spread = torch.tensor([[0], [1], [2], [3], [0], [1], [2], [3]])
    assert load_balancing_loss(uniform, spread).item() == pytest.approx(1.0)             # balanced: 1
    collapsed = torch.zeros(8, e, dtype=torch.float64)
    collapsed[:, 2] = 1.0
    assert load_balancing_loss(collapsed, torch.full((8, 1), 2)).item() == pytest.approx(e)  # collapse: E
    # hand-made, k=2: f = counts / (N k), P = mean probability
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.4, 0.4, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    chosen = torch.tensor([[0, 1], [0, 1], [3, 2]])
    f = torch.tensor([2, 2, 1, 1], dtype=torch.float64) / 6
    p = torch.tensor([1.0, 0.9, 0.5, 0.6], dtype=torch.float64) / 3
    assert load_balancing_loss(probs, chosen).item() == pytest.approx(e * float((f * p).sum()))
    assert load_balancing_loss(probs, chosen).item() == pytest.approx(4 * (2 * 1.0 + 2 * 0.9 + 0.5 + 0.6) / 18)


def test_balancing_loss_against_hugging_face_mixtral():
    pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 8, generator=g)
    for k in (1, 2, 3):
        gates, experts = top_k_route(logits, k)
        ours = load_balancing_loss(torch.softmax(logits, -1), experts)
        hf = load_balancing_loss_func((logits,), num_experts=8, top_k=k)   # divides by N, not N k
        torch.testing.assert_close(ours * k, hf.to(ours.dtype))


def test_balancing_loss_is_differentiable_through_probs_only():
    logits = torch.randn(20, 4, requires_grad=True)
    probs = torch.softmax(logits, -1)
    _, experts = probs.topk(2)
    load_balancing_loss(probs, experts).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_router_z_loss_formula():
    logits = torch.zeros(3, 4, dtype=torch.float64)
    assert router_z_loss(logits).item() == pytest.approx(math.log(4) ** 2)
    logits = torch.tensor([[1.0, 2.0], [0.0, -3.0]], dtype=torch.float64)
    expected = (math.log(math.e + math.e ** 2) ** 2 + math.log(1 + math.exp(-3)) ** 2) / 2
    assert router_z_loss(logits).item() == pytest.approx(expected)


def test_top_k_route():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]], dtype=torch.float64)
    p = torch.softmax(logits, -1)[0]
    gates, experts = top_k_route(logits, 2, normalize=False)
    assert experts.tolist() == [[1, 2]]
    torch.testing.assert_close(gates[0], p[[1, 2]])
    gates, _ = top_k_route(logits, 2, normalize=True)
    torch.testing.assert_close(gates[0], p[[1, 2]] / p[[1, 2]].sum())
    g1, e1 = top_k_route(logits, 1, normalize=True)
    assert g1.item() == 1.0 and e1.item() == 1
    with pytest.raises(ValueError, match="k"):
        top_k_route(logits, 5)


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="top_k"):
        MoE(16, MoEConfig(n_experts=4, top_k=5, d_ff=32))
    with pytest.raises(ValueError, match="dispatch"):
        MoE(16, MoEConfig(dispatch="fast", d_ff=32))
    m = _moe()
    with pytest.raises(ValueError, match="d_model"):
        m(torch.randn(2, 3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="dims"):
        m(torch.randn(16, dtype=torch.float64))
    with pytest.raises(ValueError, match="d_ff"):
        MoE(16, MoEConfig())                                                # no expert width anywhere
    with pytest.raises(ValueError, match="MoEConfig.layers"):
        GPT(GPTConfig(vocab_size=10, context_length=8, n_layers=2, n_heads=2, d_model=8,
                      moe=MoEConfig(n_experts=2, layers=(5,))))


def _tiny(**kw):
    cfg = dict(vocab_size=64, context_length=16, n_layers=3, n_heads=2, d_model=16)
    cfg.update(kw)
    torch.manual_seed(0)
    return GPT(GPTConfig(**cfg))


def test_gpt_moe_layers_aux_loss_and_param_counts():
    dense = _tiny()
    assert dense.num_params(active=True) == dense.num_params() and dense.aux_loss == 0.0
    moe = _tiny(moe=MoEConfig(n_experts=4, top_k=2, layers=(0, 2), d_ff=32))
    kinds = [type(b.ffn).__name__ for b in moe.blocks]
    assert kinds == ["MoE", "FeedForward", "MoE"]
    idx = torch.randint(0, 64, (2, 10))
    logits = moe(idx)
    assert logits.shape == (2, 10, 64)
    aux = moe.aux_loss
    assert aux.requires_grad and aux.item() > 0
    torch.testing.assert_close(aux, collect_aux_loss(moe))
    aux.backward()
    assert moe.blocks[0].ffn.router.weight.grad.abs().sum() > 0
    # active = total - (E - k) * (one expert's parameters) in each of the 2 MoE layers
    per_expert = 16 * 32 + 32 + 32 * 16 + 16                               # fc1 + b1 + fc2 + b2 (bias=True)
    assert moe.num_params() - moe.num_params(active=True) == 2 * (4 - 2) * per_expert
    router = 16 * 4
    dense_ffn = 16 * 64 + 64 + 64 * 16 + 16
    assert moe.num_params() == dense.num_params() + 2 * (router + 4 * per_expert - dense_ffn)


def test_gpt_moe_generation_with_cache_equals_without():
    moe = _tiny(positional="rope", activation="swiglu", moe=MoEConfig(n_experts=4, top_k=2, capacity_factor=1.0))
    idx = torch.randint(0, 64, (2, 4))
    a = moe.generate(idx, 8, temperature=0.0, use_cache=True)
    b = moe.generate(idx, 8, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)


def test_param_counts_from_config_match_hugging_face_qwen3_moe():
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=101, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
              num_experts=6, experts_per_token=2, expert_ffn=24)
    cfg = transformers.Qwen3MoeConfig(vocab_size=101, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=2,
                                      moe_intermediate_size=24, intermediate_size=40, decoder_sparse_step=1,
                                      mlp_only_layers=[], tie_word_embeddings=False)
    hf = transformers.Qwen3MoeForCausalLM(cfg)
    total = sum(p.numel() for p in hf.parameters())
    expert = sum(p[0].numel() for p in hf.model.layers[0].mlp.experts.parameters())
    counts = moe_lm_param_counts(**kw)
    assert counts["total"] == total
    assert counts["active"] == total - 3 * (6 - 2) * expert


def test_qwen3_235b_a22b_and_mixtral_total_and_active():
    c = moe_lm_param_counts(**QWEN3_235B_A22B)
    assert 234e9 < c["total"] < 236e9                                       # "235B"
    assert 21.5e9 < c["active"] < 22.5e9                                    # "A22B"
    c = moe_lm_param_counts(**MIXTRAL_8X7B)
    assert round(c["total"] / 1e9, 1) == 46.7 and round(c["active"] / 1e9, 1) == 12.9   # Mistral's figures


def test_deepseek_v3_counts_match_hugging_face_and_the_report():
    transformers = pytest.importorskip("transformers")
    tiny = dict(DEEPSEEK_V3, vocab_size=100, hidden_size=32, num_hidden_layers=4, first_k_dense_replace=1,
                intermediate_size=48, num_attention_heads=4, q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8,
                qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=6, moe_intermediate_size=12,
                num_experts_per_tok=2, n_group=2, topk_group=1)
    with torch.device("meta"):                                              # shapes only
        hf = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**tiny, tie_word_embeddings=False))
    assert sum(p.numel() for p in hf.parameters()) == deepseek_v3_param_counts(tiny)["total"]
    c = deepseek_v3_param_counts(DEEPSEEK_V3)
    lookup = DEEPSEEK_V3["vocab_size"] * DEEPSEEK_V3["hidden_size"]         # the input table: not multiplied
    assert 670.5e9 < c["total"] < 671.5e9 and 36.5e9 < c["active"] - lookup < 37.5e9   # "671B", "37B activated"
    assert 684e9 < c["total"] + c["mtp"] < 686e9                            # the 685B checkpoint


def test_flash_path_on_cpu_reports_the_kernel_and_fails_loudly(capfd):
    model = _tiny(moe=MoEConfig(n_experts=4, top_k=2))
    idx = torch.randint(0, 64, (2, 8))
    capfd.readouterr()
    _, used = run_with_flash(lambda: model(idx))
    assert used == ["flash (cpu)"]
    assert capfd.readouterr() == ("", "")          # the profiler's start/stop lines stay out of notebooks
    with capture_attention(model), pytest.raises(RuntimeError, match="no flash-attention kernel ran"):
        run_with_flash(lambda: model(idx))                                  # bypasses SDPA: must be caught
    q = torch.randn(1, 2, 4, 8)
    _, used = sdpa_backends_used(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert used and all(u in ("flash (cpu)", "math") for u in used)


def test_lm_throughput_smoke_cpu():
    model = _tiny(moe=MoEConfig(n_experts=4, top_k=2))
    r = lm_throughput(model, batch_size=2, seq_len=8, steps=1, warmup=1, flash=True)
    assert r["tokens_per_s"] > 0 and r["mfu"] is None and r["backends"] == ["flash (cpu)"]
    assert r["flops_per_token"] == 6 * model.num_params(non_embedding=True, active=True) + 12 * 3 * 16 * 8


@cuda
def test_flash_kernel_runs_on_cuda_bf16_and_refuses_fp32():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=128, context_length=64, n_layers=2, n_heads=4, d_model=128,
                          moe=MoEConfig(n_experts=4, top_k=2))).cuda()
    idx = torch.randint(0, 128, (2, 64), device="cuda")

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx).float().mean() + model.aux_loss
        loss.backward()
    _, used = run_with_flash(fwd_bwd)
    assert used == ["flash"]
    q = torch.randn(1, 2, 16, 64, device="cuda")                           # fp32: flash cannot take it
    with pytest.raises(RuntimeError), force_flash():
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


@cuda
def test_grouped_dispatch_on_cuda_bf16_equals_padded():
    torch.manual_seed(0)
    m = MoE(64, MoEConfig(d_ff=128, n_experts=8, top_k=2), activation="swiglu").cuda().to(torch.bfloat16)
    x = torch.randn(4, 32, 64, device="cuda", dtype=torch.bfloat16)
    assert m.choose_dispatch(x) == ("grouped" if gpu.grouped_mm_fast(x.device) else "padded")   # H200: grouped
    ref = _run(m, x, "padded")
    got = _run(m, x, "grouped")
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[1], ref[1], rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not grouped_mm_available(torch.zeros(1), 16, 32), reason="no grouped_mm in this PyTorch")
def test_auto_dispatch_pads_fp32_under_torch_compile(monkeypatch):
    # torch.compile's shape rule for grouped_mm takes bf16 only: an fp32 MoE compiled on a CPU must pad
    m = MoE(16, MoEConfig(d_ff=32, n_experts=4, top_k=2))
    x = torch.randn(8, 16)
    assert m.choose_dispatch(x) == "grouped"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert m.choose_dispatch(x) == "padded"
    assert grouped_mm_available(x.bfloat16(), 16, 32)                       # bf16 compiles


@pytest.mark.skipif(not grouped_mm_available(torch.zeros(1), 16, 32), reason="no grouped_mm in this PyTorch")
def test_grouped_dispatch_under_cpu_bf16_autocast():
    torch.manual_seed(0)
    m = MoE(16, MoEConfig(d_ff=32, n_experts=4, top_k=2), bias=True, activation="swiglu")
    x = torch.randn(3, 10, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m.choose_dispatch(x) == "grouped"                             # auto: grouped_mm where it exists
        ref, got = _run(m, x, "padded"), _run(m, x, "grouped")
    assert got[0].dtype == x.dtype                                           # back in the residual's dtype
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=2e-2)
    for name in ref[2]:
        torch.testing.assert_close(got[2][name], ref[2][name], rtol=5e-2, atol=5e-2, msg=name)


@cuda
def test_auto_dispatch_under_cuda_autocast_follows_the_gpu():
    torch.manual_seed(0)
    m = MoE(64, MoEConfig(d_ff=128, n_experts=8, top_k=2)).cuda()     # fp32 weights, bf16 autocast
    x = torch.randn(4, 32, 64, device="cuda")
    assert m.choose_dispatch(x) == "padded"                                  # fp32: no grouped kernel
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert m.choose_dispatch(x) == ("grouped" if gpu.grouped_mm_fast(x.device) else "padded")
        ref, got = _run(m, x, "padded"), _run(m, x, "grouped")
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[1], ref[1], rtol=2e-2, atol=2e-2)


# ops that, on a GPU, mean an accumulating scatter through a sort (the backward of x[idx]) or a host sync
_SCATTER_OPS = {"aten::index_put_", "aten::index_put", "aten::_index_put_impl_"}
_SYNC_OPS = {"aten::bincount", "aten::_local_scalar_dense", "aten::item", "aten::nonzero"}


def _ops_of(fn):
    """Names of the aten ops fn() runs, leaving out those inside the CPU's grouped_mm kernel (a loop over
    the groups that reads each offset on the host; the CUDA kernel reads them on the device)."""
    _, prof = profiled(fn)

    def inside_cpu_grouped_mm(e):
        e = e.cpu_parent
        while e is not None:
            if e.name == "aten::_grouped_mm":
                return True
            e = e.cpu_parent
        return False
    return {e.name for e in prof.events() if not inside_cpu_grouped_mm(e)}


def _probe_detects(ops):
    x = torch.randn(6, 4, requires_grad=True)
    seen = _ops_of(lambda: x[torch.tensor([0, 2, 2])].sum().backward())   # the old dispatch's pattern
    return bool(seen & ops)


@pytest.mark.parametrize("dispatch,capacity", [("auto", None), ("padded", 1.25), ("grouped", 1.0)])
def test_moe_training_step_has_no_scatter_backward_and_no_host_sync(dispatch, capacity):
    """The structure a GPU needs, proved on the CPU: forward + backward of an MoE GPT (two MoE layers) runs
    no accumulating index_put_ (the backward of advanced indexing) and reads nothing back to the host."""
    assert _probe_detects(_SCATTER_OPS)                                      # the profile would see one
    if dispatch == "grouped" and not grouped_mm_available(torch.zeros(1), 32, 64):
        pytest.skip("no grouped_mm in this PyTorch")
    model = _tiny(d_model=32, moe=MoEConfig(n_experts=4, top_k=2, d_ff=64, dispatch=dispatch,
                                           capacity_factor=capacity))
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

    def step():
        loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten()) + model.aux_loss
        loss.backward()
    step()                                                                    # warm-up (lazy initialisation)
    ops = _ops_of(step)
    assert "aten::bmm" in ops or "aten::_grouped_mm" in ops                  # the experts did run
    assert not ops & _SCATTER_OPS, f"accumulating scatter in the step: {sorted(ops & _SCATTER_OPS)}"
    assert not ops & _SYNC_OPS, f"host sync in the step: {sorted(ops & _SYNC_OPS)}"
