"""Byte-level BPE through Hugging Face `tokenizers`: the one trainer, and the translation vocabulary.

`train_byte_bpe` is the package's one `tokenizers` BPE trainer. Its two users differ on purpose, and
say so in its arguments: the language models (`tformer.data.text.train_tokenizer`, chapters 11-15) use
<|endoftext|>, no prefix space (GPT-2's convention) and keep every merge; the translation vocabulary
(`SharedBPE`) uses <pad>/<s>/</s>/<unk>, a prefix space (a sentence's first word is tokenized like any
other), NFC normalisation (a composed and a decomposed "ä" are one token) and merges seen at least twice.

The paper shares one byte-pair vocabulary (about 37k for EN-DE) between source and target, which lets
the model tie its source embedding, target embedding and output projection. Byte-level BPE never
meets an unknown character. The trained tokenizer is saved with the run (`tokenizer.json`).

    bpe = SharedBPE.train(english_lines + german_lines, vocab_size=8000)
    ids = bpe.encode(["Ein Hund läuft."])          # [[...]] without <s>/</s>
    bpe.decode(ids)                                # ["Ein Hund läuft."]
    bpe.encode_packed(lines)                       # PackedIds: one flat uint16 array + offsets, in chunks
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]          # ids 0, 1, 2, 3


def train_byte_bpe(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str], *, prefix_space: bool,
                   min_frequency: int = 0, unk_token: str | None = None, nfc: bool = False,
                   length: int | None = None, progress: bool = False) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` learned from `texts` up to `vocab_size` tokens.

    special_tokens take the first ids, in order; the 256 byte symbols always follow (no character is
    ever unknown). prefix_space: a space is put before the text, so its first word splits like the
    others. min_frequency: a pair is merged only when seen that often. unk_token: the model's unknown
    token (a byte-level model never emits it; kept for a tokenizer file that names one). nfc: normalise
    to Unicode NFC first. length: how many texts there are (for `tokenizers`' bookkeeping and its progress
    bar). progress: `tokenizers`' own progress bars (counting, then merging) on a terminal.
    """
    tok = Tokenizer(models.BPE(unk_token=unk_token))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=progress)
    tok.train_from_iterator(texts, trainer, length=length)
    return tok


class SharedBPE:
    """A byte-level BPE `tokenizers.Tokenizer` with the special tokens <pad>=0, <s>=1, </s>=2, <unk>=3."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        ids = [tokenizer.token_to_id(t) for t in SPECIALS]
        if ids != [0, 1, 2, 3]:
            raise ValueError(f"SharedBPE: expected special tokens {SPECIALS} at ids 0-3, got {ids}")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = ids

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2,
              length: int | None = None, progress: bool = False) -> "SharedBPE":
        """Learn merges from `texts` (both languages' training sentences) up to `vocab_size` tokens."""
        if vocab_size < 300:
            raise ValueError(f"SharedBPE.train: vocab_size must be >= 300 (256 bytes + specials), got {vocab_size}")
        return cls(train_byte_bpe(texts, vocab_size, SPECIALS, prefix_space=True, min_frequency=min_frequency,
                                  unk_token=UNK, nfc=True, length=length, progress=progress))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SharedBPE":
        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.tok.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Sentences -> token ids (no <s>/</s>; the batcher adds them). Batched in Rust."""
        return [e.ids for e in self.tok.encode_batch(list(lines), add_special_tokens=False)]

    def encode_packed(self, lines: Sequence[str], chunk: int = 20_000, progress: bool = False,
                      desc: str = "encode") -> "PackedIds":
        """Sentences -> `PackedIds` (uint16 ids while the vocabulary fits), `chunk` lines at a time.

        What `encode` gives, without holding a Python list per sentence: `tokenizers` builds an Encoding
        (ids, tokens, offsets, masks) for every line of a call, so encoding a whole corpus in one call
        holds all of them at once; here only `chunk` lines' worth is alive, and each chunk's ids go
        straight into an integer array. progress: a tqdm bar over the lines."""
        from .batching import PackedIds, id_dtype
        from tqdm import tqdm

        dtype = id_dtype(self.vocab_size)
        ids, lengths = [], []
        with tqdm(total=len(lines), desc=desc, unit=" lines", unit_scale=True, disable=not progress,
                  mininterval=1.0) as bar:
            for start in range(0, len(lines), chunk):
                encs = self.tok.encode_batch_fast(list(lines[start:start + chunk]), add_special_tokens=False)
                rows = [e.ids for e in encs]
                lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
                ids.append(np.fromiter((i for r in rows for i in r), dtype=dtype, count=int(lens.sum())))
                lengths.append(lens)
                bar.update(len(rows))
        offsets = np.zeros(len(lines) + 1, dtype=np.int64)
        if lines:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return PackedIds(np.concatenate(ids) if ids else np.zeros(0, dtype=dtype), offsets)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Token ids -> sentences; special tokens are dropped, stops at the first </s>."""
        cut = []
        for row in ids:
            row = list(row)
            if self.eos_id in row:
                row = row[:row.index(self.eos_id)]
            cut.append(row)
        return [s.strip() for s in self.tok.decode_batch(cut, skip_special_tokens=True)]
