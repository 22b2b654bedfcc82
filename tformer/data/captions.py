"""Captions for the CLIP-style aligner (chapter 12): template captions of the digits and byte-level ids.

A caption becomes BOS, its UTF-8 bytes (each byte b as id b + 3), EOS, then PAD: a 259-token vocabulary
that needs no tokenizer. The text tower pools at EOS.
"""
from __future__ import annotations

import torch

from .images import DIGIT_NAMES

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
                   generator: torch.Generator | None = None, word_dropout: float = 0.0) -> list[str]:
    """One caption per label (N,): a template drawn at random, filled with the digit's name and numeral.

    `word_dropout` p drops each word of the template's own wording with probability p (the digit's name and
    numeral always stay): a text augmentation that keeps the text tower from keying on the few wordings it
    is trained on, so that wordings it never saw still land near their class."""
    pick = torch.randint(0, len(templates), (len(labels),), generator=generator)
    caps = [templates[int(t)].format(name=DIGIT_NAMES[int(c)], digit=int(c)) for t, c in zip(pick, labels)]
    if word_dropout <= 0:
        return caps
    out = []
    for cap, c in zip(caps, labels.tolist()):
        words = cap.split(" ")
        keep = torch.rand(len(words), generator=generator) >= word_dropout
        kept = [w for w, k in zip(words, keep.tolist()) if k or DIGIT_NAMES[c] in w or str(c) in w]
        out.append(" ".join(kept))
    return out


def caption_ids(texts: list[str], context_length: int) -> torch.Tensor:
    """Byte-level ids (B, context_length): BOS, the UTF-8 bytes (+3), EOS, then PAD. A caption too long for
    the context is cut so that EOS (where the text tower pools) is always present."""
    out = torch.full((len(texts), context_length), PAD_ID, dtype=torch.long)
    for i, s in enumerate(texts):
        b = [BOS_ID] + [c + 3 for c in s.encode("utf-8")][: context_length - 2] + [EOS_ID]
        out[i, :len(b)] = torch.tensor(b)
    return out
