"""LSTM baselines: the equations written out in float64, causality, state carry-over, GPT's call shape."""
import pytest
import torch
import torch.nn as nn

from tformer.models.rnn import LSTMConfig, LSTMEncoder, LSTMLM, lstm_reference


def _small(**kw):
    torch.manual_seed(0)
    return LSTMLM(LSTMConfig(vocab_size=17, d_model=12, n_layers=2, **kw))


def test_nn_lstm_matches_the_equations_in_float64():
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 7, num_layers=2, batch_first=True).double()
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    enc = LSTMEncoder(5, 7, n_layers=2).double()
    enc.lstm.load_state_dict(lstm.state_dict())
    out, (h, c) = enc(x)
    torch.testing.assert_close(out, lstm_reference(lstm, x))
    torch.testing.assert_close(h[-1], out[:, -1])


def test_lm_logits_are_the_lstm_states_through_the_head():
    model = _small().double().eval()
    idx = torch.randint(0, 17, (2, 9))
    h = lstm_reference(model.encoder.lstm, model.tok_embed(idx))
    expected = model.head(model.final_norm(h))
    torch.testing.assert_close(model(idx), expected)
    assert model.head.weight is model.tok_embed.weight


def test_causal_future_tokens_do_not_change_past_logits():
    model = _small().eval()
    idx = torch.randint(0, 17, (2, 10))
    other = idx.clone()
    other[:, 6:] = (other[:, 6:] + 1) % 17
    a, b = model(idx), model(other)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_state_carries_over_between_chunks():
    model = _small().eval()
    idx = torch.randint(0, 17, (2, 12))
    whole = model(idx)
    first, state = model(idx[:, :5], return_state=True)
    second = model(idx[:, 5:], state)
    torch.testing.assert_close(torch.cat([first, second], 1), whole)


def test_packed_lengths_ignore_padding():
    torch.manual_seed(0)
    enc = LSTMEncoder(4, 6, bidirectional=True)
    x = torch.randn(2, 5, 4)
    lengths = torch.tensor([5, 3])
    out, _ = enc(x, lengths=lengths)
    alone, _ = enc(x[1:, :3])
    torch.testing.assert_close(out[1, :3], alone[0])
    assert torch.all(out[1, 3:] == 0)
    assert enc.d_out == 12 and out.shape == (2, 5, 12)


def test_training_step_and_generate():
    model = _small()
    idx = torch.randint(0, 17, (4, 8))
    logits = model(idx)
    assert logits.shape == (4, 8, 17)
    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 17), idx[:, 1:].reshape(-1))
    loss.backward()
    assert model.tok_embed.weight.grad is not None and model.encoder.lstm.weight_hh_l0.grad.abs().sum() > 0
    out = model.generate(idx[:, :3], 5, temperature=0.0)
    assert out.shape == (4, 8) and torch.equal(out[:, :3], idx[:, :3])
    # greedy generation step by step equals argmax of a full forward pass over the generated text
    full = model.eval()(out)
    torch.testing.assert_close(full[:, 2:-1].argmax(-1), out[:, 3:])


def test_bad_input_is_rejected():
    model = _small(context_length=4)
    with pytest.raises(TypeError):
        model(torch.randn(2, 3))
    with pytest.raises(ValueError, match="context_length"):
        model(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="d_in"):
        LSTMEncoder(4, 6)(torch.randn(2, 3, 5))
