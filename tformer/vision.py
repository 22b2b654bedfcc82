"""Image data and training helpers for chapter 12 (ViT and the CLIP-style aligner).

Offline default: scikit-learn's bundled handwritten digits (1,797 grey 8x8 images, 10 classes, no
download). Online: CIFAR-10 (`load_cifar10`) and image-caption sets such as Flickr8k
(`load_image_captions`) through `datasets`; `train_clip` and `retrieval_recall` train and score a
CLIP-style aligner on the latter. `random_affine` is a batched
augmentation (small shifts, rotations, scalings via `F.affine_grid`), `train_classifier` a plain
AdamW + warmup/cosine loop with a progress bar, `accuracy` and `recall_at_k` the metrics.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_rank
from .data.sources import load_hub_dataset
from .metrics import accuracy  # one definition, in metrics; chapter 12 imports it from here

DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@dataclass
class ImageSplit:
    """Train/test tensors: images (N, C, H, W) float, labels (N,) long, class names."""
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: list[str] = field(default_factory=list)


def load_digits(test_size: float = 0.25, seed: int = 0) -> ImageSplit:
    """scikit-learn's digits as (N, 1, 8, 8) images scaled to [0, 1] then standardised with the train
    mean/std; a stratified split with `test_size` of the images held out."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    d = sk_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0     # (1797, 1, 8, 8)
    y = torch.tensor(d.target, dtype=torch.long)
    i_tr, i_te = train_test_split(torch.arange(len(y)).numpy(), test_size=test_size, random_state=seed,
                                  stratify=y.numpy())
    i_tr, i_te = torch.as_tensor(i_tr), torch.as_tensor(i_te)
    mean, std = x[i_tr].mean(), x[i_tr].std()
    x = (x - mean) / std
    return ImageSplit(x[i_tr], y[i_tr], x[i_te], y[i_te], list(DIGIT_NAMES))


def load_cifar10(max_train: int | None = None, max_test: int | None = None, cache_dir: str | None = None) -> ImageSplit:
    """CIFAR-10 through Hugging Face `datasets` ("uoft-cs/cifar10"), as (N, 3, 32, 32) standardised tensors.

    Needs the network the first time (then the `datasets` cache). Offline, this raises
    `DataUnavailableError` saying so: use `load_digits()` instead, or copy a cached dataset into HF_HOME.
    """
    ds = load_hub_dataset("uoft-cs/cifar10", cache_dir=cache_dir, hint=(
        "CIFAR-10 needs the network once (it is cached afterwards). Offline, use tformer.vision.load_digits() "
        "(bundled with scikit-learn)."))

    def to_tensors(split, limit):
        part = ds[split] if limit is None else ds[split].select(range(min(limit, len(ds[split]))))
        part = part.with_format("numpy")
        x = torch.from_numpy(part["img"]).permute(0, 3, 1, 2).float() / 255.0     # (N, 3, 32, 32)
        return x, torch.from_numpy(part["label"]).long()

    x_tr, y_tr = to_tensors("train", max_train)
    x_te, y_te = to_tensors("test", max_test)
    mean, std = x_tr.mean(dim=(0, 2, 3), keepdim=True), x_tr.std(dim=(0, 2, 3), keepdim=True)
    return ImageSplit((x_tr - mean) / std, y_tr, (x_te - mean) / std, y_te, list(CIFAR10_NAMES))


def random_affine(images: torch.Tensor, shift: float = 1.0, degrees: float = 10.0, scale: float = 0.1,
                  flip: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    """Batched random augmentation: each image gets its own shift (+-`shift` pixels), rotation
    (+-`degrees`), zoom (1 +- `scale`) and, with `flip`, a horizontal flip half of the time.
    images (B, C, H, W) -> (B, C, H, W); the background fills with the image minimum."""
    check_rank(images, 4, "random_affine(images)", "(B, C, H, W)")
    b, _, h, w = images.shape
    dev = images.device

    def u(lo, hi):
        return torch.rand(b, generator=generator, device="cpu").to(dev) * (hi - lo) + lo
    ang = u(-degrees, degrees) * math.pi / 180
    s = 1.0 + u(-scale, scale)
    sx = torch.where(u(0, 1) < 0.5, -1.0, 1.0) if flip else torch.ones(b, device=dev)
    tx, ty = u(-shift, shift) * 2 / w, u(-shift, shift) * 2 / h        # pixels -> [-1, 1] coordinates
    cos, sin = torch.cos(ang) / s, torch.sin(ang) / s
    theta = torch.stack([torch.stack([cos * sx, -sin, tx], -1), torch.stack([sin * sx, cos, ty], -1)], 1)  # (B, 2, 3)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    return F.grid_sample(images - low, grid, align_corners=False, padding_mode="zeros") + low


def random_shift(images: torch.Tensor, max_shift: int = 1, generator: torch.Generator | None = None) -> torch.Tensor:
    """Move each image by a random whole number of pixels in [-max_shift, max_shift] along each axis (no
    interpolation, so no blur); the uncovered border takes the image minimum. (B, C, H, W) -> same shape."""
    check_rank(images, 4, "random_shift(images)", "(B, C, H, W)")
    b, _, h, w = images.shape
    s = max_shift
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    padded = F.pad(images - low, (s, s, s, s)) + low                      # (B, C, H+2s, W+2s)
    d = torch.randint(0, 2 * s + 1, (2, b), generator=generator).to(images.device)
    rows = torch.arange(h, device=images.device) + d[0, :, None]          # (B, H)
    cols = torch.arange(w, device=images.device) + d[1, :, None]          # (B, W)
    out = padded[torch.arange(b, device=images.device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2)                                         # (B, H, W, C) -> (B, C, H, W)


def recall_at_k(sim: torch.Tensor, k: int, query_labels: torch.Tensor | None = None,
                item_labels: torch.Tensor | None = None) -> float:
    """sim (N_q, N_items) similarities. Without labels, query i's match is item i (paired data); with
    labels, any item with the query's label is a match. Returns the fraction of queries with a match in
    their top k."""
    check_rank(sim, 2, "recall_at_k(sim)", "(N queries, N items)")
    topk = sim.topk(min(k, sim.shape[1]), dim=1).indices                  # (N_q, k)
    if query_labels is None:
        hit = topk == torch.arange(sim.shape[0], device=sim.device).unsqueeze(1)
    else:
        hit = item_labels.to(sim.device)[topk] == query_labels.to(sim.device).unsqueeze(1)
    return hit.any(dim=1).float().mean().item()


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Logits for x in batches (eval mode, restored afterwards)."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = torch.cat([model(x[i:i + batch_size].to(dev)).float().cpu() for i in range(0, len(x), batch_size)])
    model.train(was)
    return out


def warmup_cosine(step: int, total: int, warmup: int) -> float:
    """Learning-rate multiplier: linear warmup to 1 over `warmup` steps, then cosine decay to 0."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


@dataclass
class History:
    loss: list[float] = field(default_factory=list)        # training loss per step
    test_acc: list[float] = field(default_factory=list)    # test accuracy after each epoch
    seconds: float = 0.0


class _AdamWLoop:
    """What `train_classifier` and `train_clip` share: AdamW over the trainable parameters (no weight decay
    on biases, norms, positions or the class token), warmup + cosine over the run, a progress bar, and
    the History they return. `update(loss)` takes one step and says whether the run is done."""

    def __init__(self, model: nn.Module, n: int, batch_size: int, epochs: int, max_steps: int | None, lr: float,
                 weight_decay: float, warmup_frac: float, betas: tuple[float, float], eps: float, desc: str,
                 progress: bool):
        from tqdm.auto import tqdm

        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        decays = [p.dim() >= 2 and "pos_embed" not in name and "cls_token" not in name for name, p in named]
        self.opt = torch.optim.AdamW([{"params": [p for (_, p), d in zip(named, decays) if d], "weight_decay": weight_decay},
                                      {"params": [p for (_, p), d in zip(named, decays) if not d], "weight_decay": 0.0}],
                                     lr=lr, betas=betas, eps=eps)
        total = epochs * math.ceil(n / batch_size)
        self.total = total if max_steps is None else min(max_steps, total)
        warmup = max(1, int(warmup_frac * self.total))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: warmup_cosine(s, self.total, warmup))
        self.step, self.hist, self.t0 = 0, History(), time.perf_counter()
        self.bar = tqdm(total=self.total, desc=desc, **({} if progress else {"disable": True}))  # or TQDM_DISABLE=1

    def update(self, loss: torch.Tensor) -> bool:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.hist.loss.append(loss.item())
        self.step += 1
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{self.hist.loss[-1]:.3f}")
        return self.step >= self.total

    def close(self) -> History:
        self.bar.close()
        self.hist.seconds = time.perf_counter() - self.t0
        return self.hist


def train_classifier(model: nn.Module, data: ImageSplit, epochs: int = 10, batch_size: int = 64, lr: float = 1e-3,
                     weight_decay: float = 0.05, warmup_frac: float = 0.1, label_smoothing: float = 0.0,
                     augment=None, max_steps: int | None = None, device: torch.device | str = "cpu",
                     seed: int = 0, progress: bool = True) -> History:
    """Train `model` (images -> logits) with AdamW and warmup + cosine decay; evaluate each epoch.

    `augment(x, generator)` transforms a training batch; `max_steps` stops early (smoke tests).
    """
    g = torch.Generator().manual_seed(seed)
    model.to(device).train()
    n = len(data.y_train)
    loop = _AdamWLoop(model, n, batch_size, epochs, max_steps, lr, weight_decay, warmup_frac, (0.9, 0.999), 1e-8,
                      "train", progress)
    done = loop.total == 0
    while not done:
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, batch_size):
            idx = perm[i:i + batch_size]
            x, y = data.x_train[idx], data.y_train[idx]
            if augment is not None:
                x = augment(x, generator=g)
            done = loop.update(F.cross_entropy(model(x.to(device)), y.to(device), label_smoothing=label_smoothing))
            if done:
                break
        loop.hist.test_acc.append(accuracy(predict(model, data.x_test), data.y_test))
    return loop.close()


# --- captions for the CLIP-style aligner ----------------------------------------------------------------

TRAIN_TEMPLATES = [
    "a photo of the digit {name}.", "a handwritten {digit}.", "the number {name}, written by hand.",
    "a blurry scan of a {digit}.", "{name}", "a digit: {digit}", "someone wrote the number {name}.",
]
ZERO_SHOT_TEMPLATES = [  # never seen in training: zero-shot must generalise over the wording
    "an image of a {name}.", "this is the number {digit}.", "a picture showing {name}.",
]
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2  # byte-level caption ids: a byte b is id b + 3 (vocabulary 259)
CAPTION_VOCAB = 259


def digit_captions(labels: torch.Tensor, templates: list[str] = TRAIN_TEMPLATES,
                   generator: torch.Generator | None = None) -> list[str]:
    """One caption per label (N,): a template drawn at random, filled with the digit's name and numeral."""
    pick = torch.randint(0, len(templates), (len(labels),), generator=generator)
    return [templates[int(t)].format(name=DIGIT_NAMES[int(c)], digit=int(c)) for t, c in zip(pick, labels)]


def caption_ids(texts: list[str], context_length: int) -> torch.Tensor:
    """Byte-level ids (B, context_length): BOS, the UTF-8 bytes (+3), EOS, then PAD. A caption too long for
    the context is cut so that EOS (where the text tower pools) is always present."""
    out = torch.full((len(texts), context_length), PAD_ID, dtype=torch.long)
    for i, s in enumerate(texts):
        b = [BOS_ID] + [c + 3 for c in s.encode("utf-8")][: context_length - 2] + [EOS_ID]
        out[i, :len(b)] = torch.tensor(b)
    return out


# --- real image-caption pairs (Flickr8k and the like) through `datasets` ---------------------------------

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)   # the per-channel statistics CLIP normalises with
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
FLICKR8K = "jxie/flickr8k"                         # parquet: image, caption_0 .. caption_4; 6000/1000/1000


@dataclass
class ImageCaptions:
    """images (N, 3, S, S) normalised with CLIP's mean/std; captions[i] the captions of image i."""
    images: torch.Tensor
    captions: list[list[str]]

    def __len__(self) -> int:
        return len(self.captions)


def _caption_columns(names: list[str]) -> list[str]:
    cols = [c for c in names if c.startswith("caption") or c in ("text", "sentences", "sentence")]
    if not cols:
        raise ValueError(f"load_image_captions: found no caption column among {names}; expected caption, "
                         f"caption_0.., captions or text (or pass caption_columns=)")
    return sorted(cols)


def load_image_captions(source: str = FLICKR8K, split: str = "train", image_size: int = 64,
                        limit: int | None = None, caption_columns: list[str] | None = None,
                        image_column: str = "image") -> ImageCaptions:
    """Image-caption pairs through `datasets`: a hub name (default Flickr8k), or a local folder in the
    "imagefolder" layout (images + metadata.jsonl with file_name and caption columns), read by the same
    `load_dataset` call. Each image is made RGB, its shorter side resized to `image_size`, centre-cropped
    (CLIP's preprocessing) and normalised. A caption column may hold a string or a list of strings.
    Offline (and not cached), a hub name raises `DataUnavailableError` saying what to do.
    """
    from PIL import Image

    local = Path(source).is_dir()
    args = ("imagefolder",) if local else (source,)
    ds = load_hub_dataset(*args, split=split, local=local, **({"data_dir": source} if local else {}), hint=(
        "An image-caption set needs the network once (it is cached afterwards). Offline, the chapter's CLIP "
        "capstone uses the digits and their template captions (tformer.vision.digit_captions)."))
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    if image_column not in ds.column_names:
        raise ValueError(f"load_image_captions: no column {image_column!r} in {ds.column_names}")
    cols = caption_columns or _caption_columns([c for c in ds.column_names if c != image_column])
    images, captions = [], []
    for row in ds:
        img = row[image_column].convert("RGB")
        w, h = img.size
        k = image_size / min(w, h)
        img = img.resize((max(image_size, round(w * k)), max(image_size, round(h * k))), Image.BICUBIC)
        w, h = img.size
        left, top = (w - image_size) // 2, (h - image_size) // 2
        images.append(np.asarray(img.crop((left, top, left + image_size, top + image_size))))
        caps = []
        for c in cols:
            v = row[c]
            caps.extend([v] if isinstance(v, str) else list(v))
        captions.append([t.strip() for t in caps if t and t.strip()])
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255.0          # (N, 3, S, S)
    x = (x - torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return ImageCaptions(x, captions)


def train_clip(model: nn.Module, data: ImageCaptions, epochs: int = 10, batch_size: int = 128, lr: float = 5e-4,
               weight_decay: float = 0.1, warmup_frac: float = 0.1, augment=None, max_steps: int | None = None,
               device: torch.device | str = "cpu", seed: int = 0, progress: bool = True) -> History:
    """Train a `CLIP` on image-caption pairs: each step, every image of the batch meets one of its captions
    drawn at random; AdamW with warmup + cosine decay; `History.loss` per step. Only parameters with
    requires_grad train (freeze `model.visual` for a locked image tower, as in LiT)."""
    n = len(data)
    if n < 2 or batch_size < 2:
        raise ValueError(f"train_clip: a contrastive batch needs at least 2 pairs; got {n} pairs, batch_size={batch_size}")
    g = torch.Generator().manual_seed(seed)
    ctx = model.cfg.context_length
    model.to(device).train()
    loop = _AdamWLoop(model, n, batch_size, epochs, max_steps, lr, weight_decay, warmup_frac, (0.9, 0.98), 1e-6,
                      "CLIP", progress)
    done = loop.total == 0
    while not done:
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, batch_size):
            idx = perm[i:i + batch_size]
            if len(idx) < 2:                                # a batch of one has no negatives
                continue
            pick = torch.randint(0, 1 << 30, (len(idx),), generator=g)
            texts = [data.captions[j][int(p) % len(data.captions[j])] for j, p in zip(idx.tolist(), pick)]
            x = data.images[idx]
            if augment is not None:
                x = augment(x, generator=g)
            done = loop.update(model.loss(x.to(device), caption_ids(texts, ctx).to(device)))
            if done:
                break
    return loop.close()


@torch.no_grad()
def retrieval_recall(model: nn.Module, data: ImageCaptions, ks: tuple[int, ...] = (1, 5, 10),
                     batch_size: int = 256) -> dict[str, float]:
    """The standard image-caption retrieval protocol: every image against every caption of the set.
    image->text R@k: one of the image's own captions is in its top k; text->image R@k: the caption's image
    is in its top k. Returns {"i2t@k": ..., "t2i@k": ...}."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    ctx = model.cfg.context_length
    texts = [t for caps in data.captions for t in caps]
    owner = torch.tensor([i for i, caps in enumerate(data.captions) for _ in caps])          # (N_txt,)
    img = torch.cat([model.encode_image(data.images[i:i + batch_size].to(dev)).float().cpu()
                     for i in range(0, len(data), batch_size)])                               # (N_img, E)
    txt = torch.cat([model.encode_text(caption_ids(texts[i:i + batch_size], ctx).to(dev)).float().cpu()
                     for i in range(0, len(texts), batch_size)])                              # (N_txt, E)
    sim = img @ txt.T                                                                         # (N_img, N_txt)
    model.train(was)
    out = {}
    for k in ks:
        top_t = sim.topk(min(k, sim.shape[1]), dim=1).indices                                 # (N_img, k)
        out[f"i2t@{k}"] = (owner[top_t] == torch.arange(len(data)).unsqueeze(1)).any(1).float().mean().item()
        out[f"t2i@{k}"] = recall_at_k(sim.T, k, owner, torch.arange(len(data)))
    return out
