"""Grading one learner's notebooks, out of the learner's reach: the worker process, the cells it runs, the
judged rows and the report (`tformer grade PATH`; a class's grading, tformer/grading/classroom/run.py, uses the
same pieces).

For each notebook a fresh worker process (tformer/grading/classroom/worker.py) runs its code cells in small mode,
with `check` replaced by a collector that keeps each exercise's function (a cell that raises does not stop
the run). This process, the grader, then sends the worker each exercise's inputs (the fixed edge cases and
random cases with fresh seeds), receives the learner's outputs, kills the worker, and only then computes
the expected answers and compares them in its own process, which alone holds the answers and the points;
the notebook's printed results are for the learner only. A worker that overruns an exercise's time limit
is killed (the exercise is a timeout) and a fresh one runs the notebook again for the next exercises, once (a
second timed-out exercise ends the notebook's grading). A cell that ends the worker's process, runs past the
per-cell limit or breaks the protocol is reported and left out of the next run, so the exercises collected
before it are still graded. An exercise the notebook owes whose check cell is gone is graded with the function
of the released stub's name, if the notebook defines one, and says so; one with no such function is listed as
"not run". A class run adds the teacher's hidden cases here, in the grader. A question (questions.py) calls
nothing: the worker hands over the value its check(...) got, as builtins, and the grader judges it; a question
whose check cell is gone is "not run" (every question's cell rebinds `answer`, so no variable stands for it).

The worker and every byte it sends belong to the student. What this module guarantees regardless of what the
worker sends:
- No frame is read before its length is checked: 1 MiB for "cell", "collected" and "ready", 64 times the
  request plus 1 MiB for an exercise's reply, 256 MiB for all the frames of one notebook (NOTEBOOK_BYTES).
  Each is loaded with weights_only from torch.save's stored zip format only (no record inflates here).
- Frames come in the order cell i (increasing), collected, ..., ready; anything else ends that run as the
  cell's error. The per-cell limit runs from the cell's "cell" frame and no frame restarts it.
- A reply counts only with a status from the fixed set and counts that fit it (core.malformed), each output
  of the reference's structure (core.judge); otherwise the exercise is an "error" with one line.
- Hidden inputs reach the worker only after every public reply of the notebook is in, in requests of their own,
  and their results are pass/fail only.
- `notebook_timeout`: one deadline over every read and write of the notebook (all its workers); past it, the
  notebook is stopped and graded from what finished ("stopped after S s", NotebookReport.stopped).
- The worker never gets a teacher's file, a reference, an expected output or a point.
What it does not guarantee: a notebook can compute what the course's own references compute (they ship in the
installed package) and forge a reply; for the course's exercises that is flagged (scan.py), not prevented.
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
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..core import (REGISTRY, Outcome, Result, malformed, exercise_cases, hidden_cases, judge,
                    judge_question, load_exercises)
from ..guards import dotted
from ..messages import N_, _
from .notebooks import chapter_of, exercises_of, read_cells, released_checks

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
    stub: bool = False                                 # the function is the released stub (run.py sets it)


@dataclass
class NotebookReport:
    notebook: str
    chapter: str | None                    # "ch01" from "01_attention.ipynb"
    rows: list[Row] = field(default_factory=list)
    cell_errors: list[str] = field(default_factory=list)   # cells that raised (first line of each)
    seconds: float = 0.0
    cell_seconds: dict[int, float] = field(default_factory=dict)   # code cell index -> seconds it ran (last run)
    stopped: str = ""                      # why the notebook's budget (time or bytes) ended its grading ("": it did not)
    flags: list[str] = field(default_factory=list)   # cells that reach into the grader, for review (run.py fills it)

    @property
    def earned(self) -> int:
        return sum(r.points for r in self.rows if r.passed)

    @property
    def possible(self) -> int:
        return sum(r.points for r in self.rows)


MIB = 1 << 20
FRAME_CAP = MIB                 # a "cell", "collected" or "ready" frame
NOTEBOOK_BYTES = 256 * MIB      # every frame of one notebook, all its workers and reruns together
REPLY_MARGIN = 10.0             # seconds past an exercise's time limit before the grader stops waiting for its reply


def reply_cap(request_bytes: int) -> int:
    """The largest reply to an exercise request of `request_bytes` bytes: 64 times the request, plus 1 MiB."""
    return 64 * request_bytes + MIB


class _WorkerGone(Exception):
    """The worker's process ended or closed its channel."""


class _Refused(Exception):
    """The notebook's process sent what the protocol does not allow (its one-line reason): the student's error."""


class _Spent(Exception):
    """The notebook's budget is spent: `status` ("timeout": its time; "error": its bytes) and the message of
    every row it stopped."""

    def __init__(self, status: str, message: str):
        super().__init__(status, message)
        self.status, self.message = status, message


class _Budget:
    """One notebook's budget over all its workers: a deadline for every read and write (None: no deadline), and
    the bytes its frames may take in all."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.deadline = float("inf") if seconds is None else time.monotonic() + float(seconds)
        self.bytes_left = NOTEBOOK_BYTES

    def out_of_time(self) -> _Spent:
        return _Spent("timeout", _("stopped after {seconds} s (the notebook's time budget)").format(
            seconds=f"{self.seconds:g}"))


class _CellStopped(Exception):
    """A code cell ended the worker's process, ran past the per-cell limit, or sent what the protocol does not
    allow (`cell`: its index among the notebook's code cells, None when the process failed before its first
    cell; `why`: "exit", "timeout" or "refused", with `detail` the reason)."""

    def __init__(self, cell: int | None, why: str, detail: str = ""):
        super().__init__(cell, why, detail)
        self.cell, self.why, self.detail = cell, why, detail


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


def _load(data: bytes):
    """A frame's payload, loaded with weights_only (tensors, numbers, strings, containers: no code runs here),
    and only in torch.save's own format: a zip of stored (uncompressed) records no larger in all than the
    payload, so no record inflates in this process. _Refused otherwise."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
        if any(i.compress_type != zipfile.ZIP_STORED for i in infos) or sum(i.file_size for i in infos) > len(data):
            raise ValueError("compressed records")
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception:
        raise _Refused(_("the notebook's process sent a message that is not plain data")) from None


class _Worker:
    """One run of a notebook's code cells in a worker process (a `_Subprocess`, or a process forked by
    tformer/grading/classroom/sandbox.py); speaks the frames of tformer/grading/classroom/worker.py and trusts
    none of them: each frame's length is checked against its cap before it is read, counted against the
    notebook's byte budget, loaded with weights_only, and its shape checked. Every read and write ends by the
    earlier of its own limit and the notebook's deadline (`budget`): past the latter, _Spent."""

    def __init__(self, channel, cells: list[tuple[int, str]], cell_timeout: float, fallback: dict | None = None,
                 questions: list[str] = (), budget: _Budget | None = None):
        self.channel = channel
        self.budget = budget or _Budget(None)
        self.killed = False
        self.ready: list[str] = []
        self.uncalled: list[str] = []                 # graded without a check(...) call (check cell deleted)
        self.values: dict = {}                        # question -> the value its check(...) handed over
        self.cell_errors: list[str] = []
        self.current: int | None = None               # the code cell running now
        self.cell_seconds: dict[int, float] = {}
        indices = {i for i, _ in cells}
        started = time.perf_counter()
        until = time.monotonic() + cell_timeout       # the start, then each cell: one limit, never restarted
        in_cell, last = False, -1
        try:
            try:
                self.send({"cells": cells, "fallback": dict(fallback or {}), "questions": list(questions)}, until)
            except TimeoutError:
                raise _CellStopped(None, "timeout") from None
            except _WorkerGone:
                raise _CellStopped(None, "exit") from None
            while True:                               # "cell" and "collected" frames for each cell, then "ready"
                try:
                    msg = self.receive(until, FRAME_CAP)
                    kind = next((k for k in ("cell", "collected", "ready") if isinstance(msg, dict) and k in msg), None)
                    if kind is None:
                        raise _Refused(_("the notebook's process sent a message of the wrong shape"))
                    if kind == "cell":
                        i = msg["cell"]
                        if in_cell or type(i) is not int or i not in indices or i <= last:
                            raise _Refused(_("the notebook's process sent a cell number out of order"))
                        self.current, last, in_cell = i, i, True
                        started, until = time.perf_counter(), time.monotonic() + cell_timeout
                    elif kind == "collected":
                        if not in_cell:
                            raise _Refused(_("the notebook's process sent a message out of order"))
                        in_cell = False
                        self.cell_seconds[self.current] = round(time.perf_counter() - started, 3)
                    else:
                        if in_cell:
                            raise _Refused(_("the notebook's process sent a message out of order"))
                        self._ready(msg)
                        return
                except TimeoutError:
                    raise _CellStopped(self.current, "timeout") from None
                except _WorkerGone:
                    raise _CellStopped(self.current, "exit") from None
                except _Refused as e:
                    raise _CellStopped(self.current, "refused", str(e)) from None
        except BaseException:
            self.kill()
            raise

    def _ready(self, msg: dict) -> None:
        """The "ready" frame's fields, checked: names and messages are strings (cut to a line), values a dict."""
        def names(x) -> list[str]:
            if not isinstance(x, list) or not all(isinstance(n, str) for n in x):
                raise _Refused(_("the notebook's process sent a message of the wrong shape"))
            return list(x)
        self.ready = names(msg["ready"])
        self.cell_errors = [e[:300] for e in names(msg.get("cell_errors", []))[:100]]
        self.uncalled = [n for n in names(msg.get("uncalled", [])) if n in self.ready]
        values = msg.get("values", {})
        self.values = {k: v for k, v in values.items() if isinstance(k, str)} if isinstance(values, dict) else {}

    def _read(self, n: int, deadline: float) -> bytes:
        fd, chunks = self.channel.rfd, []
        while n:
            left = min(deadline, self.budget.deadline) - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                if time.monotonic() >= self.budget.deadline:
                    raise self.budget.out_of_time()
                raise TimeoutError
            try:
                chunk = os.read(fd, min(n, MIB))
            except OSError:
                raise _WorkerGone from None
            if not chunk:
                raise _WorkerGone
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def receive(self, until: float, cap: int):
        """The next frame, read by monotonic time `until` (TimeoutError) and the notebook's deadline (_Spent);
        one longer than `cap` is refused unread (_Refused), one over the notebook's byte budget ends it (_Spent)."""
        (n,) = struct.unpack(">Q", self._read(8, until))
        if n > cap:
            raise _Refused(_("the notebook's process sent more than {n} bytes at once").format(n=cap))
        if n > self.budget.bytes_left:
            raise _Spent("error", _("the notebook's process sent more than {n} bytes in all (the notebook's "
                                    "budget)").format(n=NOTEBOOK_BYTES))
        self.budget.bytes_left -= n
        return _load(self._read(n, until))

    def send(self, obj, until: float) -> int:
        """Write one frame by `until` (a worker that does not read cannot block the grader); its size in bytes."""
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        view = memoryview(struct.pack(">Q", len(data)) + data)
        try:
            fd = self.channel.wfile.fileno()
            os.set_blocking(fd, False)
        except (OSError, ValueError):
            raise _WorkerGone from None
        while view:
            left = min(until, self.budget.deadline) - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                if time.monotonic() >= self.budget.deadline:
                    raise self.budget.out_of_time()
                raise TimeoutError
            try:
                view = view[os.write(fd, view[:MIB]):]
            except BlockingIOError:
                continue
            except OSError:
                raise _WorkerGone from None
        return len(data)

    def kill(self) -> None:
        if not self.killed:
            self.killed = True
            self.channel.kill()


def _outcome(msg, n_cases: int) -> Outcome:
    """An exercise reply as an Outcome, from checked data only: a dict of the reply's fields, a status from
    STATUSES whose count of finished cases fits it and the `n_cases` cases sent, each case a pair (output,
    (args, kwargs) afterwards) of plain data (the frame was loaded with weights_only). _Refused (one line)
    otherwise."""
    if not isinstance(msg, dict) or not {"outputs", "status"} <= set(msg):
        raise _Refused(_("the notebook's process sent a reply of the wrong shape"))
    status, pairs = msg["status"], msg["outputs"]
    if not isinstance(status, str):                   # malformed() reads only a string's membership in STATUSES
        raise _Refused(_("the notebook's process sent an unknown status"))
    if not isinstance(pairs, list) or not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
        raise _Refused(_("the notebook's process sent a reply of the wrong shape"))
    problem = malformed(Outcome(pairs, pairs, status), n_cases)
    if problem is not None:
        raise _Refused(problem)
    error = msg.get("error", "")
    error = error.splitlines()[0][:500] if isinstance(error, str) and error else ""
    return Outcome([p[0] for p in pairs], [p[1] for p in pairs], status, error, msg.get("ignored_limit") is True)


def _request(worker: _Worker, ex, cases: list, torch_seed: int) -> Outcome:
    """The learner's outputs for `cases`, or the reason there are none: TimeoutError past the exercise's limit
    (and REPLY_MARGIN), _WorkerGone, _Refused (the reply broke the protocol), _Spent (the notebook's budget)."""
    until = time.monotonic() + ex.time_limit + REPLY_MARGIN   # the worker enforces the limit; this holds regardless
    n = worker.send({"exercise": ex.name, "time_limit": ex.time_limit, "torch_seed": torch_seed,
                     "forbidden": dotted(ex.forbidden),
                     "cases": [(f"hidden #{i}" if c.group == "hidden" else c.name, c.args, c.kwargs,
                                None if c.group == "hidden" else c.seed) for i, c in enumerate(cases, 1)]}, until)
    return _outcome(worker.receive(until, reply_cap(n)), len(cases))


MAX_STOPPED_CELLS = 3      # cells left out after they ended or stalled the notebook; after that, the rest is not run
def not_run(ex) -> str:
    """The message of an exercise or question whose check(...) never ran."""
    return _(ex.NOT_RUN)


def worker_env(small: bool = True) -> dict[str, str]:
    """The environment a worker runs a learner's notebook in: learner mode, small or full mode, no windows, no
    progress bars, the grader's language (its messages end up in the report). No teacher's file is named: the
    worker builds each exercise from its request."""
    return {"TFORMER_GRADE": "learner", "TFORMER_SMALL": "1" if small else "0", "MPLBACKEND": "Agg",
            "TQDM_DISABLE": "1", "TFORMER_LANG": os.environ.get("TFORMER_LANG") or "en", "TFORMER_GRADE_WORKER": "1"}


def fresh_seeds(ex, rng=None) -> dict:
    """Seeds for one check: one per random case (fresh, so answers cannot be looked up in advance) and one
    for the global generators while the learner's function runs."""
    rng = rng or random.SystemRandom()
    return {"cases": [rng.randrange(1 << 30) for _ in range(ex.n_random)], "torch_seed": rng.randrange(1 << 30)}


def grade_cells(nb_path: Path, cells: list[tuple[int, str]], launch, timeout: float,
                seeds: dict | None = None, owed: list[str] | None = None,
                fallback: dict[str, str] | None = None, show_hidden: bool = False,
                notebook_timeout: float | None = None) -> NotebookReport:
    """Grade one notebook's exercises: run `cells` ((index, source) of the code cells to run) in workers from
    `launch()` and judge their outputs here. A cell that ends the worker's process, runs past `timeout` or breaks
    the protocol is reported and left out of the next run, so the exercises collected before it (and those after)
    are graded. `seeds` (exercise -> fresh_seeds(...)) repeats a recorded check; the seeds used are in each row.

    Guarantees: every exercise's public cases are requested (and answered) before any hidden case is sent, each
    exercise's hidden cases in a request of their own; a reply counts only as checked here (`_outcome`, `judge`);
    a timed-out exercise reruns the notebook at most once (a second: the rest is not run); `notebook_timeout`
    seconds is one deadline over every read and write of this notebook, all its workers together: past it the
    worker is killed, what finished is graded, the rows not reached are "timeout" ("stopped after S s (the
    notebook's time budget)") and `report.stopped` says so."""
    nb_path = Path(nb_path)
    report = NotebookReport(str(nb_path), chapter_of(nb_path))
    owed = exercises_of(nb_path) if owed is None else list(owed)
    # a question's deleted check cell is not graded from a variable: every question's cell rebinds `answer`
    fallback = {n: f for n, f in (fallback or {}).items() if n in REGISTRY and REGISTRY[n].takes_cases}
    questions = [n for n in owed if n in REGISTRY and not REGISTRY[n].takes_cases]
    budget = _Budget(notebook_timeout)
    t0 = time.perf_counter()
    recs: dict[str, dict] = {}     # name -> {"value"} (a question) or {"cases", "hidden", "seeds", "outcome", "stop"}
    st = {"worker": None, "halt": None, "timeouts": 0,   # halt: (status, message) for what is not reached
          "hidden_sent": False}
    left_out, stop_errors, uncalled = [], [], set()

    def halt(status: str, message: str | None) -> None:
        st["halt"] = st["halt"] or (status, message)

    def spent(e: _Spent) -> None:
        report.stopped = report.stopped or e.message
        halt(e.status, e.message)

    def worker() -> _Worker | None:
        """The running worker, or a fresh run of the notebook; None once nothing more of it may run."""
        while st["worker"] is None and st["halt"] is None:
            try:
                w = _Worker(launch(), [c for c in cells if c[0] not in left_out], timeout, fallback, questions, budget)
            except _Spent as e:
                spent(e)
                break
            except _CellStopped as e:
                where = _("cell {n}").format(n=e.cell + 1) if e.cell is not None else _("the notebook")
                if e.why == "timeout":
                    msg = _("{where} ran longer than {seconds} s and was stopped").format(where=where, seconds=timeout)
                elif e.why == "refused":
                    msg = _("{where} broke the grading protocol ({why})").format(where=where, why=e.detail)
                else:
                    msg = _("{where} ended the notebook's process").format(where=where)
                if e.cell is None or e.cell in left_out or len(left_out) >= MAX_STOPPED_CELLS:
                    stop_errors.append(msg + _("; exercises after it were not graded"))
                    halt("not run", None)
                    break
                left_out.append(e.cell)
                stop_errors.append(msg + _("; the notebook ran again without it"))
                continue
            st["worker"] = w
            if not st["hidden_sent"]:                 # a run after hidden inputs went out reports no text of its own:
                report.cell_errors = stop_errors + w.cell_errors   # its cells could print what an earlier worker
                report.cell_seconds = w.cell_seconds               # left on disk
                uncalled.update(w.uncalled)
        return st["worker"]

    def drop() -> None:
        if st["worker"] is not None:
            st["worker"].kill()
            st["worker"] = None

    def ask(w: _Worker, ex, cases: list, torch_seed: int) -> tuple[Outcome | None, tuple | None]:
        """(the outcome, None) or (None, (status, message) the row gets instead)."""
        try:
            return _request(w, ex, cases, torch_seed), None
        except TimeoutError:
            drop()
            st["timeouts"] += 1
            if st["timeouts"] >= 2:                   # one rerun after a timed-out exercise; no more
                halt("not run", _("not run: two exercises ran past their time limit, so the notebook was not run "
                                  "again"))
            return Outcome(status="timeout", ignored_limit=True), None
        except _Spent as e:
            drop()
            spent(e)
            return None, (e.status, e.message)
        except _Refused as e:
            drop()
            return None, ("error", str(e))
        except Exception as e:                        # died, or sent what is not plain data (weights_only)
            drop()
            return None, ("error", _("the notebook's process failed ({error}) while your function ran (did it exit the "
                                     "process?)").format(error=type(e).__name__))

    for name in owed:                                 # every public case first, all exercises
        w = worker()
        if w is None:
            break
        for q in questions:                           # their values came with "ready": no exercise's stop loses them
            if q not in recs and q in w.ready:
                recs[q] = {"value": w.values.get(q)}
        if name in recs:
            continue
        ex = REGISTRY[name]
        if name not in w.ready:
            recs[name] = {"missing": True}
        elif not ex.takes_cases:                      # its value came with "ready": nothing to call
            recs[name] = {"value": w.values.get(name)}
        else:
            s = (seeds or {}).get(name) or fresh_seeds(ex)
            rec = recs[name] = {"cases": exercise_cases(ex, s["cases"]), "seeds": s,
                                "hidden": hidden_cases(name)}          # hidden: only in the grader's process
            rec["outcome"], rec["stop"] = ask(w, ex, rec["cases"], s["torch_seed"])
    for name in owed:                                 # then the hidden cases, each exercise's in requests of their own
        rec = recs.get(name, {})
        if not rec.get("hidden") or rec.get("stop") or rec["outcome"].status != "ok":
            continue
        w = worker()
        if w is None or name not in w.ready:
            status, message = st["halt"] or ("error", None)
            rec["stop"] = ("error" if status == "not run" else status, message or _(
                "its hidden cases did not run: the notebook could not run again"))
            continue
        st["hidden_sent"] = True
        hidden, stop = ask(w, REGISTRY[name], rec["hidden"], rec["seeds"]["torch_seed"])
        if stop is not None:
            rec["stop"] = stop
        else:
            public = rec["outcome"]                   # NotImplementedError on the first hidden case: an error there
            status = "error" if hidden.status == "not attempted" else hidden.status
            rec["outcome"] = Outcome(public.outputs + hidden.outputs, public.inputs_after + hidden.inputs_after,
                                     status, hidden.error, hidden.ignored_limit)
    drop()                                            # gone before any expected answer exists
    report.cell_errors = report.cell_errors or stop_errors
    report.seconds = time.perf_counter() - t0
    for name in owed:
        ex = REGISTRY[name]
        rec = recs.get(name)
        if rec is None or rec.get("missing"):
            status, message = st["halt"] if rec is None and st["halt"] else ("not run", None)
            report.rows.append(Row(name, ex.points, False, status, message or not_run(ex)))
            continue
        if not ex.takes_cases:                        # judged here, like an exercise; the value is checked first
            res = judge_question(ex, rec["value"])
            report.rows.append(Row(name, ex.points, res.passed, res.status, res.message, mistakes=res.mistakes))
            continue
        cases, outcome, stop, s = rec["cases"] + rec["hidden"], rec["outcome"], rec["stop"], rec["seeds"]
        if stop is not None and outcome is None:      # nothing of it counts
            res = Result(name, ex.points, False, stop[0], stop[1], 0)
        elif stop is not None:                        # public outputs in, hidden cases not run: no pass
            res = judge(ex, cases, Outcome(outcome.outputs, outcome.inputs_after, "timeout"), show_hidden)
            res = Result(name, ex.points, False, stop[0], stop[1], res.cases_run, res.fraction)
        else:
            res = judge(ex, cases, outcome, show_hidden)
        named = res.mistakes if res.status == "failed" else []   # judge's: on hidden cases only with show_hidden
        message = res.message
        if name in uncalled:
            message = _("No check(...) cell ran for this exercise (was it deleted?); your function {name} was graded "
                        "as if it had.").format(name=(fallback or {}).get(name, "")) + "\n" + message
        report.rows.append(Row(name, ex.points, res.passed, res.status, message, s.get("cases", []),
                               s.get("torch_seed"), named, name in uncalled, res.fraction))
    return report


def run_notebook(nb_path: Path, timeout: int = 600, small: bool = True, seeds: dict | None = None,
                 stem: str | None = None, notebook_timeout: float | None = None) -> NotebookReport:
    """Grade one notebook (`stem`: which of the course's notebooks it is, default from its name): run every code
    cell in worker processes, judge the learner's outputs here; `notebook_timeout`: seconds for all of it."""
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
                         fallback=released_checks(named.stem), notebook_timeout=notebook_timeout)
    from .scan import apply                           # the grader's own reading: the released stub, the flags
    apply(report, [source for _, source in cells], named.stem)
    report.notebook = str(nb_path)
    return report


def _pad(text: str, width: int, right: bool = False) -> str:
    """`text` padded to `width` terminal columns (a Chinese character takes two)."""
    pad = " " * max(0, width - sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text))
    return pad + text if right else text + pad


def _chapter_shown(rep: NotebookReport) -> str:
    """The chapter a report's heading names: the course notebook's ("ch01"), else the one its exercises are
    filed under, as the gradebook files them ("w09" for w09.top_k, a teacher's), else "?"."""
    if rep.chapter:
        return rep.chapter
    return ", ".join(sorted({r.exercise.split(".")[0] for r in rep.rows})) or "?"


def format_table(reports: list[NotebookReport]) -> str:
    """The report as text; its labels in the report's language (TFORMER_LANG=zh or --lang zh: Chinese)."""
    lines = []
    for rep in reports:
        lines.append(f"{_chapter_shown(rep)}  {Path(rep.notebook).name}  ({rep.seconds:.0f} s)")
        lines.append(f"  {_pad(_('exercise'), 28)} {_pad(_('points'), 6, True)}  {_pad(_('passed'), 6)}  {_('status')}")
        for r in rep.rows:
            lines.append(f"  {r.exercise:<28} {r.points:>6}  {_pad(_('yes') if r.passed else _('no'), 6)}  {_(r.status)}")
        for err in rep.cell_errors:
            lines.append("  " + _("cell error: {error}").format(error=err))
        if rep.stopped:
            lines.append("  " + _("stopped: {why}").format(why=rep.stopped))
        for flag in rep.flags:
            lines.append("  " + _("flagged for review: {flag}").format(flag=flag))
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
                       "stopped": r.stopped, "flags": r.flags,
                       "exercises": [asdict(row) for row in r.rows]} for r in reports],
    }


def grade(path: Path, json_path: Path | None = None, timeout: int = 600, small: bool = True,
          notebook_timeout: float | None = None) -> dict:
    """One learner's `tformer grade PATH`: each notebook (submissions.learner_notebooks: the class's rule), print
    the table, write JSON (if json_path); return the JSON dict. `notebook_timeout`: seconds per notebook."""
    from .submissions import learner_notebooks
    load_exercises()                                  # the grader's modules, before any learner code runs
    sub = learner_notebooks(Path(path))
    reports = [run_notebook(nb, timeout, small, stem=stem, notebook_timeout=notebook_timeout)
               for stem, nb in sub.notebooks.items()]
    print(format_table(reports))
    for stem, files in sub.ignored.items():
        print(_("also here, not graded: {files} (graded: {file}, by {why})").format(
            files=", ".join(files), file=sub.notebooks[stem].name, why=_(sub.chosen_by[stem])))
    data = to_json(reports)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {json_path}")
    return data
