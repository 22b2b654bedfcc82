"""Key/value caches for decoding.

During generation every new token attends to the keys and values of all earlier tokens. Recomputing
them each step costs O(T^2) projections for T tokens; caching them costs O(T). `KVCache` preallocates
its buffer once (no `torch.cat` per step, which would copy the whole cache every token).
"""
from __future__ import annotations

import torch


class KVCache:
    """One attention layer's cache: keys and values of shape (B, H_kv, T, head_dim).

    Self-attention appends each step (`append`); cross-attention stores the encoder's keys and values
    once (`store`) and reuses them for every decoding step.
    """

    def __init__(self, max_len: int | None = None):
        self.max_len = max_len       # capacity in tokens; None = grow on demand (static caches)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0               # tokens held

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add (B, H_kv, T_new, hd) keys/values; return views of everything held so far."""
        b, h, t, _ = k.shape
        if self.k is None:
            cap = self.max_len if self.max_len is not None else t
            self.k = k.new_empty(b, h, cap, k.shape[-1])
            self.v = v.new_empty(b, h, cap, v.shape[-1])
        end = self.length + t
        if end > self.k.shape[2]:
            if self.max_len is not None:
                raise ValueError(f"KVCache: holding {self.length} tokens + {t} new exceeds max_len={self.max_len}")
            grow = max(end, 2 * self.k.shape[2])  # amortised doubling when no capacity was given
            self.k = torch.cat([self.k, self.k.new_empty(b, h, grow - self.k.shape[2], self.k.shape[-1])], 2)
            self.v = torch.cat([self.v, self.v.new_empty(b, h, grow - self.v.shape[2], self.v.shape[-1])], 2)
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep fixed keys/values (cross-attention over an encoder output)."""
        self.k, self.v, self.length = k, v, k.shape[2]

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search keeps the cache of the surviving hypotheses)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)

    def truncate(self, length: int) -> None:
        """Forget tokens after `length` (speculative decoding rolls back rejected drafts)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"KVCache.truncate: expected 0 <= length <= {self.length}, got {length}")
        self.length = length

    def nbytes(self) -> int:
        """Bytes of the keys and values actually held."""
        if self.k is None:
            return 0
        per_tok = self.k[:, :, :1].numel() * self.k.element_size() + self.v[:, :, :1].numel() * self.v.element_size()
        return per_tok * self.length


def make_caches(n_layers: int, max_len: int | None = None) -> list[KVCache]:
    """One `KVCache` per layer."""
    return [KVCache(max_len) for _ in range(n_layers)]
