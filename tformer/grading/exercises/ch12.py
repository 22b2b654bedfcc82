"""Chapter 12: ViT's patch embedding (patchify) and CLIP's symmetric InfoNCE loss."""
import math

import torch
import torch.nn.functional as F

from ...models import clip as clip_module
from ...models import vit as vit_module
from ...models.clip import clip_loss
from ...models.vit import patchify
from ..core import Case, Exercise, register
from ..questions import Question

# --- patchify ----------------------------------------------------------------------------------------


def _img(seed, b, c, h, w):
    return torch.randn(b, c, h, w, generator=torch.Generator().manual_seed(seed))


def _patch_edge_cases() -> list[Case]:
    x = _img(31, 2, 3, 8, 8)
    return [
        Case("one 2x2 grey image, patch 2 (a single patch)", (_img(30, 1, 1, 2, 2), 2)),
        Case("patch 1: every pixel is a token", (_img(32, 1, 2, 3, 3), 1)),
        Case("RGB 8x8, patch 4", (x, 4)),
        Case("non-square 4x8 image, patch 2", (_img(33, 2, 1, 4, 8), 2)),
        Case("non-contiguous input", (x.transpose(2, 3).contiguous().transpose(2, 3), 2)),
    ]


def _patch_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(13000 + seed)
    p = int(torch.randint(1, 5, (1,), generator=g))
    b, c = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
    gh, gw = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
    return Case(f"random #{seed}: B={b} C={c} H={gh * p} W={gw * p} p={p}", (_img(13000 + seed, b, c, gh * p, gw * p), p),
                seed=13000 + seed)


def _channels_last(images, p):
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def _column_major_patches(images, p):
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p).permute(0, 4, 2, 1, 3, 5)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def _plain_reshape(images, p):
    b, c, h, w = images.shape
    return images.reshape(b, (h // p) * (w // p), c * p * p)


register(Exercise(
    name="ch12.patchify",
    title="cut images (B, C, H, W) into p x p patches -> (B, N, C*p*p)",
    reference=patchify,
    edge_cases=_patch_edge_cases,
    random_case=_patch_random_case,
    points=2,
    atol=0.0,
    rtol=0.0,
    hint="reshape to (B, C, H/p, p, W/p, p), permute to (B, H/p, W/p, C, p, p), reshape to (B, N, C*p*p): "
         "patches row by row, each flattened channel first (the order of a Conv2d weight).",
    mistakes={"channels last inside a patch (p, p, C) instead of (C, p, p)": _channels_last,
              "patches listed column by column": _column_major_patches,
              "a plain reshape (pixels of one patch are not contiguous in memory)": _plain_reshape},
    forbidden=[(vit_module, "patchify")],
))

# --- symmetric InfoNCE -------------------------------------------------------------------------------


def _emb(seed, n, e, scale=10.0, related=False):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n, e, generator=g) * 3
    txt = img + 0.5 * torch.randn(n, e, generator=g) if related else torch.randn(n, e, generator=g)
    return img, txt, scale


def _clip_edge_cases() -> list[Case]:
    return [
        Case("one pair (loss 0)", _emb(40, 1, 4)),
        Case("two pairs, scale 1", _emb(41, 2, 3, scale=1.0)),
        Case("matching pairs close together (small loss)", _emb(42, 6, 8, scale=30.0, related=True)),
        Case("logit_scale as a tensor (the learned parameter)", _emb(43, 4, 5, scale=torch.tensor(14.3))),
        Case("unnormalised embeddings of very different norms", (torch.randn(5, 4, generator=torch.Generator().manual_seed(44)) * 100,
                                                               torch.randn(5, 4, generator=torch.Generator().manual_seed(45)) * 0.01, 5.0)),
    ]


def _clip_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(14000 + seed)
    n, e = int(torch.randint(2, 17, (1,), generator=g)), int(torch.randint(2, 33, (1,), generator=g))
    scale = float(torch.empty(1).uniform_(1, 50, generator=g))
    return Case(f"random #{seed}: N={n} E={e} scale={scale:.1f}", _emb(14000 + seed, n, e, scale, related=bool(seed % 2)),
                seed=14000 + seed)


def _logits(img, txt, s):
    return s * F.normalize(img, dim=-1) @ F.normalize(txt, dim=-1).T


def _one_direction(img, txt, s):
    lg = _logits(img, txt, s)
    return F.cross_entropy(lg, torch.arange(len(img)))


def _no_normalise(img, txt, s):
    lg = s * img @ txt.T
    t = torch.arange(len(img))
    return (F.cross_entropy(lg, t) + F.cross_entropy(lg.T, t)) / 2


def _divide_by_scale(img, txt, s):
    lg = _logits(img, txt, 1.0) / s
    t = torch.arange(len(img))
    return (F.cross_entropy(lg, t) + F.cross_entropy(lg.T, t)) / 2


def _sum_directions(img, txt, s):
    lg = _logits(img, txt, s)
    t = torch.arange(len(img))
    return F.cross_entropy(lg, t) + F.cross_entropy(lg.T, t)


register(Exercise(
    name="ch12.clip_loss",
    title="symmetric InfoNCE: image_emb (N, E), text_emb (N, E), logit_scale -> scalar",
    reference=clip_loss,
    edge_cases=_clip_edge_cases,
    random_case=_clip_random_case,
    points=2,
    hint="L2-normalise both, logits = logit_scale * img @ txt.T (N, N); the matching pair of row i is column i: "
         "average F.cross_entropy(logits, arange(N)) and F.cross_entropy(logits.T, arange(N)).",
    mistakes={"only one direction (image -> text)": _one_direction,
              "embeddings not L2-normalised": _no_normalise,
              "divided by logit_scale (it is 1/temperature: multiply)": _divide_by_scale,
              "summed the two directions instead of averaging": _sum_directions},
    forbidden=[(clip_module, "clip_loss"), (clip_module, "contrastive_logits_loss")],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch12.q_vit_tokens",
    title="the tokens ViT-B/16 reads for a 224x224 RGB image, [class] included",
    kind="number", answer=197, points=1,
    mistakes={
        "196 are the patches (14 x 14); the [class] token is put in front of them": 196,
        "768 = 16 x 16 x 3 is the length of one flattened patch (and ViT-B's width), not the number of tokens": 768,
        "224 x 224 counts pixels: each 16x16 patch, not each pixel, becomes a token": 224 * 224,
    },
    hint="224 / 16 patches per side, squared, plus the [class] token.",
))

register(Question(
    name="ch12.q_clip_chance",
    title="the symmetric InfoNCE loss of N = 16 pairs when every logit is equal",
    kind="number", answer=math.log(16), rel_tol=5e-3, points=1,
    mistakes={
        "1/16 is the probability each row gives its own caption; the loss is its negative logarithm": 1 / 16,
        "the loss is the mean of the two cross-entropies (images to captions, captions to images), not their "
        "sum": 2 * math.log(16),
        "each image picks among the N captions of its row, not among all N^2 - N non-matching pairs":
            math.log(16 * 15),
    },
    hint="each row is a cross-entropy over N candidates with equal logits.",
))

register(Question(
    name="ch12.q_vlm_input",
    title="what the language model of the VLM receives from the image",
    kind="choice", answer="D", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "the LM never sees a label: it reads the projected patch features, which carry more than the class": "A",
        "this VLM has no cross-attention layer: the image tokens sit in the same sequence as the text, and the "
        "causal self-attention lets every text token read them": "C",
        "the pixels go through the frozen vision encoder first; the LM reads its features, projected to the LM's "
        "width": "B",
    },
))
