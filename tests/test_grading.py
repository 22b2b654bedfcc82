"""The exercise checker: modes, time limit, reference guard, mistakes, smallest failing case, `tformer grade`.
(Every exercise's solution, stub, named mistakes and reference guard: tests/test_exercises.py.)"""
from __future__ import annotations

import json
import math
import re
import sys
import time

import nbformat
import pytest
import torch

import tformer
from tformer.grading import REGISTRY, Case, Exercise, check, compare, register, set_mode
from tformer.grading import core
from tformer.grading import load_exercises

from exercise_solutions.ch01 import attention as _attention, softmax as _softmax
from exercise_solutions.ch03 import split_heads as _split

load_exercises()                                        # registers every chapter


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


def test_random_failure_names_its_case_by_number():
    # wrong only on random cases (edge cases pass): the report names the case "random #N" (1..n_random), not
    # its seed (a class's grades.json records the seeds)
    r = check("ch03.split_heads", lambda x, h: _split(x, h) * (1.0 if x.shape[-1] <= 4 else 2.0))
    assert r.status == "failed" and re.search(r"'random #([1-9]|10): ", r.message), r.message
    assert "seed" not in r.message, r.message


def test_smallest_failing_case_is_reported(temp_exercise):
    sizes = [2, 9, 4, 7, 3]      # the function is wrong on sizes >= 3: the report must name size 3, not 9

    def edge_cases():
        return [Case(f"n={n}", (torch.ones(n),)) for n in sizes]
    temp_exercise(Exercise("test.smallest", "t", reference=lambda x: x * 2, edge_cases=edge_cases,
                           random_case=lambda s: Case(f"r{s}", (torch.ones(50 + s),), seed=s), n_random=3))
    r = check("test.smallest", lambda x: x * 2 if x.numel() < 3 else x * 3)
    assert "FAILED 7 of 8 cases" in r.message and "'n=3'" in r.message, r.message


def test_learner_mode_never_raises(temp_exercise):
    assert check("ch01.softmax", lambda x: None).status == "error"             # returns the wrong type
    r = check("ch01.softmax", lambda x: 1 / 0)
    assert r.status == "error" and "ZeroDivisionError" in r.message and "line" in r.message
    assert check("ch01.softmax", lambda x: x.numpy()).status == "error"


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

def _notebook(path, cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells],
                                  metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nbformat.write(nb, path)


_LOOP_EXERCISE = ("from tformer.grading import Case, Exercise, register\n"
                  "register(Exercise('ch01.loop_test', 't', reference=lambda x: x, n_random=0, time_limit=0.5,\n"
                  "                  edge_cases=lambda: [Case('one', (torch.ones(1),))], random_case=None))\n")


def _tiny_notebook(path):
    _notebook(path, [
        "import torch\nfrom tformer.grading import check",
        "def sm(x):\n    e = torch.exp(x - x.amax(-1, keepdim=True))\n    return e / e.sum(-1, keepdim=True)\n"
        "check('ch01.softmax', sm)",
        "def att(q, k, v, mask=None):\n    raise NotImplementedError\ncheck('ch01.attention', att)",
        "raise RuntimeError('a broken cell')",
        _LOOP_EXERCISE +                                # the time limit holds in a worker, bare except or not
        "def spin(x):\n    while True:\n        try:\n            while True:\n                pass\n"
        "        except:\n            pass\n"
        "check('ch01.loop_test', spin)",
        "print('after the loop cell')",
    ])


@pytest.fixture
def loop_exercise(temp_exercise):
    """ch01.loop_test as the grader knows it (a notebook's own `register` gives it no points)."""
    temp_exercise(Exercise("ch01.loop_test", "t", reference=lambda x: x, n_random=0, time_limit=0.5,
                           edge_cases=lambda: [Case("one", (torch.ones(1),))], random_case=None))


def test_tformer_grade_on_a_tiny_notebook(tmp_path, capsys, loop_exercise):
    from tformer.cli import main
    _tiny_notebook(tmp_path / "01_tiny.ipynb")
    (tmp_path / "notes.ipynb").write_text("not a chapter, ignored")
    out = tmp_path / "report.json"
    assert main(["grade", str(tmp_path), "--json", str(out), "--timeout", "120"]) == 0
    printed = capsys.readouterr().out
    assert "ch01" in printed and "TOTAL 1/8 points" in printed and "RuntimeError: a broken cell" in printed
    data = json.loads(out.read_text())
    assert data["total"] == {"earned": 1, "possible": 8}   # 1 + 3 + chapter 1's three questions
    rows = {r["exercise"]: r for r in data["notebooks"][0]["exercises"]}
    assert rows["ch01.softmax"]["passed"] and rows["ch01.softmax"]["status"] == "passed"
    assert rows["ch01.attention"]["status"] == "not attempted" and rows["ch01.attention"]["points"] == 3
    assert rows["ch01.loop_test"]["status"] == "timeout" and "stopped after 0.5 s" in rows["ch01.loop_test"]["message"]
    assert main(["grade", str(tmp_path / "01_tiny.ipynb"), "--json", str(out), "--require-all"]) == 1


def test_tformer_grade_cannot_be_forged(tmp_path):
    """Patching the comparison, reading the expected answer from the caller's frames, registering a new
    exercise and writing a made-up report all happen in the worker's process: none of it changes the grade."""
    from tformer.grading.classroom.runner import grade
    _notebook(tmp_path / "01_cheats.ipynb", [
        "import json, os, sys, torch\nimport tformer.grading.core as core\nfrom tformer.grading import check",
        # patch the comparison and the judge, then hand in a wrong softmax
        "core.compare = lambda *a, **k: None\n"
        "core.judge = lambda ex, cases, out: core.Result(ex.name, ex.points, True, 'passed', 'forged', 1)\n"
        "check('ch01.softmax', lambda x: x)",
        # look for the expected answer in the callers' frames
        "def att(q, k, v, mask=None):\n    f = sys._getframe(1)\n    while f is not None:\n"
        "        for val in list(f.f_locals.values()):\n"
        "            if isinstance(val, tuple) and len(val) == 2 and getattr(val[0], 'shape', None) == q.shape:\n"
        "                return val\n        f = f.f_back\n"
        "    return torch.zeros_like(q), torch.zeros(q.shape[:-1] + (k.shape[-2],))\n"
        "check('ch01.attention', att)",
        # a made-up report line, and a made-up JSON report where the grader will write its own
        "row = {'exercise': 'ch01.attention', 'points': 3, 'passed': True, 'status': 'passed', 'message': '',"
        " 'cases_run': 1}\n"
        "open(os.environ.get('TFORMER_GRADE_REPORT') or 'r.jsonl', 'a').write(json.dumps(row) + '\\n')\n"
        "open('grade-report.json', 'w').write(json.dumps({'total': {'earned': 4, 'possible': 4}}))",
    ])
    data = grade(tmp_path / "01_cheats.ipynb", json_path=tmp_path / "grade-report.json")
    assert data["total"] == {"earned": 0, "possible": 7}, data
    rows = {r["exercise"]: r for r in data["notebooks"][0]["exercises"]}
    assert rows["ch01.softmax"]["status"] == rows["ch01.attention"]["status"] == "failed", rows
    assert json.loads((tmp_path / "grade-report.json").read_text()) == data


def test_what_the_worker_sends_cannot_run_code_in_the_grader(tmp_path):
    """The notebook replaces the worker's encoder with one that sends a pickle that would run a command when
    loaded: the grader loads with weights_only, refuses it, and grades the exercise as an error."""
    from tformer.grading.classroom.runner import run_notebook
    marker = tmp_path / "pwned"
    _notebook(tmp_path / "01_evil.ipynb", [
        "import os, torch\nfrom tformer.grading import check",
        f"class Evil:\n    def __reduce__(self):\n        return (os.system, ('touch {marker}',))\n"
        "import gc, types\nfor f in gc.get_objects():                   # the worker's own module is __main__\n"
        "    if isinstance(f, types.FunctionType) and f.__name__ == 'write_frame':\n"
        "        f.__globals__['sendable'] = lambda x: Evil()\n"
        "def sm(x):\n    e = torch.exp(x - x.amax(-1, keepdim=True))\n    return e / e.sum(-1, keepdim=True)\n"
        "check('ch01.softmax', sm)",
    ])
    rep = run_notebook(tmp_path / "01_evil.ipynb", timeout=120)
    rows = {r.exercise: r for r in rep.rows}
    assert rows["ch01.softmax"].status == "error" and not rows["ch01.softmax"].passed, (rows, rep.cell_errors)
    assert not marker.exists()


def test_reading_the_callers_frames_finds_no_answer_in_a_notebook_check_either():
    def cheat(q, k, v, mask=None):
        f = sys._getframe(1)
        while f is not None:
            for val in list(f.f_locals.values()):
                if isinstance(val, tuple) and len(val) == 2 and getattr(val[0], "shape", None) == q.shape:
                    return val
            f = f.f_back
        return torch.zeros_like(q), torch.zeros(q.shape[:-1] + (k.shape[-2],))
    assert check("ch01.attention", cheat).status == "failed"


def test_tformer_grade_bad_path(tmp_path, capsys):
    from tformer.cli import main
    assert main(["grade", str(tmp_path / "missing")]) == 2
    assert main(["grade", str(tmp_path)]) == 2
    assert "no chapter notebooks" in capsys.readouterr().err          # errors: one line on stderr


def test_not_run_exercises_are_listed(tmp_path):
    from tformer.grading.classroom.runner import run_notebook
    _notebook(tmp_path / "06_empty.ipynb", ["x = 1"])
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
    # MultiHeadAttention splits with the same function: its output is out(merge(attend(split(qkv(x)))))
    mha = tformer.MultiHeadAttention(12, 3).eval()
    q, k, v = (tformer.split_heads(t, 3) for t in mha.qkv(x).split(12, -1))
    with torch.no_grad():
        want = mha.out(tformer.merge_heads(tformer.scaled_dot_product_attention(q, k, v)[0]))
        torch.testing.assert_close(mha(x), want)


def test_in_place_edits_do_not_leak_between_reference_learner_and_mistakes():
    def vandal(x, params, n_heads):
        for t in params.values():
            t.mul_(0)                                                  # wrecks its own copy only
        x.mul_(0)
        return torch.zeros_like(x)
    r = check("ch05.encoder_layer", vandal)
    assert r.status == "failed"
    case = REGISTRY["ch05.encoder_layer"].edge_cases()[0]
    args, _ = core.clone_args(case)
    args[1]["norm1.weight"].zero_()
    assert not torch.equal(case.args[1]["norm1.weight"], args[1]["norm1.weight"])


def test_each_notebook_owes_its_own_exercises(temp_exercise, tmp_path):
    """A chapter split into two notebooks: exercises registered with `notebook=` go to that notebook only; a
    released notebook's exercises come in the order it checks them (chapter 1 checks softmax first)."""
    from tformer.grading.classroom.notebooks import exercises_of
    one = lambda: [Case("one", (torch.ones(1),))]  # noqa: E731
    temp_exercise(Exercise("ch97.first", "t", reference=lambda x: x, edge_cases=one, random_case=None, n_random=0,
                           notebook="97_first_part"))
    temp_exercise(Exercise("ch97.second", "t", reference=lambda x: x, edge_cases=one, random_case=None, n_random=0,
                           notebook="97b_second_part"))
    temp_exercise(Exercise("ch97.any", "t", reference=lambda x: x, edge_cases=one, random_case=None, n_random=0))
    assert exercises_of(tmp_path / "97_first_part.ipynb") == ["ch97.first", "ch97.any"]
    assert exercises_of(tmp_path / "97b_second_part.ipynb") == ["ch97.second", "ch97.any"]
    assert exercises_of(tmp_path / "01_attention.ipynb") == [                       # notebook order, questions last
        "ch01.softmax", "ch01.attention", "ch01.q_sharper_query", "ch01.q_score_variance", "ch01.q_saturation"]


# --- no correct answer rejected, no wrong one accepted, messages that do not mislead ------------------

def test_a_rounding_tie_does_not_decide_a_grade():
    """0.01 / (0.02 / 127) = 63.5 exactly: a float64 or multiply-by-reciprocal answer rounds it the other way
    than the float32 reference, and is as right."""
    def int8_float64(w):
        w = w.double()
        amax = w.abs().amax(1)
        s = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
        return torch.round(w / s[:, None]).clamp(-128, 127).to(torch.int8), s.float()

    def int8_reciprocal(w):
        amax = w.abs().amax(1)
        s = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
        return torch.round(w * (1 / s)[:, None]).clamp(-128, 127).to(torch.int8), s
    assert check("ch14.int8", int8_float64).passed
    assert check("ch14.int8", int8_reciprocal).passed

    def one_off_at_no_tie(w):                                           # but off by one elsewhere still fails
        q, s = int8_float64(w)
        return (q.int() + (q == 0)).to(torch.int8), s
    assert check("ch14.int8", one_off_at_no_tie).status == "failed"


def _swap_output(fn, i, convert):
    def wrapped(*a, **k):
        out = list(fn(*a, **k))
        out[i] = convert(out[i])
        return tuple(out)
    return wrapped


@pytest.mark.parametrize("name,output", [("ch14.int8", 0), ("ch13.top_k_router", 1), ("ch14.accept", 0),
                                         ("ch11.mlm_masking", 0), ("ch11.mlm_masking", 1)])
def test_integer_outputs_need_their_dtype_and_integer_values(name, output):
    from exercise_solutions import SOLUTIONS
    for convert in (lambda t: t.float(), lambda t: t.to(torch.int16), lambda t: t.double() + 0.25):
        r = check(name, _swap_output(SOLUTIONS[name], output, convert))
        assert r.status == "failed" and "dtype" in r.message, r.message
    assert "expected dtype torch.int8, got torch.int64" in compare(torch.tensor([1]), torch.tensor([1], dtype=torch.int8), 0, 0)


def test_values_wider_than_keys_are_graded():
    """Scaling by sqrt(d_v) instead of sqrt(d_k) passed when every case had d_v == d_k."""
    def attention_dv(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, -1).nan_to_num(0.0)
        return w @ v, w

    def kv_step_dv(q, k_new, v_new, k_cache, v_cache):
        k_all, v_all = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
        t_q, t_k = q.shape[2], k_all.shape[2]
        visible = torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)
        s = (q @ k_all.transpose(-2, -1) / math.sqrt(v_all.shape[-1])).masked_fill(~visible, float("-inf"))
        return torch.softmax(s, -1) @ v_all, k_all, v_all
    assert check("ch01.attention", attention_dv).status == "failed"
    assert check("ch14.kv_step", kv_step_dv).status == "failed"


def test_merge_heads_gets_contiguous_inputs_as_real_code_does():
    def merge_with_view(x):
        b, h, t, hd = x.shape
        return x.transpose(1, 2).view(b, t, h * hd)                    # fails on attention's contiguous output
    r = check("ch03.merge_heads", merge_with_view)
    assert r.status == "error" and "view" in r.message, r.message


def test_in_place_edits_of_the_inputs_are_reported():
    def softmax_in_place(x):
        x.sub_(x.amax(-1, keepdim=True)).exp_()                         # right values, the caller's x destroyed
        return x / x.sum(-1, keepdim=True)
    r = check("ch01.softmax", softmax_in_place)
    assert r.status == "failed" and "modified its input `x` in place" in r.message, r.message

    def layer_norm_edits_weight(x, w, b, eps=1e-5):
        from exercise_solutions.ch05 import layer_norm
        out = layer_norm(x, w, b, eps)
        w.zero_()
        return out
    r = check("ch05.layer_norm", layer_norm_edits_weight)
    assert r.status == "failed" and "in place" in r.message, r.message


def test_a_nan_shared_with_a_mistake_does_not_name_it():
    """No guard for fully masked rows gives NaN there, as the unscaled mistake does: that is not 'missing scale'."""
    def attention_without_guard(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, -1)
        return w @ v, w
    r = check("ch01.attention", attention_without_guard)
    assert r.status == "failed" and "NaN" in r.message and "known mistake" not in r.message, r.message


@pytest.mark.parametrize("name,mistake", [(n, m) for n in sorted(REGISTRY) for m in REGISTRY[n].mistakes
                                          if isinstance(REGISTRY[n], Exercise)])
def test_a_mistake_is_named_only_when_the_function_behaves_like_it_everywhere(name, mistake):
    """A function that equals a mistake only on the first (smallest, often degenerate) case and is right on
    every other case must not be told it made that mistake."""
    from exercise_solutions import SOLUTIONS
    ex = REGISTRY[name]
    first = ex.edge_cases()[0]
    buggy, right = ex.mistakes[mistake], SOLUTIONS[name]

    def wrong_on_the_first_case_only(*a, **k):
        return (buggy if core._same(first.args, a) else right)(*a, **k)
    r = check(name, wrong_on_the_first_case_only)
    assert mistake not in r.message, r.message


def test_close_values_are_shown_with_enough_digits_to_differ():
    e = torch.tensor([0.08838835], dtype=torch.float64)
    msg = compare(e * (1 + 3e-5), e, 1e-7, 1e-6)
    shown = re.search(r"expected ([^,]+), got ([^,]+), relative error", msg)
    assert shown and shown.group(1) != shown.group(2), msg


def test_an_error_points_to_the_learners_own_line():
    def attention_bad_einsum(q, k, v, mask=None):
        scores = torch.einsum("bhqd,bhkd->bhqk", q)                     # one operand missing
        return scores @ v, scores
    r = check("ch01.attention", attention_bad_einsum)
    assert r.status == "error" and "your line" in r.message and 'torch.einsum("bhqd' in r.message, r.message


def test_a_bare_except_cannot_defeat_the_time_limit_in_a_notebook(temp_exercise, capsys):
    temp_exercise(Exercise("test.swallow", "t", reference=lambda x: x, edge_cases=lambda: [Case("one", (torch.ones(1),))],
                           random_case=None, n_random=0, time_limit=0.3))

    def swallows_three_stops(x):
        for _ in range(4):
            try:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    time.sleep(0.01)
            except:  # noqa: E722  (the point of the test)
                pass
        return x                                                         # right answer, far too late
    r = check("test.swallow", swallows_three_stops)     # one stop only would leave it running 30 s more
    assert r.status == "timeout" and "bare `except:`" in r.message, r.message
    assert "interrupt the kernel" in capsys.readouterr().err


def test_system_exit_does_not_escape_check():
    r = check("ch01.softmax", lambda x: exit())
    assert r.status == "error" and "called exit()" in r.message, r.message
    r = check("ch01.softmax", lambda x: (_ for _ in ()).throw(SystemExit(3)))
    assert r.status == "error"


def test_torch_references_are_caught_by_any_name():
    """Aliases of torch built-ins imported before the check, and their torch._C paths."""
    from torch import softmax as imported_early
    sdpa_c = torch._C._nn.scaled_dot_product_attention
    r = check("ch01.softmax", lambda x: imported_early(x, -1))
    assert r.status == "error" and "called the reference" in r.message, r.message
    r = check("ch01.softmax", lambda x: torch._C._VariableFunctions.softmax(x, -1))
    assert r.status == "error" and "called the reference" in r.message, r.message
    r = check("ch01.attention", lambda q, k, v, mask=None: (sdpa_c(q, k, v, attn_mask=mask), None))
    assert r.status == "error" and "called the reference" in r.message, r.message
    torch.testing.assert_close(imported_early(torch.zeros(2), -1), torch.full((2,), 0.5))   # restored


def test_a_notebooks_import_of_check_loads_none_of_the_teachers_half():
    """`from tformer.grading import check` (every chapter's first cell) loads no module of grading/classroom/."""
    import subprocess
    code = ("import sys; from tformer.grading import check, load_exercises; load_exercises(); "
            "print(sorted(m for m in sys.modules if m.startswith('tformer.grading.classroom')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_an_infinite_difference_is_printed_as_inf(temp_exercise, capsys):
    """-inf expected where the function returns 0: the difference is inf, in compare's message and in the line a
    learner's check prints, never the largest double (1.8e+308)."""
    inf, nan = float("inf"), float("nan")
    msg = compare(torch.tensor([1.0, 0.0]), torch.tensor([1.0, -inf]), 1e-5, 1e-4)
    assert "largest difference inf at index (1,)" in msg and "expected -inf, got 0" in msg, msg
    msg = compare(torch.tensor([inf]), torch.tensor([-inf]), 1e-5, 1e-4)
    assert "largest difference inf" in msg and "expected -inf, got inf" in msg, msg
    msg = compare(torch.tensor([2.0]), torch.tensor([nan]), 1e-5, 1e-4)         # a number where NaN is expected
    assert "largest difference inf" in msg and "expected nan" in msg, msg
    temp_exercise(Exercise("test.masked", "t", reference=lambda x: x.masked_fill(x < 0, -inf), n_random=0,
                           edge_cases=lambda: [Case("one negative", (torch.tensor([1.0, -2.0]),))], random_case=None))
    r = check("test.masked", lambda x: x.clamp(min=0))
    printed = capsys.readouterr().out
    assert r.status == "failed" and "largest difference inf" in printed and "expected -inf, got 0" in printed, printed
    assert "e+308" not in printed, printed


def test_an_error_on_a_hidden_case_reads_as_a_failed_hidden_case(temp_exercise):
    """A function that raises on a hidden case gets the lines one that fails a hidden case gets: the public
    cases' verdict first, the partial credit last, and nothing of the case or the error in between."""
    ex = temp_exercise(Exercise("test.hidden", "t", reference=lambda x: 2 * x, n_random=2, points=3,
                                edge_cases=lambda: [Case("one", (torch.ones(2),))],
                                random_case=lambda s: Case(f"random #{s}", (torch.randn(3),), seed=s),
                                partial={"edge": 1, "random": 1, "hidden": 1}))
    cases = core.exercise_cases(ex) + [Case("a secret 7321", (torch.full((2,), 7321.0),), group="hidden")]
    right = [2 * c.args[0] for c in cases]
    after = [(c.args, c.kwargs) for c in cases]
    failed = core.judge(ex, cases, core.Outcome(right[:-1] + [cases[-1].args[0]], after))
    raised = core.judge(ex, cases, core.Outcome(right[:-1], after[:-1], "error",
                                                "ZeroDivisionError: division by zero (your line 2: `1 / 0`)"))
    assert (failed.status, raised.status) == ("failed", "error")
    assert failed.fraction == raised.fraction == pytest.approx(2 / 3)
    for r in (failed, raised):
        lines = r.message.splitlines()
        assert lines[0].startswith("passed the 3 public cases. ") and lines[-1] == "Partial credit: 67% of the points."
        assert len(lines) == 2 and "7321" not in r.message and "secret" not in r.message, r.message
    assert "Your function raised an error on a hidden case (hidden cases are not shown)." in raised.message
    assert "ZeroDivision" not in raised.message and "1 / 0" not in raised.message
    # a public failure too: the public verdict names it, as for a failed hidden case
    wrong = [right[0] + 1] + right[1:-1]
    r = core.judge(ex, cases, core.Outcome(wrong, after[:-1], "error", "ZeroDivisionError: division by zero"))
    assert r.message.startswith("FAILED 1 of 3 cases. Smallest failing case 'one'") and "raised an error on a hidden" \
        in r.message and r.fraction == pytest.approx(1 / 3), r.message


def test_a_check_cell_shows_its_verdict_once(capsys):
    """A check cell prints its verdict line; the Result, the cell's last value, adds no second display in
    Jupyter (IPython's display formatter gets nothing from it)."""
    from IPython.core.formatters import DisplayFormatter
    result = check("ch01.softmax", _softmax)
    printed = capsys.readouterr().out
    assert result.passed and printed.count(result.message) == 1 and printed.startswith("[PASS] ch01.softmax")
    assert DisplayFormatter().format(result) == ({}, {})
