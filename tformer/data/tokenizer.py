"""A shared byte-level BPE vocabulary for both languages, through Hugging Face `tokenizers`.

The paper shares one byte-pair vocabulary (about 37k for EN-DE) between source and target, which lets
the model tie its source embedding, target embedding and output projection. Byte-level BPE never
meets an unknown character. The trained tokenizer is saved with the run (`tokenizer.json`).

    bpe = SharedBPE.train(english_lines + german_lines, vocab_size=8000)
    ids = bpe.encode(["Ein Hund läuft."])          # [[...]] without <s>/</s>
    bpe.decode(ids)                                # ["Ein Hund läuft."]
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]          # ids 0, 1, 2, 3


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
              length: int | None = None) -> "SharedBPE":
        """Learn merges from `texts` (both languages' training sentences) up to `vocab_size` tokens."""
        if vocab_size < 300:
            raise ValueError(f"SharedBPE.train: vocab_size must be >= 300 (256 bytes + specials), got {vocab_size}")
        tok = Tokenizer(models.BPE(unk_token=UNK))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(texts, trainer, length=length)
        return cls(tok)

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

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Token ids -> sentences; special tokens are dropped, stops at the first </s>."""
        cut = []
        for row in ids:
            row = list(row)
            if self.eos_id in row:
                row = row[:row.index(self.eos_id)]
            cut.append(row)
        return [s.strip() for s in self.tok.decode_batch(cut, skip_special_tokens=True)]
