"""The `clip` capstone (chapter 12): a CLIP-style aligner on scikit-learn's digits, LiT-style, 3 seeds.

For each seed a tower of the vit recipe (vit_digits.py; with mild augmentation, 30 epochs), frozen, and a
byte-level text tower trained to align with it on captions from TRAIN_TEMPLATES. The headline is zero-shot
accuracy with ZERO_SHOT_TEMPLATES (never seen in training; the ten classes were seen), with recall@1 both
ways. The tower of a seed is taken from runs/capstone-vit when that run trained it with this very recipe.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from ..data.captions import CAPTION_VOCAB, TRAIN_TEMPLATES, ZERO_SHOT_TEMPLATES, caption_ids, digit_captions
from ..data.images import load_digits
from ..models.clip import CLIP, CLIPConfig
from ..models.vit import ViT
from ..training.metrics import accuracy, recall_at_k
from ..training.trainer import Trainer, adamw
from .base import Capstone, overlay
from .runfolder import CapstoneRun
from .vit_digits import EpochImageBatches, VitDigits, curve, figure, load_vit, steps, trainer_config, vit_part


class ClipDigits(Capstone):
    name, chapter = "clip", 12
    summary = "a CLIP-style aligner on digits (LiT: vit's tower frozen): zero-shot accuracy"
    RECIPE = {
        # the tower: vit's recipe with mild augmentation, which transfers better (zero-shot, 3 seeds each: 92.7%
        # on augmented towers, 89.3% on the unaugmented ones that score higher as classifiers; both before the
        # captions had word dropout); 30 epochs in 70% of the capstone's 10 minutes
        "tower": overlay(copy.deepcopy(VitDigits.RECIPE), {"augment": dict(shift=0.5, degrees=10.0, scale=0.1),
                                                           "train": dict(epochs=30), "budget_minutes": 7.0}),
        "text": dict(context_length=40, text_d_model=64, text_n_layers=2, text_n_heads=4, text_d_ff=128, embed_dim=64),
        "train": dict(epochs=20, batch_size=64, lr=3e-3, weight_decay=0.05, warmup_frac=0.1, word_dropout=0.3),
        "seeds": [0, 1, 2],
        "budget_minutes": 10.0,
    }
    TINY = {"tower": VitDigits.TINY, "text": dict(text_d_model=16, text_d_ff=32, text_n_layers=1, embed_dim=16),
            "train": dict(epochs=2), "seeds": [0, 1]}

    def run(self, run: CapstoneRun) -> dict:
        recipe = run.config
        data = load_digits()
        seeds, tc, ctx = recipe["seeds"], recipe["train"], recipe["text"]["context_length"]
        tower_share = 0.7 / len(seeds)                       # of the capstone's budget: the towers, then the aligners
        parts = []
        for seed in seeds:
            reuse_vit_tower(run, recipe["tower"], seed)
            vit_part(run, data, recipe["tower"], seed, run.part_budget(tower_share, recipe["budget_minutes"]))

            def train(folder: Path, seed=seed):
                tower = load_vit(run, recipe["tower"], seed)
                torch.manual_seed(seed)                        # the text tower's initial weights: the seed's alone
                model = clip_model(recipe, tower)
                batches = EpochCaptionBatches(data.x_train, data.y_train, tc["batch_size"], seed, ctx, tc.get("word_dropout", 0.0))
                total = steps(len(data.y_train), tc, recipe.get("max_steps"))
                budget = run.part_budget(0.3 / len(seeds), recipe["budget_minutes"])
                cfg = trainer_config(total, tc["warmup_frac"], tc["lr"], budget, run.opts.progress, seed)
                cfg.eval_every = len(batches)
                trainer = Trainer(model, lambda m, b: (m.loss(*b), 1), batches, cfg, out_dir=folder,
                                  val_fn=lambda m: {"test_acc": evaluate_clip(m, data, ctx)["zero_shot"]},
                                  optimizer=adamw(model, tc["lr"], tc["weight_decay"], (0.9, 0.98), 1e-6))
                rec = trainer.fit(steps=run.opts.stop_after)
                st = trainer.state
                if not (st.step >= total or (budget is not None and st.elapsed >= budget * 60)):
                    return None
                ev = evaluate_clip(trainer.module.cpu(), data, ctx)
                return {"seed": seed, **{k: round(v, 4) for k, v in ev.items()}, "steps": st.step,
                        "minutes": round(st.elapsed / 60, 3), "temperature": round(1 / float(trainer.module.scale().detach()), 4),
                        "curve": curve(rec["history"])}
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
        return run.finish(result, report, {"curves.png": figure(result, "test_acc", "zero-shot accuracy")})


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


def reuse_vit_tower(run: CapstoneRun, tower: dict, seed: int) -> None:
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
