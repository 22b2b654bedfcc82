"""Gradescope's autograder: `tformer class gradescope ZIP --assignment FILE` writes the zip a teacher
uploads (Configure Autograder > Zip file upload), and Gradescope runs its `run_autograder` once per submission.

    build_zip(zip, assignment)   the zip: setup.sh, run_autograder, a wheel of this checkout, assignment.toml
                                 (its paths rewritten to point inside the zip), released/ (the notebooks students
                                 got: the course's and the teacher's), exercises/ and hidden/ (the teacher's files)
    run(root)                    one submission: ROOT/submission graded as a class of one (what `tformer grade
                                 CLASS --out OUT --assignment FILE` runs), ROOT/results/results.json written, also
                                 when grading fails (the error in `output`; run_autograder writes one if Python
                                 itself dies)
    python3 -m tformer.grading.classroom.gradescope run     what run_autograder calls; ROOT is
                                 $TFORMER_AUTOGRADER_ROOT, else /autograder

Gradescope's layout and results format (gradescope/autograder_samples, docs/specs.md): the zip's files in
ROOT/source, the submission in ROOT/submission, the results in ROOT/results/results.json with `score` (it
overrides the tests' sum), `output`, and `tests`, each with `name`, `score`, `max_score`, `output` and
`visibility`, the fields gradescope-utils' JSONTestRunner writes. A test per exercise, its `max_score` and the
points its output states the assignment's; an exercise with hidden cases is "after_published" (shown once the
teacher publishes the grades), the others "visible". What the grader
prints goes to ROOT/results/stdout, which only the teacher sees.

Gradescope runs the autograder as root, in a container that may lack Landlock and user namespaces. So the
teacher's secrets are kept by permissions too: setup.sh makes an unprivileged user (WORKER_USER), the zip's
PRIVATE entries are root's only (mode 600), run_autograder makes source/ and results/ root's only (700) and
exports TFORMER_GRADE_WORKER_USER, and the keeper (sandbox.py) runs every worker under that user: a
submission's code can read neither the teacher's exercises, the hidden cases nor the assignment, nor write a
score. The submission's copy is made readable to that user. Each guarantee the workers ran without (no
Landlock, no namespaces, a shared /proc, ...) is named in results.json's `output`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from .submissions import ClassError

ROOT_ENV = "TFORMER_AUTOGRADER_ROOT"          # Gradescope's root; a test lays out a temporary one
TIMEOUT_ENV = "TFORMER_AUTOGRADER_TIMEOUT"    # seconds for one submission's grading (default: 540)
TIMEOUT = 540                                 # Gradescope stops a submission at 10 minutes by default: results first
STUDENT = "submission"                        # the class of one's student

WORKER_USER = "tformer-worker"               # the unprivileged user the grading workers run as (setup.sh makes it)
USER_ENV = "TFORMER_GRADE_WORKER_USER"        # the keeper (sandbox.py) runs workers under this user when root
PRIVATE = ("exercises/", "hidden/", "assignment.toml")   # the zip's entries no worker may read (mode 600, and
                                              # run_autograder makes source/ 700: root's only)

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as it builds the autograder's image: Python, torch's CPU build, then tformer, and
# the unprivileged user the grading workers run as (they cannot read source/ or write results/).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive PIP_BREAK_SYSTEM_PACKAGES=1
apt-get update
apt-get install -y python3 python3-pip
python3 -m pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.4,<3"
python3 -m pip install "nbformat>=5.9,<6" /autograder/source/{wheel}
id -u {user} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {user}
chmod 700 /autograder/source
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: tformer grades $ROOT/submission as a class of one and writes
# $ROOT/results/results.json (tformer/grading/classroom/gradescope.py). As root, the workers that run the
# submission's code run as the unprivileged user setup.sh made ($TFORMER_GRADE_WORKER_USER, default
# tformer-worker), which can neither read source/ (the teacher's exercises, hidden cases and assignment) nor
# write results/.
ROOT="${TFORMER_AUTOGRADER_ROOT:-/autograder}"
mkdir -p "$ROOT/results"
chmod 700 "$ROOT/results" "$ROOT/source/" 2>/dev/null
chmod -R go-rwx "$ROOT/source/exercises" "$ROOT/source/hidden" "$ROOT/source/assignment.toml" 2>/dev/null
if [ "$(id -u)" = 0 ] && id -u "${TFORMER_GRADE_WORKER_USER:-tformer-worker}" >/dev/null 2>&1; then
  export TFORMER_GRADE_WORKER_USER="${TFORMER_GRADE_WORKER_USER:-tformer-worker}"
else
  unset TFORMER_GRADE_WORKER_USER
fi
cd "$(mktemp -d)"          # not $ROOT: `python3 -m` puts the working folder on the path workers may read
python3 -m tformer.grading.classroom.gradescope run --root "$ROOT"
if [ ! -s "$ROOT/results/results.json" ]; then
  printf '{"score": 0, "output": "The autograder stopped before it wrote its results (out of memory or time?); ask your teacher.", "tests": []}\\n' \\
    > "$ROOT/results/results.json"
fi
"""


# --- the zip -------------------------------------------------------------------------------------------------

def checkout() -> Path:
    """The checkout this tformer runs from (ClassError when it is installed without one: no wheel to build)."""
    import tformer
    root = Path(tformer.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise ClassError(f"tformer runs from {root}, not from a checkout (no pyproject.toml there): the autograder "
                         f"carries a wheel of the checkout, so run this from one (git clone, make install)")
    return root


def build_wheel(root: Path, into: Path) -> Path:
    """`pip wheel --no-deps` of the checkout's package, built from a copy of its pyproject.toml, README.md and
    tformer/ (the checkout gets no build/ or egg-info). Without build isolation where this Python has the
    setuptools pyproject.toml asks for (no download needed)."""
    src = into / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(root / "tformer", src / "tformer", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(into / "dist"), str(src)]
    try:
        from importlib.metadata import version
        if int(version("setuptools").split(".")[0]) >= 77:
            cmd.insert(5, "--no-build-isolation")
    except Exception:                                 # no setuptools here: pip fetches it for the build
        pass
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted((into / "dist").glob("tformer-*.whl"))
    if proc.returncode != 0 or not wheels:
        why = (proc.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise ClassError(f"pip wheel of {root} failed: {why}")
    return wheels[0]


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007F")
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML for {type(v).__name__}")


def to_toml(data: dict) -> str:
    """An assignment's TOML from what tomllib read: keys first, then one [table] per table."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"] + [f"{json.dumps(n)} = {_toml_value(x)}" for n, x in v.items()]
    return "\n".join(lines) + "\n"


def zipped_assignment(path: Path, exercises: list[str], hidden: list[str], released: bool) -> str:
    """The assignment file as the zip holds it: its own keys, with `exercises`, `hidden` and `released` pointing
    at the zip's exercises/, hidden/ and released/."""
    from .assignment import tomllib
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    for key, files, folder in (("exercises", exercises, "exercises"), ("hidden", hidden, "hidden")):
        data.pop(key, None)
        if files:
            data[key] = [f"{folder}/{Path(f).name}" for f in files]
    data.pop("released", None)
    if released:
        data["released"] = "released"
    return to_toml(data)


def build_zip(zip_path: Path, assignment: Path, exercise_files: list[str] = ()) -> list[str]:
    """Write Gradescope's autograder zip for `assignment` (and a teacher's `exercise_files` given apart, as
    --exercises); return the names in it. ClassError (one line) on anything missing."""
    from .assignment import read_assignment
    from .notebooks import released_notebooks
    a = read_assignment(assignment)
    exercises = list(dict.fromkeys([*a.exercise_files, *(str(Path(f).resolve()) for f in exercise_files)]))
    for kind, files in (("exercise", exercises), ("hidden-cases", a.hidden)):
        names = [Path(f).name for f in files]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice:
            raise ClassError(f"two {kind} files are named {twice}: rename one (the zip keeps file names only)")
    released: dict[str, Path] = {}                    # file name in released/ -> the notebook students got
    found = released_notebooks()
    for stem in a.notebooks:
        if not found.get(stem):
            raise ClassError(f"no released notebook {stem}.ipynb (the course's are built by `make notebooks`; "
                             f"yours go in the assignment's `released` folder)")
        released[f"{stem}.ipynb"] = found[stem][0]
    if a.released:
        released.update({p.name: p for p in sorted(Path(a.released).glob("*.ipynb"))})
    root = checkout()
    with tempfile.TemporaryDirectory(prefix="tformer-gradescope-") as tmp:
        wheel = build_wheel(root, Path(tmp))
        entries: list[tuple[str, bytes | Path, int]] = [
            ("setup.sh", SETUP.format(wheel=wheel.name, user=WORKER_USER).encode(), 0o755),
            ("run_autograder", RUN.encode(), 0o755),
            (wheel.name, wheel, 0o644),
            ("assignment.toml", zipped_assignment(a.path, exercises, a.hidden, bool(released)).encode(), 0o600)]
        entries += [(f"released/{n}", p, 0o644) for n, p in sorted(released.items())]
        entries += [(f"exercises/{Path(f).name}", Path(f), 0o600) for f in exercises]     # root's only (PRIVATE)
        entries += [(f"hidden/{Path(f).name}", Path(f), 0o600) for f in a.hidden]
        part = Path(str(zip_path) + ".part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data, mode in entries:
                info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
                info.external_attr = (0o100000 | mode) << 16        # a regular file, executable where it runs
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data.read_bytes() if isinstance(data, Path) else data)
        os.replace(part, zip_path)
    return [name for name, _, _ in entries]


# --- one submission ------------------------------------------------------------------------------------------

class GradingFailed(Exception):
    """The grader did not grade the submission (the message is what the student reads)."""


def _cores() -> int:
    """The CPUs this container may use: its cgroup's quota (Gradescope's default, half a CPU, is 1), else the
    affinity mask."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


def _grade(root: Path, assignment, timeout: float) -> dict:
    """grades.json's content for ROOT/submission graded as a class of one with the zip's assignment, by the
    class grader `tformer class grade CLASS --out OUT --assignment FILE` runs (run.grade_class), in this process: a
    second Python holding torch would take a quarter of Gradescope's 768 MB. GradingFailed when it cannot."""
    from .run import grade_class
    from .settings import Run, RunSettings
    if hasattr(os, "sched_setaffinity"):              # the worker's torch threads follow the CPUs it may use
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:_cores()]))

    def stop(signum, frame):
        raise GradingFailed(f"grading took longer than {timeout:g} s and was stopped")
    with tempfile.TemporaryDirectory(prefix="tformer-gradescope-") as work:
        work = Path(work)
        cls = work / "class"
        shutil.copytree(root / "submission", cls / STUDENT, symlinks=True,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__MACOSX", ".*"))
        (work / "out").mkdir(mode=0o700)              # the grades: root's only
        if worker_user():
            readable_by_worker(work, cls)
        old = signal.signal(signal.SIGALRM, stop)
        signal.alarm(max(1, int(timeout)))
        try:
            return grade_class(cls, work / "out", Run.of(assignment, settings=RunSettings(workers=1)),
                               progress=False)
        except ClassError as e:                       # e.g. no notebook in the submission
            raise GradingFailed(str(e).replace(str(cls / STUDENT), STUDENT).replace(str(cls), STUDENT)) from None
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


def worker_user() -> str:
    """The user the grading workers run as ("" when they run as this process's user): $TFORMER_GRADE_WORKER_USER,
    which run_autograder sets when it runs as root and setup.sh made the user."""
    return os.environ.get(USER_ENV, "") if hasattr(os, "geteuid") and os.geteuid() == 0 else ""


def readable_by_worker(work: Path, cls: Path) -> None:
    """Let the worker's user reach the submission's copy: `work` traversable (not listable), the class
    readable; `work`/out (the grades) stays root's."""
    os.chmod(work, 0o711)
    for folder, dirs, files in os.walk(cls):
        os.chmod(folder, 0o755)
        for f in files:
            path = Path(folder) / f
            if not path.is_symlink():
                os.chmod(path, 0o644)


def lost_guarantees(settings: dict, user: str | None = None) -> list[str]:
    """What the workers ran without, one short phrase each, from grades.json's settings: its "isolation" (the
    sandbox's report) where there is one, else "landlock_abi" and "network"; `user`: the workers' user ("" when
    none was asked for, None: not known)."""
    from .sandbox import lost_guarantees as lost_in
    iso = {"landlock_abi": settings.get("landlock_abi"), "network": settings.get("network"),
           **(settings.get("isolation") or {})}
    lost = lost_in(iso)
    if user == "" and hasattr(os, "geteuid") and os.geteuid() == 0 and iso.get("processes") != "uid":
        lost.append(f"an unprivileged user (the workers ran as root: setup.sh makes {WORKER_USER})")
    return lost


def _visibility(name: str) -> str:
    from ..core import HIDDEN
    return "after_published" if HIDDEN.get(name) else "visible"


def results(grades: dict) -> dict:
    """Gradescope's results.json from a class of one's grades.json: one test per exercise, the total."""
    from .feedback import message_of
    from .notebooks import exercises_of
    s = grades["students"][0]
    rows = {x["exercise"]: x for nb in s["notebooks"] for x in nb["exercises"]}
    owner = {n: stem for stem in grades["settings"]["notebooks"] for n in exercises_of(Path(stem + ".ipynb"))}
    tests = []
    for e in grades["exercises"]:
        n = e["id"]
        if n in rows:
            x = rows[n]
            output = x["status"] + (f": {message_of(x, e['points'])}" if x.get("message") else "")
        else:
            output = f"not handed in: {owner.get(n, n)}.ipynb"
        tests.append({"name": n, "score": s["exercises"][n]["earned"], "max_score": e["points"], "output": output,
                      "visibility": _visibility(n)})
    lines = []                                        # no points here: hidden tests hide the total until published
    for nb in s["notebooks"]:
        lines.append(f"graded: {nb['notebook']}.ipynb ({Path(nb['file']).name})")
        if nb.get("cell_errors"):
            lines.append(f"  {nb['status']}: " + "; ".join(nb["cell_errors"][:5]))
    if s.get("missing_notebooks"):
        lines.append("not handed in: " + ", ".join(f"{m}.ipynb" for m in s["missing_notebooks"]))
    if s.get("unrecognized_files"):
        lines.append("not graded (not a notebook of this assignment by its name): "
                     + ", ".join(Path(f).name for f in s["unrecognized_files"]))
    if s.get("extra_notebooks"):
        lines.append("not graded (outside this assignment): " + ", ".join(f"{m}.ipynb" for m in s["extra_notebooks"]))
    lost = lost_guarantees(grades.get("settings", {}), worker_user())
    if lost:
        lines.append("isolation: the workers ran without " + "; ".join(lost))
    return {"score": s.get("final", s["total"]), "output": "\n".join(lines), "tests": tests}


def crashed(why: str, assignment=None) -> dict:
    """results.json when grading failed: the error in `output`, each exercise (when known) at 0."""
    from ..core import REGISTRY
    from .notebooks import course_exercises
    tests = []
    try:
        for n in course_exercises(assignment.notebooks, ordered=True) if assignment is not None else []:
            tests.append({"name": n, "score": 0, "max_score": assignment.points.get(n, REGISTRY[n].points),
                          "output": "not graded: see the message above", "visibility": _visibility(n)})
    except Exception:                                 # the message alone, then
        tests = []
    return {"score": 0, "output": f"The autograder could not grade this submission: {why}", "tests": tests}


def run(root: Path, timeout: float | None = None) -> dict:
    """Grade ROOT/submission and write ROOT/results/results.json, whatever happens; return its content."""
    root = Path(root)
    (root / "results").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timeout = timeout or float(os.environ.get(TIMEOUT_ENV) or TIMEOUT)
    assignment = None
    try:
        from .assignment import read_assignment
        assignment = read_assignment(root / "source" / "assignment.toml")   # loads the hidden cases, here only
        grades = _grade(root, assignment, timeout)
        data = results(grades)
    except GradingFailed as e:
        data = crashed(str(e), assignment)
    except Exception as e:                            # the autograder's own failure: still a results.json
        data = crashed(f"{type(e).__name__}: {e}".splitlines()[0], assignment)
    data["execution_time"] = round(time.monotonic() - started, 1)
    part = root / "results" / "results.json.part"
    part.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(part, root / "results" / "results.json")
    print(f"tformer autograder: {data['score']} points, results in {root / 'results' / 'results.json'}")
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tformer.grading.classroom.gradescope",
                                description="Gradescope's run_autograder: grade one submission")
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="grade ROOT/submission into ROOT/results/results.json")
    r.add_argument("--root", type=Path, default=Path(os.environ.get(ROOT_ENV) or "/autograder"),
                   help=f"Gradescope's folder (default: ${ROOT_ENV}, else /autograder)")
    args = p.parse_args(argv)
    run(args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
