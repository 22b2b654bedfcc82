"""The exercise checker: modes, time limit, reference guard, mistakes, smallest failing case, `tformer grade`."""
from __future__ import annotations

import json
import math

import nbformat
import pytest
import torch
import torch.nn.functional as F

import tformer
from tformer.grading import REGISTRY, Case, Exercise, check, compare, register, set_mode
from tformer.grading import core
from tformer.grading import exercises  # noqa: F401  (registers every chapter)


@pytest.fixture(autouse=True)
def learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


@pytest.fixture
def temp_exercise():
    """Register exercises for one test and remove them afterwards."""
    names = []

    def add(ex: Exercise) -> Exercise:
        names.append(ex.name)
        return register(ex)
    yield add
    for n in names:
        REGISTRY.pop(n, None)


# --- independent correct solutions (written from the formulas, not from tformer) -------------------------------

def _attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)                        # fully masked rows: 0, not NaN
    return w @ v, w


def _softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _self_attention(x, wq, wk, wv):
    return _attention(x @ wq, x @ wk, x @ wv)[0]


def _cross_attention(x, c, wq, wk, wv):
    return _attention(x @ wq, c @ wk, c @ wv)[0]


def _split(x, h):
    b, t, d = x.shape
    return x.reshape(b, t, h, d // h).permute(0, 2, 1, 3)


def _merge(x):
    b, h, t, hd = x.shape
    return x.permute(0, 2, 1, 3).reshape(b, t, h * hd)


def _mha_with_torch(x, w_qkv, b_qkv, w_o, b_o, h):               # the peer: torch.nn.MultiheadAttention
    d = x.shape[-1]
    m = torch.nn.MultiheadAttention(d, h, batch_first=True)
    with torch.no_grad():
        m.in_proj_weight.copy_(w_qkv), m.in_proj_bias.copy_(b_qkv)
        m.out_proj.weight.copy_(w_o), m.out_proj.bias.copy_(b_o)
    return m(x, x, x, need_weights=False)[0]


def _mha(x, w_qkv, b_qkv, w_o, b_o, h):
    q, k, v = (_split(z, h) for z in (x @ w_qkv.T + b_qkv).chunk(3, -1))
    return _merge(_attention(q, k, v)[0]) @ w_o.T + b_o


def _table(max_len, d):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    ang = pos / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    return torch.stack([ang.sin(), ang.cos()], -1).reshape(max_len, d).float()


def _shift(k, d):
    w = 1 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    blocks = [torch.tensor([[math.cos(k * wi), math.sin(k * wi)], [-math.sin(k * wi), math.cos(k * wi)]])
              for wi in w.tolist()]
    return torch.block_diag(*blocks).float()


def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def _ffn(x, w1, b1, w2, b2):
    return torch.relu(x @ w1.T + b1) @ w2.T + b2


def _encoder_with_torch(x, p, h):                                  # the peer: nn.TransformerEncoderLayer
    d = x.shape[-1]
    layer = torch.nn.TransformerEncoderLayer(d, h, p["ffn.fc1.weight"].shape[0], dropout=0.0, batch_first=True)
    names = {"attn.qkv.weight": "self_attn.in_proj_weight", "attn.qkv.bias": "self_attn.in_proj_bias",
             "attn.out.weight": "self_attn.out_proj.weight", "attn.out.bias": "self_attn.out_proj.bias",
             "ffn.fc1.weight": "linear1.weight", "ffn.fc1.bias": "linear1.bias",
             "ffn.fc2.weight": "linear2.weight", "ffn.fc2.bias": "linear2.bias"}
    sd = {names.get(k, k): v for k, v in p.items()}
    layer.load_state_dict(sd)
    return layer.eval()(x)


def _encoder(x, p, h):
    x = _layer_norm(x + _mha(x, p["attn.qkv.weight"], p["attn.qkv.bias"], p["attn.out.weight"], p["attn.out.bias"], h),
                    p["norm1.weight"], p["norm1.bias"])
    f = _ffn(x, p["ffn.fc1.weight"], p["ffn.fc1.bias"], p["ffn.fc2.weight"], p["ffn.fc2.bias"])
    return _layer_norm(x + f, p["norm2.weight"], p["norm2.bias"])


def _causal(t_q, t_k):
    return torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)


def _causal_padding(tok, pad_id):
    b, t = tok.shape
    return (_causal(t, t) & (tok != pad_id)[:, None, None, :]).expand(b, 1, t, t)


SOLUTIONS = {
    "ch01.attention": _attention, "ch01.softmax": _softmax,
    "ch02.self_attention": _self_attention, "ch02.cross_attention": _cross_attention,
    "ch03.split_heads": _split, "ch03.merge_heads": _merge, "ch03.mha_forward": _mha,
    "ch04.sinusoidal_table": _table, "ch04.shift_matrix": _shift,
    "ch05.layer_norm": _layer_norm, "ch05.ffn": _ffn, "ch05.encoder_layer": _encoder,
    "ch06.causal_mask": _causal, "ch06.causal_padding_mask": _causal_padding,
}
CHAPTER_EXERCISES = sorted(n for n in REGISTRY if n[:4] in {f"ch0{i}" for i in range(1, 7)})
ALL_EXERCISES = sorted(REGISTRY)  # every chapter's; the chapter test files hold their independent solutions


def test_chapters_1_to_6_have_2_to_4_exercises_each():
    for ch in range(1, 7):
        n = sum(name.startswith(f"ch0{ch}.") for name in REGISTRY)
        assert 2 <= n <= 4, f"ch0{ch} has {n} exercises"
    assert set(SOLUTIONS) == set(CHAPTER_EXERCISES)


@pytest.mark.parametrize("name", CHAPTER_EXERCISES)
def test_independent_solution_passes(name):
    r = check(name, SOLUTIONS[name])
    assert r.passed, r.message
    assert r.cases_run == len(REGISTRY[name].edge_cases()) + REGISTRY[name].n_random


@pytest.mark.parametrize("name,peer", [("ch03.mha_forward", _mha_with_torch), ("ch05.encoder_layer", _encoder_with_torch)])
def test_references_agree_with_pytorch_peers(name, peer):
    ex = REGISTRY[name]
    for case in ex.edge_cases() + [ex.random_case(s) for s in range(4)]:
        with torch.no_grad():
            torch.testing.assert_close(ex.reference(*case.args), peer(*case.args), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ALL_EXERCISES)
def test_stub_is_not_attempted(name):
    def stub(*args, **kwargs):
        raise NotImplementedError("Exercise: replace this line with your code")
    r = check(name, stub)
    assert (r.status, r.passed, r.cases_run) == ("not attempted", False, 1)


@pytest.mark.parametrize("name,mistake", [(n, m) for n in ALL_EXERCISES for m in REGISTRY[n].mistakes])
def test_each_named_mistake_is_recognized(name, mistake):
    r = check(name, REGISTRY[name].mistakes[mistake])
    assert r.status == "failed", r.message
    assert "known mistake: " in r.message and mistake in r.message, r.message


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


@pytest.mark.parametrize("name", ALL_EXERCISES)
def test_calling_the_reference_does_not_pass(name):
    ex = REGISTRY[name]
    assert ex.forbidden, f"{name} forbids nothing"
    r = check(name, lambda *a, **k: ex.reference(*a, **k))
    assert r.status == "error" and "called the reference" in r.message, r.message
    # and the reference works again afterwards
    case = ex.edge_cases()[0]
    ex.reference(*case.args, **case.kwargs)


def test_reference_guard_catches_aliases_imported_earlier():
    from tformer.attention import scaled_dot_product_attention as alias
    r = check("ch01.attention", lambda q, k, v, mask=None: alias(q, k, v, mask))
    assert r.status == "error" and "called the reference" in r.message
    r = check("ch01.attention", lambda q, k, v, mask=None: tformer.scaled_dot_product_attention(q, k, v, mask))
    assert r.status == "error"
    q = torch.randn(1, 1, 3, 4)
    torch.testing.assert_close(alias(q, q, q)[0], _attention(q, q, q)[0])     # restored after the check


def test_forbidding_a_name_this_torch_lacks_is_harmless(temp_exercise):
    temp_exercise(Exercise("test.missing", "t", reference=lambda x: x * 2, n_random=0,
                           edge_cases=lambda: [Case("one", (torch.ones(2),))], random_case=None,
                           forbidden=[(torch, "no_such_function_in_torch"), (torch, "softmax")]))
    assert check("test.missing", lambda x: x + x).passed
    assert check("test.missing", lambda x: torch.softmax(x, 0)).status == "error"


def test_wrong_answer_reports_case_shape_dtype_difference_and_hint():
    r = check("ch01.softmax", lambda x: _softmax(x) + 1e-2)
    assert r.status == "failed"
    for part in ("Smallest failing case", "values differ", "largest difference", "Hint:"):
        assert part in r.message, r.message
    r = check("ch01.softmax", lambda x: _softmax(x).double())
    assert "expected dtype torch.float32, got torch.float64" in r.message
    r = check("ch01.softmax", lambda x: _softmax(x)[..., :1])
    assert "expected shape" in r.message


def test_random_failure_reports_its_seed():
    # wrong only on random cases (edge cases pass): the report names a seed
    r = check("ch03.split_heads", lambda x, h: _split(x, h) * (1.0 if x.shape[-1] <= 4 else 2.0))
    assert r.status == "failed" and "(seed 5" in r.message, r.message


def test_smallest_failing_case_is_reported(temp_exercise):
    sizes = [2, 9, 4, 7, 3]      # the function is wrong on sizes >= 3: the report must name size 3, not 9

    def edge_cases():
        return [Case(f"n={n}", (torch.ones(n),)) for n in sizes]
    temp_exercise(Exercise("test.smallest", "t", reference=lambda x: x * 2, edge_cases=edge_cases,
                           random_case=lambda s: Case(f"r{s}", (torch.ones(50 + s),), seed=s), n_random=3))
    r = check("test.smallest", lambda x: x * 2 if x.numel() < 3 else x * 3)
    assert "FAILED 7 of 8 cases" in r.message and "'n=3'" in r.message, r.message


def test_learner_mode_never_raises(temp_exercise):
    assert check("ch01.softmax", lambda x: None).status == "failed"            # returns the wrong type
    r = check("ch01.softmax", lambda x: 1 / 0)
    assert r.status == "error" and "ZeroDivisionError" in r.message and "line" in r.message
    assert check("ch01.softmax", lambda x: x.numpy()).status == "failed"


def test_time_limit_stops_an_infinite_loop(temp_exercise):
    temp_exercise(Exercise("test.loop", "t", reference=lambda x: x, edge_cases=lambda: [Case("one", (torch.ones(1),))],
                           random_case=lambda s: Case("r", (torch.ones(1),)), n_random=0, time_limit=0.3))

    def forever(x):
        while True:
            try:
                pass
            except Exception:   # a learner's broad except must not swallow the time limit
                pass
    r = check("test.loop", forever)
    assert r.status == "timeout" and "stopped after 0.3 s" in r.message


def test_strict_mode_raises_on_failure_only():
    set_mode("strict")
    assert check("ch01.softmax", _softmax).passed
    with pytest.raises(AssertionError, match="ch01.softmax"):
        check("ch01.softmax", lambda x: x)
    with pytest.raises(AssertionError):
        check("ch01.softmax", lambda x: (_ for _ in ()).throw(NotImplementedError()))


def test_blank_mode_raises_unless_untouched_stub():
    set_mode("blank")

    def stub(x):
        raise NotImplementedError
    assert check("ch01.softmax", stub).status == "not attempted"
    with pytest.raises(AssertionError, match="untouched stub"):
        check("ch01.softmax", _softmax)
    with pytest.raises(AssertionError, match="untouched stub"):
        check("ch01.softmax", lambda x: x)


def test_mode_from_environment(monkeypatch):
    set_mode(None)
    monkeypatch.setenv("TFORMER_GRADE", "strict")
    with pytest.raises(AssertionError):
        check("ch01.softmax", lambda x: x)
    monkeypatch.setenv("TFORMER_GRADE", "bogus")
    with pytest.raises(ValueError, match="TFORMER_GRADE"):
        check("ch01.softmax", _softmax)


def test_unknown_exercise_lists_the_known_ones():
    r = check("ch99.nothing", _softmax)                          # learner mode: reported, not raised
    assert r.status == "error" and "ch01.attention" in r.message
    set_mode("strict")
    with pytest.raises(KeyError, match="ch01.attention"):
        check("ch99.nothing", _softmax)


def test_results_are_appended_to_the_report_file(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    monkeypatch.setenv("TFORMER_GRADE_REPORT", str(path))
    check("ch01.softmax", _softmax)
    check("ch01.softmax", lambda x: x)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["exercise"], r["passed"], r["points"]) for r in rows] == [("ch01.softmax", True, 1),
                                                                         ("ch01.softmax", False, 1)]


def test_compare_nan_inf_bool():
    nan, inf = float("nan"), float("inf")
    assert compare(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]), 1e-5, 1e-4) is None
    assert "NaN" in compare(torch.tensor([nan, 1.0]), torch.tensor([0.0, 1.0]), 1e-5, 1e-4)
    assert compare(torch.tensor([-inf, 1.0]), torch.tensor([-inf, 1.0]), 1e-5, 1e-4) is None
    assert compare(torch.tensor([0.0, 1.0]), torch.tensor([inf, 1.0]), 1e-5, 1e-4) is not None
    assert compare(torch.tensor([inf]), torch.tensor([-inf]), 1e-5, 1e-4) is not None
    assert "dtype" in compare(torch.tensor([1, 0]), torch.tensor([True, False]), 0, 0)
    assert "index (1,)" in compare(torch.tensor([True, True]), torch.tensor([True, False]), 0, 0)


# --- tformer grade -----------------------------------------------------------------------------------------

def _tiny_notebook(path):
    cells = [
        nbformat.v4.new_code_cell("import torch\nfrom tformer.grading import check"),
        nbformat.v4.new_code_cell("def sm(x):\n    e = torch.exp(x - x.amax(-1, keepdim=True))\n"
                                  "    return e / e.sum(-1, keepdim=True)\ncheck('ch01.softmax', sm)"),
        nbformat.v4.new_code_cell("def att(q, k, v, mask=None):\n    raise NotImplementedError\n"
                                  "check('ch01.attention', att)"),
        nbformat.v4.new_code_cell("raise RuntimeError('a broken cell')"),
        nbformat.v4.new_code_cell(                      # the time limit works inside a real kernel too
            "from tformer.grading import Case, Exercise, register\n"
            "register(Exercise('ch01.loop_test', 't', reference=lambda x: x, n_random=0, time_limit=0.5,\n"
            "                  edge_cases=lambda: [Case('one', (torch.ones(1),))], random_case=None))\n"
            "def spin(x):\n    while True:\n        pass\n"
            "check('ch01.loop_test', spin)"),
    ]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                        "language": "python"}})
    nbformat.write(nb, path)


def test_tformer_grade_on_a_tiny_notebook(tmp_path, capsys):
    from tformer.cli import main
    _tiny_notebook(tmp_path / "01_tiny.ipynb")
    (tmp_path / "notes.ipynb").write_text("not a chapter, ignored")
    out = tmp_path / "report.json"
    assert main(["grade", str(tmp_path), "--json", str(out), "--timeout", "120"]) == 0
    printed = capsys.readouterr().out
    assert "ch01" in printed and "TOTAL 1/5 points" in printed and "RuntimeError: a broken cell" in printed
    data = json.loads(out.read_text())
    assert data["total"] == {"earned": 1, "possible": 5}
    rows = {r["exercise"]: r for r in data["notebooks"][0]["exercises"]}
    assert rows["ch01.softmax"]["passed"] and rows["ch01.softmax"]["status"] == "passed"
    assert rows["ch01.attention"]["status"] == "not attempted" and rows["ch01.attention"]["points"] == 3
    assert rows["ch01.loop_test"]["status"] == "timeout" and "stopped after 0.5 s" in rows["ch01.loop_test"]["message"]
    assert main(["grade", str(tmp_path / "01_tiny.ipynb"), "--json", str(out), "--require-all"]) == 1


def test_tformer_grade_bad_path(tmp_path, capsys):
    from tformer.cli import main
    assert main(["grade", str(tmp_path / "missing")]) == 2
    assert main(["grade", str(tmp_path)]) == 2
    assert "no chapter notebooks" in capsys.readouterr().out


def test_not_run_exercises_are_listed(tmp_path):
    from tformer.grading.cli import run_notebook
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")],
                                  metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nbformat.write(nb, tmp_path / "06_empty.ipynb")
    rep = run_notebook(tmp_path / "06_empty.ipynb", timeout=120)
    assert {r.exercise for r in rep.rows} == {n for n in REGISTRY if n.startswith("ch06.")}
    assert all(r.status == "not run" and not r.passed for r in rep.rows)


def test_split_merge_heads_match_multi_head_attention_layout():
    x = torch.randn(2, 5, 12)
    h = tformer.split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    torch.testing.assert_close(h[:, 1], x[..., 4:8])                  # head 1 = features 4..7 of every position
    torch.testing.assert_close(tformer.merge_heads(h), x)
    with pytest.raises(ValueError, match="must divide"):
        tformer.split_heads(x, 5)
    with pytest.raises(ValueError, match="n_heads, T, d_head"):
        tformer.merge_heads(x)
    # MultiHeadAttention's own split gives the same heads
    mha = tformer.MultiHeadAttention(12, 3)
    torch.testing.assert_close(mha._split(x, 3), h)


def test_in_place_edits_do_not_leak_between_reference_learner_and_mistakes():
    def vandal(x, params, n_heads):
        for t in params.values():
            t.mul_(0)                                                  # wrecks its own copy only
        x.mul_(0)
        return torch.zeros_like(x)
    r = check("ch05.encoder_layer", vandal)
    assert r.status == "failed"
    case = REGISTRY["ch05.encoder_layer"].edge_cases()[0]
    args, _ = core._clone_args(case)
    args[1]["norm1.weight"].zero_()
    assert not torch.equal(case.args[1]["norm1.weight"], args[1]["norm1.weight"])
