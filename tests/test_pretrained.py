"""tformer.data.pretrained.load_pretrained: the notebooks' download-or-explain step (chapters 11 and 12)."""
import pytest

from tformer.data.pretrained import load_pretrained


def test_returns_what_load_returns():
    assert load_pretrained(lambda: (1, 2), "x") == (1, 2)


def test_offline_it_explains_instead_of_loading(monkeypatch, capsys):
    import tformer.data.pretrained as pretrained
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(pretrained, "offline_reason", lambda host: f"cannot reach {host}")
    called = []
    assert load_pretrained(lambda: called.append(1), "gpt2") is None
    out = capsys.readouterr().out
    assert not called and "could not download gpt2: cannot reach huggingface.co" in out and "HF_HOME" in out


@pytest.mark.parametrize("error", [OSError("gpt2 is not in the cache"), ValueError("bad config")])
def test_a_failed_load_is_explained(monkeypatch, capsys, error):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                  # transformers reads its cache, which lacks it

    def load():
        raise error
    assert load_pretrained(load, "openai/clip-vit-base-patch32") is None
    out = capsys.readouterr().out
    assert f"could not load openai/clip-vit-base-patch32 ({type(error).__name__}: {error})" in out
    assert "network connection" in out
