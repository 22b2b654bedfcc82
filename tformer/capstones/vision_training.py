"""Chapter 12's recipes in its notebook: an image classifier (ViT) and a CLIP-style aligner, trained with
`tformer.training.Trainer`.

Both use the ViT/CLIP recipe: AdamW without decay on biases, norms, positions and the class token
(`tformer.training.adamw`), linear warmup then a half cosine to 0 (`schedules.CosineSchedule`), no gradient clipping,
fp32 on a CPU; on a CUDA GPU the device policy's autocast (bf16 on sm80+, fp16 with a gradient scaler on
a T4). Batches are drawn from one `torch.Generator` (shuffling, captions, augmentation), so a seed gives
the same run; a batch moves to the training device before it is augmented (on a GPU the augmentation runs
there; its random draws stay on the CPU generator). Each returns a `History`: the loss of every step, test
accuracy after every epoch.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data.captions import caption_ids
from ..data.images import ImageCaptions, ImageSplit
from ..training.metrics import accuracy
from ..training.trainer import Trainer, TrainConfig, adamw


@dataclass
class History:
    loss: list[float] = field(default_factory=list)        # training loss per step
    test_acc: list[float] = field(default_factory=list)    # test accuracy after each epoch
    seconds: float = 0.0


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Logits for x in batches (eval mode, restored afterwards)."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = torch.cat([model(x[i:i + batch_size].to(dev)).float().cpu() for i in range(0, len(x), batch_size)])
    model.train(was)
    return out


class ImageBatches:
    """(images, labels) batches of a shuffled pass over x (N, C, H, W), y (N,); `augment(x, generator)`
    transforms each batch, after moving it to `device` (None: where x is), so a GPU run augments on the GPU.
    Every pass draws a new order from `generator`."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator, augment=None,
                 device: torch.device | str | None = None):
        self.x, self.y, self.batch_size, self.g, self.augment = x, y, batch_size, generator, augment
        self.device = device

    def __len__(self) -> int:
        return math.ceil(len(self.y) / self.batch_size)

    def __iter__(self):
        perm = torch.randperm(len(self.y), generator=self.g)
        for i in range(0, len(self.y), self.batch_size):
            idx = perm[i:i + self.batch_size]
            x = self.x[idx] if self.device is None else self.x[idx].to(self.device, non_blocking=True)
            yield (self.augment(x, generator=self.g) if self.augment is not None else x), self.y[idx]


class CaptionBatches:
    """(images, caption ids) batches: each image of a shuffled pass meets one of its captions, drawn at
    random. A batch of one image is skipped (it has no negative). The images move to `device` (None: where
    they are) before `augment(x, generator)` transforms them."""

    def __init__(self, data: ImageCaptions, batch_size: int, context_length: int, generator: torch.Generator,
                 augment=None, device: torch.device | str | None = None):
        self.data, self.batch_size, self.ctx, self.g, self.augment = data, batch_size, context_length, generator, augment
        self.device = device

    def __iter__(self):
        n, caps = len(self.data), self.data.captions
        perm = torch.randperm(n, generator=self.g)
        for i in range(0, n, self.batch_size):
            idx = perm[i:i + self.batch_size]
            if len(idx) < 2:                                # a batch of one has no negatives
                continue
            pick = torch.randint(0, 1 << 30, (len(idx),), generator=self.g)
            texts = [caps[j][int(p) % len(caps[j])] for j, p in zip(idx.tolist(), pick)]
            x = self.data.images[idx]
            if self.device is not None:
                x = x.to(self.device, non_blocking=True)
            if self.augment is not None:
                x = self.augment(x, generator=self.g)
            yield x, caption_ids(texts, self.ctx)


def _on_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _batch_device(device) -> torch.device | None:
    """Where the batches are augmented: the training device when it is a CUDA GPU; None (where the data is,
    the CPU) otherwise."""
    return torch.device(device) if _on_cuda(device) else None


def _fit(model: nn.Module, loss_fn, batches, total: int, lr: float, weight_decay: float, warmup_frac: float,
         betas: tuple[float, float], eps: float, device, progress: bool, val_fn=None, eval_every: int = 0) -> History:
    """The Trainer with the ViT/CLIP recipe for `total` steps; the History of the run. On a CUDA device under
    the policy's autocast (`TrainConfig.amp`); elsewhere in float32."""
    if total == 0:
        return History()
    model.to(device)
    cfg = TrainConfig(max_steps=total, lr=lr, schedule="cosine", warmup=max(1, int(warmup_frac * total)),
                      grad_clip=None, amp=_on_cuda(device), eval_every=eval_every, log_every=1, seed=None, progress=progress,
                      rate=None)
    t0 = time.perf_counter()
    trainer = Trainer(model, loss_fn, batches, cfg, val_fn=val_fn, device=device,
                      optimizer=adamw(model, lr, weight_decay, betas, eps))
    records = trainer.fit()["history"]
    return History(loss=[r["loss"] for r in records if "loss" in r],
                   test_acc=[r["test_acc"] for r in records if "test_acc" in r], seconds=time.perf_counter() - t0)


def train_classifier(model: nn.Module, data: ImageSplit, epochs: int = 10, batch_size: int = 64, lr: float = 1e-3,
                     weight_decay: float = 0.05, warmup_frac: float = 0.1, label_smoothing: float = 0.0,
                     augment=None, max_steps: int | None = None, device: torch.device | str = "cpu",
                     seed: int = 0, progress: bool = True) -> History:
    """Train `model` (images -> logits) with AdamW and warmup + cosine decay; evaluate each epoch.

    `augment(x, generator)` transforms a training batch; `max_steps` stops early (smoke tests).
    """
    batches = ImageBatches(data.x_train, data.y_train, batch_size, torch.Generator().manual_seed(seed), augment,
                           device=_batch_device(device))
    total = epochs * len(batches) if max_steps is None else min(max_steps, epochs * len(batches))

    def loss_fn(m, batch):                          # (mean over the batch, 1): one micro-batch a step
        x, y = batch
        return F.cross_entropy(m(x), y, label_smoothing=label_smoothing), 1

    def test_accuracy(m):
        return {"test_acc": accuracy(predict(m, data.x_test), data.y_test)}
    return _fit(model, loss_fn, batches, total, lr, weight_decay, warmup_frac, (0.9, 0.999), 1e-8, device, progress,
                val_fn=test_accuracy, eval_every=len(batches))


def train_clip(model: nn.Module, data: ImageCaptions, epochs: int = 10, batch_size: int = 128, lr: float = 5e-4,
               weight_decay: float = 0.1, warmup_frac: float = 0.1, augment=None, max_steps: int | None = None,
               device: torch.device | str = "cpu", seed: int = 0, progress: bool = True) -> History:
    """Train a `CLIP` on image-caption pairs: each step, every image of the batch meets one of its captions
    drawn at random; AdamW with warmup + cosine decay; `History.loss` per step. Only parameters with
    requires_grad train (freeze `model.visual` for a locked image tower, as in LiT)."""
    n = len(data)
    if n < 2 or batch_size < 2:
        raise ValueError(f"train_clip: a contrastive batch needs at least 2 pairs; got {n} pairs, batch_size={batch_size}")
    batches = CaptionBatches(data, batch_size, model.cfg.context_length, torch.Generator().manual_seed(seed), augment,
                             device=_batch_device(device))
    total = epochs * math.ceil(n / batch_size)
    total = total if max_steps is None else min(max_steps, total)
    # the contrastive loss is a mean over the whole batch (every pair is the others' negatives): (mean, 1)
    return _fit(model, lambda m, batch: (m.loss(*batch), 1), batches, total, lr, weight_decay, warmup_frac,
                (0.9, 0.98), 1e-6, device, progress)
