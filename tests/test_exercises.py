"""Every graded exercise, one parametrized suite over the registry and tests/exercise_solutions/.

For each registered exercise: an independent solution passes on every case, the untouched stub reads
"not attempted", each named mistake is recognised by name, and calling the reference does not pass.
A new exercise slots in by adding its independent solution to tests/exercise_solutions/chNN.py.
(The checker's own behaviour is tested in tests/test_grading.py.)"""
from __future__ import annotations

import pytest
import torch

from exercise_solutions import SOLUTIONS
from exercise_solutions.ch13 import balance_loss
from tformer.grading import REGISTRY, Exercise, check, set_mode
from tformer.grading import load_exercises

load_exercises()                                        # registers every chapter

# the exercises (questions are tested in tests/test_questions*.py)
ALL = sorted(n for n, ex in REGISTRY.items() if not n.startswith("test.") and isinstance(ex, Exercise))


@pytest.fixture(autouse=True)
def learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


def test_every_exercise_has_one_independent_solution():
    assert sorted(SOLUTIONS) == ALL, ("exercises without a solution in tests/exercise_solutions: "
                                      f"{sorted(set(ALL) - set(SOLUTIONS))}; solutions without an exercise: "
                                      f"{sorted(set(SOLUTIONS) - set(ALL))}")


def test_chapters_1_to_6_have_2_to_4_exercises_each():
    for ch in range(1, 7):
        n = sum(name.startswith(f"ch0{ch}.") for name in ALL)
        assert 2 <= n <= 4, f"ch0{ch} has {n} exercises"


@pytest.mark.parametrize("name", ALL)
def test_independent_solution_passes(name):
    r = check(name, SOLUTIONS[name])
    assert r.passed, r.message
    assert r.cases_run == len(REGISTRY[name].edge_cases()) + REGISTRY[name].n_random


@pytest.mark.parametrize("name", ALL)
def test_stub_is_not_attempted(name):
    def stub(*args, **kwargs):
        raise NotImplementedError("Exercise: replace this line with your code")
    r = check(name, stub)
    assert (r.status, r.passed, r.cases_run) == ("not attempted", False, 1)


@pytest.mark.parametrize("name,mistake", [(n, m) for n in ALL for m in REGISTRY[n].mistakes])
def test_each_named_mistake_is_recognized(name, mistake):
    r = check(name, REGISTRY[name].mistakes[mistake])
    assert r.status == "failed", r.message
    assert "known mistake: " in r.message and mistake in r.message, r.message


@pytest.mark.parametrize("name", ALL)
def test_calling_the_reference_does_not_pass(name):
    ex = REGISTRY[name]
    assert ex.forbidden, f"{name} forbids nothing"
    r = check(name, lambda *a, **k: ex.reference(*a, **k))
    assert r.status == "error" and "called the reference" in r.message, r.message
    case = ex.edge_cases()[0]                                           # and it works again afterwards
    ex.reference(*case.args, **case.kwargs)


def test_the_required_mistakes_are_named():
    required = {"ch01.attention": ["1/sqrt(d_k)", "wrong axis", "mask applied after the softmax"],
                "ch03.split_heads": ["reshape without the transpose"],
                "ch03.mha_forward": ["reshape without the transpose"],
                "ch05.layer_norm": ["Bessel"],
                "ch04.sinusoidal_table": ["sin and cos swapped"]}
    for name, words in required.items():
        names = " | ".join(REGISTRY[name].mistakes)
        for w in words:
            assert w in names, (name, w, names)


# --- references against independent peers ---------------------------------------------------------------------

def _mha_with_torch(x, w_qkv, b_qkv, w_o, b_o, h):               # the peer: torch.nn.MultiheadAttention
    m = torch.nn.MultiheadAttention(x.shape[-1], h, batch_first=True)
    with torch.no_grad():
        m.in_proj_weight.copy_(w_qkv), m.in_proj_bias.copy_(b_qkv)
        m.out_proj.weight.copy_(w_o), m.out_proj.bias.copy_(b_o)
    return m(x, x, x, need_weights=False)[0]


def _encoder_with_torch(x, p, h):                                  # the peer: nn.TransformerEncoderLayer
    layer = torch.nn.TransformerEncoderLayer(x.shape[-1], h, p["ffn.fc1.weight"].shape[0], dropout=0.0,
                                             batch_first=True)
    names = {"attn.qkv.weight": "self_attn.in_proj_weight", "attn.qkv.bias": "self_attn.in_proj_bias",
             "attn.out.weight": "self_attn.out_proj.weight", "attn.out.bias": "self_attn.out_proj.bias",
             "ffn.fc1.weight": "linear1.weight", "ffn.fc1.bias": "linear1.bias",
             "ffn.fc2.weight": "linear2.weight", "ffn.fc2.bias": "linear2.bias"}
    layer.load_state_dict({names.get(k, k): v for k, v in p.items()})
    return layer.eval()(x)


@pytest.mark.parametrize("name,peer", [("ch03.mha_forward", _mha_with_torch), ("ch05.encoder_layer", _encoder_with_torch)])
def test_references_agree_with_pytorch_peers(name, peer):
    ex = REGISTRY[name]
    for case in ex.edge_cases() + [ex.random_case(s) for s in range(4)]:
        with torch.no_grad():
            torch.testing.assert_close(ex.reference(*case.args), peer(*case.args), atol=1e-5, rtol=1e-4)


def test_balance_edge_cases_have_the_textbook_values():
    cases = REGISTRY["ch13.balance_loss"].edge_cases()
    assert float(balance_loss(*cases[0].args)) == pytest.approx(1.0)      # uniform
    assert float(balance_loss(*cases[1].args)) == pytest.approx(3.0)      # collapse onto 1 of E=3


def test_kv_step_reference_matches_cached_multi_head_attention():
    """The kv_step reference equals a model's cached decoding: one layer of MultiHeadAttention."""
    from tformer import MultiHeadAttention
    from tformer.cache import KVCache
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 7, 16)
    cache = KVCache()
    with torch.no_grad():
        mha(x[:, :4], is_causal=True, cache=cache)
        k_past, v_past = (t.clone() for t in cache.get())
        q, k, v = mha.qkv(x[:, 4:]).split(16, -1)
        split = lambda t: t.view(1, 3, 2, 8).transpose(1, 2)  # noqa: E731
        out, _, _ = REGISTRY["ch14.kv_step"].reference(split(q), split(k), split(v), k_past, v_past)
        want = mha(x, is_causal=True)[:, 4:]
    torch.testing.assert_close(mha.out(out.transpose(1, 2).reshape(1, 3, 16)), want, atol=1e-5, rtol=1e-4)


# The exercise statements stand alone: the formula each chapter writes, transcribed as it reads, passes the
# checker, and the types it names are the ones the checker passes and expects.
SRC = __import__("pathlib").Path(__file__).resolve().parent.parent / "notebooks" / "src"


def _statement(stem: str, heading: str) -> str:
    """The markdown cell of notebooks/src/<stem>.py that holds `heading`."""
    cells = [c for c in (SRC / f"{stem}.py").read_text().split("# %%") if heading in c]
    assert len(cells) == 1, f"{stem}: no single cell holds {heading!r}"
    return cells[0]


def test_the_admit_statement_formula_passes_the_checker():
    import math
    text = _statement("14_inference", "## Exercise 4: the scheduler's admission rule")
    assert r"F - \big(\lceil (L_i + 1) / b \rceil - s_i\big) \ge \mathrm{watermark}" in text
    assert r"F \leftarrow F - (\lceil L_i / b \rceil - s_i)" in text
    assert "Python lists of ints" in text and "an int" in text

    def admit(lengths, shared, n_free, block_size, watermark):       # the statement, line by line
        f, admitted = n_free, 0
        for length, s in zip(lengths, shared):
            if not f - (math.ceil((length + 1) / block_size) - s) >= watermark:
                break
            f -= math.ceil(length / block_size) - s
            admitted += 1
        return admitted
    r = check("ch14.admit", admit)
    assert r.passed, r.message
    ex = REGISTRY["ch14.admit"]
    for case in ex.edge_cases() + [ex.random_case(i) for i in range(20)]:
        lengths, shared, *ints = case.args
        assert isinstance(lengths, list) and isinstance(shared, list) and len(lengths) == len(shared)
        assert all(type(x) is int for x in lengths + shared + ints), case.name


def test_the_accept_statement_names_the_dtype_the_checker_needs():
    text = _statement("14_inference", "## Exercise 2: the speculative accept/reject rule")
    assert "0-d `torch.int64` tensor" in text

    def accept(p, q, draft, u):                                        # the statement's rule, token by token
        k, n = len(draft), 0
        while n < k and u[n] < p[n, draft[n]] / q[n, draft[n]]:
            n += 1
        if n == k:
            return torch.tensor(n, dtype=torch.int64), p[k]
        residual = torch.clamp(p[n] - q[n], min=0)
        return torch.tensor(n, dtype=torch.int64), residual / residual.sum()
    r = check("ch14.accept", accept)
    assert r.passed, r.message

    def int32(*args):                                                   # any other integer dtype fails
        n, dist = accept(*args)
        return n.to(torch.int32), dist
    assert not check("ch14.accept", int32).passed


def test_the_grpo_statement_mean_over_prompts_passes_the_checker():
    text = _statement("11_preference_rl", "## Exercise: the GRPO loss")
    assert r"-\frac{1}{B}\sum_b J_b" in text
    formula = _statement("11_preference_rl", "The policy then maximises PPO's clipped ratio objective")
    assert r"J = \frac{1}{G}\sum_i \frac{1}{|o_i|}\sum_t" in formula

    def grpo_loss(logp, old_logp, ref_logp, advantages, mask, eps, beta):
        js = []
        for b in range(logp.shape[0]):                                  # J of one prompt, as written above
            per_answer = []
            for i in range(logp.shape[1]):
                m = mask[b, i]
                rho = torch.exp(logp[b, i][m] - old_logp[b, i][m])
                a = advantages[b, i]
                d = torch.exp(ref_logp[b, i][m] - logp[b, i][m]) - (ref_logp[b, i][m] - logp[b, i][m]) - 1
                per_answer.append((torch.minimum(rho * a, rho.clamp(1 - eps, 1 + eps) * a) - beta * d).sum() / m.sum())
            js.append(torch.stack(per_answer).mean())
        return -torch.stack(js).mean()                                  # the mean over the B prompts, negated
    r = check("ch11.grpo_loss", grpo_loss)
    assert r.passed, r.message
