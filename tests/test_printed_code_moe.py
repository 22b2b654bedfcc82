"""The printed code is the code that runs: chapter 13 prints `top_k_route` and `load_balancing_loss` as what
`MoE.forward` runs. Patch each, run the caller the prose names, assert it was called."""
import torch

import tformer.moe
from tformer.models import GPT, GPTConfig
from tformer.moe import MoE, MoEConfig


def _spy(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, spy)
    return calls


def test_moe_forward_calls_top_k_route(monkeypatch):
    calls = _spy(monkeypatch, tformer.moe, "top_k_route")
    layer = MoE(16, MoEConfig(n_experts=4, top_k=2, d_ff=32))
    layer(torch.randn(5, 16))
    assert calls == ["top_k_route"]


def test_moe_forward_calls_load_balancing_loss(monkeypatch):
    calls = _spy(monkeypatch, tformer.moe, "load_balancing_loss")
    MoE(16, MoEConfig(n_experts=4, top_k=2, d_ff=32))(torch.randn(5, 16))
    assert calls == ["load_balancing_loss"]


def test_gpt_moe_layers_route_with_top_k_route_and_collect_one_way(monkeypatch):
    calls = _spy(monkeypatch, tformer.moe, "top_k_route")
    collected = _spy(monkeypatch, tformer.models.gpt, "collect_aux_loss")
    model = GPT(GPTConfig(vocab_size=32, context_length=8, n_layers=2, n_heads=2, d_model=16,
                          moe=MoEConfig(n_experts=4, top_k=2, layers=(1,))))
    model(torch.randint(0, 32, (2, 8)))
    assert calls == ["top_k_route"]                                   # one MoE layer, one routing
    assert model.aux_loss.requires_grad and collected == ["collect_aux_loss"]
