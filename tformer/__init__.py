"""tformer: the package behind the course. Hand-written by topic; notebooks import it.

Every module, from the bottom layer (masks, attention) up to the capstones; tests/test_layout.py
checks that this map names every module and subpackage:

    runtime      SMALL (env TFORMER_SMALL), device(), seed_everything()
    _checks      shared input checks: bad input raises an error naming what was expected
    _compat      deprecated names (old config fields, EncoderLayer) that warn and keep working
    masks        causal, padding, sliding-window masks and combining them (bool, True = may attend)  ch. 6
    attention    scaled_dot_product_attention (reference), MultiHeadAttention (MHA/GQA/MQA, KV cache),
                 split_heads / merge_heads, capture_attention                                    ch. 1-3
    cache        KVCache (one layer's keys and values while decoding)                              ch. 14
    positional   sinusoidal, learned, RoPE (+ position interpolation, NTK, YaRN)                   ch. 4, 8
    blocks       FeedForward, TransformerBlock, DecoderLayer (post-LN and pre-LN)                  ch. 5
    sparse       sliding-window, strided, Longformer and BigBird patterns                           ch. 8-9
    efficient    tiled online-softmax attention, Linformer, Performer                              ch. 9
    models/      transformer (encoder-decoder), gpt, bert, vit, clip, rnn (LSTM baselines)
    moe          top-k router, expert FFNs, load-balancing loss                                     ch. 13
    flash        forced flash kernel, tokens/s and MFU                                              ch. 13
    gpu          what the accelerator can do: bf16/fp16, flash/memory-efficient, DDP backend, peak FLOP/s  ch. 10, 13
    timing       step time, peak memory, FLOP counts, power-law fits                                ch. 7-9, 15
    train        the paper's schedule, label smoothing, Trainer                                    ch. 10
    data/        corpora (built-in, Multi30k, WMT14), shared BPE, token-count batches               ch. 10
    decode       sample_next; greedy and beam search for the encoder-decoder                       ch. 10-11
    metrics      BLEU (sacreBLEU and tokenized), accuracy, perplexity, recall@k, retrieval recall   ch. 10-13
    translate/   the translation capstone: presets, pipeline, `tformer translate`                  ch. 10
    lm, lm_data  causal_lm_loss (the one next-token loss), MLM; LM text, tokenizer and batches      ch. 11, 13
    bpe          byte-pair encoding from scratch (the merges of Hugging Face `tokenizers`)          ch. 11
    sft, lora, dpo   chat template and prompt-masked labels; low-rank adapters; preference optimisation  ch. 11
    rag          a TF-IDF retriever for retrieval-augmented generation                               ch. 11
    images       digits, CIFAR-10, image-caption sets (Flickr8k)                                   ch. 12
    captions     template captions and byte-level caption ids for CLIP                            ch. 12
    augment      batched random affine transforms and pixel shifts                                ch. 12
    image_training  train_classifier (ViT), train_clip: the Trainer with the ViT/CLIP recipe       ch. 12
    vision       deprecated: re-exports the four above for one release
    paged_cache, quantize, speculative   paged KV cache, int8/int4 weights, speculative decoding   ch. 14
    plot         heat maps and curves for the notebooks
    grading/     check("chNN.name", fn) and `tformer grade`
    cli          the `tformer` command
"""
from .attention import (MultiHeadAttention, capture_attention, fast_attention, merge_heads, scaled_dot_product_attention,
                        split_heads)
from .blocks import BlockConfig, DecoderLayer, FeedForward, TransformerBlock
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
    "scaled_dot_product_attention", "fast_attention", "MultiHeadAttention", "FeedForward", "TransformerBlock", "BlockConfig",
    "DecoderLayer", "KVCache", "causal_mask", "padding_mask", "lengths_mask", "sliding_window_mask",
    "combine_masks", "sinusoidal_table", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding",
    "RotaryEmbedding", "rope_frequencies", "SMALL", "device", "seed_everything",
    "split_heads", "merge_heads", "capture_attention", "sinusoidal_shift_matrix",
    "BlockPool", "PagedConfig", "PagedKVCache", "QuantLinear", "quantize_model", "speculative_generate",
    "MoE", "MoEConfig",
]


def __getattr__(name: str):
    if name == "EncoderLayer":                                   # the name before issue 15
        from . import blocks
        return blocks.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
