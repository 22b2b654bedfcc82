"""LSTM baselines (chapters 7 and 15): what the Transformer replaced.

    idx (B, T) -> token embedding -> N-layer nn.LSTM -> (LayerNorm) -> logits (B, T, V)

An LSTM reads a sequence one step at a time: h_t = f(h_{t-1}, x_t), so step t cannot start before
step t-1 has finished, however many cores there are. A Transformer layer computes every position at
once. `LSTMLM` has the call shape of `tformer.models.GPT` (`logits = model(idx)`), so the same
training loop, loss and timing helper (`tformer.measure.timing`) run either model.

`LSTMEncoder` is the sequence encoder on its own: embeddings (B, T, d) in, hidden states out, optionally
bidirectional (the encoder of an RNN seq2seq model).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..dropout import Dropout
from ..sampling import sample_next
from ..utils.checks import check_dim, check_rank, check_tokens


@dataclass
class LSTMConfig:
    vocab_size: int = 256              # byte-level by default
    d_model: int = 256                 # embedding and hidden width d
    n_layers: int = 2                  # stacked LSTM layers
    dropout: float = 0.0               # between LSTM layers and on the embeddings
    tie_weights: bool = True           # output projection = embedding matrix (as GPT)
    context_length: int | None = None  # None: any length (an LSTM has no position table); else a max length


class LSTMEncoder(nn.Module):
    """N stacked LSTM layers over embeddings: x (B, T, d_in) -> (out (B, T, d_out), (h, c)).

    d_out = hidden (or 2 * hidden if bidirectional). h and c are (n_layers * directions, B, hidden).
    `lengths` (B,) packs padded batches so the padding never enters the state (out is 0 there).
    """

    def __init__(self, d_in: int, hidden: int, n_layers: int = 1, dropout: float = 0.0,
                 bidirectional: bool = False):
        super().__init__()
        self.d_in, self.hidden, self.n_layers = d_in, hidden, n_layers
        self.bidirectional = bidirectional
        self.lstm = nn.LSTM(d_in, hidden, n_layers, batch_first=True, bidirectional=bidirectional,
                            dropout=dropout if n_layers > 1 else 0.0)

    @property
    def d_out(self) -> int:
        return self.hidden * (2 if self.bidirectional else 1)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None,
                lengths: torch.Tensor | None = None):
        check_rank(x, 3, "LSTMEncoder(x)", "(B, T, d_in)")
        check_dim(x, -1, self.d_in, "LSTMEncoder(x)", "d_in")
        if lengths is None:
            return self.lstm(x, state)                                 # out (B, T, d_out)
        check_rank(lengths, 1, "LSTMEncoder(lengths)", "(B,)")
        if lengths.shape[0] != x.shape[0]:
            raise ValueError(f"LSTMEncoder: lengths has {lengths.shape[0]} entries for a batch of {x.shape[0]}")
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, state = self.lstm(packed, state)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return out, state


class LSTMLM(nn.Module):
    """A language model on an LSTM: idx (B, T) -> logits (B, T, vocab_size), the call shape of GPT.

    `forward(idx, state)` continues from a previous call's state, so a long text can be read in chunks;
    `return_state=True` returns (logits, state).
    """

    def __init__(self, cfg: LSTMConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = Dropout(cfg.dropout)
        self.encoder = LSTMEncoder(cfg.d_model, cfg.d_model, cfg.n_layers, cfg.dropout)
        self.final_norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.tok_embed.weight, 0.0, 0.02)
        if cfg.tie_weights:
            self.head.weight = self.tok_embed.weight
        else:
            nn.init.normal_(self.head.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None,
                return_state: bool = False):
        """idx (B, T) token ids -> logits (B, T, vocab_size) (and the final (h, c) if return_state)."""
        check_tokens(idx, "idx")
        if self.cfg.context_length is not None and idx.shape[1] > self.cfg.context_length:
            raise ValueError(f"LSTMLM: {idx.shape[1]} tokens exceed context_length={self.cfg.context_length}")
        x = self.drop(self.tok_embed(idx))                                   # (B, T, d)
        h, state = self.encoder(x, state)                              # (B, T, d): step t waits for t-1
        logits = self.head(self.final_norm(self.drop(h)))                 # (B, T, V)
        return (logits, state) if return_state else logits

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Append `max_new_tokens` tokens to idx (B, T); the state carries the whole past (no window)."""

        check_tokens(idx, "idx")
        was_training = self.training
        self.eval()
        logits, state = self(idx, return_state=True)
        out = [idx]
        for _ in range(max_new_tokens):
            nxt = sample_next(logits[:, -1, :], temperature, top_k, generator)   # (B, 1)
            out.append(nxt)
            logits, state = self(nxt, state, return_state=True)
        self.train(was_training)
        return torch.cat(out, dim=1)


def lstm_reference(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """The LSTM equations written out, one time step per loop iteration (teaching and tests only).

    For a unidirectional, batch_first `nn.LSTM`: x (B, T, d_in) -> out (B, T, hidden) of the last layer.
        i, f, g, o = split(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)
        c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g);   h_t = sigmoid(o) * tanh(c_t)
    The loop is the point: step t needs h_{t-1}.
    """
    if lstm.bidirectional or not lstm.batch_first or lstm.proj_size:
        raise ValueError("lstm_reference: expected a unidirectional batch_first nn.LSTM without proj_size")
    check_rank(x, 3, "lstm_reference(x)", "(B, T, d_in)")
    inp = x
    for layer in range(lstm.num_layers):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
        b = (getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")) if lstm.bias else 0.0
        h = inp.new_zeros(inp.shape[0], lstm.hidden_size)
        c = inp.new_zeros(inp.shape[0], lstm.hidden_size)
        xw = inp @ w_ih.T + b                                          # (B, T, 4H): all inputs at once
        outs = []
        for t in range(inp.shape[1]):                                  # ...but the recurrence is serial
            i, f, g, o = (xw[:, t] + h @ w_hh.T).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        inp = torch.stack(outs, dim=1)                                 # (B, T, H)
    return inp
