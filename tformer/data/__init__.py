"""Every loader and tokenizer of the course (the same calls on small local files in the tests).

    sources    read_parallel (a folder of train/val/test.{lang}), multi30k(), wmt14() through `datasets`;
               cache_dir() (data/cache); DataUnavailableError, the one error of every loader
    corpus     write_offline_corpus: a built-in English-German phrase grammar (agreement, reordering)
    tokenizer  train_byte_bpe (the one `tokenizers` BPE trainer); SharedBPE, the translation vocabulary
    batching   TokenBatcher: batches by token count, reshuffled per epoch, split across DDP ranks;
               PackedIds: a corpus's ids in one flat integer array + offsets
    bpe        byte-pair encoding from scratch (chapter 11; learns the merges of `tokenizers`)
    text       LM text: the offline corpus, `datasets` corpora, a BPE tokenizer, LMBatches; MLM masking
    images     digits, CIFAR-10, image-caption sets (Flickr8k)
    captions   template captions and byte-level caption ids for CLIP
    augment    batched random affine transforms and pixel shifts
    pretrained load_pretrained: hub weights for an optional cell, or a printed reason and what to do
"""
from .batching import PackedIds, Seq2SeqBatch, TokenBatcher, collate, collate_packed
from .tokenizer import SharedBPE
from .corpus import generate_pairs, sentence_pair, write_offline_corpus
from .sources import DataUnavailableError, cache_dir, multi30k, read_parallel, wmt14

__all__ = ["SharedBPE", "TokenBatcher", "PackedIds", "Seq2SeqBatch", "collate", "collate_packed", "generate_pairs", "sentence_pair",
           "write_offline_corpus", "DataUnavailableError", "cache_dir", "multi30k", "read_parallel", "wmt14"]
