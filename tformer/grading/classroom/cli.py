"""`tformer grade PATH`: run notebooks headless and score their exercises, out of the learner's reach.

    tformer grade notebooks/                  # every NN_*.ipynb in the folder, in order
    tformer grade notebooks/01_attention.ipynb --json report.json
    tformer grade CLASS --out OUT             # a class: tformer/grading/classroom/run.py
    tformer grade CLASS --out OUT_2 --shard 2/8     # one part of a class; then:
    tformer grade --merge OUT_1 ... OUT_8 --out OUT
    tformer grade --verify OUT/grades.json CLASS    # the same verdicts again, with the recorded seeds
    tformer grade --gradescope-zip autograder.zip --assignment week1.toml   # Gradescope's autograder

How one notebook is graded is tformer/grading/classroom/runner.py. Prints one table per notebook (exercise, points,
passed) with a total, and writes the same as JSON.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .runner import grade


def _main(args: argparse.Namespace) -> int:
    """Errors follow tformer/cli.py: bad input is one line on stderr and exit 2, checked before any
    notebook runs; --require-all with points missing is exit 1."""
    from ...utils.errors import UserError
    from ..core import REGISTRY
    from . import gradebook, run, submissions
    from .submissions import ClassError
    try:                              # the names --only, --weights, --overrides and --assignment give are checked
        from .assignment import use_teacher_files
        use_teacher_files([str(f) for f in args.exercises or []])
    except ClassError as e:
        raise UserError(f"--exercises: {e}") from None
    if args.lang:
        os.environ["TFORMER_LANG"] = args.lang        # the grader's messages, and its workers' (they inherit it)
    if args.gradescope_zip is not None:               # Gradescope's autograder, instead of any grading
        return _gradescope_zip(args, UserError)
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UserError(f"--out {args.out}: not a folder (a file of that name exists); give the folder the class's "
                        f"grades go into")
    memory = None
    if args.memory is not None:
        from .sandbox import parse_size
        try:
            memory = parse_size(args.memory)
        except ValueError as e:
            raise UserError(f"--memory {e}") from None
    if args.verify is not None:
        if args.path is None or not Path(args.verify).is_file():
            raise UserError("--verify OUT/grades.json CLASS: give the grades.json of a class run and the class folder")
        try:
            res = run.verify(Path(args.verify), Path(args.path), timeout=args.timeout, workers=args.workers,
                             memory=memory, notebook_timeout=args.notebook_timeout,
                             allow_network=True if args.allow_network else None)
        except (ClassError, ValueError, KeyError) as e:
            raise UserError(f"--verify: {e}") from None
        return 1 if res["differ"] or res["changed"] or res["gone"] else 0
    if args.roster is not None and not Path(args.roster).is_file():
        raise UserError(f"--roster {args.roster}: no such file (Canvas: Grades > Export gives one)")
    if args.roster is not None and args.lms == "moodle":
        from .lms import read_moodle_roster
        try:
            read_moodle_roster(args.roster)
        except ValueError as e:
            raise UserError(f"--roster {e}") from None
    if args.merge:
        if args.out is None or args.path is not None:
            raise UserError("--merge OUT1 OUT2 ... combines shards into --out OUT: give --out and no CLASS")
        try:
            gradebook.merge(args.merge, Path(args.out), lms=args.lms, roster=args.roster)
        except ClassError as e:
            raise UserError(str(e)) from None
        return 0
    if args.path is None:
        raise UserError("give a notebook, a folder of notebooks or a class (see `tformer grade --help`)")
    if args.shard is not None and args.out is None:
        raise UserError("--shard K/N grades part of a class: give --out OUT too")
    if args.out is not None:
        return _grade_class(args, memory, UserError, REGISTRY)
    if args.json is not None and not Path(args.json).resolve().parent.is_dir():
        raise UserError(f"--json {args.json}: the folder {Path(args.json).parent} does not exist; create it or "
                        f"give another report path")
    path = Path(args.path)
    try:
        submissions.learner_notebooks(path)
    except ClassError as e:
        if path.is_dir() and submissions.has_student_folders(path):
            raise UserError(f"{path} holds student folders: grade a class with `tformer grade {path} --out OUT`") from None
        raise UserError(str(e)) from None
    import inspect
    more = ({"notebook_timeout": args.notebook_timeout}             # one learner: no budget unless given
            if args.notebook_timeout and "notebook_timeout" in inspect.signature(grade).parameters else {})
    data = grade(path, args.json, args.timeout or 600, small=not args.full, **more)
    t = data["total"]
    if args.require_all and t["earned"] < t["possible"]:
        print(f"tformer grade: not every exercise passed ({t['earned']} of {t['possible']} points)", file=sys.stderr)
        return 1
    return 0


def _gradescope_zip(args: argparse.Namespace, UserError) -> int:
    """`tformer grade --gradescope-zip ZIP --assignment FILE`: write Gradescope's autograder (gradescope.py)
    and grade nothing."""
    from .gradescope import build_zip
    from .submissions import ClassError
    if args.assignment is None:
        raise UserError("--gradescope-zip ZIP needs --assignment FILE: the notebooks and points the autograder grades")
    if args.path is not None or args.out is not None or args.merge or args.verify is not None:
        raise UserError("--gradescope-zip writes Gradescope's autograder and grades nothing: leave out CLASS, --out, "
                        "--merge and --verify")
    zip_path = Path(args.gradescope_zip)
    if zip_path.suffix.lower() != ".zip" or zip_path.is_dir():
        raise UserError(f"--gradescope-zip {zip_path}: give the .zip file to write (Gradescope uploads a zip)")
    if not zip_path.resolve().parent.is_dir():
        raise UserError(f"--gradescope-zip {zip_path}: the folder {zip_path.parent} does not exist")
    try:
        names = build_zip(zip_path, Path(args.assignment), [str(f) for f in args.exercises or []])
    except ClassError as e:
        raise UserError(f"--gradescope-zip: {e}") from None
    parts = [n for n in names if "/" not in n] + sorted({n.split("/")[0] + "/" for n in names if "/" in n})
    print(f"wrote {zip_path} ({len(names)} files: {', '.join(parts)}): upload it in Gradescope (Configure "
          f"Autograder > Zip file upload); each submission is graded there as a class of one")
    return 0


def _grade_class(args: argparse.Namespace, memory: int | None, UserError, REGISTRY) -> int:
    """`tformer grade CLASS --out OUT ...`: every input checked before a notebook runs."""
    from . import gradebook, run, submissions
    from .assignment import read_assignment
    from .submissions import ClassError
    if args.require_all:
        raise UserError("--require-all grades one learner; a class's scores are in OUT/gradebook.csv")
    if args.assignment is not None and args.weights is not None:
        raise UserError("--assignment and --weights both set points: put the points in the assignment's [points]")
    from .late import read_times
    try:
        submissions.read_class(Path(args.path))
        assignment = read_assignment(args.assignment) if args.assignment is not None else None
        weights = gradebook.read_weights(args.weights) if args.weights else None
        overrides = gradebook.read_overrides(args.overrides) if args.overrides else None
        times = {flag: read_times(getattr(args, flag), column) if getattr(args, flag) else None
                 for flag, column in (("submitted", "submitted"), ("extensions", "due"))}
    except (OSError, ClassError) as e:
        raise UserError(str(e)) from None
    if (args.submitted or args.extensions) and not (assignment is not None and assignment.due):
        raise UserError("--submitted and --extensions apply a late rule: give an --assignment with a due date "
                        "(due = 2026-12-01T23:59:00+01:00)")
    if args.only is not None and args.only not in REGISTRY:
        raise UserError(f"--only {args.only}: no such exercise or question (e.g. ch01.attention)")
    try:
        run.grade_class(Path(args.path), Path(args.out), timeout=args.timeout or run.CLASS_TIMEOUT,
                        weights=weights, overrides=overrides, only=args.only, assignment=assignment,
                        exercise_files=[str(f) for f in args.exercises or []],
                        submitted=times["submitted"], extensions=times["extensions"],
                        workers=args.workers, memory=memory, small=not args.full, skip=not args.every_cell,
                        lms=args.lms, roster=args.roster, shard=args.shard,
                        notebook_timeout=args.notebook_timeout or run.NOTEBOOK_TIMEOUT,
                        allow_network=args.allow_network)
    except ClassError as e:                           # an override naming a student not in the class, ...
        raise UserError(str(e)) from None
    return 0


def add_cli(sub) -> None:
    from ...cli import add_debug, positive_float, positive_int
    from .run import CLASS_TIMEOUT, NOTEBOOK_TIMEOUT, parse_shard

    def shard(text: str) -> tuple[int, int]:
        try:
            return parse_shard(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    p = sub.add_parser("grade", help="run notebooks headless and score their exercises (one learner or a class)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, nargs="?", help="a notebook, a folder of NN_name.ipynb notebooks, or with --out "
                   "a class: a folder with one subfolder of notebooks per student")
    p.add_argument("--json", type=Path, default=Path("grade-report.json"),
                   help="one learner: where to write the JSON report (default: grade-report.json)")
    p.add_argument("--out", type=Path, default=None,
                   help="grade a class into this folder: gradebook.csv, grades.json and journal.jsonl (an "
                        "interrupted run continues where it stopped)")
    p.add_argument("--timeout", type=positive_int, default=None,
                   help=f"seconds allowed per cell (default: 600 for one learner, {CLASS_TIMEOUT} for a class)")
    p.add_argument("--notebook-timeout", type=positive_float, default=None, metavar="S",
                   help=f"a class: seconds allowed per notebook, its cells and exercises together (default: "
                        f"{NOTEBOOK_TIMEOUT}); past it the notebook is stopped and graded from what it finished")
    p.add_argument("--allow-network", action="store_true",
                   help="a class: grade an assignment with hidden cases even where workers keep some network (no "
                        "network namespace: Landlock's TCP rules leave UDP open), which the run then states; "
                        "without it such a run stops before any notebook runs")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="a class: notebooks graded at once (default: the number of cores)")
    p.add_argument("--memory", default=None, metavar="SIZE",
                   help="a class: address space per worker, e.g. 4G (default: the machine's memory shared among "
                        "the workers); files a worker writes are limited to 1G or less")
    p.add_argument("--lms", choices=("canvas", "moodle"), default=None,
                   help="a class: also write OUT/canvas.csv for Canvas's gradebook import, or OUT/moodle.csv for "
                        "Moodle's CSV grade import (one column per chapter)")
    p.add_argument("--roster", type=Path, default=None,
                   help="a class: Canvas's gradebook export (Grades > Export); canvas.csv takes each student's ID, SIS "
                        "ids and section from it, matched by Canvas id (a Canvas download) or by the student folder's "
                        "name as SIS Login ID, SIS User ID, ID or name. With --lms moodle: Moodle's grades export or "
                        "participants CSV; moodle.csv identifies each student by the row's email (or ID number), "
                        "matched by the folder's name as email, ID number, username or name. Unmatched students "
                        "are listed")
    p.add_argument("--shard", type=shard, default=None, metavar="K/N",
                   help="a class: grade only shard K of N (students split by a hash of their id), e.g. one task "
                        "of a SLURM array or a Kubernetes indexed Job; combine the parts with --merge")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="OUT_K",
                   help="combine the OUT folders of --shard runs into --out OUT, as one run over the class")
    p.add_argument("--assignment", type=Path, default=None, metavar="FILE",
                   help="a class: what was assigned, a TOML file (notebooks = [...] in gradebook order, [points], "
                        "[lms]); possible, 'not handed in' and the Canvas columns follow it (see TEACHING.md)")
    p.add_argument("--exercises", type=Path, action="append", default=None, metavar="FILE",
                   help="a teacher's own exercises: a module of register(Exercise(...)) calls (repeat for more; "
                        "an assignment file names them as `exercises = [...]`)")
    p.add_argument("--submitted", type=Path, default=None, metavar="CSV",
                   help="a class: submission times, columns student,submitted (ISO times), for the assignment's late "
                        "rule (else nbgrader's timestamp.txt in each student's folder, else Canvas's LATE mark)")
    p.add_argument("--extensions", type=Path, default=None, metavar="CSV",
                   help="a class: per-student due dates, columns student,due (ISO times)")
    p.add_argument("--weights", type=Path, default=None, metavar="FILE",
                   help="a class: points per exercise, one `ch01.attention = 5` per line (default: the course's)")
    p.add_argument("--overrides", type=Path, default=None, metavar="CSV",
                   help="a class: manual grades, columns student, exercise, points, reason; they win over the "
                        "autograde and show in the student's feedback")
    p.add_argument("--only", default=None, metavar="EXERCISE",
                   help="a class: grade this exercise again (e.g. ch01.attention after fixing its checker), keeping "
                        "every other verdict of OUT's journal")
    p.add_argument("--verify", type=Path, default=None, metavar="GRADES_JSON",
                   help="grade CLASS again as OUT/grades.json recorded it (its seeds, cells, timeout and memory "
                        "unless given); report every notebook whose sha256 changed or that is gone and every verdict "
                        "that differs (exit 1 if any; exit 2 if another grader version wrote it)")
    p.add_argument("--gradescope-zip", type=Path, default=None, metavar="ZIP",
                   help="with --assignment FILE: write Gradescope's autograder zip (a wheel of this checkout, the "
                        "released notebooks, the assignment and your files, setup.sh, run_autograder) and grade "
                        "nothing; each submission is then graded as a class of one")
    p.add_argument("--every-cell", action="store_true",
                   help="a class: run every cell (default: skip the released cells the exercises do not need)")
    p.add_argument("--full", action="store_true", help="run in full mode (default: small mode, TFORMER_SMALL=1)")
    p.add_argument("--require-all", action="store_true", help="exit 1 unless every exercise passed")
    p.add_argument("--lang", choices=("en", "zh"), help="the report's language (default: TFORMER_LANG, else en; "
                   "zh: Chinese labels and messages, the JSON's keys and statuses stay English)")
    add_debug(p)
    p.set_defaults(func=_main)

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
    add_exercise_cli(sub)


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
                                   "cases, a random case and one named mistake (see TEACHING.md)")
    actions = e.add_subparsers(dest="action", required=True)
    n = actions.add_parser("new", help="write the template for exercise NAME (e.g. w03.double) to FILE")
    n.add_argument("name", help="chapter.exercise, e.g. w03.double (its notebook is w03_double)")
    n.add_argument("file", type=Path, help="a new .py file")
    add_debug(n)
    n.set_defaults(func=_exercise_new)


def _exercise_new(args: argparse.Namespace) -> int:
    from ...utils.errors import UserError
    from .template import new_exercise
    try:
        path = new_exercise(args.name, args.file)
    except ValueError as e:
        raise UserError(str(e)) from None
    print(f"wrote {path}: fill in reference, edge_cases, random_case and the mistakes, then try it with "
          f"`tformer grade {args.name.replace('.', '_')}.ipynb --exercises {path}`")
    return 0

