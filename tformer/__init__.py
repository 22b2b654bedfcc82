"""tformer: the package behind the course. Hand-written by topic; notebooks import it.

    attention   scaled_dot_product_attention (reference), MultiHeadAttention (MHA/GQA/MQA, KV cache)
    masks       causal, padding, sliding-window masks and combining them (bool, True = may attend)
    positional  sinusoidal, learned, RoPE (+ position interpolation, NTK, YaRN)
    blocks      FeedForward, EncoderLayer, DecoderLayer (post-LN and pre-LN)
    cache       KVCache
    paged_cache, quantize, speculative   paged KV cache, int8/int4 weights, speculative decoding (ch. 14)
    moe, flash, lm_data   mixture of experts; forced flash attention, tokens/s, MFU; LM text (ch. 13)
    models      Transformer (encoder-decoder), GPT (decoder-only), ...
"""
from .attention import MultiHeadAttention, fast_attention, merge_heads, scaled_dot_product_attention, split_heads
from .blocks import DecoderLayer, EncoderLayer, FeedForward
from .cache import KVCache
from .masks import causal_mask, combine_masks, lengths_mask, padding_mask, sliding_window_mask
from .positional import (LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding,
                         rope_frequencies, sinusoidal_shift_matrix, sinusoidal_table)
from .moe import MoE, MoEConfig
from .paged_cache import BlockPool, PagedConfig, PagedKVCache
from .quantize import QuantLinear, quantize_model
from .runtime import SMALL, device, seed_everything
from .speculative import speculative_generate

__version__ = "0.1.0"
__all__ = [
    "scaled_dot_product_attention", "fast_attention", "MultiHeadAttention", "FeedForward", "EncoderLayer",
    "DecoderLayer", "KVCache", "causal_mask", "padding_mask", "lengths_mask", "sliding_window_mask",
    "combine_masks", "sinusoidal_table", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding",
    "RotaryEmbedding", "rope_frequencies", "SMALL", "device", "seed_everything",
    "split_heads", "merge_heads", "sinusoidal_shift_matrix",
    "BlockPool", "PagedConfig", "PagedKVCache", "QuantLinear", "quantize_model", "speculative_generate",
    "MoE", "MoEConfig",
]
