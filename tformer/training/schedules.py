"""Learning-rate schedules (chapter 10): the paper's warmup then 1/sqrt(step), and the usual alternatives.

    lr(step) = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)        (Vaswani et al. 2017, eq. 3)

rises linearly for `warmup` steps, then decays as 1/sqrt(step).
"""
from __future__ import annotations

import math

import torch



def noam_lr(step: int, d_model: int, warmup: int = 4000, factor: float = 1.0) -> float:
    """The paper's learning rate at optimizer step `step` (counted from 1).

    factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); the peak, at step == warmup, is
    factor / sqrt(d_model * warmup).
    """
    if step < 1:
        raise ValueError(f"noam_lr: steps are counted from 1, got step={step}")
    if warmup < 1 or d_model < 1:
        raise ValueError(f"noam_lr: expected warmup >= 1 and d_model >= 1, got warmup={warmup}, d_model={d_model}")
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


class Schedule:
    """A learning-rate multiplier for `LambdaLR`: `schedule(i)` for optimizer step i (counted from 0).

    One interface for the Trainer: before every scheduler step it calls `set_progress(p)` with the
    fraction p (0..1) of the run done, the larger of steps / max_steps and time / time budget. A schedule
    that ends with the run (`LinearDecaySchedule`, `CosineSchedule`) reads `self.progress`; the others
    ignore it. A class, not a lambda, so that `LambdaLR` saves its state (warmup, progress) with the run.
    """

    progress: float = 0.0

    def set_progress(self, progress: float) -> None:
        self.progress = progress

    def __call__(self, i: int) -> float:
        raise NotImplementedError


class InverseSqrtSchedule(Schedule):
    """The paper's schedule (`noam_lr`) divided by its peak: linear warmup to 1 at `warmup`, then
    sqrt(warmup / step).

    With the optimizer's lr set to the peak lr this is `noam_lr` rescaled to that peak; with
    lr = (d_model * warmup)^-0.5 it is exactly `noam_lr`. `LambdaLR` counts from 0: the first optimizer
    step uses step 1.
    """

    def __init__(self, warmup: int):
        if warmup < 1:
            raise ValueError(f"InverseSqrtSchedule: expected warmup >= 1, got {warmup}")
        self.warmup = warmup

    def __call__(self, i: int) -> float:
        return noam_lr(i + 1, 1, self.warmup) / noam_lr(self.warmup, 1, self.warmup)   # d_model cancels


class ConstantSchedule(Schedule):
    """Multiplier 1 after an optional linear warmup (for the "no decay" comparison)."""

    def __init__(self, warmup: int = 0):
        self.warmup = warmup

    def __call__(self, i: int) -> float:
        return min(1.0, (i + 1) / self.warmup) if self.warmup > 0 else 1.0


class LinearDecaySchedule(Schedule):
    """Multiplier min(step / warmup, 1 - progress): linear warmup, then a straight line to 0 at the run's end.

    `progress` is the fraction of the run done (0..1): the larger of step / max_steps and elapsed / time
    budget, which the Trainer sets (`set_progress`) before every scheduler step. So a run stopped by its
    time budget still ends with the learning rate at 0, which is what a short, budgeted run wants: the
    loss drops sharply while the lr anneals, and an inverse-square-root schedule never anneals.
    """

    def __init__(self, warmup: int):
        if warmup < 1:
            raise ValueError(f"LinearDecaySchedule: expected warmup >= 1, got {warmup}")
        self.warmup = warmup
        self.progress = 0.0

    def __call__(self, i: int) -> float:
        return max(0.0, min((i + 1) / self.warmup, 1.0 - self.progress))


class CosineSchedule(Schedule):
    """Multiplier: linear warmup to 1 over `warmup` steps, then a half cosine down to 0 at the run's end
    (ViT and CLIP training, chapter 12).

    The end is step `total` or, when the Trainer reports more of the run done (`progress`, as for
    `LinearDecaySchedule`: a time budget running out first), that point: the cosine reaches 0 either way.
    """

    def __init__(self, warmup: int, total: int):
        if warmup < 1 or total < 1:
            raise ValueError(f"CosineSchedule: expected warmup >= 1 and total >= 1, got warmup={warmup}, total={total}")
        self.warmup, self.total = warmup, total
        self.progress = 0.0

    def __call__(self, i: int) -> float:
        if i < self.warmup:
            return (i + 1) / self.warmup
        span = max(1, self.total - self.warmup)
        done = (i - self.warmup) / span                                  # by steps
        by_time = (self.progress * self.total - self.warmup) / span      # progress, mapped past the warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, max(done, by_time))))


SCHEDULES = {"noam": InverseSqrtSchedule, "constant": ConstantSchedule, "linear": LinearDecaySchedule,
             "cosine": CosineSchedule}


class RunScheduler(torch.optim.lr_scheduler.LambdaLR):
    """A `LambdaLR` over `Schedule`s (one per parameter group, or one for all). `set_progress(p)` passes
    the fraction p of the run done to each; the Trainer calls it before every step."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule | list[Schedule], last_epoch: int = -1):
        for fn in schedule if isinstance(schedule, list) else [schedule]:
            if not isinstance(fn, Schedule):
                raise TypeError(f"RunScheduler: expected a tformer.training.Schedule (e.g. InverseSqrtSchedule), "
                                f"got {type(fn).__name__}")
        super().__init__(optimizer, schedule, last_epoch)

    def set_progress(self, progress: float) -> None:
        for fn in self.lr_lambdas:
            fn.set_progress(progress)


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str = "noam", warmup: int = 4000,
                   total: int | None = None) -> RunScheduler:
    """A `RunScheduler` around the optimizer: kind "noam" (inverse square root), "constant", "linear"
    (linear decay to 0 at the end of the run; the Trainer keeps its progress up to date) or "cosine"
    (half cosine to 0 at step `total`, which it needs)."""
    if kind not in SCHEDULES:
        raise ValueError(f"make_scheduler: kind must be one of {sorted(SCHEDULES)}, got {kind!r}")
    if kind == "cosine":
        if total is None:
            raise ValueError("make_scheduler: the cosine schedule needs total= (the run's optimizer steps)")
        return RunScheduler(optimizer, CosineSchedule(warmup, total))
    return RunScheduler(optimizer, SCHEDULES[kind](warmup))
