"""Chapter 15: the scaling-law fit L(N) = a N^-alpha + c (c fixed), a straight line in log-log space."""
import math

import torch

from ...training import metrics
from ...training.metrics import fit_power_law
from ..core import Case, Exercise, register


def power_law_reference(n_params: torch.Tensor, losses: torch.Tensor, c: float) -> torch.Tensor:
    """float64 tensor [a, alpha] of the least-squares line log(L - c) = log a - alpha log N."""
    return fit_power_law(n_params, losses, c)


def _line(n_params, losses, c, subtract=True, base=math.e):
    """Shared by the named mistakes: slope and intercept of log(L - c) against log N, in `base`."""
    x = n_params.double().log() / math.log(base)
    y = (losses.double() - (c if subtract else 0.0)).log() / math.log(base)
    dx = x - x.mean()
    slope = (dx * (y - y.mean())).sum() / (dx ** 2).sum()
    return slope, y.mean() - slope * x.mean()


def _c_ignored(n_params, losses, c):
    slope, icpt = _line(n_params, losses, c, subtract=False)
    return torch.stack([icpt.exp(), -slope])


def _log_a(n_params, losses, c):
    slope, icpt = _line(n_params, losses, c)
    return torch.stack([icpt, -slope])


def _slope_not_negated(n_params, losses, c):
    slope, icpt = _line(n_params, losses, c)
    return torch.stack([icpt.exp(), slope])


def _log10_then_exp(n_params, losses, c):
    slope, icpt = _line(n_params, losses, c, base=10.0)
    return torch.stack([icpt.exp(), -slope])


def _law(n, a, alpha, c, noise=0.0, seed=0):
    n = torch.tensor(n, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    loss = a * n ** -alpha + c
    if noise:
        loss = c + (loss - c) * torch.exp(noise * torch.randn(len(n), generator=g, dtype=torch.float64))
    return n, loss


def _edges() -> list[Case]:
    return [
        Case("two points on L = 2 N^-0.5, c = 0", (*_law([1.0, 4.0], 2.0, 0.5, 0.0), 0.0)),
        Case("five sizes on L = 10 N^-0.1, c = 0", (*_law([1e3, 1e4, 1e5, 1e6, 1e7], 10.0, 0.1, 0.0), 0.0)),
        Case("an offset c = 1.5 that must be subtracted", (*_law([1e4, 3e4, 1e5, 3e5, 1e6], 40.0, 0.3, 1.5), 1.5)),
        Case("sizes of real models (1e6 .. 1e11), c = 1.69", (*_law([1e6, 1e8, 1e9, 7e10, 1e11], 406.4, 0.34, 1.69), 1.69)),
        Case("noisy losses (the fit is least squares, not through two points)",
             (*_law([2e3, 7e3, 2.5e4, 1e5, 4e5], 9.0, 0.07, 0.0, noise=0.05), 0.0)),
    ]


def _random(seed: int) -> Case:
    g = torch.Generator().manual_seed(5000 + seed)
    k = int(torch.randint(2, 9, (1,), generator=g))
    n = (10 ** (3 + 6 * torch.rand(k, generator=g, dtype=torch.float64))).sort().values
    n = n + torch.arange(k, dtype=torch.float64)                          # distinct sizes
    a, alpha = float(1 + 50 * torch.rand(1, generator=g)), float(0.02 + 0.5 * torch.rand(1, generator=g))
    c = [0.0, 0.5, 1.7][seed % 3]
    _, loss = _law(n.tolist(), a, alpha, c, noise=0.03, seed=5000 + seed)
    return Case(f"random #{seed}: K={k} sizes, a={a:.2f}, alpha={alpha:.3f}, c={c}", (n, loss, c), seed=5000 + seed)


register(Exercise(
    name="ch15.power_law_fit",
    title="fit L(N) = a N^-alpha + c with c fixed: return float64 [a, alpha]",
    reference=power_law_reference,
    edge_cases=_edges,
    random_case=_random,
    points=2,
    atol=1e-9,
    rtol=1e-6,
    hint="x = log N, y = log(L - c); least squares y = b0 + b1 x gives b1 = sum((x - mean x)(y - mean y)) / "
         "sum((x - mean x)^2), b0 = mean y - b1 mean x; then a = exp(b0), alpha = -b1. Work in float64.",
    mistakes={"c not subtracted before taking the log": _c_ignored,
              "returned log a (the intercept) instead of a = exp(intercept)": _log_a,
              "returned the slope itself: alpha is minus the slope": _slope_not_negated,
              "fitted in log10 but exponentiated the intercept with exp (use 10 ** intercept, or natural logs)":
                  _log10_then_exp},
    forbidden=[(metrics, "fit_power_law")],
))
