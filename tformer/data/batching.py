"""Batches built by token count (the paper: about 25,000 source and 25,000 target tokens a batch).

Sentences of similar length go together (sorted by length), so little of each batch is padding; each
batch holds as many sentence pairs as fit `max_tokens` *padded* tokens per side. The batches are
formed once; their order is reshuffled every epoch from (seed, epoch) alone, which is what exact
resume needs. Under DistributedDataParallel each global batch is split across ranks by sentences of
similar length, so every rank gets about max_tokens / world tokens and the union is the global batch.

    src (B, S) = tokens + </s>        tgt_in (B, T) = <s> + tokens        tgt_out (B, T) = tokens + </s>

A corpus is held as `PackedIds`: one flat integer array of every sentence's ids and the offsets where
each sentence starts (uint16 when the vocabulary fits, as a 37k one does: 2 bytes a token, where a Python
list of ints costs about 36). WMT14 EN-DE's 9M sentences then take about 0.5 GB instead of about 10 GB.
`TokenBatcher` also takes lists of id lists, and packs them.
"""
from __future__ import annotations

from itertools import chain
from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence


class Seq2SeqBatch(NamedTuple):
    src: torch.Tensor       # (B, S) source ids + </s>, right-padded
    tgt_in: torch.Tensor    # (B, T) <s> + target ids (decoder input)
    tgt_out: torch.Tensor   # (B, T) target ids + </s> (what the decoder must predict)


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest array dtype for ids below `vocab_size`: uint16 up to 65,536, else int32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


class PackedIds:
    """Sentences of token ids packed in one flat array: sentence i is `ids[offsets[i]:offsets[i + 1]]`.

        packed = PackedIds.from_lists([[5, 6, 7], [8]])      # ids [5 6 7 8], offsets [0 3 4]
        len(packed), packed[0], packed.lengths               # 2, array([5, 6, 7]), array([3, 1])
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        ids, offsets = np.asarray(ids), np.asarray(offsets, dtype=np.int64)
        if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(ids) \
                or (np.diff(offsets) < 0).any():
            raise ValueError(f"PackedIds: expected 1-D ids and offsets rising from 0 to len(ids)={len(ids)}")
        self.ids, self.offsets = ids, offsets

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], dtype=None) -> "PackedIds":
        """Pack lists of ids (dtype: the smallest that holds the largest id, unless given)."""
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(offsets[-1]))
        if dtype is None:
            dtype = id_dtype(int(flat.max()) + 1 if len(flat) else 1) if not len(flat) or flat.min() >= 0 else np.int64
        return cls(flat.astype(dtype), offsets)

    @classmethod
    def concatenate(cls, parts: Sequence["PackedIds"]) -> "PackedIds":
        """One PackedIds of the sentences of `parts`, in order."""
        if not parts:
            return cls(np.zeros(0, dtype=np.uint16), np.zeros(1, dtype=np.int64))
        ids = np.concatenate([p.ids for p in parts])
        starts = np.cumsum([0] + [len(p.ids) for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
        return cls(ids, offsets)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def tolist(self) -> list[list[int]]:
        return [self[i].tolist() for i in range(len(self))]

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.offsets.nbytes


def pad_rows(packed: PackedIds, rows: np.ndarray, pad_id: int, before: int | None = None,
             after: int | None = None) -> torch.Tensor:
    """The sentences `rows` of `packed` as one right-padded int64 (B, W) tensor, with `before` put in front
    of each and `after` behind it when given (W = the longest + those). No Python loop over sentences."""
    rows = np.asarray(rows, dtype=np.int64)
    starts, lens = packed.offsets[rows], packed.offsets[rows + 1] - packed.offsets[rows]
    lead = before is not None
    width = int(lens.max(initial=0)) + lead + (after is not None)
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    total = int(lens.sum())
    row_of = np.repeat(np.arange(len(rows)), lens)                   # the row of every token, in order
    first = np.cumsum(lens) - lens                                   # where each row's tokens begin in the run
    pos = np.arange(total) - np.repeat(first, lens)                  # each token's position in its row
    out[row_of, pos + lead] = packed.ids[np.repeat(starts - first, lens) + np.arange(total)]
    if lead:
        out[:, 0] = before
    if after is not None:
        out[np.arange(len(rows)), lens + lead] = after
    return torch.from_numpy(out)


def collate(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], pad_id: int = 0, bos_id: int = 1,
            eos_id: int = 2) -> Seq2SeqBatch:
    """Lists of token ids -> one padded `Seq2SeqBatch`."""
    if len(src) != len(tgt) or not src:
        raise ValueError(f"collate: expected the same non-zero number of sources and targets, got {len(src)}, {len(tgt)}")
    s = pad_sequence([torch.tensor(list(x) + [eos_id]) for x in src], batch_first=True, padding_value=pad_id)
    ti = pad_sequence([torch.tensor([bos_id] + list(y)) for y in tgt], batch_first=True, padding_value=pad_id)
    to = pad_sequence([torch.tensor(list(y) + [eos_id]) for y in tgt], batch_first=True, padding_value=pad_id)
    return Seq2SeqBatch(s, ti, to)


def collate_packed(src: PackedIds, tgt: PackedIds, rows: np.ndarray, pad_id: int = 0, bos_id: int = 1,
                   eos_id: int = 2) -> Seq2SeqBatch:
    """The pairs `rows` of two packed corpora -> one padded `Seq2SeqBatch` (what `collate` gives for them)."""
    if len(rows) == 0:
        raise ValueError("collate_packed: expected at least one row")
    return Seq2SeqBatch(pad_rows(src, rows, pad_id, after=eos_id), pad_rows(tgt, rows, pad_id, before=bos_id),
                        pad_rows(tgt, rows, pad_id, after=eos_id))


def split_by_tokens(widths: np.ndarray, max_tokens: int) -> np.ndarray:
    """Where to cut a sequence of sentences (in batching order) so that each piece holds at most `max_tokens`
    padded tokens, n_sentences * the widest: the greedy cut, each piece as long as fits. Returns the start
    of every piece. Each piece is found with array operations on a window of at most max_tokens // (its
    first width) sentences, so the cost is one numpy call per batch, not one Python step per sentence."""
    widths = np.asarray(widths, dtype=np.int64)
    n, starts, s = len(widths), [], 0
    while s < n:
        starts.append(s)
        window = widths[s:s + max(max_tokens // max(int(widths[s]), 1), 1) + 1]
        over = np.arange(1, len(window) + 1) * np.maximum.accumulate(window) > max_tokens
        s += max(int(over.argmax()), 1) if over.any() else len(window)
    return np.asarray(starts, dtype=np.int64)


class TokenBatcher:
    """Re-iterable batches of sentence pairs holding at most `max_tokens` padded tokens per side.

    src, tgt     aligned corpora: `PackedIds` (what the pipeline passes), or lists of token-id lists
                 (without <s>/</s>)
    max_tokens   padded tokens a batch may hold: n_sentences * (longest sentence + 1) on either side
    shuffle      reshuffle the batch order every epoch (from seed + epoch); False keeps length order
    max_len      pairs with a side longer than this are skipped (None = keep all)
    rank, world  this process's share under DistributedDataParallel
    """

    def __init__(self, src: Sequence[Sequence[int]] | PackedIds, tgt: Sequence[Sequence[int]] | PackedIds,
                 max_tokens: int, *, pad_id: int = 0, bos_id: int = 1, eos_id: int = 2, shuffle: bool = True,
                 seed: int = 0, max_len: int | None = None, rank: int = 0, world: int = 1):
        if len(src) != len(tgt):
            raise ValueError(f"TokenBatcher: {len(src)} sources but {len(tgt)} targets; the corpus must be aligned")
        if not 0 <= rank < world:
            raise ValueError(f"TokenBatcher: expected 0 <= rank < world, got rank={rank}, world={world}")
        self.src = src if isinstance(src, PackedIds) else PackedIds.from_lists(src)
        self.tgt = tgt if isinstance(tgt, PackedIds) else PackedIds.from_lists(tgt)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.shuffle, self.seed, self.rank, self.world = shuffle, seed, rank, world
        self.epoch = 0
        ls = self.src.lengths + 1                                      # + </s>
        lt = self.tgt.lengths + 1                                      # + <s> (or </s>)
        keep = np.ones(len(ls), dtype=bool) if max_len is None else (ls <= max_len) & (lt <= max_len)
        keep &= (ls > 1) & (lt > 1)                                    # drop empty lines
        longest = int(np.maximum(ls, lt)[keep].max()) if keep.any() else 0
        if longest > max_tokens:
            raise ValueError(f"TokenBatcher: max_tokens={max_tokens} is smaller than the longest pair "
                             f"({longest} tokens); raise max_tokens or set max_len")
        # sort by (target, source) length; ties broken by a seeded shuffle so equal lengths mix
        idx = np.random.default_rng(seed).permutation(np.flatnonzero(keep))
        idx = idx[np.lexsort((ls[idx], lt[idx]))]
        cuts = split_by_tokens(np.maximum(ls[idx], lt[idx]), max_tokens)
        self.batches: list[np.ndarray] = [b for b in np.split(idx, cuts[1:]) if len(b) >= world]  # a sentence per rank
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
            yield collate_packed(self.src, self.tgt, rows, self.pad_id, self.bos_id, self.eos_id)
