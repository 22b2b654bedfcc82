"""The activation functions a feed-forward layer chooses from by name (chapter 5): `FeedForward`, the MoE
experts and BERT's masked-LM head look them up in ACTIVATIONS; "swiglu" is a gated layer, not a function."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's GELU approximation x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {
    "relu": F.relu,                                              # the paper
    "gelu": F.gelu,                                              # BERT, ViT
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),        # GPT-2
    "quick_gelu": quick_gelu,                                    # CLIP
    "silu": F.silu,
}
