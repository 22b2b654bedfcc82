"""Graded exercises: `check("ch01.attention", my_fn)` in a notebook (the learner's half), and `tformer grade`
(classroom/, the teacher's half, which a notebook never loads).

core.py (the checker: cases, judge, hidden cases, partial credit, `check`), questions.py (questions whose
answer is a value: a number, a letter, an expression), result.py (`Result`, a check's verdict), guards.py (what guards a
learner's function while it runs: disabled references, the time limit), equality.py (what "equal"
means: shape, dtype, tolerance, and the message that says what differs), messages.py (the checker's messages
and their Chinese translation), inputs.py (shared seeded inputs), public.py (a teacher's exercises as
`tformer handout` ships them: frozen cases and outputs, no code, no answers), exercises/ (each chapter's exercises,
registered by `load_exercises()`), classroom/ (`tformer grade`: one learner's notebooks; `tformer class`: a whole class,
graded in workers out of the learner's reach; its docstring is its map).
"""
__all__ = ["check", "Case", "Exercise", "Result", "REGISTRY", "register", "compare", "set_mode", "get_mode",
           "load_exercises", "add_hidden_cases", "Question"]


def __getattr__(name: str):
    """The checker's names load core.py (and torch) on first use: `tformer class ...` parses its arguments
    without either."""
    if name in __all__:
        from . import core
        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
