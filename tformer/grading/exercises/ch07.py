"""Chapter 7: the paper's training cost in FLOPs (time x GPUs x FLOP/s), compared by relative error."""
import torch

from ...utils import timing
from ..core import Case, Exercise, register

P100, V100, A100, H100 = 9.5e12, 15.7e12, 312e12, 989e12        # sustained FP32 (P100, V100) / dense bf16 FLOP/s


def _reference(days, n_gpus, flops_per_gpu):
    return timing.training_flops(days, n_gpus, flops_per_gpu)


def _edges() -> list[Case]:
    return [Case("the paper's big model: 3.5 days on 8 P100", (3.5, 8, P100)),
            Case("the paper's base model: 12 hours on 8 P100", (0.5, 8, P100)),
            Case("one GPU for one day", (1.0, 1, V100)),
            Case("one H100 for one hour", (1 / 24, 1, H100))]


def _random(seed: int) -> Case:
    g = torch.Generator().manual_seed(700 + seed)
    days = round(float(torch.empty(1).uniform_(0.05, 90.0, generator=g)), 3)
    gpus = int(torch.randint(1, 4097, (1,), generator=g))
    flops = [P100, V100, A100, H100][seed % 4]
    return Case(f"random #{seed}: {days} days on {gpus} GPUs at {flops:.3g} FLOP/s", (days, gpus, flops),
                seed=700 + seed)


register(Exercise(
    name="ch07.training_flops",
    title="a training run's cost in FLOPs: days x GPUs x FLOP/s per GPU",
    reference=_reference,
    edge_cases=_edges,
    random_case=_random,
    points=1,
    atol=0.0,
    rtol=1e-3,                                   # compared by relative error
    hint="convert days to seconds (24 x 3600 seconds a day), then multiply by the number of GPUs and by "
         "each GPU's FLOP/s. The paper's big model: 3.5 days x 8 P100 at 9.5e12 FLOP/s = 2.3e19 FLOPs.",
    mistakes={"days used as hours (x 3600 instead of x 86400)": lambda d, n, f: d * 3600 * n * f,
              "days not converted to seconds": lambda d, n, f: d * n * f,
              "the number of GPUs left out": lambda d, n, f: d * 86400 * f},
    forbidden=[(timing, "training_flops")],
))
