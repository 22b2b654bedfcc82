"""Text for small language models (chapters 11, 13): an offline corpus, real corpora through `datasets`,
a byte-level BPE tokenizer, and re-iterable batches of (input, next-token target) windows.

    text = offline_text()                       # Python's bundled documentation, about 0.47 MB of English
    tok = train_tokenizer([text], vocab_size=1024)
    ids = encode(tok, text)                     # LongTensor (n,)
    train, val = split_stream(ids, 0.9)
    batches = LMBatches(train, batch_size=16, context_length=64, batches_per_epoch=100)
    Trainer(model, lm_loss, batches, cfg, val_data=LMBatches(val, 16, 64, 8, shuffle=False)).fit()   # lm_loss: tformer.training.losses

With a network connection, `hf_text("wikitext")` (or any `datasets` text corpus) gives more text; it is
cached by `datasets`. Offline it raises `DataUnavailableError` saying what to do.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import torch

from .sources import DataUnavailableError, load_hub_dataset  # one error type for every loader
from .tokenizer import train_byte_bpe
from ..utils.checks import check_tokens

IGNORE = -100  # label of positions that carry no loss (F.cross_entropy's ignore_index): MLM, SFT

# name -> (datasets path, config, text column)
CORPORA = {
    "wikitext": ("Salesforce/wikitext", "wikitext-103-raw-v1", "text"),
    "wikitext2": ("Salesforce/wikitext", "wikitext-2-raw-v1", "text"),
    "tinystories": ("roneneldan/TinyStories", None, "text"),
}


def offline_text() -> str:
    """Python's own bundled documentation (`pydoc_data.topics`): ~0.47 MB of English, no download."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def hf_text(name: str = "wikitext", split: str = "train", max_chars: int | None = None) -> str:
    """A text corpus through `datasets` (cached after the first download), joined into one string.

    name: one of CORPORA, or a local .txt file (read by the `datasets` "text" builder, one row a line).
    Offline (and not cached) it raises DataUnavailableError.
    """
    if name in CORPORA:
        path, config, column = CORPORA[name]
        kwargs = {}
    elif name.endswith(".txt") and Path(name).is_file():
        path, config, column = "text", None, "text"
        kwargs = {"data_files": {split: name}}
    else:
        raise ValueError(f"hf_text: name must be one of {sorted(CORPORA)} or a local .txt file, got {name!r}")
    ds = load_hub_dataset(path, config, split=split, local=path == "text", **kwargs, hint=(
        "Run once with a network connection (it is then cached under tformer.data.cache_dir(), data/cache/ "
        "in a checkout), or use the offline corpus: tformer.data.text.offline_text() (set TFORMER_SMALL=1 in "
        "the notebooks)."))
    parts, n = [], 0
    for row in ds:
        t = row[column]
        parts.append(t)
        n += len(t)
        if max_chars is not None and n >= max_chars:
            break
    return "".join(parts) if name.startswith("wikitext") else "\n".join(parts)  # wikitext rows keep their newlines


def _chunks(text: str, chunk_chars: int = 1 << 16) -> Iterator[str]:
    """Cut text at line ends into pieces of about `chunk_chars` characters (for parallel tokenizing)."""
    cur, size = [], 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        size += len(line)
        if size >= chunk_chars:
            yield "".join(cur)
            cur, size = [], 0
    if cur:
        yield "".join(cur)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    """A byte-level BPE `tokenizers.Tokenizer` learned from `texts` (never meets an unknown character):
    `tformer.data.tokenizer.train_byte_bpe` with GPT-2's conventions (<|endoftext|>, no prefix space,
    every merge kept). Long texts are fed in pieces of lines, which `tokenizers` processes in parallel."""
    if vocab_size < 257:
        raise ValueError(f"train_tokenizer: vocab_size must be >= 257 (256 bytes + <|endoftext|>), got {vocab_size}")
    return train_byte_bpe((piece for t in texts for piece in _chunks(t)), vocab_size, ["<|endoftext|>"],
                          prefix_space=False)


def encode(tok, text: str, chunk_chars: int = 1 << 16) -> torch.Tensor:
    """text -> token ids (n,) int64, encoded in chunks of lines (in parallel by `tokenizers`)."""
    encodings = tok.encode_batch(list(_chunks(text, chunk_chars)))
    return torch.cat([torch.tensor(e.ids, dtype=torch.long) for e in encodings] or [torch.zeros(0, dtype=torch.long)])


def split_stream(ids: torch.Tensor, train_fraction: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `train_fraction` of the stream for training, the rest for validation (no overlap)."""
    if not 0 < train_fraction < 1:
        raise ValueError(f"split_stream: train_fraction must be in (0, 1), got {train_fraction}")
    cut = int(len(ids) * train_fraction)
    return ids[:cut], ids[cut:]


class LMBatches:
    """Re-iterable batches of windows of a token stream: (x (B, T), y (B, T)) with y = x shifted by one.

    shuffle=True: each epoch draws `batches_per_epoch` batches of random windows, from (seed, epoch)
    alone (exact resume with the Trainer's `set_epoch`). shuffle=False: consecutive non-overlapping
    windows from the start (a fixed validation set). Under DistributedDataParallel each rank
    (rank, world) takes its own share of every batch's rows.
    """

    def __init__(self, ids: torch.Tensor, batch_size: int, context_length: int, batches_per_epoch: int,
                 shuffle: bool = True, seed: int = 0, rank: int = 0, world: int = 1):
        if ids.dim() != 1 or len(ids) < context_length + 2:
            raise ValueError(f"LMBatches: expected a 1-D token stream longer than context_length + 1 = {context_length + 1}, "
                             f"got shape {tuple(ids.shape)}")
        if batch_size % world:
            raise ValueError(f"LMBatches: batch_size={batch_size} must be divisible by world={world}")
        if not shuffle and batches_per_epoch * batch_size * context_length + 1 > len(ids):
            raise ValueError(f"LMBatches: {batches_per_epoch} sequential batches of {batch_size}x{context_length} need "
                             f"{batches_per_epoch * batch_size * context_length + 1} tokens, the stream has {len(ids)}")
        self.ids, self.batch_size, self.context_length = ids, batch_size, context_length
        self.batches_per_epoch, self.shuffle, self.seed = batches_per_epoch, shuffle, seed
        self.rank, self.world, self.epoch = rank, world, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        b, t = self.batch_size, self.context_length
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            starts = torch.randint(0, len(self.ids) - t - 1, (self.batches_per_epoch, b), generator=g)
        else:
            starts = (torch.arange(self.batches_per_epoch * b) * t).view(self.batches_per_epoch, b)
        offsets = torch.arange(t + 1)
        per_rank = b // self.world
        for row in starts:
            row = row[self.rank * per_rank:(self.rank + 1) * per_rank]
            win = self.ids[row[:, None] + offsets]                     # (B, T + 1)
            yield win[:, :-1], win[:, 1:]


# ----------------------------------------------------------------------------------------------------
# Masked-LM inputs (BERT, chapter 11): choose 15% of the tokens; of those 80% -> [MASK], 10% -> a random
# token, 10% unchanged; the loss (`tformer.training.losses.masked_lm_loss`) counts the chosen positions only.


def apply_mlm_masking(ids: torch.Tensor, u_select: torch.Tensor, u_action: torch.Tensor, random_ids: torch.Tensor,
                      mask_id: int, p: float = 0.15, special: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking rule with its randomness given as inputs (all (B, T)).

    A position is chosen when u_select < p (and it is not `special`). A chosen position becomes
    `mask_id` when u_action < 0.8, `random_ids` when 0.8 <= u_action < 0.9, and stays as it is otherwise.
    Returns (inputs (B, T), labels (B, T)): labels hold the original id at chosen positions, IGNORE elsewhere.
    """
    check_tokens(ids, "ids")
    chosen = u_select < p
    if special is not None:
        chosen = chosen & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    inputs = torch.where(chosen & (u_action < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(chosen & (u_action >= 0.8) & (u_action < 0.9), random_ids.to(ids.dtype), inputs)
    return inputs, labels


def mask_tokens(ids: torch.Tensor, vocab_size: int, mask_id: int, p: float = 0.15, special_ids: tuple[int, ...] = (),
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-LM inputs and labels for ids (B, T): draws the randomness and calls `apply_mlm_masking`.
    Tokens in `special_ids` ([CLS], [SEP], [PAD], ...) are never chosen."""
    check_tokens(ids, "ids")
    shape, dev = ids.shape, ids.device
    u_select = torch.rand(shape, generator=generator).to(dev)
    u_action = torch.rand(shape, generator=generator).to(dev)
    random_ids = torch.randint(0, vocab_size, shape, generator=generator).to(dev)
    special = torch.isin(ids, torch.tensor(list(special_ids), dtype=ids.dtype, device=dev)) if special_ids else None
    return apply_mlm_masking(ids, u_select, u_action, random_ids, mask_id, p, special)
