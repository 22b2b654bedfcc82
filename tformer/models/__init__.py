"""Models built from tformer's blocks."""
from .gpt import GPT, GPTConfig
from .transformer import Transformer, TransformerConfig

__all__ = ["GPT", "GPTConfig", "Transformer", "TransformerConfig"]
