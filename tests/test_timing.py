"""tformer.measure.timing: peak memory counts what was allocated; fits recover known exponents; a step trains."""
import copy

import torch

from tformer.models import GPT, GPTConfig, LSTMConfig, LSTMLM
from tformer.measure.timing import count_ops, format_table, peak_memory, step_time_vs_length, time_fn, train_step_time


def test_peak_memory_sees_temporaries_and_frees():
    n = 256 * 1024                                    # floats: 1 MiB each
    def two_temporaries():
        a = torch.ones(n)
        b = torch.ones(n) * 2                         # a, b, and the ones() temp of b: 3 MiB at peak
        del a, b
        return None
    assert 3 * 4 * n <= peak_memory(two_temporaries) < 3 * 4 * n + 1024   # + a few bytes for the scalar 2
    assert peak_memory(lambda: torch.empty(0)) < 1024
    # explicit attention keeps the (T, T) score matrix alive; SDPA's fused kernel does not. On the CPU (this
    # test means the CPU, on any machine) the fused kernel takes a scratch block per thread: 2 threads here,
    # so a 16-core GPU machine measures the same as a laptop
    q = torch.randn(1, 1, 2048, 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))
    try:
        explicit = peak_memory(lambda: torch.softmax(q @ q.transpose(-2, -1), -1) @ q, device="cpu")
        fused = peak_memory(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), device="cpu")
    finally:
        torch.set_num_threads(threads)
    assert explicit >= 2 * 2048 * 2048 * 4 and fused < explicit / 8


def test_train_step_updates_the_model_and_timings_are_positive():
    torch.manual_seed(0)
    model = LSTMLM(LSTMConfig(vocab_size=11, d_model=8, n_layers=1))
    before = copy.deepcopy(model.state_dict())
    idx = torch.randint(0, 11, (2, 6))
    assert train_step_time(model, idx, warmup=0, repeat=1) > 0
    assert not torch.equal(before["encoder.lstm.weight_hh_l0"], model.state_dict()["encoder.lstm.weight_hh_l0"])
    rows = step_time_vs_length({"lstm": lambda: LSTMLM(LSTMConfig(vocab_size=11, d_model=8, n_layers=1)),
                                "gpt": lambda: GPT(GPTConfig(vocab_size=11, context_length=16, n_layers=1, n_heads=2,
                                                             d_model=8))},
                               [4, 8], batch_size=2, vocab_size=11, warmup=0, repeat=1, progress=False)
    assert [(r.name, r.seq_len) for r in rows] == [("lstm", 4), ("lstm", 8), ("gpt", 4), ("gpt", 8)]
    assert all(r.seconds > 0 and r.tokens_per_s > 0 for r in rows)
    assert time_fn(lambda: None, warmup=0, repeat=2) >= 0
    table = format_table([{"T": 4, "s": 0.5}, {"T": 16, "s": 0.25}])
    assert table.splitlines()[0].split() == ["T", "s"] and len(table.splitlines()) == 4


def test_count_ops_counts_matmuls():
    a = torch.randn(4, 4)
    assert count_ops(lambda: a @ a) == 1
    assert count_ops(lambda: [a @ a for _ in range(5)]) == 5
    assert count_ops(lambda: a + a) == 0


def test_the_timers_share_one_step_body(monkeypatch):
    """train_step_time (and step_time_vs_length through it) and flash.lm_throughput time `training_step`."""
    import tformer.measure.flash as flash
    import tformer.measure.timing as timing
    made = []

    def spy(*args, **kwargs):
        made.append(args[2])                            # the device
        return real(*args, **kwargs)
    real = timing.training_step
    monkeypatch.setattr(timing, "training_step", spy)
    monkeypatch.setattr(flash, "training_step", spy)
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=11, context_length=16, n_layers=1, n_heads=2, d_model=8))
    train_step_time(gpt, torch.randint(0, 11, (2, 6)), warmup=0, repeat=1)
    flash.lm_throughput(gpt, batch_size=2, seq_len=6, steps=1, warmup=0, flash=False)
    assert len(made) == 2
    # the step itself: loss, backward, update, gradients cleared
    w = gpt.lm_head.weight if hasattr(gpt, "lm_head") else next(gpt.parameters())
    before = w.detach().clone()
    opt = torch.optim.SGD(gpt.parameters(), lr=0.1)
    idx = torch.randint(0, 11, (2, 6))
    loss = real(lambda: gpt(idx).float().logsumexp(-1).mean(), opt, "cpu")()
    assert loss.dim() == 0 and not torch.equal(before, w) and all(p.grad is None for p in gpt.parameters())


def test_training_step_is_the_plain_float32_loop_without_a_policy_dtype():
    """The chapters' own loops (08, 11_llms) train through `training_step`: with dtype None (a CPU) it is the
    hand-written loop, clipping included, bit for bit; the batch passes through step(*batch)."""
    from tformer.measure.timing import training_step
    from tformer.training.losses import causal_lm_loss
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=40, context_length=12, n_layers=1, n_heads=2, d_model=16, dropout=0.1))
    xs = [torch.randint(0, 40, (3, 12)) for _ in range(4)]
    for clip in (None, 0.5):
        a, b = copy.deepcopy(base), copy.deepcopy(base)
        torch.manual_seed(1)
        opt = torch.optim.AdamW(a.parameters(), lr=1e-2)
        by_hand = []
        for x in xs:
            loss = causal_lm_loss(a(x), targets=x)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(a.parameters(), clip)
            opt.step()
            by_hand.append(loss.item())
        torch.manual_seed(1)
        step = training_step(lambda x: causal_lm_loss(b(x), targets=x), torch.optim.AdamW(b.parameters(), lr=1e-2),
                             "cpu", None, clip=clip)
        assert [step(x).item() for x in xs] == by_hand
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
