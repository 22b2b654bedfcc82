"""Deprecated (issue 15): chapter 12's helpers now live in modules named after what they hold.

    tformer.images          load_digits, load_cifar10, load_image_captions, ImageSplit, ImageCaptions
    tformer.captions        digit_captions, caption_ids, the templates and caption ids
    tformer.augment         random_affine, random_shift
    tformer.metrics         accuracy, recall_at_k, retrieval_recall
    tformer.image_training  train_classifier, train_clip, predict, History

`tformer.vision` re-exports them for one release.
"""
import warnings

from .augment import random_affine, random_shift
from .captions import (BOS_ID, CAPTION_VOCAB, EOS_ID, PAD_ID, TRAIN_TEMPLATES, ZERO_SHOT_TEMPLATES, caption_ids,
                       digit_captions)
from .image_training import History, predict, train_classifier, train_clip
from .images import (CIFAR10_NAMES, CLIP_MEAN, CLIP_STD, DIGIT_NAMES, FLICKR8K, ImageCaptions, ImageSplit,
                     load_cifar10, load_digits, load_image_captions)
from .metrics import accuracy, recall_at_k, retrieval_recall

warnings.warn("tformer.vision is deprecated (issue 15): import from tformer.images, tformer.captions, tformer.augment, "
              "tformer.metrics or tformer.image_training", FutureWarning, stacklevel=2)

__all__ = ["random_affine", "random_shift", "BOS_ID", "CAPTION_VOCAB", "EOS_ID", "PAD_ID", "TRAIN_TEMPLATES",
           "ZERO_SHOT_TEMPLATES", "caption_ids", "digit_captions", "History", "predict", "train_classifier",
           "train_clip", "CIFAR10_NAMES", "CLIP_MEAN", "CLIP_STD", "DIGIT_NAMES", "FLICKR8K", "ImageCaptions",
           "ImageSplit", "load_cifar10", "load_digits", "load_image_captions", "accuracy", "recall_at_k",
           "retrieval_recall"]
