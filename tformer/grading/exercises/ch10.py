"""Chapter 10: the paper's learning-rate schedule and the label-smoothed loss."""
import torch
import torch.nn.functional as F

from ...training import losses, schedules
from ...training.losses import label_smoothed_cross_entropy
from ...training.schedules import noam_lr
from ..core import Case, Exercise, register
from ..questions import Question


# -- the schedule -------------------------------------------------------------------------------------
def noam_reference(steps: torch.Tensor, d_model: int, warmup: int) -> torch.Tensor:
    """lr for each step in `steps` (LongTensor, counted from 1) as float64."""
    return torch.tensor([noam_lr(int(s), d_model, warmup) for s in steps.flatten()], dtype=torch.float64
                        ).view(steps.shape)


def _no_warmup(steps, d_model, warmup):
    return d_model ** -0.5 * steps.double() ** -0.5


def _wrong_warmup_power(steps, d_model, warmup):
    s = steps.double()
    return d_model ** -0.5 * torch.minimum(s ** -0.5, s * warmup ** -0.5)


def _no_d_model(steps, d_model, warmup):
    s = steps.double()
    return torch.minimum(s ** -0.5, s * warmup ** -1.5)


def _noam_edges() -> list[Case]:
    return [
        Case("step 1", (torch.tensor([1]), 512, 4000)),
        Case("the peak: step == warmup", (torch.tensor([4000]), 512, 4000)),
        Case("around the peak", (torch.tensor([3999, 4000, 4001]), 512, 4000)),
        Case("warmup 1 (no warmup at all)", (torch.tensor([1, 2, 10]), 64, 1)),
        Case("a 2-D tensor of steps", (torch.tensor([[1, 100], [10_000, 100_000]]), 1024, 4000)),
    ]


def _noam_random(seed: int) -> Case:
    g = torch.Generator().manual_seed(2000 + seed)
    d = int(2 ** torch.randint(4, 11, (1,), generator=g))
    w = int(torch.randint(1, 8000, (1,), generator=g))
    steps = torch.randint(1, 200_000, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g)
    return Case(f"random #{seed}: d_model={d}, warmup={w}, {len(steps)} steps", (steps, d, w), seed=2000 + seed)


register(Exercise(
    name="ch10.noam",
    title="the paper's learning rate for a tensor of steps",
    reference=noam_reference,
    edge_cases=_noam_edges,
    random_case=_noam_random,
    points=2,
    atol=1e-12,
    rtol=1e-9,
    hint="lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); work in float64 "
         "(steps.double()) and use torch.minimum for the element-wise min.",
    mistakes={"no warmup (only step^-0.5)": _no_warmup,
              "warmup^-0.5 instead of warmup^-1.5": _wrong_warmup_power,
              "missing the d_model^-0.5 factor": _no_d_model},
    forbidden=[(schedules, "noam_lr")],
))


# -- label smoothing ----------------------------------------------------------------------------------
def smoothed_reference(logits: torch.Tensor, target: torch.Tensor, smoothing: float, ignore_index: int) -> torch.Tensor:
    return label_smoothed_cross_entropy(logits, target, smoothing, ignore_index=ignore_index, reduction="mean")


def _spread_over_others(logits, target, smoothing, ignore_index):
    """eps / (V - 1) on every *other* class (fairseq's variant), not eps / V on all classes."""
    lp = torch.log_softmax(logits, -1)
    v = logits.shape[-1]
    nll = -lp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    other = (-lp.sum(-1) - nll) / (v - 1)
    loss = (1 - smoothing) * nll + smoothing * other
    keep = target != ignore_index
    return (loss * keep).sum() / keep.sum()


def _pads_counted(logits, target, smoothing, ignore_index):
    lp = torch.log_softmax(logits, -1)
    nll = -lp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return ((1 - smoothing) * nll + smoothing * -lp.mean(-1)).mean()


def _per_token(logits, target, smoothing, ignore_index):
    """(1 - eps) * NLL + eps * mean over classes of -log p, for the non-pad tokens. Written from torch
    operations (not the forbidden references), so a learner making one of these mistakes is told so."""
    lp = torch.log_softmax(logits, -1)
    nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return ((1 - smoothing) * nll - smoothing * lp.mean(-1))[target != ignore_index]


def _no_smoothing(logits, target, smoothing, ignore_index):
    return _per_token(logits, target, 0.0, ignore_index).mean()


def _sum_not_mean(logits, target, smoothing, ignore_index):
    return _per_token(logits, target, smoothing, ignore_index).sum()


def _ls_case(seed: int, b: int, t: int, v: int, smoothing: float, n_pad: int = 0, dtype=torch.float64) -> tuple:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g, dtype=dtype) * 3
    target = torch.randint(1, v, (b, t), generator=g)
    if n_pad:
        target[:, t - n_pad:] = 0
    return logits, target, smoothing, 0


def _ls_edges() -> list[Case]:
    return [
        Case("one token, smoothing 0 (plain cross-entropy)", _ls_case(0, 1, 1, 5, 0.0)),
        Case("smoothing 0.1, no padding", _ls_case(1, 2, 4, 7, 0.1)),
        Case("padding at the end of every row (ignored)", _ls_case(2, 3, 6, 9, 0.1, n_pad=2)),
        Case("large smoothing 0.5", _ls_case(3, 2, 5, 11, 0.5, n_pad=1)),
        Case("float32 logits", _ls_case(4, 2, 3, 6, 0.1, dtype=torch.float32)),
    ]


def _ls_random(seed: int) -> Case:
    g = torch.Generator().manual_seed(3000 + seed)
    b, t, v = (int(torch.randint(1, n, (1,), generator=g)) for n in (4, 9, 40))
    v = max(v, 3)
    eps = [0.0, 0.1, 0.2, 0.3][seed % 4]
    n_pad = int(torch.randint(0, t, (1,), generator=g))
    return Case(f"random #{seed}: B={b} T={t} V={v} smoothing={eps} pads={n_pad}",
                _ls_case(3000 + seed, b, t, v, eps, n_pad), seed=3000 + seed)


register(Exercise(
    name="ch10.label_smoothing",
    title="label-smoothed cross-entropy, mean over non-padding tokens",
    reference=smoothed_reference,
    edge_cases=_ls_edges,
    random_case=_ls_random,
    points=2,
    atol=1e-5,
    rtol=1e-5,
    hint="log p = log_softmax(logits); loss per token = (1 - eps) * (-log p[target]) + eps * mean over the "
         "vocabulary of (-log p); average over the tokens whose target is not ignore_index.",
    mistakes={"smoothing mass spread over the other V-1 classes instead of all V (fairseq's variant)":
              _spread_over_others,
              "padding tokens counted in the mean": _pads_counted,
              "no smoothing applied": _no_smoothing,
              "sum instead of mean": _sum_not_mean},
    forbidden=[(losses, "label_smoothed_cross_entropy"), (F, "cross_entropy")],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch10.q_peak_lr",
    title="the peak of the paper's learning rate, as a formula in d_model and warmup",
    kind="expr", answer="(d * w)**-0.5", symbols=("d", "w"), points=1,
    mistakes={
        "d**-0.5 is only the factor in front; at s = w the min(...) adds a factor w^-1/2": "d**-0.5",
        "w^-3/2 is the slope of the warmup ramp; at the peak the ramp s * w^-3/2 has reached w^-1/2":
            "d**-0.5 * w**-1.5",
        "the rate also scales as d_model^-1/2: a wider model gets a smaller rate": "w**-0.5",
    },
    hint="at s = w both branches of the min equal w^-1/2; multiply by d_model^-1/2.",
))

register(Question(
    name="ch10.q_warmup",
    title="at a constant rate without warmup, which model stays on the plateau",
    kind="choice", answer="B", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "the warmup is what takes post-LN off the plateau: with it, the same model leaves the plateau early": "A",
        "pre-LN keeps an identity path that skips every LayerNorm: it trains without warmup": "C",
        "the difference lasts: at the end of the run post-LN without warmup is still well above the other two "
        "(the printed losses and the assertion under them)": "D",
    },
))

register(Question(
    name="ch10.q_smoothed_target",
    title="label smoothing 0.1, V = 4: the probability of the right token that minimises the loss",
    kind="number", answer=0.925, points=1,
    mistakes={
        "1 - eps is the weight of the plain term; the smoothing term spreads eps over all V tokens, the right one "
        "included, so the right token's target is 1 - eps + eps / V": 0.9,
        "1 is the optimum of plain cross-entropy; with eps > 0 certainty costs (margin 30 costs more than "
        "margin 4)": 1,
        "eps / V is the target of each wrong token, not of the right one": 0.025,
    },
    hint="the loss is a cross-entropy against the target (1 - eps) one_hot(y) + eps / V: it is smallest when the "
         "model's distribution equals that target.",
))
