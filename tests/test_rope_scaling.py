"""RoPE scaling (position interpolation, NTK-aware, YaRN) against Hugging Face's own rope init functions,
and RotaryEmbedding against a float64 rotation of each feature pair."""
import math

import pytest
import torch

from tformer.positional import RotaryEmbedding, rope_frequencies

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402


def _hf(rope_type, head_dim, base, max_pos, **params):
    cfg = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                      max_position_embeddings=max_pos,
                      rope_parameters={"rope_type": rope_type, "rope_theta": base, **params})
    return cfg


@pytest.mark.parametrize("head_dim,base,factor", [(64, 10000.0, 4.0), (32, 500000.0, 8.0), (128, 10000.0, 2.0)])
def test_linear_matches_hf(head_dim, base, factor):
    inv, scale = ROPE_INIT_FUNCTIONS["linear"](_hf("linear", head_dim, base, 256, factor=factor), "cpu")
    ours, our_scale = rope_frequencies(head_dim, base, "linear", factor)
    torch.testing.assert_close(ours, inv.float(), rtol=1e-6, atol=0)
    assert our_scale == scale == 1.0


@pytest.mark.parametrize("head_dim,base,factor", [(64, 10000.0, 4.0), (32, 500000.0, 8.0), (128, 10000.0, 2.0)])
def test_ntk_matches_hf_dynamic_ntk_at_the_stretched_length(head_dim, base, factor):
    # HF's dynamic NTK raises the base by (f * seq_len / max_pos - (f - 1))^(d/(d-2)); with f = 1 and
    # seq_len = factor * max_pos that is the static NTK-aware base * factor^(d/(d-2)).
    max_pos = 256
    cfg = _hf("dynamic", head_dim, base, max_pos, factor=1.0)
    inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, "cpu", seq_len=int(factor * max_pos))
    ours, scale = rope_frequencies(head_dim, base, "ntk", factor)
    torch.testing.assert_close(ours, inv.float(), rtol=1e-5, atol=0)
    assert scale == 1.0
    assert ours[0] == 1.0 and ours[-1] < rope_frequencies(head_dim, base)[0][-1]   # low freqs stretched only


@pytest.mark.parametrize("head_dim,base,factor,orig,beta_fast,beta_slow", [
    (64, 10000.0, 4.0, 256, 32.0, 1.0), (64, 10000.0, 8.0, 2048, 32.0, 1.0), (128, 500000.0, 4.0, 8192, 32.0, 1.0),
    (32, 10000.0, 16.0, 64, 16.0, 2.0)])
def test_yarn_matches_hf(head_dim, base, factor, orig, beta_fast, beta_slow):
    cfg = _hf("yarn", head_dim, base, int(orig * factor), factor=factor, original_max_position_embeddings=orig,
              beta_fast=beta_fast, beta_slow=beta_slow)
    inv, att = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    ours, scale = rope_frequencies(head_dim, base, "yarn", factor, orig, beta_fast, beta_slow)
    torch.testing.assert_close(ours, inv.float(), rtol=1e-5, atol=0)
    assert scale == pytest.approx(att) and scale == pytest.approx(0.1 * math.log(factor) + 1)


def test_yarn_keeps_high_and_interpolates_low_frequencies():
    plain, _ = rope_frequencies(64, 10000.0)
    yarn, _ = rope_frequencies(64, 10000.0, "yarn", 4.0, 256)
    assert yarn[0] == plain[0]                                        # fastest turn: unchanged
    torch.testing.assert_close(yarn[-1], plain[-1] / 4)               # slowest: positions / factor


def test_rotary_embedding_rotates_pairs_in_float64_and_scales():
    hd, t = 8, 6
    rope = RotaryEmbedding(hd, max_len=4, scaling="yarn", factor=2.0, original_max_len=4)   # grows past max_len
    x = torch.randn(1, 2, t, hd)
    inv, scale = rope_frequencies(hd, 10000.0, "yarn", 2.0, 4)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv.double()[None]              # (T, hd/2)
    x1, x2 = x.double()[..., :hd // 2], x.double()[..., hd // 2:]                          # half-split pairs
    expected = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1) * scale
    torch.testing.assert_close(rope(x).double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rope(x[:, :, 3:], offset=3), rope(x)[:, :, 3:])


def test_relative_position_property():
    rope = RotaryEmbedding(16, max_len=64, scaling="ntk", factor=4.0)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    rope = rope.double()
    dots = [(rope(q, offset=p + 5) * rope(k, offset=p)).sum().item() for p in (0, 7, 30)]
    assert max(dots) - min(dots) < 1e-4                               # q.k depends only on the offset


def test_bad_scaling_is_rejected():
    with pytest.raises(ValueError, match="scaling"):
        rope_frequencies(8, scaling="cubic", factor=2.0)
    with pytest.raises(ValueError, match="even"):
        rope_frequencies(7)
