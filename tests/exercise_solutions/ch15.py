"""Chapter 15: the scaling-law fit L(N) = a N^-alpha + c with c fixed; the compute-optimal split of a budget."""
import math

import torch


def power_law_fit(n_params, losses, c):
    """torch.linalg.lstsq on [1, log N] -> log(L - c): another route to the same line."""
    x, y = n_params.double().log(), (losses.double() - c).log()
    design = torch.stack([torch.ones_like(x), x], dim=1)
    b = torch.linalg.lstsq(design, y[:, None], driver="gelsd").solution[:, 0]
    return torch.stack([b[0].exp(), -b[1]])


def compute_optimal(flops, tokens_per_param=20.0):
    """C = 6 N (r N) = 6 r N^2, solved in log space: log N = (log C - log 6r) / 2."""
    n = math.exp(0.5 * (math.log(flops) - math.log(6.0 * tokens_per_param)))
    return n, n * tokens_per_param


SOLUTIONS = {"ch15.power_law_fit": power_law_fit, "ch15.compute_optimal": compute_optimal}
