"""`tformer exercise new NAME FILE`: a teacher's own exercise, as a commented module to fill in, and the
notebook students fill in.

The module uses the API the course's chapters use (`Exercise`, `Case`, `register`; tformer/grading/core.py
says what each field means): a reference, two edge cases, a random case and one named mistake, and in comments
partial credit, a file of hidden cases and a question of understanding (`Question`). Grade it with
`tformer grade ... --exercises FILE` or an assignment's `exercises = ["FILE"]`.

The notebook, NAME's notebook stem + .ipynb beside FILE (w03_double.ipynb for w03.double), is the one a learner
fills in: a setup cell that imports `check` and calls `load_exercises("FILE")`, the stub `my_<exercise>`
(`raise NotImplementedError`: "not attempted" until it is filled in), and the check cell `check(NAME,
my_<exercise>)`. It is written as JSON (nbformat 4.5), so a base install without nbformat writes it too.
`tformer handout` hands out the module's public file (FILE's stem + .public.pt, tformer/grading/public.py) in
the module's place: the reference and a question's answer stay with the teacher.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

NAME = re.compile(r"^[a-z][a-z0-9]*\.[a-z_][a-z0-9_]*$")

TEMPLATE = '''"""{name}: {title} (a teacher's own exercise for tformer).

Its notebook:                  {stem}.ipynb beside this file, for students: a setup cell, the stub, the check
Try it on your own solution:   fill in a copy's stub, then `tformer grade {stem}.ipynb --exercises {file}`
Grade a class with it:         an assignment's `exercises = ["{file}"]`, or --exercises {file}
A learner's notebook checks it with
    from tformer.grading import check, load_exercises
    load_exercises("{file}")
    check("{name}", my_{slug})
Hand it out with `tformer handout --out DIR --assignment FILE`: this module stays with you (its reference, and
a question's answer, are your secrets); DIR gets {public} instead, the cases frozen with the reference's and
each mistake's outputs on them and no code, which the learner's `load_exercises("{file}")` reads.
"""
import torch

from tformer.grading import Case, Exercise, register


def reference(x):
    """The right answer: what the learner's function must return (run by the grader and `tformer handout`
    only; never sent to a grading worker or handed out)."""
    return 2 * x


def edge_cases():
    """Fixed cases, smallest first: the checker reports the smallest one that fails."""
    return [Case("a single zero", (torch.zeros(1),)),
            Case("negative and positive values", (torch.tensor([-1.5, 0.0, 2.0]),))]


def random_case(seed):
    """One case from a seed: a class is graded with fresh seeds, so answers cannot be looked up in advance."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 9, (1,), generator=g))
    return Case(f"random #{{seed}}: n={{n}}", (torch.randn(n, generator=g),), seed=seed)


def added_two(x):
    """A known mistake: named in the feedback when the learner's output equals it on every case."""
    return x + 2


register(Exercise(
    name="{name}",                       # "<chapter>.<exercise>": the gradebook groups columns by the chapter
    title="{title}",
    reference=reference,
    edge_cases=edge_cases,
    random_case=random_case,
    points=1,
    # partial={{"edge": 1, "random": 1, "hidden": 1}},   # points per group of cases (or a case's name): partial credit
    n_random=5,
    hint="multiply every value; adding shifts it instead",
    mistakes={{"added 2 instead of doubling": added_two}},
    notebook="{stem}",                   # the notebook that owes it (its released copy sits in `released`)
))

# A question of understanding (its answer a value, not a function) registers the same way; uncomment:
# from tformer.grading import Question
# register(Question(name="{chapter}.q_{slug}", title="what is 2 * x at x = 3?", kind="number", answer=6,
#                   mistakes={{"added 2 instead of doubling": 5}}, notebook="{stem}"))
# The notebook's cell is `answer = 6` then `check("{chapter}.q_{slug}", answer)`; kinds: number, choice, expr.

# Cases students never see go in a file of their own, {hidden}, named in the assignment
# (`hidden = ["{hidden}"]`) and kept outside the folder you grade from; only the class grader imports it:
#     import torch
#     from tformer.grading import Case, add_hidden_cases
#     add_hidden_cases("{name}", lambda: [Case("large values", (torch.full((3,), 1e4),))])
# A learner's own check runs the public cases only; a failed hidden case is counted, never shown.
'''

SETUP = '''import torch

from tformer.grading import check, load_exercises

load_exercises("{file}")   # your teacher's exercises: {file}, or {public} from the hand-out'''
STUB = '''def my_{slug}(x):
    raise NotImplementedError("Exercise: replace this line with your code")'''
CHECK = 'check("{name}", my_{slug})'
INTRO = """# {name}: {title}

Write `my_{slug}` below, then run the check cell: it runs your function on the exercise's cases and says what
differs. Run every cell from the top."""


def notebook_path(name: str, file: Path) -> Path:
    """The notebook `tformer exercise new NAME FILE` writes: NAME's notebook stem (w03_double), beside FILE."""
    return Path(file).with_name(name.replace(".", "_") + ".ipynb")


def notebook_json(**fields: str) -> str:
    """The learner's notebook (nbformat 4.5, as JSON): the intro, the setup cell, the stub and the check cell."""
    def cell(i: int, kind: str, source: str) -> dict:
        c = {"cell_type": kind, "id": f"tformer-{i:03d}", "metadata": {}, "source": source.splitlines(True)}
        return c if kind == "markdown" else {**c, "execution_count": None, "outputs": []}
    cells = [cell(0, "markdown", INTRO.format(**fields))] + [
        cell(i, "code", text.format(**fields)) for i, text in enumerate((SETUP, STUB, CHECK), 1)]
    nb = {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                      "name": "python3"}, "language_info": {"name": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def new_exercise(name: str, file: Path, title: str = "double every value") -> Path:
    """Write the template for exercise `name` to `file` and its learner's notebook beside it (notebook_path), both
    new files; return `file`. ValueError (and nothing written) on a bad name or a file that exists."""
    if not NAME.match(name):
        raise ValueError(f"exercise name {name!r}: expected chapter.exercise in lower case, e.g. w03.double")
    file = Path(file)
    if file.exists():
        raise ValueError(f"{file} exists: give a new file for the exercise")
    if file.suffix != ".py":
        raise ValueError(f"{file}: an exercise file is a Python module (.py)")
    notebook = notebook_path(name, file)
    if notebook.exists():
        raise ValueError(f"{notebook} exists (the notebook of {name} goes beside {file.name}): move it, or give "
                         f"the exercise file in another folder")
    stem = name.replace(".", "_")
    chapter, slug = name.split(".")
    from ..public import public_path
    fields = dict(name=name, title=title, stem=stem, file=file.name, chapter=chapter, slug=slug,
                  public=public_path(file).name, hidden=f"{file.stem}_hidden.py")
    text = TEMPLATE.format(**fields)
    page = notebook_json(**fields)
    file.write_text(text, encoding="utf-8")
    notebook.write_text(page, encoding="utf-8")
    return file
