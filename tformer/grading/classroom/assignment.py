"""The assignment a teacher declares: `tformer class grade CLASS --out OUT --assignment FILE`, a TOML file.

    notebooks = ["01_attention", "02_self_attention", "w03_double"]   # in gradebook order; w03_double: yours
    exercises = ["week3.py"]        # your own exercises: modules of register(Exercise(...)) calls (or Question);
                                    # never handed out (`tformer handout` writes week3.public.pt in their place)
    released = "handout/"           # your notebooks as students got them (w03_double.ipynb)

    [points]                        # points per exercise (whole numbers), as --weights gives them
    "ch01.attention" = 5

    [lms]
    canvas_column = "tformer {chapter}"      # the Canvas column names ({chapter}: ch01, ch02, ...)

    due = 2026-12-01T23:59:00+01:00          # a due date, and its late rule (late.py)
    [late]
    per_day = 0.1

With it, `possible`, "not handed in", the pass rates and the Canvas columns follow the assignment; a notebook
outside it is listed as extra and earns nothing. Paths in the file are relative to it. An unknown key is an
error naming it. grades.json records the file and its sha256, and `exercises_hash`: the sha256 of the
teacher's own files (exercise modules and released notebooks), kept apart from the grader's hash.
"""
from __future__ import annotations

import datetime
import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core import REGISTRY, load_exercises, load_hidden
from .late import read_rule
from .notebooks import known_stems
from .submissions import ClassError

if sys.version_info >= (3, 11):
    import tomllib
else:                                                     # pragma: no cover (Python 3.10)
    import tomli as tomllib

KEYS = {"notebooks", "points", "lms", "exercises", "released", "hidden", "show_hidden_mistakes", "round", "due", "late"}
LMS_KEYS = {"canvas_column", "moodle_column"}


@dataclass
class Assignment:
    notebooks: list[str]                                  # stems, in the gradebook's column order
    points: dict[str, int] = field(default_factory=dict)  # exercise -> points (the course's where absent)
    canvas_column: str = "tformer {chapter}"
    moodle_column: str = "tformer {chapter}"
    path: str = ""
    sha256: str = ""
    exercise_files: list[str] = field(default_factory=list)    # a teacher's exercise modules (absolute paths)
    released: str = ""                                        # a teacher's released notebooks' folder
    hidden: list[str] = field(default_factory=list)            # files of hidden cases (the grader's process only)
    show_hidden_mistakes: bool = False                         # name a mistake seen only on hidden cases
    round: int = 2                                             # digits of partial credit in the gradebook
    due: str = ""                                              # the due date (ISO, with its offset); "" = none
    late: dict = field(default_factory=dict)                   # the late rule (late.py), with `due`

    def record(self) -> dict:
        """What grades.json keeps of it."""
        return {"file": self.path, "sha256": self.sha256, "notebooks": self.notebooks, "points": self.points,
                "canvas_column": self.canvas_column, "moodle_column": self.moodle_column, "exercises": self.exercise_files, "released": self.released,
                "hidden": self.hidden, "show_hidden_mistakes": self.show_hidden_mistakes, "round": self.round,
                "due": self.due, "late": self.late}


def teacher_files(exercise_files: list[str], released: str = "", hidden: list[str] = ()) -> list[Path]:
    """A teacher's own files: the exercise modules, the hidden cases and the released notebooks."""
    files = [Path(f) for f in [*exercise_files, *hidden]]
    if released:
        files += sorted(Path(released).glob("*.ipynb"))
    return files


def exercises_hash(exercise_files: list[str], released: str = "", hidden: list[str] = ()) -> str:
    """sha256 of a teacher's own files ("" when there are none): what a grade depends on beside the grader."""
    files = teacher_files(exercise_files, released, hidden)
    if not files:
        return ""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def use_teacher_files(exercise_files: list[str], released: str = "", hidden: list[str] = ()) -> None:
    """Load a teacher's exercise modules, count their released notebooks, and import the hidden cases into this
    process only (ClassError on a bad file). A hand-out's public file (week3.public.pt) is refused: the grader
    judges with the teacher's reference and answers, which it alone holds."""
    from .notebooks import add_released
    load_exercises()                                  # the course's, always
    if released:
        if not Path(released).is_dir():
            raise ClassError(f"released = {released!r}: no such folder (your notebooks as students got them)")
        add_released(Path(released))
    for f in exercise_files:
        if Path(f).suffix == ".pt":
            raise ClassError(f"{f} is a hand-out's public file (its cases and outputs, no reference): it lets a "
                             f"notebook check itself, it cannot grade; give the teacher's module (e.g. week3.py)")
        if not Path(f).is_file():                     # not the public file beside it (load_exercises' fallback)
            raise ClassError(f"no exercise file {f} (a module of register(Exercise(...)) calls)")
        try:
            load_exercises(f)
        except FileNotFoundError as e:
            raise ClassError(str(e)) from None
        except Exception as e:                        # the teacher's module raised: say where, in one line
            raise ClassError(f"{f}: {type(e).__name__}: {e}".splitlines()[0]) from None
    for f in hidden:
        try:
            load_hidden(f)
        except FileNotFoundError as e:
            raise ClassError(str(e)) from None
        except Exception as e:
            raise ClassError(f"{f}: {type(e).__name__}: {e}".splitlines()[0]) from None
    from ..core import HIDDEN
    for name in HIDDEN:
        if name in REGISTRY and not REGISTRY[name].takes_cases:
            raise ClassError(f"hidden cases for {name}: it is a question, answered by one value; hidden cases "
                             f"and partial credit apply to exercises only")
    for name, ex in REGISTRY.items():
        if not ex.takes_cases and ex.partial:
            raise ClassError(f"{name}: a question is all or nothing; partial credit applies to exercises only")


def read_due(value: object, path: Path) -> str:
    """`due` as an ISO time with its offset: TOML's date and time (`due = 2026-12-01T23:59:00+01:00`) or the same
    in a string (`due = "2026-12-01T23:59:00+01:00"`, Z for UTC); ClassError in one line otherwise (no offset, a
    date alone, not a time)."""
    when = value
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):             # UTC, as TOML writes it (Python 3.10's fromisoformat lacks it)
            text = text[:-1] + "+00:00"
        try:
            when = datetime.datetime.fromisoformat(text)
        except ValueError:
            when = None
    if not isinstance(when, datetime.datetime) or when.tzinfo is None:
        got = value.isoformat() if isinstance(value, (datetime.date, datetime.time)) else repr(value)
        raise ClassError(f"{path}: due must be a date and time with its offset, e.g. 2026-12-01T23:59:00+01:00, "
                         f"got {got}")
    return when.isoformat()


def read_assignment(path: Path) -> Assignment:
    """The assignment in `path`; ClassError (one line, naming the key or value) on anything unexpected."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ClassError(f"--assignment {path}: {e.strerror or e}") from None
    try:
        toml = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ClassError(f"{path}: not a TOML file ({e})") from None
    unknown = sorted(set(toml) - KEYS)
    if unknown:
        raise ClassError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    stems = toml.get("notebooks")
    if not isinstance(stems, list) or not stems or not all(isinstance(s, str) for s in stems):
        raise ClassError(f'{path}: `notebooks` must be a list of notebook names, e.g. ["01_attention"]')
    base = path.resolve().parent
    files = toml.get("exercises", [])
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ClassError(f'{path}: `exercises` must be a list of files, e.g. ["week3.py"]')
    files = [str((base / f).resolve()) for f in files]
    released = toml.get("released", "")
    if not isinstance(released, str):
        raise ClassError(f'{path}: `released` must be a folder, e.g. "handout/"')
    released = str((base / released).resolve()) if released else ""
    hidden = toml.get("hidden", [])
    if not isinstance(hidden, list) or not all(isinstance(f, str) for f in hidden):
        raise ClassError(f'{path}: `hidden` must be a list of files, e.g. ["week3_hidden.py"]')
    hidden = [str((base / f).resolve()) for f in hidden]
    show = toml.get("show_hidden_mistakes", False)
    digits = toml.get("round", 2)
    if not isinstance(show, bool):
        raise ClassError(f"{path}: show_hidden_mistakes must be true or false, got {show!r}")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 0 <= digits <= 6:
        raise ClassError(f"{path}: round must be a whole number of digits from 0 to 6, got {digits!r}")
    due, rule = toml.get("due"), toml.get("late")
    if due is not None:
        due = read_due(due, path)
    if rule is not None and due is None:
        raise ClassError(f"{path}: [late] needs `due`, the due date")
    rule = read_rule(rule if rule is not None else {}, str(path)) if due else {}
    use_teacher_files(files, released, hidden)
    known = set(known_stems())
    for s in stems:
        if s not in known:
            raise ClassError(f"{path}: notebooks: no notebook {s!r} in the course or in `released` (e.g. 01_attention)")
    if len(set(stems)) != len(stems):
        raise ClassError(f"{path}: notebooks: {next(s for s in stems if stems.count(s) > 1)!r} is listed twice")
    load_exercises()
    points = toml.get("points", {})
    if not isinstance(points, dict):
        raise ClassError(f"{path}: [points] must be a table of `\"ch01.attention\" = 5` lines")
    for name, value in points.items():
        if name not in REGISTRY:
            raise ClassError(f"{path}: [points]: no exercise or question named {name!r} (e.g. ch01.attention)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ClassError(f"{path}: [points]: {name} must be a whole number of points >= 0, got {value!r}")
    lms = toml.get("lms", {})
    if not isinstance(lms, dict):
        raise ClassError(f"{path}: [lms] must be a table")
    unknown = sorted(set(lms) - LMS_KEYS)
    if unknown:
        raise ClassError(f"{path}: [lms]: unknown key {unknown[0]!r} (known: {', '.join(sorted(LMS_KEYS))})")
    columns = {key: lms.get(key, "tformer {chapter}") for key in ("canvas_column", "moodle_column")}
    for key, column in columns.items():
        if not isinstance(column, str) or "{chapter}" not in column:
            raise ClassError(f"{path}: [lms] {key} must be a name with {{chapter}} in it, got {column!r}")
    column = columns["canvas_column"]
    return Assignment(list(stems), dict(points), column, columns["moodle_column"], str(path.resolve()),
                      hashlib.sha256(data).hexdigest(),
                      files, released, hidden, show, digits, due or "", rule)
