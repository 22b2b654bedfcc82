"""The translation capstone's peer: `torch.nn.Transformer` of the same size, written as a user would.

Same width, depth, heads, FFN, dropout and post-LN as a `TranslatePreset`; the embeddings scaled by
sqrt(d_model) with sinusoidal positions and one table tied three ways (source, target, output), as the
course's `Transformer` does with a shared BPE; the layers initialised as PyTorch's translation tutorial does
(Xavier uniform on every matrix), the tied table as fairseq initialises one, N(0, d_model^-1/2). Xavier on the
table too (the tutorial has no tying) made it 4x smaller than the positions and cost the peer 25 BLEU in a
30-minute run: 10.6 against 35.7 greedy. Uncompiled, PyTorch's own kernels.

It has the course model's decoding interface (`encode`, `decode`, `new_cache`, `cfg.context_length`), so
the same pipeline trains, checkpoints, averages and scores it: `tformer translate train --set arch=torch`
(with `--set attn_dropout=none --set ffn_dropout=none` where the preset leaves those two at 0: small-avx2, gpu).
`nn.TransformerDecoder` has no KV cache, so its "cache" keeps the tokens decoded so far and every step
runs the decoder over the whole prefix again (what a user of `nn.Transformer` writes); decoding is
quadratic in the output length, which only costs scoring time, not training time.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class PeerConfig:
    d_model: int
    context_length: int          # rows of the sinusoidal table (the course model's, for the same limits)
    pad_id: int = 0


class PrefixCache:
    """The tokens decoded so far (B, t): what `decode` re-reads; `reorder` follows beam search's parents."""

    def __init__(self):
        self.tokens: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.tokens is None else self.tokens.shape[1]

    def append(self, new: torch.Tensor) -> torch.Tensor:
        self.tokens = new if self.tokens is None else torch.cat([self.tokens, new], 1)
        return self.tokens

    def reorder(self, rows: torch.Tensor) -> None:
        if self.tokens is not None:
            self.tokens = self.tokens.index_select(0, rows)


@contextlib.contextmanager
def _cpu_autocast_safe():
    """nn.Transformer's inference fast path asks `torch.is_autocast_enabled()`, which sees CUDA autocast only;
    under CPU autocast it runs with float32 weights on bf16 inputs and fails ("expected scalar type Float
    but found BFloat16"). There the regular path is taken, as it is on a GPU under autocast."""
    if not torch.is_autocast_enabled("cpu"):
        yield
        return
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


class TorchTransformer(nn.Module):
    """Embeddings + `nn.Transformer(batch_first=True)` + the tied output projection."""

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float,
                 context_length: int, pad_id: int = 0, norm_first: bool = False):
        super().__init__()
        self.cfg = PeerConfig(d_model, context_length, pad_id)
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        pos = torch.arange(context_length)[:, None] * torch.exp(torch.arange(0, d_model, 2) * (-math.log(1e4) / d_model))
        pe = torch.zeros(context_length, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.register_buffer("pe", pe, persistent=False)
        self.drop = nn.Dropout(dropout)
        self.core = nn.Transformer(d_model, n_heads, n_layers, n_layers, d_ff, dropout, batch_first=True,
                                   norm_first=norm_first)
        self.out = nn.Linear(d_model, vocab_size, bias=False)
        self.out.weight = self.embed.weight
        for p in self.core.parameters():       # PyTorch's nn.Transformer translation tutorial: Xavier on every
            if p.dim() > 1:                    # matrix of the layers
                nn.init.xavier_uniform_(p)
        nn.init.normal_(self.embed.weight, 0.0, d_model ** -0.5)   # fairseq's tied-embedding init: after the
        #   sqrt(d_model) scale the input has std 1, as the positions do (Xavier would give 0.25)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.embed(x) * math.sqrt(self.cfg.d_model) + self.pe[: x.shape[1]])

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src (B, S) -> memory (B, S, d), padding (B, S) (True = <pad>, PyTorch's convention)."""
        pad = src == self.cfg.pad_id
        with _cpu_autocast_safe():
            return self.core.encoder(self._embed(src), src_key_padding_mask=pad), pad

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, pad: torch.Tensor,
               cache: list | None = None) -> torch.Tensor:
        """tgt (B, T) (only the new tokens when a cache is given) -> logits (B, T, V)."""
        full = cache[0][0].append(tgt) if cache is not None else tgt
        causal = nn.Transformer.generate_square_subsequent_mask(full.shape[1], device=full.device)
        with _cpu_autocast_safe():
            h = self.core.decoder(self._embed(full), memory, tgt_mask=causal, tgt_is_causal=True,
                                  memory_key_padding_mask=pad)
        return self.out(h[:, full.shape[1] - tgt.shape[1]:])

    def new_cache(self, max_len: int | None = None) -> list:
        return [(PrefixCache(), None)]

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory, pad = self.encode(src)
        return self.decode(tgt, memory, pad)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
