"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    src (B, S) -> embed * sqrt(d) + PE -> N x TransformerBlock -> memory (B, S, d)
    tgt (B, T) -> embed * sqrt(d) + PE -> N x DecoderLayer(memory) -> logits (B, T, V)

Source embedding, target embedding and the output projection share one matrix when the vocabulary is
shared (the paper's section 3.4). Padding (token `pad_id`) is masked out of every attention over the
source; target sequences are right-padded, so the causal mask already keeps real tokens away from pads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from ..dropout import Dropout
from ..utils.checks import check_tokens
from ..blocks import BlockConfig, DecoderLayer, TransformerBlock
from ..cache import KVCache
from ..masks import padding_mask
from ..positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


@dataclass
class TransformerConfig:
    src_vocab_size: int = 37000        # the paper's shared EN-DE byte-pair vocabulary
    tgt_vocab_size: int | None = None  # None: same vocabulary as the source (required for sharing)
    d_model: int = 512                 # model width
    n_heads: int = 8                   # attention heads (d_model / n_heads = 64 per head)
    n_kv_heads: int | None = None      # None = n_heads; fewer for GQA/MQA
    d_ff: int = 2048                   # FFN inner width
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1               # dropout on sub-layer outputs and embeddings (P_drop)
    attn_dropout: float | None = None  # on attention weights; None = dropout (0 in the paper's text)
    ffn_dropout: float | None = None   # on the FFN's hidden units; None = dropout (0 in the paper's text)
    context_length: int = 1024         # longest sequence the positional table covers
    pad_id: int = 0                    # padding token id
    norm_first: bool = False           # False = post-LN (the paper); True = pre-LN
    final_norm: bool | None = None     # LayerNorm after each stack; None = same as norm_first
    share_embeddings: bool = True      # tie source/target embeddings and the output projection
    activation: str = "relu"
    bias: bool = True
    eps: float = 1e-5                  # LayerNorm epsilon
    positional: str = "sinusoidal"     # "sinusoidal" (the paper) or "learned"

    @classmethod
    def base(cls, vocab_size: int, **kw) -> "TransformerConfig":
        """Table 3, "base": N=6, d=512, d_ff=2048, h=8, P_drop=0.1 (65M parameters at 37k vocabulary)."""
        return replace(cls(src_vocab_size=vocab_size), **kw)

    @classmethod
    def big(cls, vocab_size: int, **kw) -> "TransformerConfig":
        """Table 3, "big": N=6, d=1024, d_ff=4096, h=16, P_drop=0.3 (213M parameters)."""
        return replace(cls(src_vocab_size=vocab_size, d_model=1024, d_ff=4096, n_heads=16, dropout=0.3), **kw)

    def block(self) -> BlockConfig:
        """The sizes and switches every encoder and decoder layer shares."""
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, dropout=self.dropout,
                           norm_first=self.norm_first, activation=self.activation, n_kv_heads=self.n_kv_heads,
                           bias=self.bias, eps=self.eps, attn_dropout=self.attn_dropout,
                           ffn_dropout=self.ffn_dropout)

    @property
    def tgt_vocab(self) -> int:
        return self.src_vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size


class Stack(nn.Module):
    """N layers built from `cfg.block()` + a final LayerNorm (pre-LN; `final_norm`): the encoder and the decoder."""

    def __init__(self, cfg: TransformerConfig, layer: type[nn.Module], n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(layer(cfg.block()) for _ in range(n_layers))
        final = cfg.norm_first if cfg.final_norm is None else cfg.final_norm
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps) if final else nn.Identity()


class Encoder(Stack):
    """A stack of encoder layers (`TransformerBlock`, bidirectional)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg, TransformerBlock, cfg.n_encoder_layers)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x)


class Decoder(Stack):
    """A stack of decoder layers (`DecoderLayer`: causal self-attention, cross-attention, FFN)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg, DecoderLayer, cfg.n_decoder_layers)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                cache: list[tuple[KVCache, KVCache]] | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            sc, cc = cache[i] if cache is not None else (None, None)
            x = layer(x, memory, memory_mask=memory_mask, is_causal=True, self_cache=sc, cross_cache=cc)
        return self.final_norm(x)


class Transformer(nn.Module):
    """Encoder-decoder Transformer. `logits = model(src, tgt)`: (B, S), (B, T) ids -> (B, T, V_tgt)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.share_embeddings and cfg.tgt_vocab != cfg.src_vocab_size:
            raise ValueError("TransformerConfig: share_embeddings needs one vocabulary "
                             f"(src {cfg.src_vocab_size} vs tgt {cfg.tgt_vocab})")
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab, cfg.d_model)
        if cfg.positional == "sinusoidal":
            self.pos_embed = SinusoidalPositionalEncoding(cfg.d_model, cfg.context_length)
        elif cfg.positional == "learned":
            self.pos_embed = LearnedPositionalEmbedding(cfg.context_length, cfg.d_model)
        else:
            raise ValueError(f"TransformerConfig.positional must be 'sinusoidal' or 'learned', got {cfg.positional!r}")
        self.drop = Dropout(cfg.dropout)
        self.encoder, self.decoder = Encoder(cfg), Decoder(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)
        if cfg.share_embeddings:
            self.head.weight = self.tgt_embed.weight            # three-way weight tying
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform matrices (as `nn.Transformer`), N(0, d^-1/2) embeddings (scaled by sqrt(d) later)."""
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name and "pos" not in name:
                nn.init.xavier_uniform_(p)
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, 0.0, self.cfg.d_model ** -0.5)

    def embed(self, tokens: torch.Tensor, table: nn.Embedding, offset: int = 0) -> torch.Tensor:
        if offset + tokens.shape[1] > self.cfg.context_length:
            raise ValueError(f"Transformer: sequence of {offset + tokens.shape[1]} tokens exceeds context_length={self.cfg.context_length}")
        return self.drop(self.pos_embed(table(tokens) * math.sqrt(self.cfg.d_model), offset))

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src (B, S) -> memory (B, S, d_model), src_mask (B, 1, 1, S) (True = real token)."""
        check_tokens(src, "src")
        src_mask = padding_mask(src, self.cfg.pad_id)
        return self.encoder(self.embed(src, self.src_embed), src_mask), src_mask

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               cache: list[tuple[KVCache, KVCache]] | None = None) -> torch.Tensor:
        """tgt (B, T) (only the new tokens when a cache is given) -> logits (B, T, V_tgt)."""
        return self.head(self.decode_hidden(tgt, memory, src_mask, cache))

    def decode_hidden(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                      cache: list[tuple[KVCache, KVCache]] | None = None) -> torch.Tensor:
        """`decode` before the output projection: the decoder's final states (B, T, d_model)."""
        check_tokens(tgt, "tgt")
        offset = cache[0][0].length if cache is not None else 0
        return self.decoder(self.embed(tgt, self.tgt_embed, offset), memory, src_mask, cache)

    def new_cache(self, max_len: int | None = None) -> list[tuple[KVCache, KVCache]]:
        """One (self-attention, cross-attention) cache pair per decoder layer."""
        return [(KVCache(max_len), KVCache()) for _ in range(self.cfg.n_decoder_layers)]

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, targets: torch.Tensor | None = None, *,
                label_smoothing: float = 0.0) -> torch.Tensor:
        """src (B, S), tgt (B, T) -> logits (B, T, V_tgt). With `targets` (B, T) (tgt shifted by one): the
        label-smoothed cross-entropy summed over the targets that are not <pad>, the head fused into the
        loss (tformer.training.losses.linear_cross_entropy: no (B, T, V) logits, no FLOPs on padding).
        Through `forward`, so DistributedDataParallel sees it."""
        check_tokens(src, "src")
        check_tokens(tgt, "tgt")
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(f"Transformer: src batch {src.shape[0]} != tgt batch {tgt.shape[0]}")
        memory, src_mask = self.encode(src)
        if targets is None:
            return self.decode(tgt, memory, src_mask)
        if targets.shape != tgt.shape:
            raise ValueError(f"Transformer: targets {tuple(targets.shape)} must have tgt's shape {tuple(tgt.shape)}")
        from ..training.losses import linear_cross_entropy
        h = self.decode_hidden(tgt, memory, src_mask)                                 # (B, T, d)
        return linear_cross_entropy(h.flatten(0, 1), self.head.weight, targets.flatten(), ignore_index=self.cfg.pad_id,
                                    smoothing=label_smoothing, reduction="sum")

    def num_params(self) -> int:
        """Parameters, counting tied matrices once."""
        return sum(p.numel() for p in self.parameters())
