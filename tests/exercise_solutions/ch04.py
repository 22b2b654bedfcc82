"""Chapter 4: sinusoidal positions and their shift matrices."""
import math

import torch


def sinusoidal_table(max_len, d):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    ang = pos / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    return torch.stack([ang.sin(), ang.cos()], -1).reshape(max_len, d).float()


def shift_matrix(k, d):
    w = 1 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    blocks = [torch.tensor([[math.cos(k * wi), math.sin(k * wi)], [-math.sin(k * wi), math.cos(k * wi)]])
              for wi in w.tolist()]
    return torch.block_diag(*blocks).float()


SOLUTIONS = {"ch04.sinusoidal_table": sinusoidal_table, "ch04.shift_matrix": shift_matrix}
