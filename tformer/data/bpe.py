"""Byte-pair encoding from scratch (chapter 11), learning the same merges as Hugging Face `tokenizers`.

BPE (Sennrich et al. 2016; byte-level as in GPT-2): start from the 256 bytes, count every adjacent pair of
tokens in the corpus, merge the most frequent pair into a new token, repeat until the vocabulary is full.

    bpe = train_bpe([text], vocab_size=512)          # 1 special + 256 bytes + 255 merges
    bpe.merges[:3]                                   # [('Ġ', 't'), ('e', 'r'), ...]
    ids = bpe.encode("The for statement")            # list[int]; bpe.decode(ids) gives the text back

Words come from the byte-level pre-tokenizer of `tokenizers` (GPT-2's regex: a word keeps its leading
space, shown as 'Ġ'; bytes are written as printable characters), so words never merge across spaces.
The merge loop matches `tokenizers.trainers.BpeTrainer`: the most frequent pair wins, a tie goes to the
pair with the smaller (left id, right id), where ids are: special tokens, then the 256 byte characters
sorted by code point, then merged tokens in the order they were made.
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable


def merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of `pair` in `ids`, left to right, by `new_id`."""
    out, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def pre_tokenize(text: str) -> list[str]:
    """GPT-2's byte-level words of `text` (leading space kept as 'Ġ'), via `tokenizers`' pre-tokenizer."""
    from tokenizers import pre_tokenizers

    return [w for w, _ in pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)]


def byte_alphabet() -> list[str]:
    """The 256 printable characters byte-level BPE writes bytes as, sorted by code point."""
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


@dataclass
class BytePairEncoding:
    """A trained byte-level BPE: `vocab` token -> id and `merges` in the order they were learned."""
    vocab: dict[str, int]
    merges: list[tuple[str, str]]
    _ranks: dict[tuple[str, str], int] = field(init=False, repr=False)

    def __post_init__(self):
        self._ranks = {m: r for r, m in enumerate(self.merges)}
        self._cache: dict[str, list[int]] = {}
        self.id_to_token = {i: t for t, i in self.vocab.items()}

    def _encode_word(self, word: str) -> list[int]:
        if word not in self._cache:
            parts = list(word)
            while len(parts) > 1:      # apply the earliest-learned merge present, as training did
                pairs = [(self._ranks.get(p, len(self._ranks)), i) for i, p in enumerate(zip(parts, parts[1:]))]
                rank, _ = min(pairs)
                if rank == len(self._ranks):
                    break
                a, b = self.merges[rank]
                parts = [self.id_to_token[i] for i in merge([self.vocab[p] for p in parts],
                                                            (self.vocab[a], self.vocab[b]), self.vocab[a + b])]
            self._cache[word] = [self.vocab[p] for p in parts]
        return self._cache[word]

    def encode(self, text: str) -> list[int]:
        return [i for w in pre_tokenize(text) for i in self._encode_word(w)]

    def decode(self, ids: list[int]) -> str:
        from tokenizers import decoders

        return decoders.ByteLevel().decode([self.id_to_token[i] for i in ids])

    def __len__(self) -> int:
        return len(self.vocab)


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: tuple[str, ...] = ("<|endoftext|>",)
              ) -> BytePairEncoding:
    """Learn merges until the vocabulary (specials + 256 bytes + merges) holds `vocab_size` tokens.

    Each merge updates only the words that contain the pair (an index pair -> words), so a merge costs
    the occurrences it touches rather than a pass over the corpus.
    """
    alphabet = byte_alphabet()
    if vocab_size < len(special_tokens) + len(alphabet):
        raise ValueError(f"train_bpe: vocab_size must be >= {len(special_tokens) + len(alphabet)} "
                         f"({len(special_tokens)} special tokens + 256 bytes), got {vocab_size}")
    vocab = {t: i for i, t in enumerate(list(special_tokens) + alphabet)}
    counts = Counter(w for t in texts for w in pre_tokenize(t))
    words = [[vocab[c] for c in w] for w in counts]                  # each distinct word as ids
    freq = list(counts.values())
    pairs: Counter = Counter()                                        # (a, b) -> occurrences in the corpus
    where = defaultdict(set)                                          # (a, b) -> indices of words holding it
    for k, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += freq[k]
            where[p].add(k)
    heap = [(-c, p) for p, c in pairs.items()]                       # lazy max-heap: stale entries skipped
    heapq.heapify(heap)
    tokens = list(vocab)
    merges = []
    while len(tokens) < vocab_size and heap:
        neg, best = heapq.heappop(heap)
        if -neg != pairs.get(best, 0) or neg == 0:                   # stale (count changed) or gone
            continue
        new_id = len(tokens)                                          # most frequent; ties: smaller ids
        tokens.append(tokens[best[0]] + tokens[best[1]])
        merges.append((tokens[best[0]], tokens[best[1]]))
        changed = set()
        for k in where.pop(best):
            old, new = words[k], merge(words[k], best, new_id)
            for p in zip(old, old[1:]):                               # remove the word's old pairs ...
                pairs[p] -= freq[k]
                changed.add(p)
            for p in zip(new, new[1:]):                               # ... and add its new ones
                pairs[p] += freq[k]
                where[p].add(k)
                changed.add(p)
            words[k] = new
        for p in changed:
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], p))
    return BytePairEncoding({t: i for i, t in enumerate(tokens)}, merges)


def tokenizers_merges(tok) -> list[tuple[str, str]]:
    """The merges of a trained `tokenizers.Tokenizer` (BPE model), in the order they were learned."""
    import json

    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


__all__ = ["merge", "pre_tokenize", "byte_alphabet", "BytePairEncoding", "train_bpe", "tokenizers_merges"]
