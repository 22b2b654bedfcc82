"""tformer.training.lora: the adapter formula in float64, merged == unmerged, what is frozen, the trainable share."""
import copy

import pytest
import torch
import torch.nn as nn

from tformer.training.lora import LoRALinear, add_lora, lora_forward, merge_lora, trainable_params
from tformer.models import GPT, GPTConfig


def test_lora_forward_is_the_formula_in_float64():
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((2, 5, 8), (6, 8), (6,)))
    A, B = torch.randn(3, 8, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)
    expected = x @ w.T + b + (16 / 3) * (x @ A.T) @ B.T
    torch.testing.assert_close(lora_forward(x, w, b, A, B, 16), expected)
    torch.testing.assert_close(lora_forward(x, w, None, A, B, 16), expected - b)
    with pytest.raises(ValueError, match=r"expected A \(r, in=8\)"):
        lora_forward(x, w, b, A.T, B, 16)


def test_a_new_adapter_changes_nothing_and_only_a_b_train():
    base = nn.Linear(8, 6)
    lin = LoRALinear(copy.deepcopy(base), r=2, alpha=4)
    x = torch.randn(3, 8)
    torch.testing.assert_close(lin(x), base(x))                   # B = 0 at the start
    assert [n for n, p in lin.named_parameters() if p.requires_grad] == ["A", "B"]


def _tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50, context_length=16, n_layers=2, n_heads=2, d_model=32))


def test_merged_equals_unmerged_on_gpt():
    gpt = add_lora(_tiny_gpt(), r=4, alpha=8)
    with torch.no_grad():
        for m in gpt.modules():
            if isinstance(m, LoRALinear):
                m.B.normal_()                                      # a trained-looking update
    idx = torch.randint(0, 50, (2, 10))
    gpt.eval()
    with torch.no_grad():
        before = gpt(idx)
        merged = merge_lora(copy.deepcopy(gpt))
        after = merged(idx)
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    assert trainable_params(merged)[1] == trainable_params(_tiny_gpt())[1]    # same shape as the original


def test_add_lora_counts_and_training_moves_only_the_adapters():
    gpt = _tiny_gpt()
    frozen = {n: p.clone() for n, p in gpt.named_parameters()}
    add_lora(gpt, r=4, alpha=8)
    trainable, total = trainable_params(gpt)
    d, ff = 32, 128
    per_layer = 4 * (d + 3 * d) + 4 * (d + d) + 4 * (d + ff) + 4 * (ff + d)   # qkv, out, fc1, fc2
    assert trainable == 2 * per_layer and total == trainable_params(_tiny_gpt())[1] + trainable
    opt = torch.optim.SGD([p for p in gpt.parameters() if p.requires_grad], lr=0.1)
    idx = torch.randint(0, 50, (2, 10))
    gpt(idx).logsumexp(-1).mean().backward()
    opt.step()
    for n, p in gpt.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen[n.replace(".base.", ".")]), n


def test_trainable_share_under_2_percent_at_gpt2_width():
    gpt = GPT(GPTConfig(vocab_size=1024, context_length=64, n_layers=6, n_heads=6, d_model=384))
    trainable, total = trainable_params(add_lora(gpt, r=4, alpha=8))
    assert trainable / total < 0.02, trainable / total


def test_add_lora_without_a_target_says_so():
    with pytest.raises(ValueError, match="no nn.Linear named"):
        add_lora(nn.Sequential(nn.Linear(2, 2)))
