"""`tformer exercise new NAME FILE`: a teacher's own exercise, as a commented module to fill in.

The module uses the API the course's chapters use (`Exercise`, `Case`, `register`; tformer/grading/core.py
says what each field means): a reference, two edge cases, a random case and one named mistake, and a question
of understanding (`Question`) in comments. Grade it with
`tformer grade ... --exercises FILE` or an assignment's `exercises = ["FILE"]`; a learner's notebook checks it
with `load_exercises("FILE")` and `check(NAME, fn)`. `tformer handout` hands out its public file (FILE's stem +
.public.pt, tformer/grading/public.py) in its place: the reference and a question's answer stay with the teacher.
"""
from __future__ import annotations

import re
from pathlib import Path

NAME = re.compile(r"^[a-z][a-z0-9]*\.[a-z_][a-z0-9_]*$")

TEMPLATE = '''"""{name}: {title} (a teacher's own exercise for tformer).

Try it on your own solution:   tformer grade {stem}.ipynb --exercises {file}
Grade a class with it:         an assignment's `exercises = ["{file}"]`, or --exercises {file}
A learner's notebook checks it with
    from tformer.grading import check, load_exercises
    load_exercises("{file}")
    check("{name}", my_function)
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
'''


def new_exercise(name: str, file: Path, title: str = "double every value") -> Path:
    """Write the template for exercise `name` to `file` (a new file); ValueError on a bad name or an existing file."""
    if not NAME.match(name):
        raise ValueError(f"exercise name {name!r}: expected chapter.exercise in lower case, e.g. w03.double")
    file = Path(file)
    if file.exists():
        raise ValueError(f"{file} exists: give a new file for the exercise")
    if file.suffix != ".py":
        raise ValueError(f"{file}: an exercise file is a Python module (.py)")
    stem = name.replace(".", "_")
    chapter, slug = name.split(".")
    from ..public import public_path
    file.write_text(TEMPLATE.format(name=name, title=title, stem=stem, file=file.name, chapter=chapter, slug=slug,
                                    public=public_path(file).name), encoding="utf-8")
    return file
