"""Text for small LMs (tformer.data.text): offline corpus, tokenizer, batches, loss; no downloads."""
import pytest
import torch
import torch.nn.functional as F

from tformer.data.sources import DataUnavailableError
from tformer.data.text import LMBatches, encode, hf_text, offline_text, split_stream, train_tokenizer
from tformer.training.losses import fused_lm_loss, lm_loss
from tformer.models import GPT, GPTConfig
from tformer.moe import MoEConfig


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([offline_text()[:100_000]], vocab_size=300)


def test_offline_text_is_english_prose():
    text = offline_text()
    assert len(text) > 400_000 and "assert" in text and text == offline_text()


def test_tokenizer_round_trip_and_chunked_encoding(tok):
    text = "The assert statement\nis a convenient way.\n\n  Ünïcödé too: 42 ≥ 41\n" * 3
    ids = encode(tok, text, chunk_chars=10)                      # chunked on line ends
    assert ids.dtype == torch.long and tok.decode(ids.tolist()) == text
    assert torch.equal(ids, torch.tensor(tok.encode(text).ids))
    assert tok.get_vocab_size() == 300
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


def test_batches_are_shifted_windows_deterministic_per_epoch():
    ids = torch.arange(1000)
    b = LMBatches(ids, batch_size=4, context_length=8, batches_per_epoch=3, seed=1)
    first = list(b)
    assert len(first) == 3
    for x, y in first:
        assert x.shape == y.shape == (4, 8)
        assert torch.equal(y, x + 1)                              # next token of a counting stream
        assert torch.equal(x[:, 1:], x[:, :-1] + 1)               # contiguous windows
    assert all(torch.equal(a[0], c[0]) for a, c in zip(first, list(b)))       # same epoch, same batches
    b.set_epoch(1)
    assert not torch.equal(list(b)[0][0], first[0][0])                        # new epoch, new order
    halves = [list(LMBatches(ids, 4, 8, 3, seed=1, rank=r, world=2)) for r in (0, 1)]
    for j in range(3):                                                        # DDP ranks split each batch
        assert torch.equal(torch.cat([halves[0][j][0], halves[1][j][0]]), first[j][0])


def test_sequential_batches_cover_the_stream_in_order():
    ids = torch.arange(100)
    x0, y0 = next(iter(LMBatches(ids, 2, 5, 3, shuffle=False)))
    assert x0.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    with pytest.raises(ValueError, match="need"):
        LMBatches(ids, 4, 10, 5, shuffle=False)
    with pytest.raises(ValueError, match="1-D"):
        LMBatches(torch.arange(5), 1, 8, 1)


def test_split_stream():
    tr, va = split_stream(torch.arange(10), 0.8)
    assert tr.tolist() == list(range(8)) and va.tolist() == [8, 9]


def test_lm_loss_sum_count_and_aux_only_in_training():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, context_length=8, n_layers=1, n_heads=2, d_model=16,
                          moe=MoEConfig(n_experts=4, top_k=2)))
    x, y = torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8))
    model.train()
    loss, n = lm_loss(model, (x, y))
    ce = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    assert n == 16
    torch.testing.assert_close(loss, (ce + model.aux_loss) * 16)
    model.eval()
    loss, n = lm_loss(model, (x, y))
    torch.testing.assert_close(loss, F.cross_entropy(model(x).flatten(0, 1), y.flatten()) * 16)


def test_fused_lm_loss_is_lm_loss_without_the_logits():
    """The MoE capstone's loss: the same sum, aux loss and gradients as lm_loss, in both modes (lm_loss takes
    its cross-entropy in float32, hence float32's tolerance on a float64 model; the aux loss is 0.4% of it)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, context_length=8, n_layers=2, n_heads=2, d_model=16,
                          moe=MoEConfig(n_experts=4, top_k=2))).double()
    x, y = torch.randint(0, 50, (3, 8)), torch.randint(0, 50, (3, 8))
    params = list(model.parameters())
    for train in (True, False):
        model.train(train)
        (ref, n_ref), (out, n) = lm_loss(model, (x, y)), fused_lm_loss(model, (x, y))
        assert n == n_ref == 24
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6, check_dtype=False)
        if train:
            for a, b in zip(torch.autograd.grad(out, params), torch.autograd.grad(ref, params)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_hf_text_reads_a_local_file_through_datasets(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("first line\nsecond line\nthird\n")
    assert hf_text(str(f)) == "first line\nsecond line\nthird"
    assert hf_text(str(f), max_chars=5) == "first line"


def test_hf_text_offline_says_what_to_do(monkeypatch):
    import tformer.data.text as lm_data
    monkeypatch.setitem(lm_data.CORPORA, "missing", ("tformer-tests/no-such-dataset", None, "text"))
    with pytest.raises(DataUnavailableError, match="offline_text"):   # HF_DATASETS_OFFLINE=1 (conftest)
        hf_text("missing")
    with pytest.raises(ValueError, match="local .txt"):
        hf_text("no-such-corpus")
