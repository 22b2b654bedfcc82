"""Chapter 15: the scaling-law fit L(N) = a N^-alpha + c (c fixed), a straight line in log-log space."""
import math

import torch

from ...training import metrics
from ...training.metrics import fit_power_law
from ..core import Case, Exercise, register
from ..questions import Question


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


# ---- the compute-optimal split of a budget (Chinchilla) ----------------------------------------------------

def compute_optimal_reference(flops: float, tokens_per_param: float = 20.0) -> tuple[float, float]:
    """(n_params, n_tokens) with 6 N D = flops and D = tokens_per_param * N."""
    return metrics.compute_optimal(flops, tokens_per_param)


def _split(flops, r, cost=6.0, root=True, per_param=True):
    """Shared by the named mistakes: N from C = cost N D with D = r N (or D = N / r), with or without the root."""
    ratio = r if per_param else 1.0 / r
    n = math.sqrt(flops / (cost * ratio)) if root else flops / (cost * ratio)
    return n, ratio * n


def _optimal_edges() -> list[Case]:
    return [Case("C = 120 FLOPs at 20 tokens per parameter: N = 1, D = 20", (120.0, 20.0)),
            Case("r = 1: as many tokens as parameters", (6.0e6, 1.0)),
            Case("Chinchilla's own budget: 6 x 70e9 x 1.4e12 FLOPs", (6 * 70e9 * 1.4e12, 20.0)),
            Case("GPT-3's budget (6 x 175e9 x 300e9) at Chinchilla's ratio", (6 * 175e9 * 300e9, 20.0)),
            Case("an over-trained small model: 200 tokens per parameter", (1.0e21, 200.0))]


def _optimal_random(seed: int) -> Case:
    g = torch.Generator().manual_seed(5100 + seed)
    flops = float(10 ** (8 + 18 * torch.rand(1, generator=g, dtype=torch.float64)))
    r = round(float(1 + 299 * torch.rand(1, generator=g, dtype=torch.float64)), 2)
    return Case(f"random #{seed}: C = {flops:.3g} FLOPs, {r} tokens per parameter", (flops, r), seed=5100 + seed)


register(Exercise(
    name="ch15.compute_optimal",
    title="the compute-optimal split: (n_params, n_tokens) with C = 6 N D and D = r N",
    reference=compute_optimal_reference,
    edge_cases=_optimal_edges,
    random_case=_optimal_random,
    points=1,
    atol=0.0,
    rtol=1e-5,                                   # compared by relative error
    hint="put D = r N into C = 6 N D: C = 6 r N^2, so N = sqrt(C / (6 r)) and D = r N. "
         "Check: C = 120, r = 20 gives N = 1, D = 20.",
    mistakes={"forward only: C = 2 N D (training is 6 N D: forward 2, backward 4 per parameter per token)":
                  lambda c, r=20.0: _split(c, r, cost=2.0),
              "the 6 left out: C = N D": lambda c, r=20.0: _split(c, r, cost=1.0),
              "no square root: N = C / (6 r)": lambda c, r=20.0: _split(c, r, root=False),
              "D = N / r (r is tokens per parameter: D = r N)": lambda c, r=20.0: _split(c, r, per_param=False),
              "returned (n_tokens, n_params): the order is (n_params, n_tokens)":
                  lambda c, r=20.0: _split(c, r)[::-1]},
    forbidden=[(metrics, "compute_optimal")],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch15.q_flat_gradient",
    title="why the Transformer's gradient does not fall with distance",
    kind="choice", answer="D", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "the curve beyond the last position is flat, not slowly falling: the far half gets about as much as the "
        "near half (printed); an LSTM's falls geometrically": "B",
        "the model is at initialisation, with random positions: nothing has learned to favour far tokens yet; "
        "every earlier position is simply one attention step away": "C",
        "the causal mask hides only the future; every earlier position is visible, near or far": "A",
    },
))

register(Question(
    name="ch15.q_parallel_cpu",
    title="why a CPU timing that favours the LSTM does not contradict the Transformer's parallelism",
    kind="choice", answer="B", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "the claim is about steps that must wait for each other, not about one machine's clock: on a GPU, which "
        "can run the positions at once, the parallel form wins (full mode, benchmarks/gpu_check.py)": "A",
        "a compiled loop is still a loop: the LSTM's step t needs the state of step t-1, so its T steps run one "
        "after another, however fast each is": "C",
        "in training the causal mask does not make position t wait for t-1: all T rows of the masked scores are "
        "computed at once": "D",
    },
))

register(Question(
    name="ch15.q_chinchilla_flops",
    title="the training compute of Chinchilla (70B parameters, 1.4T tokens), in FLOPs",
    kind="number", answer=6 * 70e9 * 1.4e12, rel_tol=0.025, points=1,   # 5.76e23, the paper's budget, passes
    mistakes={
        "2ND counts the forward pass only; the backward pass costs about twice the forward, so C = 6ND":
            2 * 70e9 * 1.4e12,
        "N x D counts one operation per parameter and token; each parameter costs a multiply-add (2 FLOPs) per "
        "token forward and two more backward: 6 FLOPs": 70e9 * 1.4e12,
        "20 tokens per parameter is the ratio D / N that Chinchilla's rule gives, not a factor of the compute":
            20 * 70e9 * 1.4e12,
    },
    hint="C = 6 N D: 2 FLOPs per parameter and token forward, 4 backward.",
))
