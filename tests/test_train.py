"""tformer.training: schedule, label smoothing, Trainer (exact resume, accumulation, averaging)."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tformer.training import (InverseSqrtSchedule, Trainer, TrainConfig, atomic_save, average_checkpoints,
                           label_smoothed_cross_entropy, make_scheduler, noam_lr)


# -- schedule -----------------------------------------------------------------------------------------
def test_noam_formula_and_peak():
    d, w = 512, 4000
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        assert noam_lr(step, d, w) == pytest.approx(d ** -0.5 * min(step ** -0.5, step * w ** -1.5))
    peak = max(range(1, 20_000, 7), key=lambda s: noam_lr(s, d, w))
    assert abs(peak - w) <= 7
    assert noam_lr(w, d, w) == pytest.approx((d * w) ** -0.5)
    with pytest.raises(ValueError, match="from 1"):
        noam_lr(0, d, w)


def test_lambda_scheduler_reproduces_noam():
    d, w = 64, 10
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([p], lr=(d * w) ** -0.5)
    sched = make_scheduler(opt, "noam", w)
    for step in range(1, 40):
        assert opt.param_groups[0]["lr"] == pytest.approx(noam_lr(step, d, w))
        opt.step()
        sched.step()
    assert InverseSqrtSchedule(w)(w - 1) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="kind must be one of"):
        make_scheduler(opt, "cosin", 10)
    with pytest.raises(ValueError, match="needs total"):
        make_scheduler(opt, "cosine", 10)


# -- label smoothing ----------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_matches_pytorch(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g, dtype=torch.float64)
    target = torch.randint(1, 11, (3, 7), generator=g)
    target[0, 5:] = 0
    target[2, 1:] = 0
    for red in ("mean", "sum"):
        ref = F.cross_entropy(logits.transpose(1, 2), target, ignore_index=0, label_smoothing=eps, reduction=red)
        got = label_smoothed_cross_entropy(logits.float(), target, eps, ignore_index=0, reduction=red)
        torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)
    none = label_smoothed_cross_entropy(logits, target, eps, ignore_index=0, reduction="none")
    assert none.shape == target.shape and (none[target == 0] == 0).all()


def test_label_smoothing_penalises_confidence():
    # a very confident correct prediction costs more than a moderately confident one under smoothing
    target = torch.tensor([0])
    sharp, soft = torch.tensor([[30.0, 0, 0, 0]]), torch.tensor([[4.0, 0, 0, 0]])
    assert label_smoothed_cross_entropy(sharp, target, 0.1) > label_smoothed_cross_entropy(soft, target, 0.1)
    assert label_smoothed_cross_entropy(sharp, target, 0.0) < label_smoothed_cross_entropy(soft, target, 0.0)


def test_label_smoothing_bad_input():
    with pytest.raises(ValueError, match="leading shape"):
        label_smoothed_cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothed_cross_entropy(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), 1.0)
    with pytest.raises(TypeError, match="floating"):
        label_smoothed_cross_entropy(torch.ones(2, 5, dtype=torch.long), torch.zeros(2, dtype=torch.long))


# -- Trainer ------------------------------------------------------------------------------------------
class Shuffled:
    """A tiny regression set whose order depends only on the epoch (what exact resume needs)."""

    def __init__(self, n=48, bs=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
        self.bs, self.epoch = bs, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        perm = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(100 + self.epoch))
        for i in range(0, len(perm), self.bs):
            j = perm[i:i + self.bs]
            yield self.x[j], self.y[j]


def make_model(seed=123, p=0.2):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 1))


def mse_sum(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).sum(), y.numel()


def cfg(**kw):
    base = dict(max_steps=20, lr=1e-2, warmup=5, progress=False, log_every=5, save_every=7, seed=3)
    base.update(kw)
    return TrainConfig(**base)


def test_progress_false_writes_no_validation_lines(capsys, monkeypatch):
    """Validation lines go under the progress bar: without the bar (a notebook's quiet run) nothing is printed,
    and the records are still in the history."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    for progress in (False, True):
        capsys.readouterr()
        out = Trainer(make_model(), mse_sum, Shuffled(), cfg(progress=progress, eval_every=5),
                      val_data=list(Shuffled(n=16))).fit()
        printed = capsys.readouterr()
        lines = [line for line in (printed.out + printed.err).splitlines() if "val_loss=" in line]
        assert sum("val_loss" in r for r in out["history"]) >= 3
        assert (len(lines) > 0) == progress, (progress, lines)


def test_the_bar_names_the_rate_of_what_the_loss_counts(capsys, monkeypatch):
    """tok_s on the bar by default (a loss_fn that counts tokens); rate=None for one that counts 1 a step, where
    a tok_s would be steps a second and the bar's it/s says it already; another name shows as given."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    for rate, shown in (("tok_s", "tok_s="), (None, None), ("img_s", "img_s=")):
        capsys.readouterr()
        Trainer(make_model(), mse_sum, Shuffled(), cfg(progress=True, rate=rate, save_every=0)).fit()
        err = capsys.readouterr().err
        assert "loss=" in err and ("_s=" in err) == (shown is not None) and (shown is None or shown in err), (rate, err)


def test_resume_gives_identical_weights(tmp_path):
    full = Trainer(make_model(), mse_sum, Shuffled(), cfg(), out_dir=tmp_path / "a")
    full.fit()
    part = Trainer(make_model(), mse_sum, Shuffled(), cfg(), out_dir=tmp_path / "b")
    part.fit(steps=9)                                     # "interrupted" mid-epoch (6 batches an epoch)
    assert part.state.step == 9
    resumed = Trainer(make_model(seed=999), mse_sum, Shuffled(), cfg(), out_dir=tmp_path / "b")
    assert resumed.state.step == 9 and resumed.state.epoch == 1 and resumed.state.batch_in_epoch == 3
    resumed.fit()
    assert resumed.state.step == 20
    for (k, a), b in zip(full.module.state_dict().items(), resumed.module.state_dict().values()):
        assert torch.equal(a, b), k
    # and the run really depends on the data position: a resume that forgot it diverges
    wrong = Trainer(make_model(), mse_sum, Shuffled(), cfg(), out_dir=tmp_path / "c")
    wrong.fit(steps=9)
    w2 = Trainer(make_model(seed=999), mse_sum, Shuffled(), cfg(), out_dir=tmp_path / "c")
    w2.state.batch_in_epoch = 0
    w2.fit()
    assert not torch.equal(w2.module[0].weight, full.module[0].weight)


def test_fit_returns_the_whole_history_across_a_stop_and_a_crash(tmp_path):
    """What fit returns holds every step of the run once: the steps before a resume come from last.pt, and
    the steps a crash made the resumed run repeat (after the last save) are not counted twice."""
    def steps(out):
        return [r["step"] for r in out["history"] if "loss" in r]

    whole = Trainer(make_model(), mse_sum, Shuffled(), cfg(log_every=1), out_dir=tmp_path / "whole").fit()
    assert steps(whole) == list(range(1, 21))
    folder = tmp_path / "cut"
    first = Trainer(make_model(), mse_sum, Shuffled(), cfg(log_every=1), out_dir=folder).fit(steps=9)   # stopped
    assert steps(first) == list(range(1, 10))
    calls = {"n": 0}

    def crashes_at_step_12(model, batch):                  # saved at step 9 (the stop), then 14: dies in between
        calls["n"] += 1
        if calls["n"] == 12 - 9:
            raise KeyboardInterrupt
        return mse_sum(model, batch)
    with pytest.raises(KeyboardInterrupt):
        Trainer(make_model(), crashes_at_step_12, Shuffled(), cfg(log_every=1), out_dir=folder).fit()
    last = Trainer(make_model(), mse_sum, Shuffled(), cfg(log_every=1), out_dir=folder).fit()
    assert steps(last) == list(range(1, 21))
    assert [r["loss"] for r in last["history"] if "loss" in r] == [r["loss"] for r in whole["history"] if "loss" in r]
    logged = [r["step"] for r in map(json.loads, (folder / "log.jsonl").read_text().splitlines()) if "loss" in r]
    assert logged.count(10) == 2                           # the log file repeats the replayed steps; history does not


def test_checkpoint_files_atomic(tmp_path):
    t = Trainer(make_model(), mse_sum, Shuffled(), cfg(snapshot_every=3, keep_snapshots=2), out_dir=tmp_path)
    t.fit()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "last.pt" in names and "log.jsonl" in names
    assert not [n for n in names if ".tmp" in n]
    assert [p.name for p in t.snapshots()] == ["snapshot_0000015.pt", "snapshot_0000018.pt"]
    atomic_save({"a": torch.ones(2)}, tmp_path / "x" / "y.pt")
    assert torch.equal(torch.load(tmp_path / "x" / "y.pt")["a"], torch.ones(2))


def test_accumulation_equals_one_big_batch():
    """Two micro-batches of (sum, count) give the same update as their union in one batch."""
    data = Shuffled(n=16, bs=16)
    x, y = next(iter(data))
    big = make_model(p=0.0)
    small = make_model(p=0.0)
    # uneven split: 5 + 11 items, so a plain average of two means would be wrong
    t1 = Trainer(big, mse_sum, [(x, y)], cfg(max_steps=1, grad_clip=None))
    t2 = Trainer(small, mse_sum, [(x[:5], y[:5]), (x[5:], y[5:])], cfg(max_steps=1, grad_clip=None, accum_steps=2))
    t1.fit(), t2.fit()
    for a, b in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    # the same update from a mean loss, returned as (mean, 1)
    mean_model = make_model(p=0.0)
    Trainer(mean_model, lambda m, b: (F.mse_loss(m(b[0]), b[1]), 1), [(x, y)], cfg(max_steps=1, grad_clip=None)).fit()
    for a, b in zip(big.parameters(), mean_model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def lrs_of_run(trainer):
    """The learning rate each optimizer step of `trainer.fit()` used."""
    seen = []
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    trainer.fit()
    return seen


def test_linear_schedule_warms_up_then_reaches_zero_at_the_end(tmp_path):
    n, w, peak = 20, 5, 1e-2
    lrs = lrs_of_run(Trainer(make_model(), mse_sum, Shuffled(), cfg(schedule="linear", max_steps=n, warmup=w,
                                                                      lr=peak)))
    expect = [peak * min(k / w, 1 - (k - 1) / n) for k in range(1, n + 1)]   # step k uses progress (k-1)/n
    assert lrs == pytest.approx(expect)
    assert lrs[w - 1] == max(lrs) and lrs[-1] == pytest.approx(peak / n)
    # a resumed run continues on the same line (the multiplier's progress is recomputed, not stale)
    part = Trainer(make_model(), mse_sum, Shuffled(), cfg(schedule="linear", max_steps=n, warmup=w, lr=peak),
                   out_dir=tmp_path / "r")
    part.fit(steps=9)
    rest = lrs_of_run(Trainer(make_model(), mse_sum, Shuffled(), cfg(schedule="linear", max_steps=n, warmup=w,
                                                                     lr=peak), out_dir=tmp_path / "r"))
    assert rest == pytest.approx(expect[9:])
    # with a time budget, progress is the larger of the step and time fractions
    t = Trainer(make_model(), mse_sum, Shuffled(), cfg(schedule="linear", max_steps=1000, time_budget=2.0))
    t.state.step, t.state.elapsed = 100, 60.0
    assert t._progress() == pytest.approx(0.5)
    t.state.elapsed = 500.0
    assert t._progress() == 1.0


def test_cosine_schedule_ends_at_zero_when_the_time_budget_runs_out_first(monkeypatch):
    import itertools
    from tformer.training import CosineSchedule
    # by steps alone (no budget) the curve is the textbook one: warmup, then a half cosine to 0 at `total`
    s = CosineSchedule(warmup=5, total=45)
    assert [s(i) for i in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert s(25) == pytest.approx(0.5) and s(45) == pytest.approx(0.0)
    s.progress = 25 / 45                                      # progress that only restates the step: same value
    assert s(25) == pytest.approx(0.5)
    s.progress = 25 / 45                                      # at step 10, time says step 25's share is done:
    assert s(10) == pytest.approx(0.5)                        # the cosine follows the time
    # a Trainer whose clock gives 1 s a step, with a 30 s budget and max_steps far away, anneals to ~0 by 30 s
    ticks = itertools.count()
    monkeypatch.setattr("tformer.training.trainer.time.perf_counter", lambda: float(next(ticks)))
    t = Trainer(make_model(), mse_sum, Shuffled(), cfg(schedule="cosine", max_steps=1000, warmup=3, lr=1e-2,
                                                      time_budget=0.5))
    lrs = lrs_of_run(t)
    assert t.state.step == 30 and max(lrs) == pytest.approx(1e-2)
    assert lrs[-1] < 1e-2 * 0.01          # the last step's lr is about 0, not the 0.998 of a 1000-step cosine


def test_validation_budget_and_divergence(tmp_path):
    calls = []
    t = Trainer(make_model(), mse_sum, Shuffled(), cfg(eval_every=10), val_data=Shuffled(seed=1),
                val_fn=lambda m: calls.append(m.training) or {"extra": 1.0})
    out = t.fit()
    assert "val_loss" in out and out["extra"] == 1.0 and calls == [False, False]
    assert any("val_loss" in r for r in t.state.history)
    none = Trainer(make_model(), mse_sum, Shuffled(), cfg(time_budget=0.0))
    none.fit()
    assert none.state.step == 0
    boom = Trainer(make_model(), lambda m, b: (m(b[0]).sum() * float("nan"), 1), Shuffled(), cfg())
    with pytest.raises(FloatingPointError, match="step 1"):
        boom.fit()
    with pytest.raises(ValueError, match="no batches"):
        Trainer(make_model(), mse_sum, [], cfg()).fit()


def test_average_checkpoints(tmp_path):
    sds = []
    for i in range(3):
        m = make_model(seed=i)
        sds.append(m.state_dict())
        torch.save({"model": m.state_dict()} if i else m.state_dict(), tmp_path / f"{i}.pt")
    avg = average_checkpoints(sorted(tmp_path.glob("*.pt")))
    for k in sds[0]:
        torch.testing.assert_close(avg[k], sum(sd[k].double() for sd in sds).float() / 3)
    with pytest.raises(ValueError, match="no checkpoint"):
        average_checkpoints([])
    assert math.isfinite(float(avg["0.weight"].sum()))


def test_loss_fn_returns_sum_and_count_always():
    """One shape for every loss_fn: (sum, count). A bare mean is refused with what to return instead."""
    with pytest.raises(TypeError, match=r"\(sum of per-item losses, item count\).*\(mean, 1\)"):
        Trainer(make_model(), lambda m, b: F.mse_loss(m(b[0]), b[1]), Shuffled(), cfg()).fit()
    t = Trainer(make_model(), mse_sum, Shuffled(), cfg(), val_data=[(torch.zeros(2, 6), torch.zeros(2, 1))])
    t.loss_fn = lambda m, b: ((m(b[0]) - b[1]) ** 2).mean()
    with pytest.raises(TypeError, match="loss_fn must return"):
        t.evaluate()


def test_every_schedule_is_told_the_progress_through_one_interface():
    """The Trainer calls scheduler.set_progress(p) on every schedule kind; a scheduler without it is refused."""
    from tformer.training import RunScheduler, Schedule
    for kind in ("noam", "constant", "linear", "cosine"):
        t = Trainer(make_model(), mse_sum, Shuffled(), cfg(schedule=kind, max_steps=4))
        seen = []
        [fn] = t.scheduler.lr_lambdas
        assert isinstance(fn, Schedule)
        orig = fn.set_progress
        fn.set_progress = lambda p, orig=orig: (seen.append(p), orig(p))
        t.fit()
        assert seen == pytest.approx([0.25, 0.5, 0.75, 1.0]), kind
    opt = torch.optim.SGD(make_model().parameters(), lr=0.1)
    with pytest.raises(TypeError, match="RunScheduler"):
        Trainer(make_model(), mse_sum, Shuffled(), cfg(), scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0))
    with pytest.raises(TypeError, match="Schedule"):
        RunScheduler(opt, lambda i: 1.0)


def test_a_bare_loop_gives_the_trainers_weights_bit_for_bit():
    """Chapter 10's claim: the Trainer's defaults are Adam(0.9, 0.98, 1e-9) (fused), noam_lr over its peak,
    (sum, count) divided after backward, clipping at 1, the seed at the start of fit."""
    steps, warmup, lr = 9, 4, 1e-2
    data = Shuffled()
    trainer = Trainer(make_model(p=0.2), mse_sum, data, TrainConfig(max_steps=steps, lr=lr, warmup=warmup, seed=0,
                                                                    progress=False))
    trainer.fit()
    model = make_model(p=0.2)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: noam_lr(i + 1, 1, warmup) / noam_lr(warmup, 1, warmup))
    torch.manual_seed(0)
    model.train()
    done = 0
    for epoch in range(3):                                   # 6 batches an epoch: the run crosses into epoch 1
        data.set_epoch(epoch)
        for batch in data:
            if done == steps:
                break
            loss_sum, count = mse_sum(model, batch)
            loss_sum.backward()
            for p in model.parameters():
                p.grad.mul_(1 / float(count))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            done += 1
    for (k, a), b in zip(model.state_dict().items(), trainer.module.state_dict().values()):
        assert torch.equal(a, b), k


def test_the_package_builds_fused_optimizers_where_the_kernel_runs():
    """Adam/AdamW take torch's fused kernel on CPU and CUDA float parameters, and only there."""
    from tformer.training import adamw, fusable, train_steps
    assert fusable([torch.zeros(3), torch.zeros(2, 2, dtype=torch.float64)])
    assert not fusable([])
    assert not fusable([torch.zeros(3), torch.zeros(3, dtype=torch.long)])
    assert not fusable([torch.zeros(3, device="meta")])
    model = make_model()
    assert Trainer(model, mse_sum, Shuffled(), TrainConfig(progress=False)).optimizer.defaults["fused"]
    assert adamw(model, 1e-3, 0.1).defaults["fused"]
    seen = []
    real_step = torch.optim.AdamW.step

    def spy(opt, *a, **k):
        seen.append(opt.defaults["fused"])
        return real_step(opt, *a, **k)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.AdamW, "step", spy)
        train_steps(model, mse_sum, Shuffled(), steps=2, lr=1e-3)
    assert seen == [True, True]
