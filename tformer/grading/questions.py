"""Questions of understanding: an exercise whose answer is a value, not a function.

    answer = ...                       # the stub: "not attempted" in every mode
    check("ch01.q_scale", answer)

A `Question` is registered like an `Exercise` (the same registry, `register(Question(...))`) and judged by
its kind:
    number   a number within rel_tol / abs_tol of the answer (an int, a float, a Fraction, a Decimal, a numpy
             scalar, a tensor of one element, or a string that reads as one: "4096", "1_050_624"; not a bool)
    choice   a letter among `choices`, in either case, as learners type it: "b", " C ", "(C)", "B.", "C)", and
             the full-width forms of a Chinese input method ("Ｄ", "（D）", "D。"); two letters are refused
    expr     a short expression in a string ("n**2 * d", or "n^2*d": ^ reads as **), read with `ast` into a
             whitelist (numbers, the declared symbols, + - * / ** and log, sqrt, exp) and evaluated in float64
             on a few fixed positive values of its symbols; learner text is never passed to eval or exec.
Every string answer is read in Unicode's NFKC form first (full-width letters, digits and signs become ASCII).
A wrong answer equal to one of `mistakes`' values names that misconception; any other wrong answer gets the
hint.

The value crosses a process boundary in `tformer grade`: `plain(value)` turns it into a small tuple of
builtins (a float, a string of at most MAX_TEXT characters, or what the value was), the only thing a worker
sends, and `judge_question` judges that tuple, in the learner's kernel and in the grader alike.
"""
from __future__ import annotations

import ast
import decimal
import fractions
import math
import random
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from .messages import N_, _  # noqa: F401  (N_: the questions' messages)
from .result import Result

KINDS = ("number", "choice", "expr")
FUNCTIONS = {"log": math.log, "sqrt": math.sqrt, "exp": math.exp}
MAX_TEXT = 200                  # characters of a string answer that the judge reads (an expression is short)
MAX_EXPONENT = 1000.0           # |exponent| of ** in an expression (9**9**9 is refused, not computed)
N_POINTS = 5                    # values of the symbols an expression is compared on
EXPR_RTOL = 1e-9


@dataclass
class Question:
    name: str                                   # "ch01.q_scale"
    title: str                                  # one line, shown in the feedback and the gradebook
    kind: str                                   # "number" | "choice" | "expr"
    answer: Any                                 # number: int/float; choice: "B"; expr: "n**2 * d"
    points: int = 1
    notebook: str = ""                          # as Exercise.notebook ("" = the chapter's notebook)
    rel_tol: float = 1e-3                       # number only
    abs_tol: float = 0.0                        # number only
    choices: tuple = ("A", "B", "C", "D")       # choice only: the letters offered
    symbols: tuple = ()                         # expr only: the free symbols the learner may use
    mistakes: dict[str, Any] = field(default_factory=dict)   # message -> the wrong answer that shows it
    hint: str = ""                              # shown on a wrong answer with no named misconception
    partial: dict = field(default_factory=dict)  # always {}: a question is all or nothing

    # What a question and an exercise (core.Exercise) both answer
    takes_cases = False                         # judged on the value its check(...) got, never called
    NOT_RUN = N_("check(...) never ran for this question (its cell deleted, or the notebook stopped before it): "
                 "a question is graded from its check cell only")

    def entry(self) -> dict:
        """grades.json's entry: its id, chapter and points, and that it is a question, with its title."""
        return {"id": self.name, "chapter": self.name.split(".")[0], "points": self.points, "kind": "question",
                "title": self.title}

    def code(self) -> tuple:
        """None: a question is data (in chNN.py, which the grader's hash covers, or a teacher's file)."""
        return ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"question {self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.partial:
            raise ValueError(f"question {self.name}: a question is all or nothing (no partial credit)")
        self.choices = tuple(c.upper() for c in self.choices)
        self.symbols = tuple(self.symbols)
        if self.kind == "choice":
            wanted = [self.answer, *self.mistakes.values()]
            bad = [c for c in wanted if not isinstance(c, str) or c.upper() not in self.choices]
            if bad:
                raise ValueError(f"question {self.name}: {bad} not among the choices {self.choices}")
        elif self.kind == "number":
            for v in [self.answer, *self.mistakes.values()]:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ValueError(f"question {self.name}: {v!r} is not a number")
        else:
            for v in [self.answer, *self.mistakes.values()]:
                problem = expression_problem(str(v), self.symbols)
                if problem:
                    raise ValueError(f"question {self.name}: {v!r}: {problem}")


# --- the value, as it crosses the process boundary ----------------------------------------------------

def plain(value) -> tuple:
    """What the judge reads of a learner's value, as builtins only: ("stub",), ("number", float),
    ("text", str) (cut to MAX_TEXT + 1 characters) or ("other", a short description of what it was).
    Never raises."""
    try:
        return _plain(value)
    except Exception:
        return ("other", "an object")


def _plain(value) -> tuple:
    if value is Ellipsis:
        return ("stub",)
    kind = str(type(value).__name__)[:40]
    if isinstance(value, bool):
        return ("other", kind)
    if isinstance(value, str):
        return ("text", str.__getitem__(value, slice(0, MAX_TEXT + 1)))
    if isinstance(value, (int, float, fractions.Fraction, decimal.Decimal)):
        return ("number", _float(value))
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "item") and hasattr(value, "dtype"):   # a tensor, a numpy value
        dims = tuple(int(d) for d in shape)
        if math.prod(dims) == 1 and not any(w in str(value.dtype) for w in ("bool", "complex")):
            return ("number", _float(value.item()))
        return ("other", f"{kind} of shape {dims}"[:60])
    return ("other", kind)


def valid(p) -> tuple:
    """`p` as `plain` makes it, whatever it is (a worker's frame is the learner's to forge): ("other", "?") for
    anything that is not one of plain's forms."""
    if type(p) is tuple and p == ("stub",):
        return p
    if type(p) is tuple and len(p) == 2 and type(p[0]) is str:
        if p[0] == "number" and type(p[1]) in (int, float):
            return ("number", _float(p[1]))
        if p[0] in ("text", "other") and type(p[1]) is str:
            return (p[0], p[1][: MAX_TEXT + 1 if p[0] == "text" else 60])
    return ("other", "?")


def _float(x) -> float:
    try:
        return float(x)
    except OverflowError:                       # an int beyond float64
        return math.inf if x > 0 else -math.inf


def _number(x: float) -> str:
    """A number with all its digits: 1050624, not 1.05062e+06; 0.925; 1e+30."""
    if math.isfinite(x) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return repr(x)


def _shown(p: tuple) -> str:
    """The learner's answer as the feedback quotes it."""
    if p[0] == "number":
        return _number(p[1])
    if p[0] == "text":
        text = p[1] if len(p[1]) <= 40 else p[1][:40] + "..."
        return repr(text)
    return p[-1] if len(p) > 1 else "..."


# --- expressions ---------------------------------------------------------------------------------------

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.Pow: None}


class _Refused(Exception):
    pass


def _allowed(symbols: tuple) -> str:
    return _("only numbers, {symbols}+ - * / ** ( ) and log, sqrt, exp are allowed").format(
        symbols="".join(f"{s}, " for s in symbols))


def _found(node: ast.AST) -> str:
    """What a refused node is, in the learner's words."""
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else "")
        if isinstance(f, ast.Name) and name in FUNCTIONS:
            return _("{name}(...) other than {name}(x)").format(name=name)
        return _("a call to {name}").format(name=name) if name else _("a call")
    if isinstance(node, ast.Name):
        return _("the name {name}").format(name=node.id)
    if isinstance(node, ast.Attribute):
        return _("an attribute (.{name})").format(name=node.attr)
    if isinstance(node, ast.Subscript):
        return _("a subscript ([...])")
    if isinstance(node, ast.Lambda):
        return _("a lambda")
    if isinstance(node, ast.Constant):
        return _("the value {value}").format(value=repr(node.value)[:20])
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        op = node.op
        return _("the operator {op}").format(op={ast.FloorDiv: "//", ast.Mod: "%", ast.MatMult: "@",
                                                 ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
                                                 ast.LShift: "<<", ast.RShift: ">>", ast.Invert: "~",
                                                 ast.Not: "not"}.get(type(op), type(op).__name__))
    if isinstance(node, ast.BoolOp):
        return _("the operator {op}").format(op="and" if isinstance(node.op, ast.And) else "or")
    if isinstance(node, ast.NamedExpr):
        return _("the operator {op}").format(op=":=")
    if isinstance(node, ast.Compare):
        return _("a comparison")
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return _("a comprehension")
    if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
        return _("a {what}").format(what=type(node).__name__.lower())
    if isinstance(node, ast.IfExp):
        return _("an if-else")
    return _("a {what}").format(what=type(node).__name__)


def _check_node(node: ast.AST, symbols: tuple) -> None:
    if isinstance(node, ast.Expression):
        return _check_node(node.body, symbols)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return
    if isinstance(node, ast.Name) and node.id in symbols:
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        _check_node(node.left, symbols)
        return _check_node(node.right, symbols)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _check_node(node.operand, symbols)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
            and node.func.id not in symbols and len(node.args) == 1 and not node.keywords):
        return _check_node(node.args[0], symbols)
    raise _Refused(_found(node))


def _parse(text: str, symbols: tuple) -> ast.Expression:
    """The expression's tree, every node in the whitelist; _Refused(the learner's message) otherwise."""
    if len(text) > MAX_TEXT:
        raise _Refused(_("an expression of at most {n} characters is expected").format(n=MAX_TEXT))
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise _Refused(_("this is not an expression Python can read")) from None
    try:
        _check_node(tree, symbols)
    except RecursionError:
        raise _Refused(_("this expression is nested too deeply")) from None
    except _Refused as e:
        raise _Refused(_("{allowed}; found {what}").format(allowed=_allowed(symbols), what=e.args[0])) from None
    return tree


def expression_problem(text: str, symbols: tuple) -> str | None:
    """Why `text` is not an expression the judge accepts (None: it is)."""
    try:
        _values(_parse(text, symbols), symbols)
    except _Refused as e:
        return e.args[0]
    return None


def _eval(node: ast.AST, env: dict[str, float]) -> float:
    """The value of a whitelisted tree in float64: nan where it is undefined, +-inf where it overflows; a
    power's exponent is bounded by MAX_EXPONENT (_Refused beyond it); every number is a float, so nothing here
    can run long."""
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant):
        return _float(node.value)
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        x = _eval(node.operand, env)
        return -x if isinstance(node.op, ast.USub) else x
    if isinstance(node, ast.Call):
        x = _eval(node.args[0], env)
        try:
            return FUNCTIONS[node.func.id](x)
        except (ValueError, OverflowError):
            return math.inf if node.func.id == "exp" else math.nan
    a, b = _eval(node.left, env), _eval(node.right, env)
    if math.isnan(a) or math.isnan(b):
        return math.nan
    try:
        if isinstance(node.op, ast.Pow):
            if abs(b) > MAX_EXPONENT:
                raise _Refused(_("an exponent of at most {n} is allowed; found {value}").format(
                    n=f"{MAX_EXPONENT:g}", value=f"{b:g}"))
            r = a ** b
            return math.nan if isinstance(r, complex) else r
        return _BINOPS[type(node.op)](a, b)
    except ZeroDivisionError:
        return math.nan
    except OverflowError:
        return math.inf


def _points(symbols: tuple) -> list[dict[str, float]]:
    """N_POINTS fixed values of the symbols, each in [2, 10): positive, not 1, not round."""
    rng = random.Random(54)
    return [{s: rng.uniform(2.0, 10.0) for s in symbols} for _ in range(N_POINTS)]


def _values(tree: ast.Expression, symbols: tuple) -> list[float]:
    return [_eval(tree, env) for env in _points(symbols)]


def _same_values(got: list[float], expected: list[float]) -> bool:
    """Equal on every point where the expected value is defined (and defined somewhere)."""
    pairs = [(g, e) for g, e in zip(got, expected) if not math.isnan(e)]
    return bool(pairs) and all(not math.isnan(g) and (g == e or math.isclose(g, e, rel_tol=EXPR_RTOL))
                               for g, e in pairs)


# --- the judge ---------------------------------------------------------------------------------------

def _matches(q: Question, p: tuple, target) -> bool:
    """Whether the plain value `p` (already of the kind's type) equals `target` (the answer or a mistake's)."""
    if q.kind == "number":
        return math.isclose(p[1], float(target), rel_tol=q.rel_tol, abs_tol=q.abs_tol)
    if q.kind == "choice":
        return p[1].strip().upper() == str(target).upper()
    return _same_values(p[2], _values(_parse(str(target), q.symbols), q.symbols))


_AROUND = "()[]{}.:;,!?\u3002\uff0e\u3001 \t"      # around one letter: "(C)", "B.", "C)", and 。、 of Chinese input


def _normalized(q: Question, p: tuple) -> tuple:
    """`p` with a string answer read as learners type it (NFKC first): a number kind's numeric string as a number,
    a choice's one letter without the brackets and stops around it, an expression's ^ as **. What is still
    ambiguous (two letters, "1/2" for a number) stays as it was, to be refused with its message."""
    if p[0] != "text":
        return p
    text = unicodedata.normalize("NFKC", p[1]).strip()
    if q.kind == "number":
        try:
            return ("number", _float(float(text)))
        except (ValueError, OverflowError):
            return ("text", text)
    if q.kind == "choice":
        letter = text.strip(_AROUND)
        return ("text", letter if re.fullmatch(r"[A-Za-z]", letter) else text)
    return ("text", text.replace("^", "**"))


def _wrong_type(q: Question, p: tuple) -> str | None:
    """The message for a value of the wrong type or form (None: `p` can be compared), and for expressions
    `p` extended with its values."""
    if q.kind == "number":
        if p[0] == "number":
            return None
        return _("expected a number, got {got}").format(got=_shown(p))
    if q.kind == "choice":
        if p[0] == "text" and p[1].strip().upper() in q.choices:
            return None
        return _("expected one of the letters {letters}, got {got}").format(
            letters=", ".join(q.choices), got=_shown(p))
    if p[0] not in ("text", "number"):
        return _("expected an expression in a string, such as \"2 * n\", got {got}").format(got=_shown(p))
    return None


def judge_question(q: Question, p: tuple):
    """The Result of the plain value `p` (see `plain`) for question `q`."""
    p = _normalized(q, valid(p))
    if p[0] == "stub":
        return Result(q.name, q.points, False, "not attempted",
                      _("not attempted yet: replace `...` in `answer = ...` with your answer."), 1)
    problem = _wrong_type(q, p)
    if problem is None and q.kind == "expr":
        text = p[1] if p[0] == "text" else repr(p[1])
        try:
            p = ("text", text, _values(_parse(text, q.symbols), q.symbols))
        except _Refused as e:
            problem = e.args[0]
    if problem is not None:
        return Result(q.name, q.points, False, "failed", _("not accepted: {problem}.").format(problem=problem), 1)
    if q.answer is None:                        # a teacher's question as the hand-out ships it (public.py)
        return Result(q.name, q.points, True, "well formed", _("well formed ({answer}); graded by your teacher "
                      "(the hand-out does not carry the answer).").format(answer=_shown(p)), 1)
    if _matches(q, p, q.answer):
        return Result(q.name, q.points, True, "passed",
                      _("right ({answer}). {points} point(s).").format(answer=_shown(p), points=q.points), 1)
    msg = _("not right: you answered {answer}.").format(answer=_shown(p))
    named = [m for m, v in q.mistakes.items() if _matches(q, p, v)]
    if named:
        msg += "\n" + _("Your answer is a known mistake: {mistakes}.").format(mistakes=_("; or ").join(_(m) for m in named))
    elif q.hint:
        msg += "\n" + _("Hint: {hint}").format(hint=_(q.hint))
    return Result(q.name, q.points, False, "failed", msg, 1, mistakes=named)
