"""The pieces around attention (chapter 5): position-wise FFN, LayerNorm, residual connections, and the
blocks built from them: `TransformerBlock` (self-attention + FFN: the paper's encoder layer, and the
block of GPT, BERT, ViT and CLIP) and `DecoderLayer` (adds cross-attention, encoder-decoder only).

Post-LN (the paper):  x = LN(x + Sublayer(x))
Pre-LN  (GPT-2, ViT): x = x + Sublayer(LN(x))
Pre-LN keeps an identity path from the output to every layer, so deep stacks train without warmup;
post-LN needs the warmup the paper uses (chapter 10 shows both).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .activations import ACTIVATIONS
from .attention import MultiHeadAttention
from .cache import KVCache
from .dropout import Dropout
from .moe import MoE, MoEConfig


class FeedForward(nn.Module):
    """FFN(x) = W_2 act(W_1 x + b_1) + b_2, applied to each position independently (same weights).

    activation="swiglu": W_2 (silu(W_1 x) * W_3 x), the gated form used by Llama and Qwen.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu", bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS and activation != "swiglu":
            raise ValueError(f"FeedForward: activation must be one of {sorted(ACTIVATIONS) + ['swiglu']}, got {activation!r}")
        self.activation = activation
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)           # expand
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)           # contract
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            h = F.silu(self.fc1(x)) * self.gate(x)
        else:
            h = ACTIVATIONS[self.activation](self.fc1(x))
        return self.fc2(self.dropout(h))


def make_norm(kind: str, d: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """The normalization of a block: "layernorm" (the paper, GPT-2, BERT) or "rmsnorm" (Llama, Qwen):
    x / sqrt(mean(x^2) + eps) * g, LayerNorm without the mean and the bias (Zhang and Sennrich, 2019)."""
    if kind == "layernorm":
        return nn.LayerNorm(d, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(d, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


def _inner_dropout(dropout: float, attn: float | None, ffn: float | None) -> tuple[float, float]:
    """Dropout on attention weights and inside the FFN; None = the residual `dropout` (nn.Transformer's
    choice). The paper drops only sub-layer outputs and embeddings, i.e. both 0 (fairseq's defaults)."""
    return (dropout if attn is None else attn), (dropout if ffn is None else ffn)


@dataclass
class BlockConfig:
    """The sizes and switches of one block: `TransformerBlock(cfg)`, `DecoderLayer(cfg)`. Every model fills
    it by keyword from its own config (`GPTConfig.block(i)`, `TransformerConfig.block()`, ...)."""
    d_model: int = 512                 # width
    n_heads: int = 8                   # attention heads
    d_ff: int = 2048                   # FFN inner width
    dropout: float = 0.1               # on each sub-layer's output
    norm_first: bool = False           # False = post-LN (the paper); True = pre-LN
    activation: str = "relu"           # see ACTIVATIONS, or "swiglu"
    n_kv_heads: int | None = None      # None = n_heads; fewer for GQA/MQA
    bias: bool = True                  # biases in Linear and LayerNorm
    eps: float = 1e-5                  # the norm's epsilon
    norm: str = "layernorm"            # "layernorm" or "rmsnorm" (Llama, Qwen)
    head_dim: int | None = None        # None = d_model // n_heads
    qk_norm: bool = False              # RMSNorm on each query and key head before RoPE (Qwen3)
    attn_dropout: float | None = None  # on attention weights; None = dropout
    ffn_dropout: float | None = None   # on the FFN's hidden units; None = dropout
    moe: MoEConfig | None = None       # a mixture of experts instead of the dense FFN (chapter 13; self-attention
                                       # blocks only): its experts get this block's width, activation, bias, dropout


class TransformerBlock(nn.Module):
    """Self-attention + FFN, each wrapped in a residual connection and LayerNorm.

    Serves the paper's encoder (post-LN, bidirectional), GPT (pre-LN, `is_causal=True`), BERT, ViT and
    CLIP's towers. `cfg.moe` makes the FFN a mixture of experts (`tformer.moe.MoE`, chapter 13); `ffn`
    replaces the FFN by any module. `dropout` is applied to each sub-layer's output;
    `attn_dropout`/`ffn_dropout` (None = `dropout`) to the attention weights and the FFN's hidden units.
    """

    def __init__(self, cfg: BlockConfig, ffn: nn.Module | None = None):
        super().__init__()
        if not isinstance(cfg, BlockConfig):
            raise TypeError(f"TransformerBlock: expected a BlockConfig, got {type(cfg).__name__} "
                            "(e.g. TransformerBlock(BlockConfig(d_model=64, n_heads=4, d_ff=256)))")
        self.cfg = cfg
        self.norm_first = cfg.norm_first
        attn_p, ffn_p = _inner_dropout(cfg.dropout, cfg.attn_dropout, cfg.ffn_dropout)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, dropout=attn_p, bias=cfg.bias,
                                       head_dim=cfg.head_dim, qk_norm=cfg.qk_norm, eps=cfg.eps)
        if ffn is None and cfg.moe is not None:
            ffn = MoE(cfg.d_model, cfg.moe, d_ff=cfg.d_ff, activation=cfg.activation, bias=cfg.bias, dropout=ffn_p)
        self.ffn = ffn if ffn is not None else FeedForward(cfg.d_model, cfg.d_ff, ffn_p, cfg.activation, cfg.bias)
        self.norm1 = make_norm(cfg.norm, cfg.d_model, cfg.eps, cfg.bias)
        self.norm2 = make_norm(cfg.norm, cfg.d_model, cfg.eps, cfg.bias)
        self.drop1, self.drop2 = Dropout(cfg.dropout), Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, is_causal: bool = False,
                rope=None, cache: KVCache | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model) -> (B, T, d_model); positions (B, T): see `MultiHeadAttention.forward`."""
        def attend(h):
            return self.drop1(self.attn(h, mask=mask, is_causal=is_causal, rope=rope, cache=cache, positions=positions))
        if self.norm_first:
            x = x + attend(self.norm1(x))
            return x + self.drop2(self.ffn(self.norm2(x)))
        x = self.norm1(x + attend(x))
        return self.norm2(x + self.drop2(self.ffn(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, FFN; post-LN or pre-LN."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        if not isinstance(cfg, BlockConfig) or cfg.moe is not None:
            raise TypeError("DecoderLayer: expected a BlockConfig without moe (e.g. DecoderLayer(BlockConfig("
                            f"d_model=64, n_heads=4, d_ff=256))), got {cfg!r}")
        self.cfg = cfg
        self.norm_first = cfg.norm_first
        d, bias = cfg.d_model, cfg.bias
        attn_p, ffn_p = _inner_dropout(cfg.dropout, cfg.attn_dropout, cfg.ffn_dropout)
        self.self_attn = MultiHeadAttention(d, cfg.n_heads, cfg.n_kv_heads, dropout=attn_p, bias=bias)
        self.cross_attn = MultiHeadAttention(d, cfg.n_heads, cfg.n_kv_heads, dropout=attn_p, bias=bias)
        self.ffn = FeedForward(d, cfg.d_ff, ffn_p, cfg.activation, bias)
        self.norm1, self.norm2, self.norm3 = (make_norm(cfg.norm, d, cfg.eps, bias) for _ in range(3))
        self.drop1, self.drop2, self.drop3 = (Dropout(cfg.dropout) for _ in range(3))

    def forward(self, x: torch.Tensor, memory: torch.Tensor, self_mask: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None, *, is_causal: bool = True, rope=None,
                self_cache: KVCache | None = None, cross_cache: KVCache | None = None) -> torch.Tensor:
        """x (B, T, d_model) target side; memory (B, S, d_model) encoder output; memory_mask (B, 1, 1, S)."""
        def self_attend(h):
            return self.drop1(self.self_attn(h, mask=self_mask, is_causal=is_causal, rope=rope, cache=self_cache))

        def cross_attend(h):
            return self.drop2(self.cross_attn(h, memory, mask=memory_mask, cache=cross_cache))
        if self.norm_first:
            x = x + self_attend(self.norm1(x))
            x = x + cross_attend(self.norm2(x))
            return x + self.drop3(self.ffn(self.norm3(x)))
        x = self.norm1(x + self_attend(x))
        x = self.norm2(x + cross_attend(x))
        return self.norm3(x + self.drop3(self.ffn(x)))
