"""The class run: `tformer class grade CLASS --out OUT` grades every student's notebooks in parallel, resumably,
and `tformer class verify` grades them again with the recorded seeds.

Each notebook is graded as one learner's is (tformer/grading/classroom/runner.py: the learner's code runs in a
worker that never holds an answer, the grader judges), with three differences that make a class fast:

- Only the cells the exercises need run (cells.py): a cell that differs from every released cell always runs;
  released cells that define nothing an exercise's function needs are skipped.
- Workers are forked from a warm process that imported torch and tformer once (sandbox.py), under a memory
  and file-size limit, each in its own PID namespace where the kernel allows (everything a notebook starts dies
  with its worker) and under Landlock (landlock.py), up to one per core at a time.
- A class's per-cell limit is short (`CLASS_TIMEOUT`); a cell that overruns it or ends its process is
  reported and left out of a second run, so the exercises collected before it are still graded.

A notebook with the same sha256 graded by the same grader code (`grader_hash`) is not graded again; a changed
checker regrades. What is written to OUT is gradebook.py's.

The worker and every byte it sends belong to the student (TEACHING.md's threat model). So the grader also reads each notebook
itself (scan.py): an exercise whose function is still the released stub earns nothing, whatever the worker
reported, and cells that reach into the grader are flagged for the teacher (grades.json, the summary). Each
notebook has a wall budget (`--notebook-timeout`, NOTEBOOK_TIMEOUT), and grades.json's settings record every
limit and the isolation the workers ran under (--verify reuses them). An assignment with hidden cases stops
before any notebook runs where workers keep some network, unless --allow-network (then the run says so). A
notebook that was not graded (the sandbox failed, the grader failed) is blank in gradebook.csv and the LMS
files, never 0, and the summary says why.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import inspect
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from ..core import REGISTRY, load_exercises
from ..messages import _
from . import cells as cellplan, scan
from .gradebook import Journal, build_grades, finish, reload_journal, summary
from .notebooks import chapter_of, chapter_order, exercises_of, read_cells, released_checks, released_notebooks
from .runner import NotebookReport, Row, grade_cells, not_run, worker_env
from .settings import CLASS_TIMEOUT, NOTEBOOK_TIMEOUT, Run
from .submissions import ClassError, read_class




# Python 3.11's ast module is not safe in two threads at once ("SystemError: AST constructor recursion depth
# mismatch", CPython gh-106905): the grader's threads parse notebooks (cells.py, scan.py) one at a time
_AST_LOCK = threading.RLock()


class NetworkRefused(ClassError):
    """Hidden cases would reach workers that keep some network, and --allow-network was not given."""


def grader_hash(folder: Path | None = None) -> str:
    """sha256 of the grader's code: every .py of tformer/grading (`folder`), subfolders included, but the pages
    module classroom/feedback.py; the modules of tformer its references and mistakes live in; the torch
    version. A grade recorded under another hash is graded again. A teacher's own exercise files are hashed
    apart (assignment.exercises_hash)."""
    import torch
    load_exercises()
    grading = Path(folder) if folder is not None else Path(__file__).resolve().parents[1]
    pages = grading / "classroom" / "feedback.py"
    files = {f for f in grading.rglob("*.py") if f != pages}
    for ex in REGISTRY.values():
        for fn in ex.code():
            try:
                f = inspect.getsourcefile(fn)
            except TypeError:
                f = None
            package = Path(__file__).resolve().parents[2]           # tformer/: a teacher's files are apart
            if f and Path(f).resolve().is_relative_to(package) and not Path(f).resolve().is_relative_to(grading):
                files.add(Path(f).resolve())
    h = hashlib.sha256(torch.__version__.encode())
    for f in sorted(files, key=lambda f: (f.is_relative_to(grading), str(f.relative_to(grading)) if f.is_relative_to(grading) else str(f))):
        name = f.relative_to(grading).as_posix() if f.is_relative_to(grading) else f.name
        h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def grade_notebook(path: Path, stem: str, launch, timeout: float, skip: bool = True,
                   seeds: dict | None = None, only: str | None = None, cells_run: list[int] | None = None,
                   show_hidden: bool = False, notebook_timeout: float | None = None) -> dict:
    """One notebook's record for the journal: its sha256, the cells run and skipped, the report (of the
    exercise `only`, when given). `cells_run` runs exactly those code cells (a recorded run, `class verify`).
    `notebook_timeout`: the notebook's wall budget, cells and exercises together (runner.grade_cells).

    What the grader reads in the notebook itself (scan.py), whatever the worker reported: an exercise whose
    function is the released stub earns nothing ("not attempted", `stub`), and the cells that reach into the
    grader are the report's `flags`, for the teacher."""
    data = path.read_bytes()
    record = {"file": str(path), "sha256": hashlib.sha256(data).hexdigest()}
    named = Path(stem + ".ipynb")
    with _AST_LOCK:
        owed = [only] if only else exercises_of(named)
        try:
            cells = read_cells(path)
        except ValueError as e:
            report = NotebookReport(str(path), chapter_of(named))
            report.cell_errors = [_("not a readable notebook: {error}").format(error=e)]
            report.rows = [Row(n, REGISTRY[n].points, False, "not run", not_run(REGISTRY[n])) for n in owed]
            return {**record, "status": "invalid", "cells": 0, "run": [], "report": asdict(report)}
        plan = cellplan.plan(cells, cellplan.released_cells().get(stem) if skip else None)
        fallback = released_checks(stem)
    run = plan.run if cells_run is None else [i for i in cells_run if i < len(cells)]
    report = grade_cells(named, [(i, cells[i]) for i in run], launch, timeout, seeds, owed,
                         fallback=fallback, show_hidden=show_hidden, notebook_timeout=notebook_timeout)
    report.notebook = str(path)
    status = "errors" if report.cell_errors else "graded"
    with _AST_LOCK:
        found = scan.apply(report, cells, stem)
    return {**record, "status": status, "cells": len(cells), "run": run, "edited": plan.edited,
            "stub_rule": "applied" if found else "not applied: no released notebook found", "report": asdict(report)}


def _preload_modules() -> list[str]:
    """The torch, tformer, numpy, matplotlib, transformers and tqdm modules the released notebooks import (the warm
    process loads them once, so a notebook's import cell takes milliseconds)."""
    import ast
    mods = set()
    for cells in cellplan.released_cells().values():
        for src in cells:
            try:
                tree = ast.parse(cellplan.python_of(src))
            except Exception:
                continue
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
                mods |= {n for n in names if n.split(".")[0] in ("tformer", "torch", "numpy", "matplotlib", "transformers", "tqdm")}
    return sorted(mods)


def _hidden_out_of_reach(hidden: list[str], cls: Path) -> None:
    """Refuse (ClassError) a file of hidden cases that a grading worker could read: under Landlock a worker
    reads Python's search path (the folder tformer runs from among it) and the class; a hidden file there would
    be one `open` away from a student's code."""
    import tempfile
    from .landlock import worker_paths
    if not hidden:
        return
    read, _ = worker_paths([Path(cls)], Path(tempfile.gettempdir()), Path(cls))
    for f in hidden:
        where = next((r for r in read if Path(f).resolve().is_relative_to(r)), None)
        if where is not None:
            raise ClassError(f"hidden cases {f} are in {where}, which grading workers can read (Python's search path "
                             f"or the class): keep them elsewhere, and run tformer from another folder")


NETWORK_LEFT = {"landlock-tcp": "UDP left open: Landlock refuses TCP only", "none": "TCP and UDP left open"}


def network_note(network: str | None, allowed: bool) -> str:
    """The line that says hidden cases go to workers that keep some network ("" under a network namespace)."""
    if network in (None, "netns"):
        return ""
    left = NETWORK_LEFT.get(network, network)
    if allowed:
        return (f"workers here have no network namespace (network {network}: {left}) and this assignment has hidden "
                f"cases: a notebook could send them out (--allow-network)")
    return (f"workers here have no network namespace (network {network}: {left}) and this assignment has hidden "
            f"cases, which a notebook could send out: grade on a machine that gives workers a network namespace, "
            f"or give --allow-network to go on")


def in_warm_workers(tasks: list, one, workers: int, limits, small: bool = True, log=print,
                    hidden: bool = False, allow_network: bool = False, notes: list | None = None) -> dict | None:
    """Call one(task, spawn) for every task, `workers` at a time; spawn(folder, own, class_folder) forks a
    worker for a notebook in `folder`, allowed to read only `own` of the class (sandbox.py), from one warm
    process started only when there is work. Returns the isolation the workers ran under (WarmProcess.isolation(): at
    least {"landlock_abi": the lowest Landlock ABI (0: none), "network": the weakest ("netns", "landlock-tcp" or
    "none")}); None: no work.

    `hidden`: the run sends hidden cases. Workers that keep some network (no network namespace) then stop the
    run before any notebook runs (NetworkRefused), unless `allow_network`, which says so at the start (a line
    added to `notes`, for the summary and grades.json)."""
    from .sandbox import WarmProcess, lost_guarantees
    if not tasks:
        return None
    warm = WarmProcess(worker_env(small), limits, _preload_modules())
    told = threading.Lock()
    said: list[str] = []

    def gate(network: str | None) -> None:
        """Before any learner code runs: refuse, or say once, where hidden cases meet a network."""
        if not hidden or network in (None, "netns"):
            return
        note = network_note(network, allow_network)
        if not allow_network:
            raise NetworkRefused(note)
        with told:
            if not said:
                said.append(note)
                log(f"tformer class: warning: {note}")
                if notes is not None:
                    notes.append(note)

    def spawn(*args, **kwargs):
        worker = warm.spawn(*args, **kwargs)
        try:
            gate(warm.isolation()["network"])         # the weakest network any worker had, this one included
        except NetworkRefused:
            worker.kill()                             # it ran nothing yet: its cells are sent by the grader
            raise
        return worker

    pool = None
    try:
        if hidden:                                    # one empty worker first: refuse before grading anything
            gate((warm.probe() or {}).get("network"))
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        for f in concurrent.futures.as_completed([pool.submit(one, t, spawn) for t in tasks]):
            f.result()
    except BaseException:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        iso = warm.isolation()
        lost = lost_guarantees(iso)
        if lost:
            log("tformer class: the workers ran without " + "; ".join(lost))
        warm.close()
    pool.shutdown()
    return iso


def _graded(sub, stem: str, nb: Path, spawn, cls: Path, run: Run, log, failures: dict, sandbox_failures: list,
            **how) -> dict | None:
    """One notebook of a class graded (grade_notebook, `how` its options), or None when it could not be: the
    reason is kept in `failures` (not journaled, so the next run tries again). NetworkRefused stops the run."""
    from .sandbox import SandboxFailed
    try:
        own = sub.own()
        return grade_notebook(nb, stem, lambda: spawn(nb.parent.resolve(), own, cls), run.settings.timeout,
                              run.settings.skip, show_hidden=run.show_hidden,
                              notebook_timeout=run.settings.notebook_timeout, **how)
    except NetworkRefused:                            # the whole run stops: no hidden case leaves the grader
        raise
    except SandboxFailed as e:                        # no learner code ran
        reason = str(e).splitlines()[0][:300]
        sandbox_failures.append(reason)
        failures[(sub.student, stem)] = ("sandbox failed", _(
            "the sandbox could not be built ({reason}): none of this notebook ran, and the next run tries "
            "again").format(reason=reason))
        log(f"tformer class: {sub.student}/{nb.name} was not graded: the sandbox could not be built ({reason})")
    except Exception as e:                            # the grader's own failure
        failures[(sub.student, stem)] = ("not graded", f"{type(e).__name__}: {e}".splitlines()[0][:300])
        log(f"tformer class: {sub.student}/{nb.name} was not graded: {failures[(sub.student, stem)][1]}")
    return None


def _plan(subs, stems: list[str], journal: Journal, grader: str, lang: str, teacher: str, only: str | None):
    """The notebooks to grade: [(submission, stem, file, old record or None)], and the line that says what
    --only kept. Without --only, a notebook is graded unless the journal holds it with this sha256, grader,
    language and teacher's files. With --only X, only X is graded again, in the notebooks that owe it, and
    every other verdict is kept, even one recorded before the teacher's files changed (the line says how many);
    a notebook the journal lacks, or that another grader or another version of the file graded, is graded in
    full: a verdict of other grader code is no verdict."""
    tasks, kept, before = [], 0, 0
    for sub in subs:
        for stem, nb in sub.notebooks.items():
            if stem not in stems:
                continue                                        # outside the assignment: listed, not graded
            sha = _sha256(nb)
            if only is None:
                if journal.done(sub.student, stem, sha, grader, lang, teacher) is None:
                    tasks.append((sub, stem, nb, None))
                continue
            old = journal.graded(sub.student, stem, sha, grader, lang)
            if old is None:
                tasks.append((sub, stem, nb, None))
            elif only in exercises_of(Path(stem + ".ipynb")):
                tasks.append((sub, stem, nb, old))
            else:
                kept += 1
                before += old.get("exercises_hash", "") != teacher
    line = None
    if only is not None:
        again = sum(1 for t in tasks if t[3] is not None)
        full = len(tasks) - again
        line = (f"--only {only}: graded again in {again} notebook(s); {kept} other notebook(s) kept as the journal "
                f"holds them" + (f" ({before} of them graded before the teacher's files changed: a run without "
                                 f"--only grades them again)" if before else "")
                + (f"; {full} notebook(s) graded in full (not in the journal, changed, or graded by other grader "
                   f"code)" if full else ""))
    return tasks, line


def grade_class(path: Path, out: Path, run: Run | None = None, progress: bool = True, log=print) -> dict:
    """Grade every student's notebooks under `path` into `out` (resuming from out/journal.jsonl) as `run` says
    (settings.Run: the assignment, the teacher's files, points, overrides, late times, and how: limits,
    workers, shard, --only, the LMS); return grades. Without an assignment, whatever the class handed in is
    graded. Hidden cases stop the run before any notebook runs where workers keep some network, unless
    `run.settings.allow_network`."""
    run = run or Run()
    s = run.settings
    load_exercises()                                          # the grader's modules, before any learner code runs
    from .sandbox import available_cores, machine_limits
    t0 = time.perf_counter()
    subs = read_class(path)
    from .late import nbgrader_timestamp
    for sub in subs:
        sub.submitted = None if sub.flat else nbgrader_timestamp(sub.folder)
    teacher = run.load()
    _hidden_out_of_reach(run.hidden, path)
    overrides = run.overrides
    if s.shard is not None:                                    # K/N: the students of shard K, by id
        subs = [x for x in subs if shard_of(x.student, s.shard[1]) == s.shard[0] - 1]
        overrides = [o for o in overrides if o["student"] in {x.student for x in subs}]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    workers = s.workers or available_cores()
    limits = machine_limits(workers, s.memory)
    grader = grader_hash()
    stems = (list(run.assignment.notebooks) if run.assignment is not None
             else sorted({x for sub in subs for x in sub.notebooks}, key=chapter_order))
    settings = {**run.record(teacher), "workers": workers, "memory": limits.memory, "file_size": limits.file_size,
                "threads_per_worker": limits.threads, "limits": limits_record(limits, s.timeout, s.notebook_timeout),
                "stub_rule": stub_rule(stems), "notebooks": stems}
    if s.skip and not cellplan.released_cells():
        log("tformer class: no released notebooks found next to the package (notebooks/): every cell runs")
    journal = Journal(out / "journal.jsonl")
    lang = "zh" if (os.environ.get("TFORMER_LANG") or "").lower().startswith("zh") else "en"
    if s.only is not None and journal.records and not any(r.get("grader") == grader for r in journal.records.values()):
        log(f"tformer class: --only {s.only}: OUT was graded by other grader code (another grader hash), so every "
            f"notebook is graded again")
    tasks, only_line = _plan(subs, stems, journal, grader, lang, teacher, s.only)
    left = {sub.student: 0 for sub in subs}
    for t in tasks:
        left[t[0].student] += 1
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(subs), unit="student", desc="grading", file=sys.stderr, dynamic_ncols=True)
        bar.update(sum(1 for sub in subs if left[sub.student] == 0))
    lock = threading.Lock()
    failures: dict[tuple[str, str], tuple[str, str]] = {}     # (student, stem) -> (status, why): not journaled
    sandbox_failures: list[str] = []

    def one(task, spawn):
        sub, stem, nb, old = task
        rec = _graded(sub, stem, nb, spawn, path, run, log, failures, sandbox_failures,
                      only=s.only if old else None)
        if rec is not None and old is not None:                 # --only: this exercise's row replaces its old one
            new = {r["exercise"]: r for r in rec["report"]["rows"]}
            rows = [new.get(r["exercise"], r) for r in old["report"]["rows"]]
            rec = {**old, "report": {**old["report"], "rows": rows}}
        if rec is not None:
            journal.add({"student": sub.student, "notebook": stem, "grader": grader, "lang": lang,
                         "exercises_hash": old["exercises_hash"] if old is not None else teacher,
                         **{k: v for k, v in rec.items() if k != "exercises_hash"}})
        with lock:
            left[sub.student] -= 1
            if left[sub.student] == 0 and bar is not None:
                bar.update(1)

    notes: list[str] = []
    try:
        isolation = in_warm_workers(tasks, one, workers, limits, s.small, log, hidden=bool(run.hidden),
                                    allow_network=s.allow_network, notes=notes)
    finally:
        journal.close()
        if bar is not None:
            bar.close()
    settings["landlock_abi"] = isolation["landlock_abi"] if isolation else None   # 0: no sandbox; None: no work
    settings["network"] = isolation["network"] if isolation else None
    settings["isolation"] = isolation                                         # None: no notebook was graded now
    settings["network_warning"] = notes[0] if notes else None
    settings["sandbox_failure"] = sandbox_failures[0] if sandbox_failures else None
    grades = build_grades(subs, reload_journal(out / "journal.jsonl"), settings, grader, failures)
    from . import similarity
    finish(out, grades, similarity.answers_of(subs), s.lms, s.roster, log, run.points, overrides)
    if only_line:
        log(only_line)
    log(summary(grades, time.perf_counter() - t0))
    return grades


def limits_record(limits, timeout: float, notebook_timeout: float | None) -> dict:
    """What each limit of a worker was (grades.json's settings["limits"]; --verify reuses them): sandbox.Limits's
    fields (memory, file_size, processes, tmp_size, threads: only those it has, none claimed), the per-cell and
    per-notebook time, and the protocol's frame caps where the runner or the worker names them."""
    from dataclasses import fields, is_dataclass
    from . import runner, worker
    rec = {f.name: getattr(limits, f.name) for f in fields(limits)} if is_dataclass(limits) else {}
    rec.update(cell_timeout=timeout, notebook_timeout=notebook_timeout)
    frames = {}
    for module in (runner, worker):
        for name, value in vars(module).items():
            if name.isupper() and ("FRAME" in name or name.endswith("_BYTES")) and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                frames.setdefault(name.lower(), value)
    if frames:
        rec["frames"] = frames
    return rec


def stub_rule(stems: list[str]) -> dict:
    """Whether the released-stub rule (scan.stub_exercises) applies to each notebook: it needs the released
    notebook (notebooks/, notebooks/zh/ or an assignment's `released` folder)."""
    released = released_notebooks()
    missing = [s for s in stems if not released.get(s)]
    return {"applied": [s for s in stems if released.get(s)], "not_applied": missing,
            **({"why": "no released notebook found"} if missing else {})}


def verify(grades_path: Path, path: Path, log=print, **given) -> dict:
    """Grade CLASS again as grades.json recorded it (settings.Run.recorded: its assignment and teacher's files,
    refused if they changed): the same cells of each notebook, the same seeds, its limits unless `given`
    (RunSettings fields: timeout, notebook_timeout, workers, memory, allow_network). Reports every notebook
    whose sha256 changed or that is gone, and every exercise whose status or named mistakes differ. Another
    grader hash is a ClassError: the verdicts could differ for that reason alone. A learner can show their own
    work so."""
    from .sandbox import available_cores, machine_limits
    grades = json.loads(Path(grades_path).read_text(encoding="utf-8"))
    grader = grader_hash()
    if grades.get("grader") != grader:
        raise ClassError(f"{grades_path} was written by other grader code ({str(grades.get('grader'))[:12]}, this "
                         f"is {grader[:12]}): verify with the version that graded (`tformer --version`)")
    run = Run.recorded(grades.get("settings", {}), where=str(grades_path)).with_settings(**given)
    s = run.settings
    subs = {x.student: x for x in read_class(path)}
    result = {"changed": [], "gone": [], "differ": [], "checked": 0, "timeout": s.timeout, "memory": s.memory,
              "notebook_timeout": s.notebook_timeout}
    tasks = []
    for st in grades["students"]:
        for nb in st["notebooks"]:
            if not nb.get("sha256"):
                continue                                              # never graded: nothing to reproduce
            file = subs[st["student"]].notebooks.get(nb["notebook"]) if st["student"] in subs else None
            where = f"{st['student']}/{nb['notebook']}"
            if file is None:
                result["gone"].append(where)
            elif _sha256(file) != nb["sha256"]:
                result["changed"].append(where)
            else:
                tasks.append((subs[st["student"]], where, nb, file))
    workers = s.workers or available_cores()
    lock = threading.Lock()
    failures: dict = {}

    def one(task, spawn):
        sub, where, nb, file = task
        seeds = {x["exercise"]: {"cases": x["seeds"], "torch_seed": x["torch_seed"]} for x in nb["exercises"]
                 if x.get("torch_seed") is not None}
        rec = _graded(sub, nb["notebook"], file, spawn, path, run, log, failures, [], seeds=seeds,
                      cells_run=nb.get("cells_run"))
        again = {r["exercise"]: r for r in rec["report"]["rows"]} if rec is not None else {}
        with lock:
            result["checked"] += 1
            for x in nb["exercises"]:
                y = again.get(x["exercise"], {"status": "not graded"})
                if (x["status"], x.get("mistakes", [])) != (y.get("status"), y.get("mistakes", [])):
                    result["differ"].append({"notebook": where, "exercise": x["exercise"], "recorded": x["status"],
                                             "now": y.get("status"), "mistakes": [x.get("mistakes", []),
                                                                                  y.get("mistakes", [])]})

    in_warm_workers(tasks, one, workers, machine_limits(workers, s.memory), s.small, log,
                    hidden=bool(run.hidden), allow_network=s.allow_network)
    budget = f", {s.notebook_timeout:g} s per notebook" if s.notebook_timeout else ""
    log(f"tformer class verify: {result['checked']} notebook(s) graded again with the recorded seeds, cells, "
        f"{s.timeout:g} s per cell{budget}; {len(result['differ'])} verdict(s) differ; {len(result['changed'])} "
        f"notebook(s) changed since, {len(result['gone'])} gone")
    for d in result["differ"]:
        log(f"  {d['notebook']} {d['exercise']}: recorded {d['recorded']}, now {d['now']}")
    for w in result["changed"]:
        log(f"  {w}: changed since it was graded (another sha256)")
    for w in result["gone"]:
        log(f"  {w}: gone since it was graded (no such student or notebook in the class now)")
    return result


def shard_of(student: str, n: int) -> int:
    """0..n-1: the shard a student belongs to, from the id alone (the same on every machine and run)."""
    return int(hashlib.sha256(student.encode("utf-8")).hexdigest(), 16) % n


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' (1 <= K <= N) -> (K, N)."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"expected K/N, e.g. 2/8, got {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"expected 1 <= K <= N in K/N, got {text!r}")
    return k, n


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
