"""Batches built by token count (the paper: about 25,000 source and 25,000 target tokens a batch).

Sentences of similar length go together (sorted by length), so little of each batch is padding; each
batch holds as many sentence pairs as fit `max_tokens` *padded* tokens per side. The batches are
formed once; their order is reshuffled every epoch from (seed, epoch) alone, which is what exact
resume needs. Under DistributedDataParallel each global batch is split across ranks by sentences of
similar length, so every rank gets about max_tokens / world tokens and the union is the global batch.

    src (B, S) = tokens + </s>        tgt_in (B, T) = <s> + tokens        tgt_out (B, T) = tokens + </s>
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence


class Seq2SeqBatch(NamedTuple):
    src: torch.Tensor       # (B, S) source ids + </s>, right-padded
    tgt_in: torch.Tensor    # (B, T) <s> + target ids (decoder input)
    tgt_out: torch.Tensor   # (B, T) target ids + </s> (what the decoder must predict)


def collate(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], pad_id: int = 0, bos_id: int = 1,
            eos_id: int = 2) -> Seq2SeqBatch:
    """Lists of token ids -> one padded `Seq2SeqBatch`."""
    if len(src) != len(tgt) or not src:
        raise ValueError(f"collate: expected the same non-zero number of sources and targets, got {len(src)}, {len(tgt)}")
    s = pad_sequence([torch.tensor(list(x) + [eos_id]) for x in src], batch_first=True, padding_value=pad_id)
    ti = pad_sequence([torch.tensor([bos_id] + list(y)) for y in tgt], batch_first=True, padding_value=pad_id)
    to = pad_sequence([torch.tensor(list(y) + [eos_id]) for y in tgt], batch_first=True, padding_value=pad_id)
    return Seq2SeqBatch(s, ti, to)


class TokenBatcher:
    """Re-iterable batches of sentence pairs holding at most `max_tokens` padded tokens per side.

    src, tgt     aligned lists of token-id lists (without <s>/</s>)
    max_tokens   padded tokens a batch may hold: n_sentences * (longest sentence + 1) on either side
    shuffle      reshuffle the batch order every epoch (from seed + epoch); False keeps length order
    max_len      pairs with a side longer than this are skipped (None = keep all)
    rank, world  this process's share under DistributedDataParallel
    """

    def __init__(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], max_tokens: int, *,
                 pad_id: int = 0, bos_id: int = 1, eos_id: int = 2, shuffle: bool = True, seed: int = 0,
                 max_len: int | None = None, rank: int = 0, world: int = 1):
        if len(src) != len(tgt):
            raise ValueError(f"TokenBatcher: {len(src)} sources but {len(tgt)} targets; the corpus must be aligned")
        if not 0 <= rank < world:
            raise ValueError(f"TokenBatcher: expected 0 <= rank < world, got rank={rank}, world={world}")
        self.src, self.tgt = src, tgt
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.shuffle, self.seed, self.rank, self.world = shuffle, seed, rank, world
        self.epoch = 0
        ls = np.array([len(x) + 1 for x in src], dtype=np.int64)      # + </s>
        lt = np.array([len(y) + 1 for y in tgt], dtype=np.int64)      # + <s> (or </s>)
        keep = np.ones(len(src), dtype=bool) if max_len is None else (ls <= max_len) & (lt <= max_len)
        keep &= (ls > 1) & (lt > 1)                                    # drop empty lines
        longest = int(np.maximum(ls, lt)[keep].max()) if keep.any() else 0
        if longest > max_tokens:
            raise ValueError(f"TokenBatcher: max_tokens={max_tokens} is smaller than the longest pair "
                             f"({longest} tokens); raise max_tokens or set max_len")
        # sort by (target, source) length; ties broken by a seeded shuffle so equal lengths mix
        idx = np.random.default_rng(seed).permutation(np.flatnonzero(keep))
        idx = idx[np.lexsort((ls[idx], lt[idx]))]
        self.batches: list[np.ndarray] = []
        start, width = 0, 0
        for i in range(len(idx)):       # one pass over sentence lengths (not tokens), at construction only
            width = max(width, ls[idx[i]], lt[idx[i]])
            if (i - start + 1) * width > max_tokens:
                self.batches.append(idx[start:i])
                start, width = i, max(ls[idx[i]], lt[idx[i]])
        if start < len(idx):
            self.batches.append(idx[start:])
        self.batches = [b for b in self.batches if len(b) >= world]  # every rank needs a sentence
        self.n_pairs = int(keep.sum())

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batch order `__iter__` yields (the Trainer calls this)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.batches)

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.batches)))
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(len(self.batches), generator=g).tolist()

    def __iter__(self):
        for b in self.order():
            rows = self.batches[b][self.rank::self.world]            # this rank's share of the global batch
            yield collate([self.src[i] for i in rows], [self.tgt[i] for i in rows],
                          self.pad_id, self.bos_id, self.eos_id)
