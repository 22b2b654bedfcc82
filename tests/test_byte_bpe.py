"""tformer.data.tokenizer.train_byte_bpe, the one `tokenizers` BPE trainer: the translation vocabulary
(SharedBPE.train) and the language models' (data.text.train_tokenizer) give the same tokenizers as
their separate trainers did (the BLEU baseline depends on the translation ids)."""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tformer.data.corpus import generate_pairs
from tformer.data.text import _chunks, train_tokenizer
from tformer.data.tokenizer import SPECIALS, UNK, SharedBPE

CORPUS = ["Ein kleiner Hund läuft über die Straße.", "Zwei Männer spielen Fußball im Park.",
          "A small dog runs across the street.", "Two men play football in the park.",
          "Eine Frau liest ein Buch.", "A woman reads a book.", "Der Hund schläft.", "The dog sleeps."] * 5


# the two call sequences as they were before they became one function
def old_shared_bpe(texts, vocab_size, min_frequency=2, length=None):
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer, length=length)
    return tok


def old_lm_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((piece for t in texts for piece in _chunks(t)), trainer)
    return tok


def test_translation_ids_are_unchanged():
    # fixed ids, computed by the separate trainer before the merge (tokenizers as pinned by the project)
    bpe = SharedBPE.train(CORPUS, vocab_size=300)
    assert bpe.vocab_size == 300
    assert bpe.encode(["Der kleine Hund liest.", "The woman plays in the street."]) == [
        [224, 297, 224, 78, 266, 260, 72, 295, 224, 79, 265, 86, 87, 17],
        [287, 264, 224, 283, 80, 68, 81, 289, 79, 68, 92, 86, 224, 260, 292, 261, 87, 281, 72, 87, 17]]
    # and the whole tokenizer (vocabulary, merges, normaliser, pre-tokenizer) equals the old call sequence's
    en, de = generate_pairs(300, seed=0)
    for vocab in (320, 600):
        new, old = SharedBPE.train(en + de, vocab_size=vocab).tok, old_shared_bpe(en + de, vocab)
        assert new.to_str() == old.to_str()
        lines = en[:20] + de[:20]
        assert [e.ids for e in new.encode_batch(lines)] == [e.ids for e in old.encode_batch(lines)]


def test_language_model_ids_are_unchanged():
    tok = train_tokenizer(["\n".join(CORPUS)], vocab_size=280)
    assert tok.get_vocab_size() == 280
    assert tok.encode("Der kleine Hund liest.\nThe woman plays in the street.").ids == [
        36, 259, 221, 75, 263, 257, 69, 221, 269, 68, 221, 76, 262, 83, 84, 14, 199, 52, 261, 221, 87, 79, 77, 65, 78,
        221, 80, 76, 65, 89, 83, 221, 257, 221, 279, 258, 84, 278, 69, 84, 14]
    en, de = generate_pairs(300, seed=0)
    text = "\n".join(en + de)
    assert train_tokenizer([text], vocab_size=400).to_str() == old_lm_tokenizer([text], 400).to_str()
