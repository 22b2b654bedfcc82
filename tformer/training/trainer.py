"""The Trainer (chapter 10, reused by chapters 11-13): a model, a loss over one batch, batches.

    lr(step) = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)        (Vaswani et al. 2017, eq. 3)

rises linearly for `warmup` steps, then decays as 1/sqrt(step). Adam(0.9, 0.98, 1e-9), label smoothing
0.1 and dropout 0.1 complete the recipe.

`Trainer` is generic: a model, a loss function over one batch, and an iterable of batches.

    def loss_fn(model, batch):                   # returns (sum of per-item losses, item count), always
        src, tgt_in, tgt_out = batch
        logits = model(src, tgt_in)
        return label_smoothed_cross_entropy(logits, tgt_out, 0.1, ignore_index=0, reduction="sum"), \
               (tgt_out != 0).sum()

    trainer = Trainer(model, loss_fn, batches, TrainConfig(max_steps=1000, warmup=100, lr=1e-3), out_dir="runs/x")
    out = trainer.fit()                          # resumes from runs/x/last.pt when it exists
    out["val_loss"], out["history"]              # the last record; every record of the run, resumes included

It gives: a tqdm progress bar, gradient accumulation and clipping, bf16 autocast on CUDA, periodic
validation, atomic checkpoints (a temporary file then `os.replace`, so a crash never leaves a torn
file; the previous full checkpoint stays beside the newest as last.prev.pt, and resume falls back to it
when last.pt is unreadable), exact resume (model, optimizer, scheduler, RNG states, data position: an interrupted and
resumed run ends with the same weights as an uninterrupted one), a time budget, the last few weight
snapshots for checkpoint averaging, and DistributedDataParallel when launched by `torchrun`.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from ..utils.device import amp_dtype, resolve as resolve_device
from ..utils.gpu import grad_scaler
from .checkpoint import CheckpointError, atomic_save, load_checkpoint, previous_path, rng_state, set_rng_state
from .distributed import is_distributed
from .schedules import RunScheduler, make_scheduler


def fusable(params) -> bool:
    """Whether torch's fused Adam/AdamW kernel can update `params` (floating-point tensors on a CPU or a
    CUDA GPU). The fused kernel updates every parameter in one pass; the default (`foreach`) runs a
    chain of whole-list operations, each one a trip through memory. Every optimizer the package builds
    passes `fused=fusable(params)`, as Hugging Face's Trainer does by default since torch 2.8
    (`python benchmarks/bench_optim.py` times the two)."""
    params = list(params)
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def adamw(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, without weight decay on biases, norms (1-d parameters),
    position embeddings or a class token (the ViT / CLIP recipe); the fused kernel where it runs."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    decays = [p.dim() >= 2 and "pos_embed" not in name and "cls_token" not in name for name, p in named]
    return torch.optim.AdamW([{"params": [p for (_, p), d in zip(named, decays) if d], "weight_decay": weight_decay},
                              {"params": [p for (_, p), d in zip(named, decays) if not d], "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, fused=fusable(p for _, p in named))



@dataclass
class TrainConfig:
    max_steps: int = 1000              # optimizer steps in all (a resumed run counts from where it stopped)
    time_budget: float | None = None   # minutes of training (summed over resumes); None = no limit
    lr: float = 1e-3                   # peak learning rate (reached at the end of warmup)
    schedule: str = "noam"             # "noam" (warmup, then 1/sqrt(step)), "constant" (warmup, then flat),
                                       # "linear" (warmup, then down to 0 at max_steps or the time budget)
                                       # or "cosine" (warmup, then a half cosine to 0 at max_steps)
    warmup: int = 4000                 # warmup steps (the paper: 4000)
    betas: tuple[float, float] = (0.9, 0.98)  # Adam betas (the paper)
    adam_eps: float = 1e-9             # Adam epsilon (the paper)
    weight_decay: float = 0.0          # Adam's coupled L2 penalty (for decoupled decay pass optimizer=adamw(...)); 0 = paper
    grad_clip: float | None = 1.0      # max global gradient norm; None = no clipping
    accum_steps: int = 1               # micro-batches per optimizer step
    amp: bool = True                   # CUDA autocast: bf16 on sm80+, fp16 + grad scaler before (ignored on CPU)
    cpu_bf16: bool = False             # ... and bf16 autocast on a CPU with bf16 matrix units (AMX, AVX512-BF16)
    eval_every: int = 0                # validate every N steps (0 = only at the end)
    save_every: int = 0                # full checkpoint (last.pt) every N steps (0 = only at the end)
    snapshot_every: int = 0            # weights-only snapshot for averaging every N steps (0 = off)
    snapshot_minutes: float = 0.0      # ... or every M minutes of training (0 = off)
    keep_snapshots: int = 5            # snapshots kept for checkpoint averaging
    log_every: int = 10                # steps between progress-bar/log updates
    rate: str | None = "tok_s"         # the progress bar's name for loss_fn's count per second (None: not shown,
                                       # for a loss_fn that counts 1 a step: the bar's it/s says it)
    seed: int | None = 0               # seeds torch/python at the start of a fresh run; None: leave them as they are
    progress: bool = True              # tqdm progress bar and validation lines (TQDM_DISABLE=1 also turns them off)
    resume: bool = True                # continue from out_dir/last.pt when it exists


@dataclass
class TrainState:
    step: int = 0                      # optimizer steps done
    epoch: int = 0                     # passes over the training data begun
    batch_in_epoch: int = 0            # micro-batches of the current epoch consumed
    elapsed: float = 0.0               # seconds of training (excludes validation)
    tokens: float = 0.0                # items counted by the loss (target tokens), all ranks
    history: list = field(default_factory=list)


LossOut = tuple[torch.Tensor, torch.Tensor | int | float]    # (sum of per-item losses, item count)


def _sum_and_count(out) -> tuple[torch.Tensor, torch.Tensor | int | float]:
    """A loss_fn's result as (sum, count), or a TypeError saying what a loss_fn returns."""
    try:
        loss_sum, count = out
    except (TypeError, ValueError):
        raise TypeError(f"Trainer: loss_fn must return (sum of per-item losses, item count), got "
                        f"{type(out).__name__}{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}; "
                        f"for a mean over the batch return (mean, 1)") from None
    return loss_sum, count


class Trainer:
    """Train `model` on `train_data` with `loss_fn`; see the module docstring for an example.

    model       an `nn.Module`; moved to `device`; wrapped in DistributedDataParallel when a process
                group is running (`setup_distributed()` under torchrun). `trainer.module` is the bare model.
    loss_fn     loss_fn(model, batch) -> (sum of per-item losses, item count), always. The trainer
                divides by the total count over micro-batches and ranks, so every token weighs the same
                however the batch was split (a loss that is a mean over its batch: (mean, 1), every
                micro-batch then weighs the same). Call `model(...)` (its forward)
                so that DDP sees the computation. Batches are moved to `device` first (tensors, or
                tuples/lists/dicts of tensors).
    train_data  a re-iterable of batches, iterated epoch after epoch. For exact resume its order must
                depend only on the epoch: give it `set_epoch(epoch)` (like `TokenBatcher` or a
                DistributedSampler); on resume the consumed batches of the current epoch are skipped.
    val_data    optional re-iterable of batches: validation loss with the same loss_fn, model in eval mode.
    val_fn      optional val_fn(model) -> dict of extra metrics (e.g. BLEU), run at each validation.
    optimizer   default Adam(betas, eps) at cfg.lr.
    scheduler   a `RunScheduler` (default `make_scheduler(cfg.schedule, cfg.warmup)`): before every step the
                trainer tells it the fraction of the run done (`set_progress`), then steps it.
    out_dir     where last.pt, snapshots and log.jsonl go; None = keep nothing on disk.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, Any], LossOut], train_data: Iterable,
                 config: TrainConfig | None = None, *, val_data: Iterable | None = None,
                 val_fn: Callable[[nn.Module], dict] | None = None, optimizer: torch.optim.Optimizer | None = None,
                 scheduler=None, out_dir: str | os.PathLike | None = None, device: torch.device | str | None = None,
                 extra_state: dict | None = None):
        self.cfg = config or TrainConfig()
        self.device = resolve_device(device)     # tformer.utils.device: --device, else CUDA, else MPS, else CPU
        self.module = model.to(self.device)
        self.rank = dist.get_rank() if is_distributed() else 0
        self.world = dist.get_world_size() if is_distributed() else 1
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DDP(self.module, device_ids=ids)
        else:
            self.model = self.module
        self.loss_fn, self.train_data, self.val_data, self.val_fn = loss_fn, train_data, val_data, val_fn
        self.optimizer = optimizer or torch.optim.Adam(self.module.parameters(), lr=self.cfg.lr, betas=self.cfg.betas,
                                                       eps=self.cfg.adam_eps, weight_decay=self.cfg.weight_decay,
                                                       fused=fusable(self.module.parameters()))
        self.scheduler = scheduler or make_scheduler(self.optimizer, self.cfg.schedule, self.cfg.warmup,
                                                     total=self.cfg.max_steps)
        if not isinstance(self.scheduler, RunScheduler):
            raise TypeError(f"Trainer: scheduler must be a tformer.training.RunScheduler (make_scheduler(...), or "
                            f"RunScheduler(optimizer, schedule) with a Schedule), got {type(self.scheduler).__name__}")
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.extra_state = extra_state or {}    # saved with last.pt (e.g. the run's model config)
        self.amp_dtype = (amp_dtype(self.device, cpu_bf16=self.cfg.cpu_bf16)   # tformer.utils.device: the policy
                          if self.cfg.amp else None)
        self.scaler = grad_scaler(self.amp_dtype, self.device)                # only fp16 scales the loss
        self.state = TrainState()
        self._resumed = False
        self.resumed_from: Path | None = None
        if self.out_dir is not None and self.cfg.resume:
            self._resume()

    def _resume(self) -> None:
        """Load the newest readable full checkpoint: last.pt, else the one before it (last.prev.pt)."""
        found = [p for p in (self.out_dir / "last.pt", previous_path(self.out_dir / "last.pt")) if p.exists()]
        errors = []
        for path in found:
            try:
                self.load(path)
            except CheckpointError as e:
                errors.append(str(e))
                continue
            if errors and self.rank == 0:
                print(f"warning: {errors[0]}; resuming from {path.name} (step {self.state.step}) instead",
                      file=sys.stderr)
            self._resumed, self.resumed_from = True, path
            return
        if errors:
            raise CheckpointError(f"cannot resume: {'; '.join(errors)}. Delete the folder to start again, "
                                  f"or train into another --out")

    # -- helpers ---------------------------------------------------------------------------------------
    def _autocast(self):
        if self.amp_dtype is not None:
            return torch.autocast(self.device.type, dtype=self.amp_dtype)
        return nullcontext()

    def _to_device(self, batch):
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, (list, tuple)):
            moved = [self._to_device(b) for b in batch]
            return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
        if isinstance(batch, dict):
            return {k: self._to_device(v) for k, v in batch.items()}
        return batch

    def _batches(self):
        """Endless micro-batches; keeps `state.epoch` / `state.batch_in_epoch` at the data position."""
        st = self.state
        while True:
            if hasattr(self.train_data, "set_epoch"):
                self.train_data.set_epoch(st.epoch)
            n = 0
            for i, batch in enumerate(self.train_data):
                n += 1
                if i < st.batch_in_epoch:             # consumed before the interruption
                    continue
                st.batch_in_epoch = i + 1
                yield batch
            if n == 0:
                raise ValueError("Trainer: train_data yielded no batches")
            st.epoch += 1
            st.batch_in_epoch = 0

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        st = self.state
        rng = [rng_state()]
        if self.world > 1:                          # every rank's RNG (dropout masks differ per rank)
            rng = [None] * self.world
            dist.all_gather_object(rng, rng_state())
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(), "rng": rng, "world": self.world,
                "train": {k: v for k, v in asdict(st).items()}, "config": asdict(self.cfg), "extra": self.extra_state}

    def save(self, path: str | os.PathLike | None = None) -> None:
        """Full checkpoint (atomic). All ranks must call it (it gathers their RNG states); rank 0 writes."""
        sd = self.state_dict()
        if self.rank == 0:                          # the checkpoint it replaces stays as last.prev.pt
            atomic_save(sd, path or self.out_dir / "last.pt", keep_previous=path is None)

    def load(self, path: str | os.PathLike) -> None:
        """Restore everything `save` wrote: weights, optimizer, scheduler, RNG, data position, history."""
        ck = load_checkpoint(path)
        if not isinstance(ck, dict) or not {"model", "optimizer", "scheduler", "train", "rng"} <= ck.keys():
            raise CheckpointError(f"{path} is not a full training checkpoint (written by Trainer.save)")
        try:
            self.module.load_state_dict(ck["model"])
        except RuntimeError as e:
            raise CheckpointError(f"{path} does not fit this model: {str(e).splitlines()[0]}") from e
        self.optimizer.load_state_dict(ck["optimizer"])
        self.scheduler.load_state_dict(ck["scheduler"])
        if ck.get("scaler"):
            self.scaler.load_state_dict(ck["scaler"])
        self.state = TrainState(**ck["train"])
        rng = ck["rng"]
        set_rng_state(rng[self.rank] if len(rng) == self.world else rng[0])

    def _snapshot(self) -> None:
        """Weights only, for checkpoint averaging; keeps the last `keep_snapshots`."""
        if self.rank != 0 or self.out_dir is None:
            return
        atomic_save(self.module.state_dict(), self.out_dir / f"snapshot_{self.state.step:07d}.pt")
        for old in self.snapshots()[:-self.cfg.keep_snapshots]:
            old.unlink(missing_ok=True)

    def snapshots(self) -> list[Path]:
        """Weight snapshots on disk, oldest first."""
        return sorted(self.out_dir.glob("snapshot_*.pt")) if self.out_dir is not None else []

    # -- evaluation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation loss over `val_data` (+ `val_fn`'s metrics), model in eval mode. Rank 0 only."""
        out: dict = {}
        if self.rank != 0:
            return out
        was_training = self.module.training
        self.module.eval()
        try:
            if self.val_data is not None:
                total, count = 0.0, 0.0
                for batch in self.val_data:
                    with self._autocast():
                        loss_sum, n = _sum_and_count(self.loss_fn(self.module, self._to_device(batch)))
                    total += float(loss_sum)
                    count += float(n)
                out["val_loss"] = total / max(count, 1e-9)
            if self.val_fn is not None:
                out.update(self.val_fn(self.module))
        finally:
            self.module.train(was_training)
        return out

    # -- training --------------------------------------------------------------------------------------
    def train_step(self, micro_batches: list) -> tuple[float, float]:
        """One optimizer step over `micro_batches`; returns (mean loss, count) over all ranks."""
        model = self.model
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        count = torch.zeros((), device=self.device, dtype=torch.float64)
        for j, batch in enumerate(micro_batches):
            sync = j == len(micro_batches) - 1 or self.world == 1
            with nullcontext() if sync else model.no_sync():
                with self._autocast():
                    loss, n = _sum_and_count(self.loss_fn(model, self._to_device(batch)))
                self.scaler.scale(loss).backward()          # the gradient of the sum: normalised below
            loss_sum += loss.detach().double()
            count += float(n)
        stats = torch.stack([loss_sum, count])
        if self.world > 1:
            dist.all_reduce(stats)
        # DDP averaged the gradients of per-rank sums: scale so the gradient is of (global sum / global count)
        scale = self.world / max(float(stats[1]), 1e-12)
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        mean = float(stats[0] / stats[1])
        self.scaler.unscale_(self.optimizer)               # fp16: back to true gradients before clipping
        if self.cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)                    # fp16: skipped when a gradient overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return mean, float(stats[1])

    def _progress(self) -> float:
        """Fraction of the run done: steps against max_steps, training time against the time budget."""
        cfg, st = self.cfg, self.state
        done = st.step / max(cfg.max_steps, 1)
        if cfg.time_budget:
            done = max(done, st.elapsed / (cfg.time_budget * 60.0))
        return min(done, 1.0)

    def fit(self, steps: int | None = None) -> dict:
        """Train until `cfg.max_steps` or the time budget (or `steps` more steps, to stop early on purpose).

        Returns the last log record (step, loss, lr, tokens_per_s, minutes and the validation metrics) with
        "history": every record of the whole run in order, the steps before a resume included, each step
        once (`state.history`, which last.pt carries; log.jsonl repeats the steps a crash made it replay).
        Writes last.pt (and validates) at the end.
        """
        from tqdm import tqdm

        cfg, st = self.cfg, self.state
        if st.step == 0 and not self._resumed and cfg.seed is not None:
            torch.manual_seed(cfg.seed + self.rank)
            random.seed(cfg.seed + self.rank)
        stop_at = cfg.max_steps if steps is None else min(cfg.max_steps, st.step + steps)
        budget = None if cfg.time_budget is None else cfg.time_budget * 60.0
        quiet = os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")   # an explicit disable= beats tqdm's env
        bar = tqdm(total=cfg.max_steps, initial=st.step, disable=not cfg.progress or self.rank != 0 or quiet,
                   desc="train", dynamic_ncols=True)
        self.module.train()
        batches = self._batches()
        last_snap = st.elapsed
        saved_at = st.step if self._resumed else None      # last.pt already holds this step
        record: dict = {}
        win_loss, win_n, win_tok, win_t = 0.0, 0, 0.0, 0.0
        while st.step < stop_at and (budget is None or st.elapsed < budget):
            t0 = time.perf_counter()
            micro = [next(batches) for _ in range(cfg.accum_steps)]
            loss, n = self.train_step(micro)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if self.world > 1:                      # rank 0's clock for all: same lr, same stopping step
                t = torch.tensor([dt], dtype=torch.float64, device=self.device)
                dist.broadcast(t, 0)
                dt = float(t)
            st.step += 1
            st.elapsed += dt
            self.scheduler.set_progress(self._progress())   # what a schedule that ends with the run needs
            self.scheduler.step()
            st.tokens += n
            win_loss += loss; win_n += 1; win_tok += n; win_t += dt
            if not math.isfinite(loss):
                raise FloatingPointError(f"Trainer: loss became {loss} at step {st.step} (lr too high? no warmup?)")
            bar.update(1)
            if st.step % cfg.log_every == 0 or st.step == stop_at:
                record = {"step": st.step, "loss": win_loss / win_n, "lr": self.scheduler.get_last_lr()[0],
                          "tokens_per_s": win_tok / max(win_t, 1e-9), "minutes": st.elapsed / 60}
                left = {} if budget is None else {"left": f"{max(budget - st.elapsed, 0) / 60:.1f}min"}
                rate = {cfg.rate: f"{record['tokens_per_s']:.0f}"} if cfg.rate else {}
                bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}", **rate, **left)
                self._log(record)
                win_loss, win_n, win_tok, win_t = 0.0, 0, 0.0, 0.0
            if cfg.eval_every and st.step % cfg.eval_every == 0 and st.step < stop_at:
                self._log({"step": st.step, "minutes": st.elapsed / 60, **self.evaluate()}, bar)
            if (cfg.snapshot_every and st.step % cfg.snapshot_every == 0) or (
                    cfg.snapshot_minutes and st.elapsed - last_snap >= cfg.snapshot_minutes * 60):
                self._snapshot()
                last_snap = st.elapsed
            if self.out_dir is not None and cfg.save_every and st.step % cfg.save_every == 0:
                self.save()
                saved_at = st.step
        bar.close()
        if self.out_dir is not None and saved_at != st.step:   # before validating: the RNG state saved is the step's
            self.save()
        final = {"step": st.step, "minutes": st.elapsed / 60, **self.evaluate()}
        if final.keys() - {"step", "minutes"}:
            self._log(final)
        return {**record, **final, "history": list(st.history)}

    def _log(self, record: dict, bar=None) -> None:
        self.state.history.append(record)
        if bar is not None and not bar.disable and len(record) > 2:     # progress=False: no lines either
            bar.write("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()))
        if self.out_dir is not None and self.rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / "log.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")


def train_steps(model: nn.Module, loss_fn: Callable[[nn.Module, Any], LossOut], batches: Iterable, steps: int,
                lr: float, schedule: str = "linear", weight_decay: float = 0.0,
                device: torch.device | str | None = None) -> list[float]:
    """Chapter 11's short runs (pretraining, SFT, LoRA, DPO) in one call: AdamW(0.9, 0.95) over the
    parameters that require grad (so LoRA trains only its adapters), warmup over the first 10% of `steps`,
    then `schedule`; no progress bar, nothing on disk. Returns the logged training losses."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay, fused=fusable(params))
    cfg = TrainConfig(max_steps=steps, lr=lr, schedule=schedule, warmup=max(1, steps // 10), log_every=10,
                      progress=False)
    history = Trainer(model, loss_fn, batches, cfg, optimizer=opt, device=device).fit()["history"]
    return [r["loss"] for r in history if "loss" in r]
