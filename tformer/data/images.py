"""Image datasets for chapter 12: the offline digits, CIFAR-10 and image-caption sets (Flickr8k ...).

Offline default: scikit-learn's bundled handwritten digits (1,797 grey 8x8 images, 10 classes, no
download). Online, through `datasets`: CIFAR-10 (`load_cifar10`) and image-caption pairs
(`load_image_captions`, Flickr8k by default, or a local "imagefolder").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .sources import load_hub_dataset

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
    `DataUnavailableError` saying so: use `load_digits()` instead, or copy a cached dataset into
    `tformer.data.cache_dir()` / "huggingface" (data/cache/ in a checkout; see data/cifar10/README.md).
    """
    ds = load_hub_dataset("uoft-cs/cifar10", cache_dir=cache_dir, hint=(
        "CIFAR-10 needs the network once (it is cached afterwards). Offline, use tformer.data.images.load_digits() "
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
        "capstone uses the digits and their template captions (tformer.data.captions.digit_captions)."))
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
