"""The teacher's and the learner's commands: one subcommand per thing a teacher does (otter's assign/check/grade
split, nbgrader's app per command), each with only the flags it uses.

    tformer grade notebooks/                          # a learner's own notebooks: every NN_*.ipynb, in order
    tformer grade notebooks/01_attention.ipynb --json report.json
    tformer class grade CLASS --out OUT [--assignment FILE] ...     # a class (run.py)
    tformer class grade CLASS --out OUT_2 --shard 2/8                # one part of a class; then:
    tformer class merge OUT_1 ... OUT_8 --out OUT
    tformer class verify OUT/grades.json CLASS        # the same verdicts again, with the recorded seeds
    tformer class gradescope autograder.zip --assignment week1.toml  # Gradescope's autograder
    tformer handout --out DIR --assignment FILE       # what students get
    tformer exercise new w03.double week3.py          # a teacher's own exercise

A class command turns what was typed into one settings.Run (the assignment with --exercises and --weights
applied, and RunSettings); grades.json records it, and `class verify` and `class merge` read it back. Every
input is checked before a notebook runs: bad input is one line on stderr and exit 2 (tformer/cli.py). Nothing
here imports torch before the arguments are parsed.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .lms import EXPORTS
from .settings import CLASS_TIMEOUT, NOTEBOOK_TIMEOUT, Run, RunSettings

MOVED = {"merge": "tformer class merge OUT_1 ... OUT_N --out OUT",        # `tformer grade`'s old class flags
         "verify": "tformer class verify OUT/grades.json CLASS",
         "gradescope_zip": "tformer class gradescope ZIP --assignment FILE", "out": "tformer class grade CLASS --out OUT"}
OLD_FLAGS = ("--assignment", "--weights", "--overrides", "--only", "--shard", "--lms", "--roster", "--workers",
             "--memory", "--allow-network", "--every-cell", "--submitted", "--extensions")   # a class's, on `tformer grade`


def _user_error(e, prefix: str = ""):
    from ...utils.errors import UserError
    return UserError(f"{prefix}{e}")


def _learner(args: argparse.Namespace) -> int:
    """`tformer grade PATH`: one learner's notebooks; --require-all with points missing is exit 1."""
    from . import submissions
    from .submissions import ClassError
    moved = next((MOVED[k] for k in MOVED if getattr(args, k, None) is not None), None)
    if moved is None and any(getattr(args, f.lstrip("-").replace("-", "_"), None) is not None for f in OLD_FLAGS):
        moved = MOVED["out"]
    if moved:
        raise _user_error(f"a class's commands moved to `tformer class`: use `{moved}` (see `tformer class --help`)")
    if args.path is None:
        raise _user_error("give a notebook or a folder of notebooks (a class: `tformer class grade CLASS --out OUT`)")
    _teacher_files(args.exercises)
    _language(args)
    if not Path(args.json).resolve().parent.is_dir():
        raise _user_error(f"--json {args.json}: the folder {Path(args.json).parent} does not exist; create it or "
                          f"give another report path")
    path = Path(args.path)
    try:
        submissions.learner_notebooks(path)
    except ClassError as e:
        if path.is_dir() and submissions.has_student_folders(path):
            raise _user_error(f"{path} holds student folders: grade a class with `tformer class grade {path} --out "
                              f"OUT`") from None
        raise _user_error(e) from None
    from .runner import grade
    data = grade(path, args.json, args.timeout or 600, small=not args.full, notebook_timeout=args.notebook_timeout)
    t = data["total"]
    if args.require_all and t["earned"] < t["possible"]:
        print(f"tformer grade: not every exercise passed ({t['earned']} of {t['possible']} points)", file=sys.stderr)
        return 1
    return 0


def _language(args) -> None:
    if getattr(args, "lang", None):
        os.environ["TFORMER_LANG"] = args.lang        # the grader's messages, and its workers' (they inherit it)


def _teacher_files(files) -> None:
    """Load --exercises FILE... now, so the names --only, --weights and --overrides give can be checked."""
    if not files:
        return
    from .assignment import use_teacher_files
    from .submissions import ClassError
    try:
        use_teacher_files([str(f) for f in files or []])
    except ClassError as e:
        raise _user_error(e, "--exercises: ") from None


def _memory(args) -> int | None:
    if getattr(args, "memory", None) is None:
        return None
    from .sandbox import parse_size
    try:
        return parse_size(args.memory)
    except ValueError as e:
        raise _user_error(e, "--memory ") from None


def _roster(args) -> None:
    """--roster FILE must be there and readable as the chosen LMS's roster (lms.EXPORTS)."""
    if args.roster is None:
        return
    if not Path(args.roster).is_file():
        raise _user_error(f"--roster {args.roster}: no such file (Canvas: Grades > Export gives one)")
    if args.lms is None:
        raise _user_error(f"--roster {args.roster} is read for an LMS's import: give --lms ({', '.join(EXPORTS)})")
    try:
        EXPORTS[args.lms](args.roster)
    except ValueError as e:
        raise _user_error(e, "--roster ") from None


def _out_folder(out: Path) -> None:
    if Path(out).exists() and not Path(out).is_dir():
        raise _user_error(f"--out {out}: not a folder (a file of that name exists); give the folder the class's "
                          f"grades go into")


def class_run(args: argparse.Namespace) -> Run:
    """What `tformer class grade` was told, as one Run; every file read and every name checked (UserError)."""
    from ..core import REGISTRY, load_exercises
    load_exercises()                                  # the course's exercises: the names below are checked against them
    from . import gradebook
    from .assignment import read_assignment
    from .late import read_times
    from .submissions import ClassError
    if args.assignment is not None and args.weights is not None:
        raise _user_error("--assignment and --weights both set points: put the points in the assignment's [points]")
    try:
        assignment = read_assignment(args.assignment) if args.assignment is not None else None
        weights = gradebook.read_weights(args.weights) if args.weights else None
        overrides = gradebook.read_overrides(args.overrides) if args.overrides else None
        submitted = read_times(args.submitted, "submitted") if args.submitted else None
        extensions = read_times(args.extensions, "due") if args.extensions else None
    except (OSError, ClassError) as e:
        raise _user_error(e) from None
    if (args.submitted or args.extensions) and not (assignment is not None and assignment.due):
        raise _user_error("--submitted and --extensions apply a late rule: give an --assignment with a due date "
                          "(due = 2026-12-01T23:59:00+01:00)")
    if args.only is not None and args.only not in REGISTRY:
        raise _user_error(f"--only {args.only}: no such exercise or question (e.g. ch01.attention)")
    settings = RunSettings(timeout=args.timeout or CLASS_TIMEOUT,
                           notebook_timeout=args.notebook_timeout or NOTEBOOK_TIMEOUT, workers=args.workers,
                           memory=_memory(args), small=not args.full, skip=not args.every_cell,
                           allow_network=args.allow_network, shard=args.shard, only=args.only, lms=args.lms,
                           roster=args.roster)
    return Run.of(assignment, args.exercises or [], weights, settings, overrides=overrides, submitted=submitted,
                  extensions=extensions)


def _class_grade(args: argparse.Namespace) -> int:
    """`tformer class grade CLASS --out OUT ...`"""
    from . import run, submissions
    from .submissions import ClassError
    _out_folder(args.out)
    _roster(args)
    _memory(args)
    _language(args)
    try:
        submissions.read_class(Path(args.path))
    except (OSError, ClassError) as e:
        raise _user_error(e) from None
    _teacher_files(args.exercises)
    plan = class_run(args)
    try:
        run.grade_class(Path(args.path), Path(args.out), plan)
    except ClassError as e:                           # an override naming a student not in the class, ...
        raise _user_error(e) from None
    return 0


def _class_verify(args: argparse.Namespace) -> int:
    """`tformer class verify OUT/grades.json CLASS`: exit 1 when a verdict differs or a notebook changed."""
    from . import run
    from .submissions import ClassError
    if not Path(args.grades).is_file():
        raise _user_error(f"{args.grades}: no such file (give the grades.json a class run wrote)")
    try:
        res = run.verify(Path(args.grades), Path(args.path), timeout=args.timeout, workers=args.workers,
                         memory=_memory(args), notebook_timeout=args.notebook_timeout,
                         allow_network=True if args.allow_network else None)
    except (ClassError, ValueError, KeyError) as e:
        raise _user_error(e, "class verify: ") from None
    return 1 if res["differ"] or res["changed"] or res["gone"] else 0


def _class_merge(args: argparse.Namespace) -> int:
    """`tformer class merge OUT_1 ... OUT_N --out OUT`"""
    from . import gradebook
    from .submissions import ClassError
    _out_folder(args.out)
    _roster(args)
    _language(args)
    try:
        gradebook.merge(args.parts, Path(args.out), lms=args.lms, roster=args.roster)
    except ClassError as e:
        raise _user_error(e) from None
    return 0


def _class_gradescope(args: argparse.Namespace) -> int:
    """`tformer class gradescope ZIP --assignment FILE`: write Gradescope's autograder (gradescope.py), grade
    nothing."""
    from .gradescope import build_zip
    from .submissions import ClassError
    zip_path = Path(args.zip)
    if zip_path.suffix.lower() != ".zip" or zip_path.is_dir():
        raise _user_error(f"{zip_path}: give the .zip file to write (Gradescope uploads a zip)")
    if not zip_path.resolve().parent.is_dir():
        raise _user_error(f"{zip_path}: the folder {zip_path.parent} does not exist")
    _teacher_files(args.exercises)
    try:
        names = build_zip(zip_path, Path(args.assignment), [str(f) for f in args.exercises or []])
    except ClassError as e:
        raise _user_error(e, "class gradescope: ") from None
    parts = [n for n in names if "/" not in n] + sorted({n.split("/")[0] + "/" for n in names if "/" in n})
    print(f"wrote {zip_path} ({len(names)} files: {', '.join(parts)}): upload it in Gradescope (Configure "
          f"Autograder > Zip file upload); each submission is graded there as a class of one")
    return 0


def _shard(text: str) -> tuple[int, int]:
    from .run import parse_shard
    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


FLAGS = {   # the class flags: (option, add_argument's keywords); the same help wherever they appear
    "timeout": ("--timeout", dict(kind="int", default=None, help=(
        f"seconds allowed per cell (default: {CLASS_TIMEOUT}; class verify: the recorded one)"))),
    "notebook_timeout": ("--notebook-timeout", dict(kind="float", default=None, metavar="S", help=(
        f"seconds allowed per notebook, its cells and exercises together (default: {NOTEBOOK_TIMEOUT}; class "
        f"verify: the recorded one); past it the notebook is stopped and graded from what it finished"))),
    "workers": ("--workers", dict(kind="int", default=None, help="notebooks graded at once (default: the number of "
                                                                "cores)")),
    "memory": ("--memory", dict(default=None, metavar="SIZE", help=(
        "address space per worker, e.g. 4G (default: the machine's memory shared among the workers); files a "
        "worker writes are limited to 1G or less"))),
    "allow_network": ("--allow-network", dict(action="store_true", help=(
        "grade an assignment with hidden cases even where workers keep some network (no network namespace: "
        "Landlock's TCP rules leave UDP open), which the run then states; without it such a run stops before any "
        "notebook runs"))),
    "lms": ("--lms", dict(choices=tuple(EXPORTS), default=None, help=(
        "also write OUT/canvas.csv for Canvas's gradebook import, or OUT/moodle.csv for Moodle's CSV grade import "
        "(one column per chapter); an LMS file in OUT this run did not write is removed"))),
    "roster": ("--roster", dict(type=Path, default=None, help=(
        "with --lms canvas: Canvas's gradebook export (Grades > Export); canvas.csv takes each student's ID, SIS ids "
        "and section from it, matched by Canvas id (a Canvas download) or by the student folder's name as SIS Login "
        "ID, SIS User ID, ID or name. With --lms moodle: Moodle's grades export or participants CSV; moodle.csv "
        "identifies each student by the row's email (or ID number), matched by the folder's name as email, ID "
        "number, username or name. Unmatched students are listed"))),
    "exercises": ("--exercises", dict(type=Path, action="append", default=None, metavar="FILE", help=(
        "a teacher's own exercises: a module of register(Exercise(...)) calls (repeat for more; an assignment file "
        "names them as `exercises = [...]`)"))),
    "lang": ("--lang", dict(choices=("en", "zh"), help=(
        "the language of reports and feedback (default: TFORMER_LANG, else en; zh: Chinese labels and messages, the "
        "JSON's keys and statuses stay English)"))),
}


def _flags(p, *names: str) -> None:
    from ...cli import positive_float, positive_int
    for n in names:
        option, kw = FLAGS[n]
        kw = dict(kw)
        kind = kw.pop("kind", None)
        if kind:
            kw["type"] = positive_int if kind == "int" else positive_float
        p.add_argument(option, **kw)


def add_cli(sub) -> None:
    from ...cli import add_debug, positive_float, positive_int
    p = sub.add_parser("grade", help="run a learner's notebooks headless and score their exercises (a class: "
                       "`tformer class grade`)", description="Run one learner's notebooks headless, out of their "
                       "reach, and score the exercises: a table per notebook and a JSON report.")
    p.add_argument("path", type=Path, nargs="?", help="a notebook, or a folder of NN_name.ipynb notebooks")
    p.add_argument("--json", type=Path, default=Path("grade-report.json"),
                   help="where to write the JSON report (default: grade-report.json)")
    p.add_argument("--timeout", type=positive_int, default=None, help="seconds allowed per cell (default: 600)")
    p.add_argument("--notebook-timeout", type=positive_float, default=None, metavar="S",
                   help="seconds allowed per notebook, its cells and exercises together (default: none)")
    p.add_argument("--full", action="store_true", help="run in full mode (default: small mode, TFORMER_SMALL=1)")
    p.add_argument("--require-all", action="store_true", help="exit 1 unless every exercise passed")
    _flags(p, "exercises", "lang")
    for flag in ("--out", "--merge", "--verify", "--gradescope-zip", *OLD_FLAGS):   # moved to `tformer class`: a hint
        p.add_argument(flag, nargs="*", default=None, help=argparse.SUPPRESS)
    add_debug(p)
    p.set_defaults(func=_learner)
    add_class_cli(sub)
    add_handout_cli(sub)
    add_exercise_cli(sub)


def add_class_cli(sub) -> None:
    """`tformer class grade | verify | merge | gradescope`."""
    from ...cli import add_debug
    c = sub.add_parser("class", help="grade a class: grade, verify, merge shards, Gradescope's autograder",
                       description="A teacher's commands for a class (TEACHING.md).")
    actions = c.add_subparsers(dest="action", required=True, metavar="{grade,verify,merge,gradescope}")
    g = actions.add_parser("grade", help="grade every student's notebooks into OUT (resumable)",
                           description="Grade every student's notebooks into OUT: gradebook.csv, grades.json, "
                                       "feedback pages, report.html; an interrupted run continues where it stopped.")
    g.add_argument("path", type=Path, metavar="CLASS", help="a folder with one subfolder of notebooks per student, "
                   "or an LMS's download (Canvas, Moodle)")
    g.add_argument("--out", type=Path, required=True, help="the folder the grades go into")
    g.add_argument("--assignment", type=Path, default=None, metavar="FILE",
                   help="what was assigned, a TOML file (notebooks = [...] in gradebook order, [points], [lms], a due "
                        "date); possible, 'not handed in' and the LMS columns follow it (see TEACHING.md)")
    _flags(g, "exercises")
    g.add_argument("--weights", type=Path, default=None, metavar="FILE",
                   help="points per exercise, one `ch01.attention = 5` per line (default: the course's)")
    g.add_argument("--overrides", type=Path, default=None, metavar="CSV",
                   help="manual grades, columns student, exercise, points, reason; they win over the autograde and "
                        "show in the student's feedback")
    g.add_argument("--submitted", type=Path, default=None, metavar="CSV",
                   help="submission times, columns student,submitted (ISO times), for the assignment's late rule "
                        "(else nbgrader's timestamp.txt in each student's folder, else Canvas's LATE mark)")
    g.add_argument("--extensions", type=Path, default=None, metavar="CSV",
                   help="per-student due dates, columns student,due (ISO times)")
    g.add_argument("--only", default=None, metavar="EXERCISE",
                   help="grade this exercise again (e.g. after fixing its checker) in the notebooks that owe it, "
                        "keeping every other verdict of OUT's journal")
    g.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                   help="grade only shard K of N (students split by a hash of their id), e.g. one task of a SLURM "
                        "array or a Kubernetes indexed Job; combine the parts with `tformer class merge`")
    _flags(g, "lms", "roster", "timeout", "notebook_timeout", "workers", "memory", "allow_network")
    g.add_argument("--every-cell", action="store_true",
                   help="run every cell (default: skip the released cells the exercises do not need)")
    g.add_argument("--full", action="store_true", help="run in full mode (default: small mode, TFORMER_SMALL=1)")
    _flags(g, "lang")
    g.set_defaults(func=_class_grade)

    v = actions.add_parser("verify", help="grade a class again as its grades.json recorded it",
                           description="Grade CLASS again as OUT/grades.json recorded it: its assignment and teacher's "
                                       "files (refused if they changed), seeds, cells and limits unless given. Reports "
                                       "every notebook whose sha256 changed or that is gone and every verdict that "
                                       "differs (exit 1 if any; exit 2 if another grader version wrote it).")
    v.add_argument("grades", type=Path, metavar="GRADES_JSON", help="the grades.json of a class run")
    v.add_argument("path", type=Path, metavar="CLASS", help="the class folder it graded")
    _flags(v, "timeout", "notebook_timeout", "workers", "memory", "allow_network")
    v.set_defaults(func=_class_verify)

    m = actions.add_parser("merge", help="combine the OUT folders of `class grade --shard` runs",
                           description="Combine the OUT folders of `tformer class grade --shard K/N` runs into OUT, "
                                       "as one run over the class. Every shard must have recorded the same assignment, "
                                       "teacher's files, points and limits; they are read from the shards.")
    m.add_argument("parts", type=Path, nargs="+", metavar="OUT_K", help="the shards' OUT folders")
    m.add_argument("--out", type=Path, required=True, help="the folder the combined grades go into")
    _flags(m, "lms", "roster", "lang")
    m.set_defaults(func=_class_merge)

    z = actions.add_parser("gradescope", help="write Gradescope's autograder zip (grades nothing)",
                           description="Write Gradescope's autograder: a wheel of this checkout, the released notebooks, "
                                       "the assignment and your files, setup.sh, run_autograder. Each submission is "
                                       "then graded there as a class of one.")
    z.add_argument("zip", type=Path, metavar="ZIP", help="the .zip file to write")
    z.add_argument("--assignment", type=Path, required=True, metavar="FILE",
                   help="the notebooks and points the autograder grades (TOML)")
    _flags(z, "exercises")
    z.set_defaults(func=_class_gradescope)
    for q in (c, g, v, m, z):
        add_debug(q)


def add_handout_cli(sub) -> None:
    from ...cli import add_debug
    h = sub.add_parser("handout", help="write what students get: the learner notebooks of the assigned chapters, "
                       "without notebooks/src/ (which holds the solutions)",
                       description="Copy the released learner notebooks (each exercise a stub) of the assignment's "
                                   "chapters, in one edition, into a new folder to hand out.")
    h.add_argument("--out", type=Path, required=True, help="a new or empty folder for the hand-out")
    h.add_argument("--assignment", type=Path, default=None, metavar="FILE",
                   help="the assignment's TOML file: its notebooks only (default: every chapter)")
    h.add_argument("--lang", choices=("en", "zh"), default="en", help="the edition (default: en; zh: Chinese)")
    add_debug(h)
    h.set_defaults(func=_handout)


def _handout(args: argparse.Namespace) -> int:
    from ...utils.errors import UserError
    from .assignment import read_assignment
    from .handout import handout
    from .submissions import ClassError
    try:
        assignment = read_assignment(args.assignment) if args.assignment is not None else None
        stems = assignment.notebooks if assignment is not None else None
        written = handout(args.out, stems, args.lang, assignment.exercise_files if assignment is not None else [])
    except ClassError as e:
        raise UserError(str(e)) from None
    print(f"wrote {len(written)} file(s) to {args.out}: {', '.join(p.name for p in written)}")
    return 0


def add_exercise_cli(sub) -> None:
    """`tformer exercise new NAME FILE`: a teacher's own exercise, from a commented template."""
    from ...cli import add_debug
    e = sub.add_parser("exercise", help="write a teacher's own exercise from a template",
                       description="tformer exercise new NAME FILE: a commented module with a reference, two edge "
                                   "cases, a random case and one named mistake, and beside it the notebook students "
                                   "fill in (see TEACHING.md)")
    actions = e.add_subparsers(dest="action", required=True)
    n = actions.add_parser("new", help="write the template for exercise NAME (e.g. w03.double) to FILE, and its "
                                                  "notebook (w03_double.ipynb) beside FILE")
    n.add_argument("name", help="chapter.exercise, e.g. w03.double (its notebook is w03_double)")
    n.add_argument("file", type=Path, help="a new .py file")
    add_debug(n)
    n.set_defaults(func=_exercise_new)


def _exercise_new(args: argparse.Namespace) -> int:
    from ...utils.errors import UserError
    from .template import new_exercise, notebook_path
    try:
        path = new_exercise(args.name, args.file)
    except ValueError as e:
        raise UserError(str(e)) from None
    nb = notebook_path(args.name, path)
    print(f"wrote {path} and {nb}: fill in reference, edge_cases, random_case and the mistakes, then try it on "
          f"your own solution in {nb.name} with `tformer grade {nb} --exercises {path}`")
    return 0

