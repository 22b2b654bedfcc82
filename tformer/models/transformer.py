"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    src (B, S) -> embed * sqrt(d) + PE -> N x TransformerBlock -> memory (B, S, d)
    tgt (B, T) -> embed * sqrt(d) + PE -> N x DecoderLayer(memory) -> logits (B, T, V)

Source embedding, target embedding and the output projection share one matrix when the vocabulary is
shared (the paper's section 3.4). Padding (token `pad_id`) is masked out of every attention over the
source; target sequences are right-padded, so the causal mask already keeps real tokens away from pads.

`Transformer.from_hf_marian` loads a Hugging Face `MarianMTModel` (Helsinki-NLP's opus-mt models: WMT-style
Transformers of the paper's base shape). What differs from the paper is a config option each: the
concatenated sinusoidal layout (`positional="sinusoidal_concat"`), no sqrt(d) embedding scale
(`scale_embeddings`), swish (`activation="silu"`), a bias on the logits (`logits_bias`) and the start
token, which is the pad id (`bos_id`).
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
    positional: str = "sinusoidal"     # "sinusoidal" (the paper: sin, cos interleaved), "sinusoidal_concat"
                                       # (every sin, then every cos: tensor2tensor, Marian) or "learned"
    scale_embeddings: bool = True      # token embeddings * sqrt(d_model) (the paper; Marian only if it says so)
    logits_bias: bool = False          # a bias on the output logits (Marian's final_logits_bias)
    bos_id: int = 1                    # the decoder's start token (Marian starts with the pad id)
    eos_id: int = 2                    # end of sentence

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
        if cfg.positional in ("sinusoidal", "sinusoidal_concat"):
            layout = "interleaved" if cfg.positional == "sinusoidal" else "concat"
            self.pos_embed = SinusoidalPositionalEncoding(cfg.d_model, cfg.context_length, layout)
        elif cfg.positional == "learned":
            self.pos_embed = LearnedPositionalEmbedding(cfg.context_length, cfg.d_model)
        else:
            raise ValueError("TransformerConfig.positional must be 'sinusoidal', 'sinusoidal_concat' or 'learned', "
                             f"got {cfg.positional!r}")
        self.drop = Dropout(cfg.dropout)
        self.encoder, self.decoder = Encoder(cfg), Decoder(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=cfg.logits_bias)
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
        if self.head.bias is not None:
            nn.init.zeros_(self.head.bias)

    def embed(self, tokens: torch.Tensor, table: nn.Embedding, offset: int = 0) -> torch.Tensor:
        if offset + tokens.shape[1] > self.cfg.context_length:
            raise ValueError(f"Transformer: sequence of {offset + tokens.shape[1]} tokens exceeds context_length={self.cfg.context_length}")
        x = table(tokens)
        return self.drop(self.pos_embed(x * math.sqrt(self.cfg.d_model) if self.cfg.scale_embeddings else x, offset))

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
        h = self.decode_hidden(tgt, memory, src_mask).flatten(0, 1)                   # (B*T, d)
        w = self.head.weight
        if self.head.bias is not None:              # h @ W.T + b = [h, 1] @ [W, b].T: the bias as one more feature
            h = torch.cat([h, h.new_ones(h.shape[0], 1)], 1)
            w = torch.cat([w, self.head.bias[:, None]], 1)
        return linear_cross_entropy(h, w, targets.flatten(), ignore_index=self.cfg.pad_id,
                                    smoothing=label_smoothing, reduction="sum")

    def num_params(self) -> int:
        """Parameters, counting tied matrices once."""
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_hf_marian(cls, model) -> "Transformer":
        """Build a Transformer from a Hugging Face `MarianMTModel` (e.g. Helsinki-NLP/opus-mt-de-en).

        Post-LN without a final norm, LayerNorm eps 1e-5, biases everywhere and head_dim^-0.5 already match;
        the config takes what differs: the concatenated sinusoidal layout (Marian does not save its table:
        it is built from the config), the embedding scale (`scale_embedding`), the activation (swish is
        silu), `final_logits_bias` and the start token (the pad id). q_proj, k_proj and v_proj are stacked
        into each attention's `qkv`. Returned in eval mode.
        """
        c = model.config
        acts = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh"}
        unsupported = [f"{k}={v!r}" for k, v, ok in (
            ("activation_function", c.activation_function, c.activation_function in acts),
            ("decoder_attention_heads", c.decoder_attention_heads,
             c.decoder_attention_heads == c.encoder_attention_heads),
            ("decoder_ffn_dim", c.decoder_ffn_dim, c.decoder_ffn_dim == c.encoder_ffn_dim),
            ("d_model", c.d_model, c.d_model % 2 == 0)) if not ok]
        if unsupported:
            raise ValueError(f"Transformer.from_hf_marian: this model uses what TransformerConfig does not: "
                             f"{', '.join(unsupported)}")
        hf = model.model
        enc_emb, dec_emb = hf.encoder.embed_tokens.weight, hf.decoder.embed_tokens.weight
        shared = (bool(c.share_encoder_decoder_embeddings) and enc_emb.data_ptr() == dec_emb.data_ptr()
                  and model.lm_head.weight.data_ptr() == dec_emb.data_ptr())
        cfg = TransformerConfig(
            src_vocab_size=enc_emb.shape[0], tgt_vocab_size=None if shared else dec_emb.shape[0],
            d_model=c.d_model, n_heads=c.encoder_attention_heads, d_ff=c.encoder_ffn_dim,
            n_encoder_layers=c.encoder_layers, n_decoder_layers=c.decoder_layers, dropout=c.dropout,
            attn_dropout=c.attention_dropout, ffn_dropout=c.activation_dropout,
            context_length=c.max_position_embeddings, pad_id=c.pad_token_id, share_embeddings=shared,
            activation=acts[c.activation_function], positional="sinusoidal_concat",
            scale_embeddings=bool(c.scale_embedding), logits_bias=True, bos_id=c.decoder_start_token_id,
            eos_id=c.eos_token_id if isinstance(c.eos_token_id, int) else c.eos_token_id[0])
        ours = {"src_embed.weight": enc_emb, "head.weight": model.lm_head.weight,
                "head.bias": model.final_logits_bias.reshape(-1)}
        ours["tgt_embed.weight"] = enc_emb if shared else dec_emb       # shared: one matrix under three names

        def attention(theirs, mine: str) -> None:
            for kind in ("weight", "bias"):
                ours[f"{mine}.qkv.{kind}"] = torch.cat([getattr(getattr(theirs, f"{x}_proj"), kind) for x in "qkv"])
                ours[f"{mine}.out.{kind}"] = getattr(theirs.out_proj, kind)

        def linear(theirs: nn.Module, mine: str) -> None:
            ours[f"{mine}.weight"], ours[f"{mine}.bias"] = theirs.weight, theirs.bias
        for i, layer in enumerate(hf.encoder.layers):
            me = f"encoder.layers.{i}."
            attention(layer.self_attn, me + "attn")
            for theirs, mine in ((layer.self_attn_layer_norm, "norm1"), (layer.fc1, "ffn.fc1"), (layer.fc2, "ffn.fc2"),
                                 (layer.final_layer_norm, "norm2")):
                linear(theirs, me + mine)
        for i, layer in enumerate(hf.decoder.layers):
            me = f"decoder.layers.{i}."
            attention(layer.self_attn, me + "self_attn")
            attention(layer.encoder_attn, me + "cross_attn")
            for theirs, mine in ((layer.self_attn_layer_norm, "norm1"), (layer.encoder_attn_layer_norm, "norm2"),
                                 (layer.fc1, "ffn.fc1"), (layer.fc2, "ffn.fc2"), (layer.final_layer_norm, "norm3")):
                linear(theirs, me + mine)
        out = cls(cfg)
        missing, unexpected = out.load_state_dict({k: v.detach() for k, v in ours.items()}, strict=False)
        if missing or unexpected:
            raise ValueError(f"Transformer.from_hf_marian: missing {missing}, unexpected {unexpected}")
        return out.eval()
