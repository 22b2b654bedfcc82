"""tformer: the package behind the course. Hand-written by topic; notebooks import it.

What the chapters build sits flat at the top; the rest is grouped by what it holds. Each folder's
`__init__.py` lists its modules; tests/test_layout.py checks that this map names every entry:

    masks        causal, padding, sliding-window masks and combining them (bool, True = may attend)  ch. 6
    attention    scaled_dot_product_attention (reference), MultiHeadAttention (MHA/GQA/MQA, KV cache),
                 split_heads / merge_heads, capture_attention                                    ch. 1-3
    positional   sinusoidal, learned, RoPE (+ position interpolation, NTK, YaRN)                   ch. 4, 8
    blocks       FeedForward, TransformerBlock, DecoderLayer (post-LN and pre-LN)                  ch. 5
    dropout      Dropout / dropout: F.dropout with one random draw per four elements on a CPU     ch. 10
    sparse       sliding-window, strided, Longformer and BigBird patterns                           ch. 8-9
    efficient    tiled online-softmax attention, Linformer, Performer                              ch. 9
    moe          top-k router, expert FFNs, load-balancing loss                                     ch. 13
    models/      transformer (encoder-decoder), gpt, bert, vit, clip, rnn (LSTM baselines)
    training/    schedules, losses, checkpoint (atomic save, run lock, RNG state), distributed, trainer;
                 metrics; the recipes sft, lora, dpo and vision (ViT / CLIP)                   ch. 10-13
    inference/   decode (sampling, greedy, beam), cache (KV), paged_cache, engine (continuous batching),
                 quantize, speculative, rag                                                     ch. 10-14
    serve/       `tformer serve` (an OpenAI-compatible server), run folders, `tformer export --to hf`  ch. 14
    data/        every loader and tokenizer: translation corpora (sources, corpus), tokenizer (shared BPE),
                 batching, text (LM text and MLM masking), bpe (from scratch), images, captions, augment
    utils/       runtime (SMALL, device(), seeds), gpu, flash (tokens/s, MFU), timing, plot, checks
    translate/   the translation capstone: presets, pipeline, `tformer translate`                  ch. 10
    capstones/   `tformer capstone NAME`: one run folder for vit, clip, translate, moe; show()   ch. 10-13
    grading/     check("chNN.name", fn) and `tformer grade`
    cli          the `tformer` command
"""
from .attention import (MultiHeadAttention, capture_attention, fast_attention, merge_heads,
                        scaled_dot_product_attention, split_heads)
from .blocks import BlockConfig, DecoderLayer, FeedForward, TransformerBlock
from .inference.cache import KVCache
from .masks import causal_mask, combine_masks, lengths_mask, padding_mask, sliding_window_mask
from .positional import (LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding, rope_frequencies,
                         sinusoidal_shift_matrix, sinusoidal_table)
from .moe import MoE, MoEConfig
from .inference.paged_cache import BlockPool, PagedConfig, PagedKVCache
from .inference.quantize import QuantLinear, quantize_model
from .utils.runtime import SMALL, device, seed_everything
from .inference.speculative import speculative_generate

__version__ = "0.1.0"
__all__ = [
    "scaled_dot_product_attention", "fast_attention", "MultiHeadAttention", "FeedForward", "TransformerBlock", "BlockConfig",
    "DecoderLayer", "KVCache", "causal_mask", "padding_mask", "lengths_mask", "sliding_window_mask",
    "combine_masks", "sinusoidal_table", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding",
    "RotaryEmbedding", "rope_frequencies", "SMALL", "device", "seed_everything",
    "split_heads", "merge_heads", "capture_attention", "sinusoidal_shift_matrix",
    "BlockPool", "PagedConfig", "PagedKVCache", "QuantLinear", "quantize_model", "speculative_generate",
    "MoE", "MoEConfig",
]
