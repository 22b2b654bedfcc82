"""int8 / int4 weight quantization: against torch's own quantizer and float64 math."""
import pytest
import torch
import torch.nn as nn

from tformer.models import GPT, GPTConfig
from tformer.inference.quantize import (QuantLinear, dequantize_int4, dequantize_int8, model_bytes, pack_int4,
                              quantize_int4, quantize_int8, quantize_model, unpack_int4)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_int8_matches_torch_quantize_per_channel():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 24, generator=g) * torch.rand(16, 1, generator=g) * 3
    w[3] = 0.0                                                 # an all-zero row
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.shape == (16,)
    w64 = w.double()
    s_ref = torch.where(w64.abs().amax(1) > 0, w64.abs().amax(1) / 127, 1.0)
    torch.testing.assert_close(s.double(), s_ref)
    assert torch.equal(q, torch.round(w64 / s_ref[:, None]).to(torch.int8))   # float64 math
    if hasattr(torch, "quantize_per_channel"):                 # PyTorch's own (deprecated) per-channel quantizer
        ref = torch.quantize_per_channel(w, s.double(), torch.zeros(16, dtype=torch.long), 0, torch.qint8)
        assert torch.equal(q, ref.int_repr())
    assert (q.abs().amax(1)[torch.arange(16) != 3] == 127).all()  # each row uses the full range
    err = (dequantize_int8(q, s) - w).abs()
    assert (err <= s[:, None] / 2 + 1e-6).all()                # round to nearest: at most half a step


def test_int4_pack_layout_and_roundtrip():
    q = torch.tensor([[1, -1, 7, -8], [0, 3, -2, 5]])
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 2)
    assert packed[0].tolist() == [0x1 | 0xF << 4, 0x7 | 0x8 << 4]  # low nibble first, two's complement
    assert torch.equal(unpack_int4(packed), q.to(torch.int8))
    g = torch.Generator().manual_seed(1)
    r = torch.randint(-8, 8, (5, 6, 32), generator=g)
    assert torch.equal(unpack_int4(pack_int4(r)), r.to(torch.int8))
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack_int4(torch.tensor([8, 0]))
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.tensor([1, 2, 3]))


def test_int4_groupwise_matches_float64_reference():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(8, 64, generator=g, dtype=torch.float64)
    packed, s = quantize_int4(w, group_size=16)
    assert packed.shape == (8, 32) and s.shape == (8, 4)
    groups = w.view(8, 4, 16)
    s_ref = groups.abs().amax(-1) / 7
    q_ref = torch.clamp(torch.round(groups / s_ref[..., None]), -8, 7)
    torch.testing.assert_close(s, s_ref)
    torch.testing.assert_close(dequantize_int4(packed, s), (q_ref * s_ref[..., None]).view(8, 64))
    assert ((dequantize_int4(packed, s) - w).abs() <= s.repeat_interleave(16, 1) / 2 + 1e-12).all()
    with pytest.raises(ValueError, match="divide in_features=64"):
        quantize_int4(w, group_size=24)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantlinear_uses_the_quantized_weights(bits):
    torch.manual_seed(3)
    lin = nn.Linear(64, 10).double()
    ql = QuantLinear.from_linear(lin, bits=bits, group_size=16)
    assert ql.qweight.dtype == (torch.int8 if bits == 8 else torch.uint8)
    assert not any(isinstance(t, nn.Parameter) for t in ql.buffers()) and not list(ql.parameters())
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    w_hat = ql.dequantized_weight()
    torch.testing.assert_close(ql(x), x @ w_hat.T + lin.bias, rtol=1e-12, atol=1e-12)
    # the quantized layer is close to, but not the same as, the float layer
    diff = (ql(x) - lin(x)).abs().max().item()
    assert 0 < diff < (0.05 if bits == 8 else 0.5)
    with pytest.raises(ValueError, match=r"\(\.\.\., 64\)"):
        ql(torch.randn(3, 63, dtype=torch.float64))


def test_quantize_gpt_memory_and_outputs():
    torch.manual_seed(4)
    cfg = GPTConfig(vocab_size=64, context_length=32, n_layers=2, n_heads=4, d_model=64)
    m = GPT(cfg).eval()
    idx = torch.randint(0, 64, (2, 16))
    ref = m(idx)
    sizes = {"fp32": model_bytes(m)}
    linear_fp32 = sum(mod.weight.numel() * 4 for n, mod in m.named_modules() if type(mod) is nn.Linear and n != "lm_head")
    for bits in (8, 4):
        q = quantize_model(_copy(m), bits=bits, group_size=32)
        assert sum(isinstance(x, QuantLinear) for x in q.modules()) == 4 * cfg.n_layers
        assert type(q.head) is nn.Linear and q.head.weight is q.tok_embed.weight  # tied head kept in float
        sizes[bits] = model_bytes(q)
        out = q(idx)
        rel = ((out - ref).norm() / ref.norm()).item()
        assert 0 < rel < (0.02 if bits == 8 else 0.2), (bits, rel)
    saved8, saved4 = sizes["fp32"] - sizes[8], sizes["fp32"] - sizes[4]
    assert saved8 > 0.7 * linear_fp32 and saved4 > 0.8 * linear_fp32    # ~3/4 and ~7/8 of the linear weights


def _copy(m):
    c = GPT(m.cfg).eval()
    c.load_state_dict(m.state_dict())
    return c
