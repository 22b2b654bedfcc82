"""sinusoidal_shift_matrix: PE(pos + k) is a fixed linear map of PE(pos), checked in float64."""
import math

import pytest
import torch

from tformer.positional import sinusoidal_shift_matrix, sinusoidal_table


def _pe64(max_len, d):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    ang = pos * torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
    return torch.stack([ang.sin(), ang.cos()], -1).reshape(max_len, d)


@pytest.mark.parametrize("k,d", [(0, 2), (1, 8), (5, 16), (-3, 32), (40, 64)])
def test_shift_matrix_maps_pe_pos_to_pe_pos_plus_k(k, d):
    pe = _pe64(100, d)
    m = sinusoidal_shift_matrix(k, d).double()
    lo, hi = max(0, -k), min(100, 100 - k)
    torch.testing.assert_close(pe[lo:hi] @ m.T, pe[lo + k:hi + k], atol=1e-6, rtol=0)


def test_shift_matrix_is_orthogonal_and_composes():
    a, b = sinusoidal_shift_matrix(3, 16).double(), sinusoidal_shift_matrix(4, 16).double()
    torch.testing.assert_close(a @ a.T, torch.eye(16, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(b @ a, sinusoidal_shift_matrix(7, 16).double(), atol=1e-6, rtol=0)


def test_table_matches_float64_formula_and_shift_rejects_odd():
    torch.testing.assert_close(sinusoidal_table(50, 10), _pe64(50, 10).float())
    with pytest.raises(ValueError, match="even"):
        sinusoidal_shift_matrix(1, 7)


def test_positions_per_row_equal_each_row_at_its_own_offset():
    """RoPE and learned positions take positions (B, T), each row its own (a serving step): row i at
    positions o_i..o_i+T-1 equals that row alone at offset o_i; past the table, a learned one says so."""
    from tformer.positional import LearnedPositionalEmbedding, RotaryEmbedding
    torch.manual_seed(0)
    rope, learned = RotaryEmbedding(16, max_len=8), LearnedPositionalEmbedding(32, 16)
    offsets = [0, 5, 21]
    pos = torch.tensor(offsets)[:, None] + torch.arange(3)                     # (3, 3)
    q, x = torch.randn(3, 2, 3, 16), torch.randn(3, 3, 16)
    got_q, got_x = rope(q, positions=pos), learned(x, positions=pos)           # 23 > 8: the table grows
    for i, o in enumerate(offsets):
        torch.testing.assert_close(got_q[i:i + 1], rope(q[i:i + 1], offset=o))
        torch.testing.assert_close(got_x[i:i + 1], learned(x[i:i + 1], offset=o))
    with pytest.raises(ValueError, match="position 32 is past the 32"):
        learned(x, positions=pos + 9)
