"""Data for the translation chapter and capstone (and the LM chapters).

    bpe        SharedBPE: one byte-level BPE vocabulary for both languages (`tokenizers`)
    batching   TokenBatcher: batches by token count, reshuffled per epoch, split across DDP ranks
    sources    read_parallel (a folder of train/val/test.{lang}), multi30k(), wmt14() through `datasets`
    corpus     write_offline_corpus: a built-in English-German phrase grammar (agreement, reordering)
"""
from .batching import Seq2SeqBatch, TokenBatcher, collate
from .bpe import SharedBPE
from .corpus import generate_pairs, sentence_pair, write_offline_corpus
from .sources import DataUnavailableError, cache_dir, multi30k, read_parallel, wmt14

__all__ = ["SharedBPE", "TokenBatcher", "Seq2SeqBatch", "collate", "generate_pairs", "sentence_pair",
           "write_offline_corpus", "DataUnavailableError", "cache_dir", "multi30k", "read_parallel", "wmt14"]
