"""Models built from tformer's blocks."""
from .gpt import GPT, GPTConfig
from .rnn import LSTMConfig, LSTMEncoder, LSTMLM
from .transformer import Transformer, TransformerConfig

__all__ = ["GPT", "GPTConfig", "Transformer", "TransformerConfig"]
__all__ += ["LSTMConfig", "LSTMEncoder", "LSTMLM"]
