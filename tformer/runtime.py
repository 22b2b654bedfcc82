"""Run-time switches shared by notebooks and scripts.

TFORMER_SMALL=1 makes every notebook run small and fast on a CPU (CI uses it); unset or 0, notebooks
use a GPU when present and the full-size data and models.
"""
from __future__ import annotations

import os
import random

import torch

SMALL: bool = os.environ.get("TFORMER_SMALL", "0").lower() not in ("0", "", "false", "no")


def device() -> torch.device:
    """CUDA if available (and not in small mode), else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() and not SMALL else "cpu")


def seed_everything(seed: int = 0) -> None:
    """Seed Python, and torch (CPU and CUDA)."""
    random.seed(seed)
    torch.manual_seed(seed)
