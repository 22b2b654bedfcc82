"""Fixtures the tests share (the repository's conftest.py sets up the whole run)."""
import pytest

PAIRS = [("ein hund läuft .", "a dog runs ."), ("eine katze schläft .", "a cat sleeps ."),
         ("ein mann liest ein buch .", "a man reads a book ."), ("zwei kinder spielen .", "two children play ."),
         ("eine frau singt .", "a woman sings ."), ("der hund schläft .", "the dog sleeps .")]


@pytest.fixture
def multi30k(tmp_path):
    """A folder in Multi30k's layout (train, val, test_2016_flickr; .de and .en, line-aligned), a few lines."""
    folder = tmp_path / "m30k"
    folder.mkdir()
    for split, n in (("train", 60), ("val", 6), ("test_2016_flickr", 6)):
        rows = [PAIRS[i % len(PAIRS)] for i in range(n)]
        (folder / f"{split}.de").write_text("\n".join(d for d, _ in rows) + "\n", encoding="utf-8")
        (folder / f"{split}.en").write_text("\n".join(e for _, e in rows) + "\n", encoding="utf-8")
    return folder
