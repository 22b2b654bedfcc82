"""Questions of understanding (tformer/grading/questions.py): the judge of every kind, the expression whitelist,
the stub in every mode, the value a worker hands over, the notebooks' `### ANSWER` line, and a tiny class
graded as a teacher types it, with questions registered from the teacher's own module."""
from __future__ import annotations

import io
import json
import time
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from tformer.grading import REGISTRY, Question, check, register, set_mode
from tformer.grading.questions import MAX_TEXT, expression_problem, judge_question, plain, valid

SCALE = Question(name="test.q_scale", title="the variance of q.k for unit-variance entries, d_k = 64", kind="number",
                 answer=64, points=2, mistakes={"the standard deviation of q.k, not its variance": 8},
                 hint="add up d_k products, each of variance 1")
ZERO = Question(name="test.q_zero", title="a number that is zero", kind="number", answer=0, abs_tol=1e-6)
MASK = Question(name="test.q_mask", title="where the mask goes", kind="choice", answer="B",
                mistakes={"the mask after the softmax: the weights no longer sum to 1": "A",
                          "a mask on the queries hides nothing that matters": "C",
                          "masking with 0 instead of -inf leaves the keys their weight": "D"})
COST = Question(name="test.q_cost", title="the cost of the scores of one layer", kind="expr", answer="n**2 * d",
                symbols=("n", "d"), mistakes={"the projections' cost, not the scores'": "n * d**2"},
                hint="n queries times n keys, each a dot product of length d")
QUESTIONS = (SCALE, ZERO, MASK, COST)


@pytest.fixture(autouse=True, scope="module")
def registered():
    for q in QUESTIONS:
        register(q)
    yield
    for q in QUESTIONS:
        REGISTRY.pop(q.name, None)


@pytest.fixture(autouse=True)
def learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


def verdict(name, value):
    r = check(name, value)
    return r.status, r.message


# --- the judge, kind by kind ------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [64, 64.0, np.float32(64), np.int64(64), torch.tensor(64.0), torch.tensor([64]),
                                   64 * (1 + 0.99e-3), 64 * (1 - 0.99e-3)])
def test_a_number_within_the_tolerance_passes(value):
    r = check("test.q_scale", value)
    assert r.passed and r.status == "passed" and r.points == 2, r.message


@pytest.mark.parametrize("value", [64 * (1 + 1.01e-3), 64 * (1 - 1.01e-3), 65, -64, float("nan"), float("inf"), 10 ** 400])
def test_a_number_outside_the_tolerance_fails_with_the_hint(value):
    status, msg = verdict("test.q_scale", value)
    assert status == "failed" and "Hint: add up d_k products" in msg and "known mistake" not in msg, msg


def test_abs_tol_for_an_answer_of_zero():
    assert check("test.q_zero", 1e-7).passed and check("test.q_zero", -1e-7).passed
    assert not check("test.q_zero", 2e-6).passed


def test_a_wrong_number_names_its_misconception_and_the_answer_given():
    status, msg = verdict("test.q_scale", 8.001)
    assert status == "failed" and "you answered 8.001" in msg, msg
    assert "known mistake: the standard deviation of q.k, not its variance" in msg and "Hint" not in msg, msg
    assert check("test.q_scale", 8).mistakes == ["the standard deviation of q.k, not its variance"]


@pytest.mark.parametrize("value,shown", [("sixty-four", "'sixty-four'"), ("1/2", "'1/2'"), (True, "bool"), (torch.ones(2, 3), "Tensor of shape (2, 3)"),
                                         (None, "NoneType"), ([64], "list"), (torch.tensor(True), "Tensor of shape ()"),
                                         (check, "function")])
def test_a_number_question_refuses_other_types(value, shown):
    status, msg = verdict("test.q_scale", value)
    assert status == "failed" and "expected a number" in msg and shown in msg, msg


@pytest.mark.parametrize("value", ["B", "b", " b ", "B\n"])
def test_a_choice_by_its_letter_in_either_case(value):
    assert check("test.q_mask", value).passed


# --- answers as learners type them: read, not refused ------------------------------------------------------

@pytest.mark.parametrize("value", ["(B)", "B.", "B)", "[b]", "Ｂ", "（B）", "B。", "ｂ．", " (B) "])
def test_a_choice_in_brackets_with_a_stop_or_full_width_is_read(value):
    r = check("test.q_mask", value)
    assert r.passed, (value, r.message)


@pytest.mark.parametrize("value", ["(C)", "Ｃ", "C。"])
def test_a_wrong_choice_typed_so_still_names_its_misconception(value):
    assert check("test.q_mask", value).mistakes == ["a mask on the queries hides nothing that matters"]


@pytest.mark.parametrize("value", ["B or C", "(B)(C)", "BC", "B, C", "答案B"])
def test_two_letters_or_more_stay_refused(value):
    status, msg = verdict("test.q_mask", value)
    assert status == "failed" and "expected one of the letters" in msg, msg


@pytest.mark.parametrize("value", ["64", " 64.0 ", "6.4e1", "6_4", "６４", Fraction(128, 2), Decimal("64.000")])
def test_a_number_in_a_string_a_fraction_or_a_decimal_is_read(value):
    assert check("test.q_scale", value).passed


def test_a_number_is_shown_with_all_its_digits():
    big = Question(name="test.q_big", title="a big count", kind="number", answer=1_050_624)
    register(big)
    try:
        assert "right (1050624)" in check("test.q_big", 1_050_624).message
        assert "you answered 1061131.25" in check("test.q_big", 1_061_131.25).message
        assert "you answered 0.925" in check("test.q_big", 0.925).message
    finally:
        REGISTRY.pop("test.q_big")


@pytest.mark.parametrize("value", ["n^2*d", "n^2 * d", "d*n^2", "n＊n＊d"])
def test_a_caret_reads_as_a_power_and_full_width_signs_as_ascii(value):
    r = check("test.q_cost", value)
    assert r.passed, r.message


@pytest.mark.parametrize("letter", ["A", "C", "D"])
def test_each_wrong_choice_names_its_misconception(letter):
    r = check("test.q_mask", letter.lower())
    assert r.status == "failed" and r.mistakes == [m for m, v in MASK.mistakes.items() if v == letter], r.message
    assert f"known mistake: {r.mistakes[0]}" in r.message, r.message


@pytest.mark.parametrize("value", ["E", "AB", "", 2, None, ("B",)])
def test_a_choice_outside_the_letters_is_refused(value):
    status, msg = verdict("test.q_mask", value)
    assert status == "failed" and "expected one of the letters A, B, C, D" in msg, msg


@pytest.mark.parametrize("value", ["n**2 * d", "d*n*n", "n * n * d", "(n**2)*d + 0", "sqrt(n)**4 * d", "exp(log(n) * 2) * d",
                                   "  n ** 2 * d  ", "n**2*d*2/2", "-(-n**2*d)"])
def test_an_equivalent_expression_passes(value):
    r = check("test.q_cost", value)
    assert r.passed, r.message


def test_a_wrong_expression_names_its_misconception_or_gets_the_hint():
    r = check("test.q_cost", "d**2 * n")
    assert r.status == "failed" and r.mistakes == ["the projections' cost, not the scores'"], r.message
    status, msg = verdict("test.q_cost", "n * d")
    assert status == "failed" and "Hint: n queries times n keys" in msg, msg
    assert check("test.q_cost", "n**2 * d * (1 + 1e-6)").status == "failed"     # close is not equal
    assert check("test.q_cost", 7).status == "failed"                           # a number: a constant expression


@pytest.mark.parametrize("text,found", [
    ("n.real * d", "an attribute (.real)"),
    ("__import__('os').system('true')", "a call to system"),
    ("__import__('os')", "a call to __import__"),
    ("open(n)", "a call to open"),
    ("print(n) or n**2*d", "the operator or"),
    ("abs(n)**2 * d", "a call to abs"),
    ("(n, d)", "a tuple"),
    ("n if d else n", "an if-else"),
    ("f'{n}'", "a JoinedStr"),
    ("log(n, 2) * d", "log(...) other than log(x)"),
    ("sqrt(x=n)", "sqrt(...) other than sqrt(x)"),
    ("x**2 * d", "the name x"),
    ("N**2 * d", "the name N"),
    ("(lambda: n)()", "a call"),
    ("lambda: n", "a lambda"),
    ("[n][0] * d", "a subscript"),
    ("'n**2 * d'", "the value 'n**2 * d'"),
    ("True * n**2 * d", "the value True"),
    ("1j * n", "the value 1j"),
    ("n // 1 * n * d", "the operator //"),
    ("n % 3", "the operator %"),
    ("n < d", "a comparison"),
    ("[n for n in (1,)]", "a comprehension"),
    ("(y := n) * d", "the operator :="),
])
def test_the_expression_whitelist_refuses_with_a_clear_message(text, found):
    status, msg = verdict("test.q_cost", text)
    assert status == "failed", msg
    assert "only numbers, n, d, + - * / ** ( ) and log, sqrt, exp are allowed" in msg and f"found {found}" in msg, msg


@pytest.mark.parametrize("text", ["9**9**9", "9**9**9**9", "2**n**n**n", "(n*d)**(10**10)", "10**-(9**9)"])
def test_huge_exponents_are_refused_at_once(text):
    t0 = time.perf_counter()
    status, msg = verdict("test.q_cost", text)
    assert status == "failed" and "an exponent of at most 1000" in msg, msg
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("text,why", [("n" * (MAX_TEXT + 1), f"at most {MAX_TEXT} characters"),
                                      ("n**2 *", "not an expression"), ("(" * 90 + "n" + ")" * 90, "")])
def test_long_broken_or_deep_expressions_are_refused(text, why):
    t0 = time.perf_counter()
    status, msg = verdict("test.q_cost", text)
    assert status == "failed" and why in msg and time.perf_counter() - t0 < 1.0, msg


def test_undefined_and_overflowing_values_are_wrong_not_errors():
    for text in ("n**2 * d / 0", "sqrt(-n) * d", "log(n - n)", "exp(exp(exp(n))) * d", "1e308 * n * d * 10"):
        assert check("test.q_cost", text).status == "failed", text


def test_a_question_checks_its_own_answer_and_mistakes():
    with pytest.raises(ValueError, match="not among the choices"):
        Question(name="t.q", title="t", kind="choice", answer="E")
    with pytest.raises(ValueError, match="not among the choices"):
        Question(name="t.q", title="t", kind="choice", answer="A", mistakes={"m": "Z"})
    with pytest.raises(ValueError, match="found a call to open"):
        Question(name="t.q", title="t", kind="expr", answer="open(n)", symbols=("n",))
    with pytest.raises(ValueError, match="the name m"):
        Question(name="t.q", title="t", kind="expr", answer="n", symbols=("n",), mistakes={"x": "m"})
    with pytest.raises(ValueError, match="not a number"):
        Question(name="t.q", title="t", kind="number", answer="64")
    with pytest.raises(ValueError, match="all or nothing"):
        Question(name="t.q", title="t", kind="number", answer=64, partial={"edge": 1})
    with pytest.raises(ValueError, match="kind must be one of"):
        Question(name="t.q", title="t", kind="text", answer="x")


# --- the stub, in every mode --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [q.name for q in QUESTIONS])
def test_the_stub_is_not_attempted_in_every_mode(name, capsys):
    r = check(name, ...)
    assert (r.status, r.passed, r.cases_run) == ("not attempted", False, 1)
    assert "[TODO]" in capsys.readouterr().out
    set_mode("blank")
    assert check(name, ...).status == "not attempted"                      # blank: the stub passes
    with pytest.raises(AssertionError, match="expected the untouched stub"):
        check(name, "B" if name == "test.q_mask" else 64)
    set_mode("strict")
    with pytest.raises(AssertionError, match="not attempted"):
        check(name, ...)


def test_strict_mode_raises_on_a_wrong_answer_and_passes_a_right_one():
    set_mode("strict")
    assert check("test.q_mask", "B").passed
    with pytest.raises(AssertionError, match="known mistake"):
        check("test.q_mask", "A")


def test_messages_in_chinese(monkeypatch):
    monkeypatch.setenv("TFORMER_LANG", "zh")
    assert "尚未作答" in check("test.q_scale", ...).message
    msg = check("test.q_cost", "open(n)").message
    assert "open" in msg and "只允许" in msg, msg


# --- the value that crosses the process boundary -------------------------------------------------------------

class Nasty:
    """A learner's object whose every attribute raises."""

    def __getattribute__(self, name):
        raise RuntimeError("boom")


def test_plain_is_builtins_only_and_never_raises():
    assert plain(...) == ("stub",)
    assert plain(torch.tensor([[2.5]])) == ("number", 2.5) and plain(np.float64(2.5)) == ("number", 2.5)
    assert plain(10 ** 400) == ("number", float("inf"))
    assert plain("x" * 10_000) == ("text", "x" * (MAX_TEXT + 1))
    assert plain(Nasty())[0] == "other" and plain(torch.zeros(3))[0] == "other"

    class Sly(str):
        def __getitem__(self, i):
            return Nasty()
    assert plain(Sly("B")) == ("text", "B") and type(plain(Sly("B"))[1]) is str
    for value in (..., 3, "B", torch.ones(2), Nasty(), Sly("B")):           # what a worker sends, as the grader loads it
        buf = io.BytesIO()
        torch.save(plain(value), buf)
        assert torch.load(io.BytesIO(buf.getvalue()), weights_only=True) == plain(value)


@pytest.mark.parametrize("forged", [("number", "64"), ("text", 64), ("number", True), ("stub", 1), ["number", 64.0],
                                    ("text", "B", "extra"), None, 64, {"number": 64}, ("number", torch.tensor(64.0))])
def test_a_forged_value_is_a_wrong_type(forged):
    """A worker's frame is the learner's to forge: anything that is not one of plain's forms is judged as an
    object of unknown type, never run or trusted."""
    assert valid(forged) == ("other", "?")
    r = judge_question(SCALE, forged)
    assert r.status == "failed" and "expected a number" in r.message


def test_expression_problem_reads_without_running():
    assert expression_problem("n**2 * d", ("n", "d")) is None
    assert "found a call to exec" in expression_problem("exec('1')", ("n",))


# --- the notebooks' ### ANSWER line --------------------------------------------------------------------------

def test_the_answer_line_in_learner_and_solution_notebooks():
    from tools.notebooks import strip_solutions
    src = 'x = 1\nanswer = "B"  ### ANSWER\ncheck("ch01.q_scale", answer)\n'
    assert strip_solutions(src, solutions=True) == 'x = 1\nanswer = "B"\ncheck("ch01.q_scale", answer)\n'
    assert strip_solutions(src, solutions=False) == 'x = 1\nanswer = ...  # your answer\ncheck("ch01.q_scale", answer)\n'
    with pytest.raises(ValueError, match="line 1"):
        strip_solutions("check(x)  ### ANSWER\n", solutions=False)


def test_the_grader_hash_covers_a_registered_question():
    from tformer.grading.classroom.run import grader_hash
    assert len(grader_hash()) == 64


# --- a tiny class, as a teacher types it ---------------------------------------------------------------------

QUIZ = '''from tformer.grading import Question, register

register(Question(name="w01.q_scale", title="the variance of q.k for unit-variance entries, d_k = 64", kind="number",
                  answer=64, points=2, notebook="w01_quiz",
                  mistakes={"the standard deviation of q.k, not its variance": 8}, hint="add up d_k products"))
register(Question(name="w01.q_mask", title="where the causal mask goes", kind="choice", answer="B",
                  notebook="w01_quiz", mistakes={"the mask after the softmax": "A", "a mask on the queries": "C",
                                                 "masking with 0 instead of -inf": "D"}))
register(Question(name="w01.q_cost", title="the cost of the attention scores", kind="expr", answer="n**2 * d",
                  symbols=("n", "d"), notebook="w01_quiz", mistakes={"the projections' cost": "n * d**2"}))
'''
HEAD = "import torch\nfrom tformer.grading import check, load_exercises\nload_exercises('quiz.py')"


def quiz(scale="...", mask="...", cost="...", drop="") -> list[str]:
    cells = [HEAD, f'answer = {scale}  # your answer\ncheck("w01.q_scale", answer)',
             f'answer = {mask}  # your answer\ncheck("w01.q_mask", answer)',
             f'answer = {cost}  # your answer\ncheck("w01.q_cost", answer)']
    return [c for c in cells if not (drop and drop in c)]


@pytest.fixture(scope="module")
def quiz_class(tmp_path_factory):
    """quiz.py (three questions, 2 + 1 + 1 points, the mask's raised to 2 by the assignment), its released notebook,
    and a class: ada right on all three; bob the std (a named mistake), the mask after the softmax (named), the cost
    untouched; cy the handout as it was; dee a tensor of 3 numbers, a deleted mask cell, an expression that would
    create a file if it ran, and an override on the cost."""
    from test_grade_cli import tformer, write
    root = tmp_path_factory.mktemp("quiz")
    (root / "work").mkdir()
    (root / "quiz.py").write_text(QUIZ, encoding="utf-8")
    write(root / "handout" / "w01_quiz.ipynb", quiz())
    (root / "quiz.toml").write_text('notebooks = ["w01_quiz"]\nexercises = ["quiz.py"]\nreleased = "handout/"\n\n'
                                    '[points]\n"w01.q_mask" = 2\n', encoding="utf-8")
    cls = root / "class"
    write(cls / "ada" / "w01_quiz.ipynb", quiz("64", "' b '", "'d * n**2'"))
    write(cls / "bob" / "w01_quiz.ipynb", quiz("8", "'A'"))
    write(cls / "cy" / "w01_quiz.ipynb", quiz())
    pwned = root / "PWNED"
    write(cls / "dee" / "w01_quiz.ipynb", quiz("torch.ones(3)", cost=repr(f"__import__('os').mkdir({str(pwned)!r})"),
                                              drop="w01.q_mask").copy())
    (root / "overrides.csv").write_text("student,exercise,points,reason\ndee,w01.q_cost,1,explained it in class\n",
                                        encoding="utf-8")
    out = root / "out"
    proc = tformer("class", "grade", cls, "--out", out, "--assignment", root / "quiz.toml", "--overrides", root / "overrides.csv",
                   "--workers", 2, cwd=root / "work")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not pwned.exists()
    return root, cls, out


def test_questions_in_the_gradebook_feedback_and_report(quiz_class):
    from test_grade_cli import book, grades_of, rows
    root, cls, out = quiz_class
    assert rows(out / "gradebook.csv")[0] == ["student", "w01.q_scale", "w01.q_mask", "w01.q_cost", "w01", "total",
                                              "possible"]
    b = book(out)
    assert {s: (b[s]["w01.q_scale"], b[s]["w01.q_mask"], b[s]["w01.q_cost"], b[s]["total"], b[s]["possible"])
            for s in b} == {"ada": ("2", "2", "1", "5", "5"), "bob": ("0", "0", "0", "0", "5"),
                            "cy": ("0", "0", "0", "0", "5"), "dee": ("0", "0", "1", "1", "5")}
    grades = grades_of(out)
    assert grades["exercises"][0] == {"id": "w01.q_scale", "chapter": "w01", "points": 2, "kind": "question",
                                      "title": "the variance of q.k for unit-variance entries, d_k = 64"}
    rows_of = {s["student"]: {x["exercise"]: x for nb in s["notebooks"] for x in nb["exercises"]}
               for s in grades["students"]}
    assert rows_of["bob"]["w01.q_scale"]["mistakes"] == ["the standard deviation of q.k, not its variance"]
    assert rows_of["bob"]["w01.q_mask"]["mistakes"] == ["the mask after the softmax"]
    assert {x["status"] for x in rows_of["cy"].values()} == {"not attempted"}
    assert rows_of["bob"]["w01.q_cost"]["status"] == "not attempted"
    assert rows_of["dee"]["w01.q_mask"]["status"] == "not run" and "its cell deleted" in rows_of["dee"]["w01.q_mask"]["message"]
    assert "expected a number, got Tensor of shape (3,)" in rows_of["dee"]["w01.q_scale"]["message"]
    assert "found a call to mkdir" in rows_of["dee"]["w01.q_cost"]["message"]
    assert all(x["seeds"] == [] for r in rows_of.values() for x in r.values())
    bob = (out / "feedback" / "bob.html").read_text(encoding="utf-8")
    assert "the variance of q.k for unit-variance entries, d_k = 64" in bob                 # the title
    assert "you answered 8" in bob and "the standard deviation of q.k, not its variance" in bob
    assert "you answered &#x27;A&#x27;" in bob and "0 of 5 points" in bob
    assert "explained it in class" in (out / "feedback" / "dee.html").read_text(encoding="utf-8")
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "w01.q_scale: 1 of 4, the standard deviation of q.k, not its variance" in report
    assert "w01.q_mask: 1 of 4, the mask after the softmax" in report
    assert not (grades.get("similar") or {}).get("pairs")


def test_only_regrades_a_question(quiz_class, tmp_path):
    import shutil
    from test_grade_cli import grades_of, tformer
    root, cls, out = quiz_class
    again = tmp_path / "again"
    shutil.copytree(out, again)
    proc = tformer("class", "grade", cls, "--out", again, "--only", "w01.q_scale", "--assignment", root / "quiz.toml",
                   "--overrides", root / "overrides.csv", "--workers", 2, cwd=root / "work")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (again / "gradebook.csv").read_text() == (out / "gradebook.csv").read_text()
    assert grades_of(again)["students"] == grades_of(out)["students"]


def test_one_learner_with_a_question_wrong_exits_1(quiz_class, tmp_path):
    from test_grade_cli import tformer, write
    root, _, _ = quiz_class
    (tmp_path / "quiz.py").write_text(QUIZ, encoding="utf-8")
    nb = write(tmp_path / "w01_quiz.ipynb", quiz("64", "'B'", "'n * d**2'"))
    proc = tformer("grade", nb, "--exercises", tmp_path / "quiz.py", "--json", tmp_path / "r.json", "--require-all",
                   cwd=tmp_path)
    assert proc.returncode == 1 and "not every exercise passed" in proc.stderr, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["total"] == {"earned": 3, "possible": 4}
    cost = next(x for x in report["notebooks"][0]["exercises"] if x["exercise"] == "w01.q_cost")
    assert cost["status"] == "failed" and cost["mistakes"] == ["the projections' cost"], cost


def test_a_question_refuses_hidden_cases_partial_credit_and_unknown_names(quiz_class, tmp_path):
    from test_grade_cli import one_line_error, tformer
    root, cls, _ = quiz_class
    (tmp_path / "hidden.py").write_text("from tformer.grading import add_hidden_cases\n"
                                        "add_hidden_cases('w01.q_scale', lambda: [])\n", encoding="utf-8")
    (tmp_path / "h.toml").write_text(f'notebooks = ["w01_quiz"]\nexercises = ["{root / "quiz.py"}"]\n'
                                     f'released = "{root / "handout"}"\nhidden = ["hidden.py"]\n', encoding="utf-8")
    (tmp_path / "partial.py").write_text(QUIZ.replace('notebook="w01_quiz",\n', 'notebook="w01_quiz", partial={"edge": 1},\n', 1),
                                         encoding="utf-8")
    (tmp_path / "weights.txt").write_text("w01.q_scale = 3\nw01.q_nope = 1\n", encoding="utf-8")
    one_line_error(tformer("class", "grade", cls, "--out", tmp_path / "o", "--assignment", tmp_path / "h.toml", cwd=tmp_path),
                   "w01.q_scale", "question", "hidden cases")
    one_line_error(tformer("class", "grade", cls, "--out", tmp_path / "o", "--exercises", tmp_path / "partial.py", cwd=tmp_path),
                   "partial.py", "all or nothing")
    one_line_error(tformer("class", "grade", cls, "--out", tmp_path / "o", "--exercises", root / "quiz.py", "--weights",
                           tmp_path / "weights.txt", cwd=tmp_path), "weights.txt:2", "w01.q_nope")
    one_line_error(tformer("class", "grade", cls, "--out", tmp_path / "o", "--exercises", root / "quiz.py", "--only", "w01.q_nope",
                           cwd=tmp_path), "--only", "w01.q_nope")


def test_the_exercise_templates_commented_question_works_once_uncommented(tmp_path):
    """`tformer exercise new` writes a question in comments; uncommented, it registers and judges as it says."""
    from tformer.grading import load_exercises
    from tformer.grading.classroom.template import new_exercise
    text = new_exercise("w09.triple", tmp_path / "w09.py").read_text()
    block = [line for line in text.splitlines() if line.startswith("# from tformer.grading import Question")
             or line.startswith("# register(Question(") or line.startswith("#                   mistakes=")]
    assert len(block) == 3, text
    (tmp_path / "w09.py").write_text(text + "\n" + "\n".join(line[2:] for line in block) + "\n")
    try:
        load_exercises(tmp_path / "w09.py")
        assert verdict("w09.q_triple", 6)[0] == "passed"
        status, message = verdict("w09.q_triple", 5)
        assert status == "failed" and "added 2 instead of doubling" in message
    finally:
        REGISTRY.pop("w09.triple", None)
        REGISTRY.pop("w09.q_triple", None)
