"""GRPO (tformer.training.grpo): the advantage against NumPy, the loss against a float64 reference written
from the DeepSeekMath paper, pass@k against its definition, the task split, and batched sampling."""
import itertools
import math

import numpy as np
import pytest
import torch

from tformer.training import grpo


def numpy_advantages(r):
    r = np.asarray(r, dtype=np.float64)
    if r.shape[1] < 2:
        return np.zeros_like(r)
    return (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)


def paper_loss(logp, old, ref, adv, mask, eps=0.2, beta=0.04):
    """DeepSeekMath eq. (3), term by term in float64 Python: 1/G sum_i 1/|o_i| sum_t [...], negated."""
    total, n = 0.0, 0
    B, G, T = logp.shape
    for b in range(B):
        for i in range(G):
            terms = []
            for t in range(T):
                if not mask[b, i, t]:
                    continue
                rho = math.exp(logp[b, i, t] - old[b, i, t])
                a = adv[b, i]
                clipped = min(max(rho, 1 - eps), 1 + eps)
                ratio_ref = math.exp(ref[b, i, t] - logp[b, i, t])
                kl = ratio_ref - math.log(ratio_ref) - 1
                terms.append(min(rho * a, clipped * a) - beta * kl)
            total += sum(terms) / max(len(terms), 1)
            n += 1
    return -total / n


@pytest.mark.parametrize("shape", [(1, 2), (3, 4), (5, 8), (2, 16)])
def test_advantages_match_numpy(shape):
    g = torch.Generator().manual_seed(sum(shape))
    r = (torch.rand(shape, generator=g) < 0.5).float() + torch.rand(shape, generator=g) * (shape[0] % 2)
    np.testing.assert_allclose(grpo.group_advantages(r.double()).numpy(), numpy_advantages(r.numpy()), rtol=1e-10)


def test_advantage_edge_cases():
    assert torch.equal(grpo.group_advantages(torch.ones(3, 4)), torch.zeros(3, 4))     # all equal: no signal
    assert torch.equal(grpo.group_advantages(torch.tensor([[1.0], [0.0]])), torch.zeros(2, 1))  # groups of one
    a = grpo.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]))
    assert a[0, 0] > 0 > a[0, 1] and a[1, 3] < 0 < a[1, 0]                               # per group, not per batch
    with pytest.raises(ValueError, match=r"\(B, G\)"):
        grpo.group_advantages(torch.ones(4))


@pytest.mark.parametrize("seed", range(4))
def test_loss_matches_paper_float64(seed):
    g = torch.Generator().manual_seed(seed)
    B, G, T = 2, 3, 5
    logp = -torch.rand(B, G, T, generator=g, dtype=torch.float64) * 3
    old = logp + (torch.rand(B, G, T, generator=g, dtype=torch.float64) - 0.5)        # ratios beyond the clip
    ref = logp + (torch.rand(B, G, T, generator=g, dtype=torch.float64) - 0.5)
    adv = torch.randn(B, G, generator=g, dtype=torch.float64)
    mask = torch.rand(B, G, T, generator=g) < 0.7
    mask[:, :, 0] = True
    mask[0, 0] = False                                                                # an empty answer counts 0
    got = grpo.grpo_loss(logp, old, ref, adv, mask)
    want = paper_loss(logp.numpy(), old.numpy(), ref.numpy(), adv.numpy(), mask.numpy())
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_loss_gradient_and_kl():
    logp = torch.zeros(1, 2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    loss = grpo.grpo_loss(logp, logp.detach(), logp.detach(), adv, mask)
    loss.backward()
    assert loss.item() == 0.0 and (logp.grad[0, 0] < 0).all() and (logp.grad[0, 1] > 0).all()
    assert (grpo.k3_kl(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])) > 0).all()
    with pytest.raises(ValueError, match="advantages"):
        grpo.grpo_loss(logp, logp, logp, torch.ones(2), mask)


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 4), (4, 4, 2), (8, 1, 8)])
def test_pass_at_k_is_the_subset_average(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    want = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert grpo.pass_at_k(n, c, k) == pytest.approx(want)
    with pytest.raises(ValueError):
        grpo.pass_at_k(3, 4, 1)


def test_tasks_hold_prompts_out():
    train, test = grpo.problems(2000, seed=0), grpo.problems(300, seed=1, split="test")
    assert not {q for _, q, _ in train} & {q for _, q, _ in test} and len({q for _, q, _ in test}) == 300
    assert all(grpo.held_out(q) for _, q, _ in test) and not any(grpo.held_out(q) for _, q, _ in train)
    adds = [(q, a) for k, q, a in test if k == "add"]
    assert any(int(q.split()[2]) % 10 + int(q.split()[4][:-1]) % 10 >= 10 for q, _ in adds)         # carries
    for k, q, a in test:
        nums = [int(x) for x in q.rstrip("?.").replace("What is", "").replace("Sort", "").replace("+", " ").split()]
        assert a == (str(sum(nums)) if k == "add" else " ".join(map(str, sorted(nums))))
    assert grpo.reward(" 132", "132") == 1.0 and grpo.reward("13", "132") == 0.0


def test_sampling_is_batched_and_masks_the_answer():
    from tformer.data.text import train_tokenizer
    from tformer.models import GPT, GPTConfig
    from tformer.training.sft import prompt_ids

    tok = train_tokenizer(["What is 12 + 34? Sort 1 2 3 4. User: Assistant: " * 20], vocab_size=300)
    end = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.get_vocab_size(), context_length=48, n_layers=1, n_heads=2, d_model=16))
    calls = []
    gen = model.generate
    model.generate = lambda x, *a, **k: calls.append(x.shape) or gen(x, *a, **k)
    data = grpo.problems(6, seed=0)
    roll = grpo.sample_answers(model, tok, [q for _, q, _ in data], [a for _, _, a in data], 4, 6, end,
                               generator=torch.Generator().manual_seed(0))
    lengths = {len(prompt_ids(tok, [(q, "")])) for _, q, _ in data}
    assert len(calls) == len(lengths) and sum(s[0] for s in calls) == 24      # one call per prompt length
    assert roll.ids.shape[0] == 24 and roll.mask.shape == (24, roll.ids.shape[1] - 1) and len(roll.texts) == 24
    assert roll.mask.any(1).all() and (roll.mask.sum(1) <= 6).all()
    lp = grpo.token_logprobs(model, roll.ids)
    assert lp.shape == roll.mask.shape and (lp <= 0).all()


def test_an_interrupted_grpo_capstone_resumes_to_the_same_result(tmp_path):
    from tformer.capstones import run_capstone

    kw = dict(tiny=True, threads=1, progress=False)
    whole = run_capstone("grpo", tmp_path / "whole", **kw)
    assert run_capstone("grpo", tmp_path / "cut", stop_after=2, **kw) is None       # stopped inside seed 0's GRPO
    assert not (tmp_path / "cut" / "result.json").exists()
    resumed = run_capstone("grpo", tmp_path / "cut", **kw)
    assert resumed["sessions"] >= 2
    for key in ("sft_greedy_mean", "grpo_greedy_mean", "grpo_sampled_pass_at_1", "curves"):
        assert whole[key] == resumed[key], key
    a = torch.load(tmp_path / "whole" / "grpo-seed0" / "last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "cut" / "grpo-seed0" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)                        # the same final weights, bit for bit
    assert whole["sft"]["pass_at_k"].keys() == {"1", "2", "4"} and len(whole["grpo"]) == 2


def test_an_sft_run_folder_loads_only_with_its_recipe(tmp_path):
    from tformer.data.text import train_tokenizer
    from tformer.models import GPT, GPTConfig
    from tformer.training.sft import load_run, save_run

    tok = train_tokenizer(["User: What is 1 + 2? Assistant: 3 " * 20], vocab_size=300)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.get_vocab_size(), context_length=16, n_layers=1, n_heads=2, d_model=16))
    meta = {"small": True, "sft_steps": 400}
    save_run(tmp_path / "run", model, tok, meta)
    got, got_tok = load_run(tmp_path / "run", meta)
    x = torch.tensor([tok.encode("What is 1 + 2?").ids])
    assert torch.equal(got.eval()(x), model.eval()(x)) and got_tok.to_str() == tok.to_str()
    assert load_run(tmp_path / "run", {**meta, "sft_steps": 300}) is None           # another recipe
    assert load_run(tmp_path / "none", meta) is None                                 # no run there
    (tmp_path / "run" / "model.pt").write_bytes(b"cut")
    assert load_run(tmp_path / "run", meta) is None                                  # unreadable


def test_the_capstone_starts_from_the_notebooks_recipe():
    from tformer.capstones.grpo_tasks import GRPOTasks
    RECIPE = GRPOTasks.RECIPE
    from tformer.capstones.sft_start import notebook_recipe

    small = notebook_recipe(small=True)
    for key in ("model", "vocab_size", "pretrain"):
        assert RECIPE[key] == small[key], key
    assert {**RECIPE["sft"], "steps": small["sft"]["steps"]} == small["sft"]      # the capstone trains SFT longer
    assert notebook_recipe(small=False).keys() == small.keys()


def test_the_sft_start_loads_only_with_its_recipe_and_tokenizer(tmp_path):
    from tformer.data.text import train_tokenizer
    from tformer.models import GPT, GPTConfig
    from tformer.capstones.sft_start import load_sft_start, notebook_recipe, save_sft_start

    tok = train_tokenizer(["User: What is 1 + 2? Assistant: 3 " * 20], vocab_size=300)
    other = train_tokenizer(["User: Sort 3 1 2. Assistant: 1 2 3 " * 20], vocab_size=300)
    recipe = notebook_recipe(small=True)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.get_vocab_size(), context_length=16, n_layers=1, n_heads=2, d_model=16))
    save_sft_start(model, tok, recipe, True, folder=tmp_path / "run")
    got = load_sft_start(tok, recipe, True, folder=tmp_path / "run")
    x = torch.tensor([tok.encode("What is 1 + 2?").ids])
    assert torch.equal(got.eval()(x), model.eval()(x))
    assert load_sft_start(tok, recipe, False, folder=tmp_path / "run") is None       # the other mode
    assert load_sft_start(tok, {**recipe, "sft": {**recipe["sft"], "steps": 1}}, True, folder=tmp_path / "run") is None
    assert load_sft_start(other, recipe, True, folder=tmp_path / "run") is None      # another tokenizer


def test_start_from_gives_a_trainable_policy_and_a_frozen_reference():
    import torch
    from tformer.models.gpt import GPT, GPTConfig
    from tformer.training.grpo import start_from
    sft = GPT(GPTConfig(vocab_size=32, context_length=16, n_layers=1, n_heads=2, d_model=16))
    policy, ref, opt = start_from(sft, 1e-3)
    assert policy is not sft and ref is not sft and not ref.training
    assert all(p.requires_grad for p in policy.parameters()) and not any(p.requires_grad for p in ref.parameters())
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in policy.parameters()}
    for a, b in zip(policy.parameters(), sft.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert opt.defaults["weight_decay"] == 0.0 and opt.defaults["betas"] == (0.9, 0.99)


def test_the_full_mode_recipe_finds_its_training_problems():
    """Chapter 11's full mode asks for recipe["sft"]["n_train"] distinct training prompts of each kind in
    turn (11_fine_tuning and 11_preference_rl): the train split must hold that many, held-out ones excluded."""
    from tformer.capstones.sft_start import notebook_recipe
    for small in (True, False):
        n = notebook_recipe(small)["sft"]["n_train"]
        got = grpo.problems(n, seed=0)
        assert len(got) == n and len({q for _, q, _ in got}) == n
        assert not any(grpo.held_out(q) for _, q, _ in got)


def test_grpo_updates_run_under_the_policy_dtype_with_one_scaler_per_optimizer(monkeypatch):
    """On a CPU the policy gives no autocast (float32, the step as before); under fp16 (a T4's, injected here)
    the updates scale their loss, and the scaler persists across grpo_step calls of one optimizer."""
    from tformer.data.text import train_tokenizer
    from tformer.models import GPT, GPTConfig

    tok = train_tokenizer(["What is 12 + 34? Sort 1 2 3 4. User: Assistant: " * 20], vocab_size=300)
    end = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    sft = GPT(GPTConfig(vocab_size=tok.get_vocab_size(), context_length=48, n_layers=1, n_heads=2, d_model=16))
    data = grpo.problems(4, seed=0)
    for dtype, scaled in ((None, False), (torch.float16, True)):
        monkeypatch.setattr(grpo, "amp_dtype", lambda dev, dtype=dtype: dtype)
        policy, ref, opt = grpo.start_from(sft, 1e-3)
        gen = torch.Generator().manual_seed(0)
        scalers = []
        for _ in range(2):
            out = grpo.grpo_step(policy, ref, opt, tok, data, group=4, max_new=4, end_id=end, generator=gen)
            assert all(math.isfinite(v) for v in out.values())
            scalers.append(grpo._SCALERS[opt])
        assert scalers[0] is scalers[1] and scalers[0].is_enabled() is scaled
