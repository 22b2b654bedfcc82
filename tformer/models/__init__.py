"""Models built from tformer's blocks, one file each (nanoGPT's model.py style: a config, then the model).

    transformer  the encoder-decoder of "Attention Is All You Need" (TransformerConfig, Transformer),
                 from_hf_marian (Helsinki-NLP's opus-mt WMT models)
    gpt          decoder-only LM (GPTConfig, GPT), from_hf_gpt2; optional MoE layers
    bert         encoder with masked-LM pretraining and a classifier head
    vit          Vision Transformer (patches, class token)
    clip         CLIP-style image and text towers with a contrastive loss
    rnn          LSTM baselines (LSTMEncoder, LSTMLM) for chapters 7 and 15
"""
from .gpt import GPT, GPTConfig
from .rnn import LSTMConfig, LSTMEncoder, LSTMLM
from .transformer import Transformer, TransformerConfig

__all__ = ["GPT", "GPTConfig", "Transformer", "TransformerConfig"]
__all__ += ["LSTMConfig", "LSTMEncoder", "LSTMLM"]
from .bert import BERT, BertClassifier, BertConfig  # noqa: E402
from .vit import ViT, ViTConfig  # noqa: E402
from .clip import CLIP, CLIPConfig  # noqa: E402

__all__ += ["BERT", "BertConfig", "BertClassifier", "ViT", "ViTConfig", "CLIP", "CLIPConfig"]
