"""tformer.data.bpe against Hugging Face `tokenizers`: the same merges, the same vocabulary, the same ids."""
import pytest

from tformer.data.bpe import merge, train_bpe, tokenizers_merges
from tformer.data.text import offline_text, train_tokenizer


@pytest.mark.parametrize("ids, pair, new_id, expected", [
    ([1, 2, 3, 1, 2], (1, 2), 9, [9, 3, 9]),
    ([1, 1, 1], (1, 1), 9, [9, 1]),                  # non-overlapping, left to right
    ([1, 1, 1, 1], (1, 1), 9, [9, 9]),
    ([], (1, 2), 9, []),
    ([2, 1], (1, 2), 9, [2, 1]),                      # order matters
    ([1], (1, 2), 9, [1]),
])
def test_merge(ids, pair, new_id, expected):
    assert merge(ids, pair, new_id) == expected


@pytest.mark.parametrize("chars, vocab_size", [(5_000, 300), (40_000, 700)])
def test_train_bpe_learns_the_merges_tokenizers_learns(chars, vocab_size):
    text = offline_text()[:chars]
    mine, theirs = train_bpe([text], vocab_size), train_tokenizer([text], vocab_size)
    assert mine.merges == tokenizers_merges(theirs)
    assert mine.vocab == theirs.get_vocab()
    held_out = offline_text()[200_000:203_000]                 # text the merges were not learned from
    assert mine.encode(held_out) == theirs.encode(held_out).ids
    assert mine.decode(mine.encode(held_out)) == held_out


def test_ties_go_to_the_smaller_pair_and_training_stops_when_nothing_is_left():
    bpe = train_bpe(["ab cd"], 400)                 # every pair occurs once: ties everywhere
    theirs = train_tokenizer(["ab cd"], 400)
    assert bpe.merges == tokenizers_merges(theirs) and len(bpe) == theirs.get_vocab_size() < 400


def test_vocab_size_too_small_is_rejected():
    with pytest.raises(ValueError, match="vocab_size must be >= 257"):
        train_bpe(["hello"], 100)
