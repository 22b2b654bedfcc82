"""Every question of understanding, one parametrized suite over the registry and the chapter sources.

For each registered `Question`: the right answer passes, the untouched stub is "not attempted", every named
misconception's value fails and names it, a choice question has a message for every wrong letter, and the
question has exactly one answer cell (`answer = ...  ### ANSWER` + `check("chNN.q_...", answer)`) in one
chapter source, after that chapter's `## Questions` cell and before its `## Summary`, under a markdown cell
that offers the letters the registry knows and says where above the answer is shown. The answer written in
that cell is the registry's answer (so the solution notebook passes), and the learner notebook built from it
holds the stub. The right letters of the choice questions spread over A-D, and the built Chinese notebook
offers the same letters in the same order. (The form itself, the judge and its whitelist, is tested in
tests/test_questions.py; the solution and learner notebooks run whole under nbval, strict and blank.)"""
from __future__ import annotations

import ast
import re
from collections import Counter, defaultdict
from pathlib import Path

import nbformat
import pytest

from tformer.grading import REGISTRY, Question, check, load_exercises, set_mode

load_exercises()                                        # registers every chapter

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
QUESTIONS = sorted(n for n, ex in REGISTRY.items() if isinstance(ex, Question) and not n.startswith("test."))
CHECK = re.compile(r"""check\(\s*["'](ch\d\d\.\w+)["']\s*,\s*answer\s*\)""")
ANSWER_LINE = re.compile(r"^answer\s*=\s*(.+?)\s+### ANSWER$")
LETTER = re.compile(r"^- \*\*([A-Z])\.\*\*", re.M)
ITEM = re.compile(r"(?ms)^- \*\*([A-Z])\.\*\* (.*?)(?=^- \*\*|^\s*$|\Z)")   # letter, text of a choice


def cells(path: Path) -> list[tuple[str, str]]:
    """(kind, text) of every cell of a jupytext percent source; markdown text without its `# `."""
    out, kind, lines = [], None, []
    for line in path.read_text().splitlines():
        if line.startswith("# %%"):
            if kind:
                out.append((kind, "\n".join(lines).strip("\n")))
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind == "markdown":
            lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
        elif kind:
            lines.append(line)
    if kind:
        out.append((kind, "\n".join(lines).strip("\n")))
    return out


SOURCES = {p.stem: cells(p) for p in sorted(SRC.glob("[0-9][0-9]_*.py"))}


def answer_cells() -> dict[str, list[tuple[str, int]]]:
    """question name -> [(source stem, cell index)] of the code cells that check it."""
    found = defaultdict(list)
    for stem, cs in SOURCES.items():
        for i, (kind, text) in enumerate(cs):
            if kind == "code" and "### ANSWER" in text:
                for name in CHECK.findall(text):
                    found[name].append((stem, i))
    return found


ANSWER_CELLS = answer_cells()


@pytest.fixture(autouse=True)
def learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


def test_there_are_questions_and_every_answer_cell_checks_a_registered_one():
    assert len(QUESTIONS) >= 2
    unknown = sorted(set(ANSWER_CELLS) - set(QUESTIONS))
    assert not unknown, f"answer cells check questions nobody registered: {unknown}"


@pytest.mark.parametrize("name", QUESTIONS)
def test_the_right_answer_passes(name):
    q = REGISTRY[name]
    r = check(name, q.answer)
    assert r.passed and r.status == "passed", r.message
    if q.kind == "choice":                                        # a letter in either case, with spaces
        assert check(name, f" {q.answer.lower()} ").passed


@pytest.mark.parametrize("name", QUESTIONS)
def test_the_stub_is_not_attempted(name):
    r = check(name, ...)
    assert (r.status, r.passed) == ("not attempted", False), r.message


@pytest.mark.parametrize("name", QUESTIONS)
def test_every_wrong_choice_names_a_misconception(name):
    q = REGISTRY[name]
    assert q.points == 1 and q.title and q.mistakes, f"{name}: one point, a title and at least one named mistake"
    if q.kind == "choice":
        assert len(q.choices) >= 3, f"{name}: a choice question offers at least three letters"
        assert set(q.mistakes.values()) == set(q.choices) - {q.answer}, (
            f"{name}: every wrong letter needs its own message: {sorted(set(q.choices) - {q.answer})} "
            f"wrong, {sorted(q.mistakes.values())} named")
        assert len(set(q.mistakes.values())) == len(q.mistakes), f"{name}: two messages for one letter"


@pytest.mark.parametrize("name,message", [(n, m) for n in QUESTIONS for m in REGISTRY[n].mistakes])
def test_each_mistake_fails_and_names_its_misconception(name, message):
    r = check(name, REGISTRY[name].mistakes[message])
    assert r.status == "failed" and not r.passed, r.message
    assert message in r.mistakes and message in r.message, r.message


@pytest.mark.parametrize("name", QUESTIONS)
def test_each_question_has_one_answer_cell_in_its_chapter(name):
    q = REGISTRY[name]
    where = ANSWER_CELLS.get(name, [])
    assert len(where) == 1, f"{name}: answer cells with `### ANSWER` found in {where} (expected exactly one)"
    stem, i = where[0]
    if q.notebook:
        assert stem == q.notebook, f"{name} is registered for {q.notebook}, its cell is in {stem}"
    else:
        assert stem.startswith(name[2:4] + "_"), f"{name}: its cell is in {stem}, not chapter {name[2:4]}"
    lines = [l for l in SOURCES[stem][i][1].splitlines() if l.strip()]
    assert len(lines) == 2 and ANSWER_LINE.match(lines[0]) and CHECK.fullmatch(lines[1].strip()), (
        f"{name}: the cell is `answer = ...  ### ANSWER` then `check(\"{name}\", answer)`, got {lines}")


@pytest.mark.parametrize("name", QUESTIONS)
def test_the_solution_cell_answers_right(name):
    """The value written on the `### ANSWER` line (a literal or arithmetic of literals) is a right answer:
    the solution notebook passes the question."""
    stem, i = ANSWER_CELLS[name][0]
    expr = ANSWER_LINE.match(SOURCES[stem][i][1].splitlines()[0].strip()).group(1)
    tree = ast.parse(expr, mode="eval")
    allowed = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
    assert all(isinstance(n, allowed) for n in ast.walk(tree)), f"{name}: the answer is a literal, got {expr}"
    value = eval(compile(tree, name, "eval"), {"__builtins__": {}})   # our own source, literals only
    r = check(name, value)
    assert r.passed, f"{stem}'s answer to {name}, {expr}: {r.message}"


@pytest.mark.parametrize("name", QUESTIONS)
def test_the_question_is_asked_in_the_markdown_above_its_cell(name):
    q = REGISTRY[name]
    stem, i = ANSWER_CELLS[name][0]
    kind, text = SOURCES[stem][i - 1]
    assert kind == "markdown" and text.startswith("**Question"), f"{name}: no question above its cell in {stem}"
    letters = LETTER.findall(text)
    if q.kind == "choice":
        assert tuple(letters) == q.choices, f"{name}: the markdown offers {letters}, the registry {q.choices}"
    else:
        assert not letters, f"{name} is a {q.kind} question, but its markdown lists choices {letters}"
    assert re.search(r"\b(cell|figure|table)\b", text), f"{name}: say which cell above shows the answer"


def _chapters_with_questions() -> list[str]:
    return sorted({stem for where in ANSWER_CELLS.values() for stem, _ in where})


@pytest.mark.parametrize("stem", _chapters_with_questions())
def test_questions_sit_between_their_heading_and_the_summary(stem):
    cs = SOURCES[stem]
    heading = [i for i, (k, t) in enumerate(cs) if k == "markdown" and t.startswith("## Questions")]
    summary = [i for i, (k, t) in enumerate(cs) if k == "markdown" and t.startswith("## Summary")]
    mine = sorted(i for where in ANSWER_CELLS.values() for s, i in where if s == stem)
    assert len(heading) == 1 and len(summary) == 1, f"{stem}: one `## Questions` cell and one `## Summary`"
    assert heading[0] < mine[0] and mine[-1] < summary[0], f"{stem}: the questions go between the two"
    assert all(k != "code" or "### BEGIN SOLUTION" not in t for k, t in cs[heading[0]:summary[0]]), (
        f"{stem}: no code exercise between `## Questions` and the summary")


def test_every_chapter_asks_two_or_three_questions_and_each_notebook_one():
    """Chapters 1-15 ask 2 or 3 questions each; chapter 11, three notebooks, one to three in each."""
    per_chapter, per_notebook = defaultdict(int), defaultdict(int)
    for name in QUESTIONS:
        per_chapter[name.split(".")[0]] += 1
        per_notebook[ANSWER_CELLS[name][0][0]] += 1
    assert set(per_chapter) >= {f"ch{n:02d}" for n in range(1, 16)}, sorted(per_chapter)
    odd = {ch: n for ch, n in per_chapter.items() if ch != "ch11" and not 2 <= n <= 3}
    odd.update({stem: n for stem, n in per_notebook.items() if stem.startswith("11_") and not 1 <= n <= 3})
    assert not odd, f"chapters (or chapter 11's notebooks) asking another number of questions: {odd}"
    chapters = sorted(p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
    assert [c for c in chapters if not per_notebook[c]] == [], "a notebook without a question"


@pytest.mark.parametrize("name", QUESTIONS)
def test_the_learner_notebook_holds_the_stub(name):
    """The built learner notebook carries `answer = ...`, which its cell reports as not attempted."""
    stem, _ = ANSWER_CELLS[name][0]
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    mine = [c.source for c in nb.cells if c.cell_type == "code" and CHECK.search(c.source)
            and CHECK.search(c.source).group(1) == name]
    assert len(mine) == 1 and mine[0].splitlines()[0] == "answer = ...  # your answer", mine
    results = []
    exec(mine[0], {"check": lambda n, a: results.append(check(n, a))})   # the notebook's own cell
    assert [r.status for r in results] == ["not attempted"], [r.message for r in results]


CHOICE_QUESTIONS = [n for n in QUESTIONS if REGISTRY[n].kind == "choice"]


def test_the_right_letters_of_the_choice_questions_spread():
    """A learner who writes the same letter everywhere gets few right: no letter is the answer of more than
    40% of the choice questions, each of A-D is the answer of at least 3, and no chapter with two or more
    choice questions puts all their answers on one letter."""
    counts = Counter(REGISTRY[n].answer for n in CHOICE_QUESTIONS)
    assert len(CHOICE_QUESTIONS) >= 10, CHOICE_QUESTIONS
    assert max(counts.values()) <= 0.4 * len(CHOICE_QUESTIONS), f"one letter answers too many: {dict(counts)}"
    assert all(counts[letter] >= 3 for letter in "ABCD"), f"a letter is (almost) never right: {dict(counts)}"
    per_chapter = defaultdict(list)
    for name in CHOICE_QUESTIONS:
        per_chapter[name.split(".")[0]].append(REGISTRY[name].answer)
    same = {ch: a for ch, a in per_chapter.items() if len(a) >= 2 and len(set(a)) == 1}
    assert not same, f"chapters whose choice questions all have the same right letter: {same}"


def _zh_question_cell(name: str) -> str:
    """The markdown cell above `name`'s answer cell in the built Chinese notebook."""
    stem, _ = ANSWER_CELLS[name][0]
    nb = nbformat.read(ROOT / "notebooks" / "zh" / f"{stem}.ipynb", as_version=4)
    found = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and CHECK.search(c.source)
             and CHECK.search(c.source).group(1) == name]
    assert len(found) == 1 and found[0] > 0 and nb.cells[found[0] - 1].cell_type == "markdown", (
        f"{name}: no question cell above its answer cell in notebooks/zh/{stem}.ipynb")
    return nb.cells[found[0] - 1].source


@pytest.mark.parametrize("name", CHOICE_QUESTIONS)
def test_every_letter_the_registry_names_is_a_choice_in_both_editions(name):
    """The answer and every mistake's letter are offered as `- **X.**` in the English source and the built
    Chinese notebook, in the registry's order; a choice's formulas and numbers are the same in both, so the
    two editions list the choices in the same order."""
    q = REGISTRY[name]
    named = {q.answer, *q.mistakes.values()}
    stem, i = ANSWER_CELLS[name][0]
    english, chinese = SOURCES[stem][i - 1][1], _zh_question_cell(name)
    for edition, text in (("English source", english), ("Chinese notebook", chinese)):
        offered = LETTER.findall(text)
        assert tuple(offered) == q.choices, f"{name}: the {edition} offers {offered}, the registry {q.choices}"
        missing = sorted(letter for letter in named if f"- **{letter}.**" not in text)
        assert not missing, f"{name}: the {edition} has no choice {missing}, which the registry names"
    en, zh = dict(ITEM.findall(english)), dict(ITEM.findall(chinese))
    for letter in q.choices:
        terms = [sorted(re.findall(r"\$[^$]+\$|\d+", text[letter])) for text in (en, zh)]
        assert terms[0] == terms[1], f"{name}, choice {letter}: formulas and numbers differ: {terms}"
