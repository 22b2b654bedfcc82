"""Models built from tformer's blocks."""
from .gpt import GPT, GPTConfig
from .rnn import LSTMConfig, LSTMEncoder, LSTMLM
from .transformer import Transformer, TransformerConfig

__all__ = ["GPT", "GPTConfig", "Transformer", "TransformerConfig"]
__all__ += ["LSTMConfig", "LSTMEncoder", "LSTMLM"]
from .bert import BERT, BertClassifier, BertConfig  # noqa: E402
from .vit import ViT, ViTConfig  # noqa: E402
from .clip import CLIP, CLIPConfig  # noqa: E402

__all__ += ["BERT", "BertConfig", "BertClassifier", "ViT", "ViTConfig", "CLIP", "CLIPConfig"]
