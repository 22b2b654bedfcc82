"""Grading one learner's notebooks, out of the learner's reach: the worker process, the cells it runs, the
judged rows and the report (`tformer grade PATH`; a class's grading, tformer/grading/classroom/run.py, uses the
same pieces).

For each notebook a fresh worker process (tformer/grading/classroom/worker.py) runs its code cells in small mode,
with `check` replaced by a collector that keeps each exercise's function (a cell that raises does not stop
the run). This process, the grader, then sends the worker each exercise's inputs (the fixed edge cases and
random cases with fresh seeds), receives the learner's outputs, kills the worker, and only then computes
the expected answers and compares them in its own process, which alone holds the answers and the points;
the notebook's printed results are for the learner only. A worker that overruns an exercise's time limit
is killed (the exercise is a timeout) and a fresh one runs the notebook again for the next exercises. A cell
that ends the worker's process (`os._exit`) or runs past the per-cell limit is reported and left out of the
next run, so the exercises collected before it are still graded. An exercise the notebook owes whose check
cell is gone is graded with the function of the released stub's name, if the notebook defines one, and says
so; one with no such function is listed as "not run". A class run adds the teacher's hidden cases here, in
the grader, and sends the worker their inputs under neutral names. A question (questions.py) calls nothing:
the worker hands over the value its check(...) got, as builtins, and the grader judges it; a question whose
check cell is gone is "not run" (every question's cell rebinds `answer`, so no variable stands for it).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..core import (REGISTRY, Outcome, Question, Result, exercise_cases, hidden_cases, judge, judge_question,
                    load_exercises, named_mistakes)
from ..messages import N_, _
from .notebooks import chapter_of, exercises_of, read_cells, released_checks
from .worker import MAX_FRAME, write_frame

# the table's statuses in the report's language (TFORMER_LANG or --lang, through the checker's catalog);
# the JSON keeps them in English
_STATUSES = (N_("passed"), N_("failed"), N_("not attempted"), N_("error"), N_("timeout"), N_("not run"))
# the labels of a class's feedback pages and report (tformer/grading/classroom/feedback.py), in the same catalog
_FEEDBACK_LABELS = (N_("missing"), N_("Feedback for {student}"), N_("{earned} of {possible} points"),
                    N_("notebook"), N_("verdict"), N_("message"), N_("Cells that raised"),
                    N_("Notebooks not handed in: {names}"), N_("Also handed in, not graded (an older file): {files}"),
                    N_("This notebook could not be graded: {why}"), N_("Class report"),
                    N_("{n} students, mean score {mean} of {possible} points"), N_("Score distribution"),
                    N_("Pass rate per exercise"), N_("pass rate"), N_("Named mistakes"),
                    N_("{exercise}: {n} of {total}, {mistake}"), N_("Students whose notebooks errored or timed out"),
                    N_("none"), N_("students"))


@dataclass
class Row:
    exercise: str
    points: int
    passed: bool
    status: str        # passed / failed / not attempted / error / timeout / not run
    message: str = ""
    seeds: list[int] = field(default_factory=list)    # the random cases' seeds (to repeat the check)
    torch_seed: int | None = None                      # the global generators' seed while the function ran
    mistakes: list[str] = field(default_factory=list)  # the known mistakes it was named (English names)
    check_missing: bool = False                        # no check(...) ran: the released stub's function was graded
    fraction: float | None = None                      # partial credit: the share of the points (None: all or nothing)


@dataclass
class NotebookReport:
    notebook: str
    chapter: str | None                    # "ch01" from "01_attention.ipynb"
    rows: list[Row] = field(default_factory=list)
    cell_errors: list[str] = field(default_factory=list)   # cells that raised (first line of each)
    seconds: float = 0.0
    cell_seconds: dict[int, float] = field(default_factory=dict)   # code cell index -> seconds it ran (last run)

    @property
    def earned(self) -> int:
        return sum(r.points for r in self.rows if r.passed)

    @property
    def possible(self) -> int:
        return sum(r.points for r in self.rows)


class _WorkerGone(Exception):
    pass


class _CellStopped(Exception):
    """A code cell ended the worker's process or ran past the per-cell limit (`cell`: its index among the
    notebook's code cells, None when the process failed before its first cell)."""

    def __init__(self, cell: int | None, why: str):
        super().__init__(cell, why)
        self.cell, self.why = cell, why


class _Subprocess:
    """A worker started as `python -m tformer.grading.classroom.worker` in its own session (killed as a group)."""

    def __init__(self, cwd: Path, env: dict):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "tformer.grading.classroom.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     cwd=cwd, env={**os.environ, **env}, start_new_session=True)
        self.rfd, self.wfile = self.proc.stdout.fileno(), self.proc.stdin

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and anything it started
        self.proc.wait()
        self.log.close()


class _Worker:
    """One run of a notebook's code cells in a worker process (a `_Subprocess`, or a process forked by
    tformer/grading/classroom/sandbox.py); speaks the frames of tformer/grading/classroom/worker.py."""

    def __init__(self, channel, cells: list[tuple[int, str]], cell_timeout: float, fallback: dict | None = None):
        self.channel = channel
        self.ready: list[str] = []
        self.uncalled: list[str] = []                 # graded without a check(...) call (check cell deleted)
        self.values: dict = {}                        # question -> the value its check(...) handed over
        self.cell_errors: list[str] = []
        self.current: int | None = None               # the code cell running now
        self.cell_seconds: dict[int, float] = {}
        started = time.perf_counter()
        try:
            self.send({"cells": cells, "fallback": dict(fallback or {})})
            while True:                               # "cell" and "collected" frames for each cell, then "ready"
                try:
                    msg = self.receive(cell_timeout)
                except TimeoutError:
                    raise _CellStopped(self.current, "timeout") from None
                except _WorkerGone:
                    raise _CellStopped(self.current, "exit") from None
                if "cell" in msg:
                    self.current, started = int(msg["cell"]), time.perf_counter()
                elif "collected" in msg and self.current is not None:
                    self.cell_seconds[self.current] = round(time.perf_counter() - started, 3)
                elif "ready" in msg:
                    self.ready, self.cell_errors = list(msg["ready"]), list(msg["cell_errors"])
                    self.uncalled = list(msg.get("uncalled", []))
                    values = msg.get("values", {})
                    self.values = dict(values) if isinstance(values, dict) else {}
                    return
        except BaseException:
            self.kill()
            raise

    def _read(self, n: int, deadline: float) -> bytes:
        fd, chunks = self.channel.rfd, []
        while n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            try:
                chunk = os.read(fd, min(n, 1 << 20))
            except OSError:
                raise _WorkerGone from None
            if not chunk:
                raise _WorkerGone
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def receive(self, seconds: float):
        deadline = time.monotonic() + seconds
        (n,) = struct.unpack(">Q", self._read(8, deadline))
        if n > MAX_FRAME:
            raise _WorkerGone
        # weights_only: tensors, numbers, strings and containers; nothing the worker sends can run code here
        try:
            return torch.load(io.BytesIO(self._read(n, deadline)), weights_only=True)
        except (TimeoutError, _WorkerGone):
            raise
        except Exception:
            raise _WorkerGone from None

    def send(self, obj) -> None:
        try:
            write_frame(self.channel.wfile, obj)
        except (BrokenPipeError, OSError, ValueError):
            raise _WorkerGone from None

    def kill(self) -> None:
        self.channel.kill()


def _request(worker: _Worker, ex, cases: list, torch_seed: int) -> Outcome:
    """The learner's outputs for `cases`, or the reason there are none (the worker is killed if late)."""
    worker.send({"exercise": ex.name, "time_limit": ex.time_limit, "torch_seed": torch_seed,
                 "cases": [(f"hidden #{i}" if c.group == "hidden" else c.name, c.args, c.kwargs,
                            None if c.group == "hidden" else c.seed) for i, c in enumerate(cases, 1)]})
    msg = worker.receive(ex.time_limit + 10.0)        # the worker enforces the limit; this holds regardless
    return Outcome(list(msg["outputs"]), [tuple(a) for a in msg["inputs_after"]], str(msg["status"]),
                   str(msg["error"]), bool(msg["ignored_limit"]))


MAX_STOPPED_CELLS = 3      # cells left out after they ended or stalled the notebook; after that, the rest is not run
NOT_RUN = N_("check(...) never ran for this exercise")
NOT_RUN_QUESTION = N_("check(...) never ran for this question (its cell deleted, or the notebook stopped before it): "
                      "a question is graded from its check cell only")


def not_run(ex) -> str:
    """The message of an exercise or question whose check(...) never ran."""
    return _(NOT_RUN_QUESTION) if isinstance(ex, Question) else _(NOT_RUN)


def worker_env(small: bool = True) -> dict[str, str]:
    """The environment a worker runs a learner's notebook in: learner mode, small or full mode, no windows, no
    progress bars, the grader's language (its messages end up in the report), and the teacher's exercise
    files the grader loaded (never a hidden-cases file)."""
    from ..core import TEACHER_FILES
    return {"TFORMER_GRADE": "learner", "TFORMER_SMALL": "1" if small else "0", "MPLBACKEND": "Agg",
            "TQDM_DISABLE": "1", "TFORMER_LANG": os.environ.get("TFORMER_LANG") or "en",
            "TFORMER_GRADE_WORKER": "1", "TFORMER_GRADE_EXERCISES": os.pathsep.join(TEACHER_FILES)}


def fresh_seeds(ex, rng=None) -> dict:
    """Seeds for one check: one per random case (fresh, so answers cannot be looked up in advance) and one
    for the global generators while the learner's function runs."""
    rng = rng or random.SystemRandom()
    return {"cases": [rng.randrange(1 << 30) for _ in range(ex.n_random)], "torch_seed": rng.randrange(1 << 30)}


def grade_cells(nb_path: Path, cells: list[tuple[int, str]], launch, timeout: float,
                seeds: dict | None = None, owed: list[str] | None = None,
                fallback: dict[str, str] | None = None, show_hidden: bool = False) -> NotebookReport:
    """Grade one notebook's exercises: run `cells` ((index, source) of the code cells to run) in workers from
    `launch()` and judge their outputs here. A cell that ends the worker's process or runs past `timeout` is
    reported and left out of the next run, so the exercises collected before it (and those after) are graded.
    `seeds` (exercise -> fresh_seeds(...)) repeats a recorded check; the seeds used are in each row."""
    nb_path = Path(nb_path)
    report = NotebookReport(str(nb_path), chapter_of(nb_path))
    owed = exercises_of(nb_path) if owed is None else owed
    # a question's deleted check cell is not graded from a variable: every question's cell rebinds `answer`
    fallback = {n: f for n, f in (fallback or {}).items() if not isinstance(REGISTRY.get(n), Question)}
    outcomes: dict[str, tuple[list, Outcome | None, str, dict]] = {}   # name -> (cases, outcome, crash, seeds)
    t0 = time.perf_counter()
    worker, todo, left_out, stop_errors, uncalled = None, list(owed), [], [], set()
    while todo:
        if worker is None:
            try:
                worker = _Worker(launch(), [c for c in cells if c[0] not in left_out], timeout, fallback)
            except _CellStopped as e:
                where = _("cell {n}").format(n=e.cell + 1) if e.cell is not None else _("the notebook")
                if e.why == "timeout":
                    msg = _("{where} ran longer than {seconds} s and was stopped").format(where=where, seconds=timeout)
                else:
                    msg = _("{where} ended the notebook's process").format(where=where)
                if e.cell is None or e.cell in left_out or len(left_out) >= MAX_STOPPED_CELLS:
                    stop_errors.append(msg + _("; exercises after it were not graded"))
                    break
                left_out.append(e.cell)
                stop_errors.append(msg + _("; the notebook ran again without it"))
                continue
            report.cell_errors = stop_errors + worker.cell_errors
            report.cell_seconds = worker.cell_seconds
            uncalled |= set(worker.uncalled)
        name = todo.pop(0)
        ex = REGISTRY[name]
        if name not in worker.ready:
            outcomes[name] = ([], None, "", {})
            continue
        if isinstance(ex, Question):                  # its value came with "ready": nothing to call
            outcomes[name] = ([], worker.values.get(name), "", {})
            continue
        s = (seeds or {}).get(name) or fresh_seeds(ex)
        cases = exercise_cases(ex, s["cases"]) + hidden_cases(name)   # hidden: only in the grader's process
        try:
            outcomes[name] = (cases, _request(worker, ex, cases, s["torch_seed"]), "", s)
        except TimeoutError:
            outcomes[name] = (cases, Outcome(status="timeout", ignored_limit=True), "", s)
            worker.kill()
            worker = None
        except Exception as e:                        # died, or sent what is not plain data (weights_only)
            outcomes[name] = (cases, Outcome(status="error"), _(
                "the notebook's process failed ({error}) while your function ran (did it exit the process?)").format(
                error=type(e).__name__), s)
            worker.kill()
            worker = None
    if worker is not None:
        worker.kill()                                 # gone before any expected answer exists
    if not report.cell_errors:
        report.cell_errors = stop_errors
    report.seconds = time.perf_counter() - t0
    for name in owed:
        ex = REGISTRY[name]
        cases, outcome, crash, s = outcomes.get(name, ([], None, "", {}))
        if outcome is None:
            report.rows.append(Row(name, ex.points, False, "not run", not_run(ex)))
            continue
        if isinstance(ex, Question):                  # judged here, like an exercise; the value is checked first
            res = judge_question(ex, outcome)
            report.rows.append(Row(name, ex.points, res.passed, res.status, res.message, mistakes=res.mistakes))
            continue
        res = Result(name, ex.points, False, "error", crash, 0) if crash else judge(ex, cases, outcome, show_hidden)
        named = named_mistakes(ex, cases, outcome.outputs) if res.status == "failed" and ex.mistakes else []
        message = res.message
        if name in uncalled:
            message = _("No check(...) cell ran for this exercise (was it deleted?); your function {name} was graded "
                        "as if it had.").format(name=(fallback or {}).get(name, "")) + "\n" + message
        report.rows.append(Row(name, ex.points, res.passed, res.status, message, s.get("cases", []),
                               s.get("torch_seed"), named, name in uncalled, res.fraction))
    return report


def run_notebook(nb_path: Path, timeout: int = 600, small: bool = True, seeds: dict | None = None,
                 stem: str | None = None) -> NotebookReport:
    """Grade one notebook (`stem`: which of the course's notebooks it is, default from its name): run every code
    cell in worker processes, judge the learner's outputs here."""
    try:
        import IPython  # noqa: F401  (the worker runs cells in an IPython shell)
        import nbformat  # noqa: F401
    except ImportError as e:
        raise ValueError(f"tformer grade needs nbformat and ipykernel ({e}); install them with "
                         "`pip install -e '.[dev]'` (or `make install`)") from None
    nb_path = Path(nb_path)
    named = Path((stem or nb_path.stem) + ".ipynb")
    env = worker_env(small)
    try:
        cells = list(enumerate(read_cells(nb_path)))
    except ValueError as e:
        report = NotebookReport(str(nb_path), chapter_of(named))
        report.cell_errors = [_("not a readable notebook: {error}").format(error=e)]
        report.rows = [Row(n, REGISTRY[n].points, False, "not run", not_run(REGISTRY[n])) for n in exercises_of(named)]
        return report
    report = grade_cells(named, cells, lambda: _Subprocess(nb_path.parent.resolve(), env), timeout, seeds,
                         fallback=released_checks(named.stem))
    report.notebook = str(nb_path)
    return report


def _pad(text: str, width: int, right: bool = False) -> str:
    """`text` padded to `width` terminal columns (a Chinese character takes two)."""
    pad = " " * max(0, width - sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text))
    return pad + text if right else text + pad


def format_table(reports: list[NotebookReport]) -> str:
    """The report as text; its labels in the report's language (TFORMER_LANG=zh or --lang zh: Chinese)."""
    lines = []
    for rep in reports:
        lines.append(f"{rep.chapter or '?'}  {Path(rep.notebook).name}  ({rep.seconds:.0f} s)")
        lines.append(f"  {_pad(_('exercise'), 28)} {_pad(_('points'), 6, True)}  {_pad(_('passed'), 6)}  {_('status')}")
        for r in rep.rows:
            lines.append(f"  {r.exercise:<28} {r.points:>6}  {_pad(_('yes') if r.passed else _('no'), 6)}  {_(r.status)}")
        for err in rep.cell_errors:
            lines.append("  " + _("cell error: {error}").format(error=err))
        lines.append(f"  {_pad(_('chapter total'), 28)} {rep.earned:>3}/{rep.possible:<3}")
        lines.append("")
    earned, possible = sum(r.earned for r in reports), sum(r.possible for r in reports)
    lines.append(_("TOTAL {earned}/{possible} points").format(earned=earned, possible=possible))
    return "\n".join(lines)


def to_json(reports: list[NotebookReport]) -> dict:
    return {
        "total": {"earned": sum(r.earned for r in reports), "possible": sum(r.possible for r in reports)},
        "notebooks": [{"notebook": r.notebook, "chapter": r.chapter, "seconds": round(r.seconds, 1),
                       "earned": r.earned, "possible": r.possible, "cell_errors": r.cell_errors,
                       "exercises": [asdict(row) for row in r.rows]} for r in reports],
    }


def grade(path: Path, json_path: Path | None = None, timeout: int = 600, small: bool = True) -> dict:
    """One learner's `tformer grade PATH`: each notebook (submissions.learner_notebooks: the class's rule), print
    the table, write JSON (if json_path); return the JSON dict."""
    from .submissions import learner_notebooks
    load_exercises()                                  # the grader's modules, before any learner code runs
    sub = learner_notebooks(Path(path))
    reports = [run_notebook(nb, timeout, small, stem=stem) for stem, nb in sub.notebooks.items()]
    print(format_table(reports))
    for stem, files in sub.ignored.items():
        print(_("also here, not graded: {files} (graded: {file}, by {why})").format(
            files=", ".join(files), file=sub.notebooks[stem].name, why=_(sub.chosen_by[stem])))
    data = to_json(reports)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {json_path}")
    return data
