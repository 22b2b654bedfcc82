"""`tformer grade CLASS --out OUT`: a whole class, graded in parallel, resumable, into a gradebook.

    tformer grade class/ --out grades/              # class/<student>/<notebooks>, as an LMS download gives them
    tformer grade class/ --out grades/ --workers 2 --timeout 60 --memory 4G

CLASS holds one folder per student (the folder's name is the student's id), each with that student's
notebooks under any name a download gives them: `04_positional_encoding (1).ipynb` is chapter 4's notebook
(the chapter's name is found in the file's name; download suffixes such as ` (1)`, `-1` or ` copy` do not
matter). Where a student has two files for one notebook, the newest is graded and the other listed. A folder
with chapter notebooks directly inside is one learner (a class of one); one with both is refused.

Each notebook is graded as `tformer grade` grades one (tformer/grading/cli.py: the learner's code runs in a
worker that never holds an answer, the grader judges), with three differences that make a class fast:

- Only the cells the exercises need run (tformer/grading/cells.py): a cell that differs from every released
  cell always runs; released cells that define nothing an exercise's function needs are skipped.
- Workers are forked from a warm process that imported torch and tformer once (tformer/grading/sandbox.py),
  under a memory and file-size limit, each in its own PID namespace where the kernel allows (everything a
  notebook starts dies with its worker), up to one per core at a time.
- A class's per-cell limit is short (`CLASS_TIMEOUT`); a cell that overruns it or ends its process is
  reported and left out of a second run, so the exercises collected before it are still graded.

Written to OUT: `journal.jsonl` (one line per graded notebook, appended as each finishes: an interrupted
run, Ctrl-C or kill -9, continues where it stopped when the same command runs again; a notebook with the same
sha256 graded by the same grader code is not graded again, and a changed checker regrades), `grades.json`
(everything, with each notebook's sha256, the grader's hash and the seeds of every check) and
`gradebook.csv` (one row per student: the points of each exercise in chapter order, the chapter totals,
`total` and `possible`; an exercise never attempted or a notebook never handed in counts 0), and the pages of
tformer/grading/feedback.py: `feedback/<student>.html`, `report.html` and, with `--lms canvas`, `canvas.csv`.

A Canvas bulk download (one flat folder of `name_userid_submissionid_original.ipynb`) is read too: its
students are `name_userid`, and `--roster` (Canvas's gradebook export) gives canvas.csv their SIS ids and
sections.
"""
from __future__ import annotations

import concurrent.futures
import csv
import datetime
import hashlib
import inspect
import io
import json
import os
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import cells as cellplan
from .runner import NOT_RUN, NotebookReport, Row, chapter_of, code_cells, exercises_of, grade_cells
from .core import REGISTRY, _

CLASS_TIMEOUT = 120           # seconds per cell for a class (a learner's own folder: 600); small mode's slowest cell, one
                              # thread on a busy 2-core machine: 52 s (chapter 10)
_CHAPTER_STEM = re.compile(r"(?<![0-9])(\d\d[a-z]?_[a-z0-9_]*[a-z0-9])")
_DOWNLOAD_SUFFIX = re.compile(r"(\s*\(\d+\)|[-_ ]\d{1,3}|[-_ ]copy|\s+copy\s*\d*)+$", re.IGNORECASE)
_SKIP_DIRS = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}


class ClassError(ValueError):
    """CLASS cannot be graded (the message is one line)."""


# --- the class folder -----------------------------------------------------------------------------------------

def known_stems() -> list[str]:
    """The course's notebooks by stem ("01_attention", "11_llms", ...): the released ones and the sources."""
    stems = set(cellplan.released_cells())
    stems |= {p.stem for p in (cellplan.ROOT / "notebooks" / "src").glob("[0-9][0-9]*_*.py")}
    return sorted(stems)


def notebook_stem(filename: str, known: list[str]) -> str | None:
    """The notebook a file is, from its name: `04_positional_encoding (1).ipynb` -> "04_positional_encoding".
    A known stem found in the name wins (the longest); else a chapter-like name with download suffixes
    stripped ("01_tiny" from "01_tiny-2.ipynb"); None if the name holds no chapter number."""
    base = filename[:-len(".ipynb")] if filename.lower().endswith(".ipynb") else filename
    flat = re.sub(r"[\s\-]+", "_", base.lower())
    for stem in sorted(known, key=len, reverse=True):
        at = flat.find(stem)
        if at >= 0 and (at == 0 or not flat[at - 1].isdigit()) and not flat[at + len(stem):at + len(stem) + 1].isalpha():
            return stem
    stripped = _DOWNLOAD_SUFFIX.sub("", base).strip()
    m = _CHAPTER_STEM.match(stripped.lower()) if stripped[:2].isdigit() else None
    return m.group(1) if m and m.end() == len(stripped) else None


# Canvas's bulk download of submissions: one flat folder of `name_userid_submissionid_original.ipynb`
# (`name_LATE_userid_...` when late; the original name may carry `-1` for a resubmission)
_CANVAS_NAME = re.compile(r"^(?P<name>[A-Za-z0-9]+?)(?:_late)?_(?P<uid>\d+)_(?P<sub>\d+)_(?P<file>.+\.ipynb)$", re.IGNORECASE)


@dataclass
class Submission:
    student: str
    folder: Path
    notebooks: dict[str, Path] = field(default_factory=dict)          # stem -> the file graded
    ignored: dict[str, list[str]] = field(default_factory=dict)       # stem -> older files for the same notebook
    unrecognized: list[str] = field(default_factory=list)             # .ipynb files naming no chapter
    canvas_id: str = ""                                               # Canvas's user id (a Canvas download)


def _notebook_files(folder: Path, recursive: bool) -> list[Path]:
    found = folder.rglob("*.ipynb") if recursive else folder.glob("*.ipynb")
    return sorted(p for p in found if p.is_file() and not _SKIP_DIRS & set(p.relative_to(folder).parts[:-1]))


def _submission(student: str, folder: Path, files: list[Path], known: list[str], canvas_id: str = "") -> Submission:
    sub = Submission(student, folder, canvas_id=canvas_id)
    by_stem: dict[str, list[Path]] = {}
    for f in files:
        m = _CANVAS_NAME.match(f.name) if canvas_id else None
        stem = notebook_stem(m.group("file") if m else f.name, known)
        if stem is None:
            sub.unrecognized.append(str(f.relative_to(folder)))
        else:
            by_stem.setdefault(stem, []).append(f)
    for stem, paths in sorted(by_stem.items()):
        paths.sort(key=lambda p: (p.stat().st_mtime, p.name), reverse=True)   # the newest first
        sub.notebooks[stem] = paths[0]
        if paths[1:]:
            sub.ignored[stem] = [str(p.relative_to(folder)) for p in paths[1:]]
    return sub


def read_class(path: Path) -> list[Submission]:
    """The students of CLASS: one per subfolder, or the folder itself when the notebooks are directly inside."""
    path = Path(path)
    if not path.is_dir():
        raise ClassError(f"{path} is not a folder" if path.exists() else f"{path} does not exist")
    known = known_stems()
    files = _notebook_files(path, recursive=False)
    canvas = [p for p in files if _CANVAS_NAME.match(p.name)]
    direct = [p for p in files if notebook_stem(p.name, known)]
    folders = sorted(d for d in path.iterdir() if d.is_dir() and d.name not in _SKIP_DIRS
                     and not d.name.startswith(".") and _notebook_files(d, recursive=True))
    if direct and folders:
        raise ClassError(f"{path} holds both chapter notebooks ({direct[0].name}, ...) and student folders "
                         f"({folders[0].name}/, ...): put each student's notebooks in their own folder")
    if canvas and len(canvas) == len(direct):        # a Canvas bulk download: students by their Canvas id
        by_id: dict[str, list[Path]] = {}
        names: dict[str, str] = {}
        for f in canvas:
            m = _CANVAS_NAME.match(f.name)
            by_id.setdefault(m.group("uid"), []).append(f)
            names.setdefault(m.group("uid"), m.group("name").lower())
        return [_submission(f"{names[uid]}_{uid}", path, fs, known, canvas_id=uid) for uid, fs in sorted(by_id.items())]
    if direct:
        return [_submission(path.resolve().name, path, direct, known)]
    if not folders:
        raise ClassError(f"no student folders with notebooks and no chapter notebooks (NN_name.ipynb) in {path}")
    return [_submission(d.name, d, _notebook_files(d, recursive=True), known) for d in folders]


def has_student_folders(path: Path) -> bool:
    """True when `path` is a folder with subfolders holding notebooks (a class, not one learner)."""
    path = Path(path)
    return path.is_dir() and any(d.is_dir() and d.name not in _SKIP_DIRS and not d.name.startswith(".")
                                 and _notebook_files(d, recursive=True) for d in path.iterdir())


# --- what a grade depends on ----------------------------------------------------------------------------------

def grader_hash() -> str:
    """sha256 of the grader's code (tformer/grading, but for the pages of feedback.py), the modules its
    references and mistakes live in, and the torch version: a grade recorded under another hash is graded again."""
    from . import exercises  # noqa: F401
    import torch
    files = {f for f in Path(__file__).resolve().parent.rglob("*.py") if f.name != "feedback.py"}   # pages only
    for ex in REGISTRY.values():
        for fn in (ex.reference, ex.edge_cases, ex.random_case, ex.compare, *ex.mistakes.values()):
            try:
                f = inspect.getsourcefile(fn) if fn is not None else None
            except TypeError:
                f = None
            if f:
                files.add(Path(f).resolve())
    h = hashlib.sha256(torch.__version__.encode())
    for f in sorted(files):
        h.update(str(f.name).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def course_exercises(stems: list[str]) -> list[str]:
    """The exercises the notebooks `stems` owe, in chapter order (a chapter's notebooks by name)."""
    out: list[str] = []
    for stem in sorted(stems, key=lambda s: (s[:2], s)):
        out += [n for n in exercises_of(Path(stem + ".ipynb")) if n not in out]
    return out


# --- grading one notebook -------------------------------------------------------------------------------------

def grade_notebook(path: Path, stem: str, launch, timeout: float, skip: bool = True,
                   seeds: dict | None = None, only: str | None = None) -> dict:
    """One notebook's record for the journal: its sha256, the cells run and skipped, the report (of the
    exercise `only`, when given)."""
    data = path.read_bytes()
    record = {"file": str(path), "sha256": hashlib.sha256(data).hexdigest()}
    owed = [only] if only else exercises_of(Path(stem + ".ipynb"))
    try:
        cells = code_cells(path)
    except ValueError as e:
        report = NotebookReport(str(path), chapter_of(Path(stem + ".ipynb")))
        report.cell_errors = [_("not a readable notebook: {error}").format(error=e)]
        report.rows = [Row(n, REGISTRY[n].points, False, "not run", _(NOT_RUN)) for n in owed]
        return {**record, "status": "invalid", "cells": 0, "run": [], "report": asdict(report)}
    plan = cellplan.plan(cells, cellplan.released_cells().get(stem) if skip else None)
    report = grade_cells(Path(stem + ".ipynb"), [(i, cells[i]) for i in plan.run], launch, timeout, seeds, owed)
    report.notebook = str(path)
    status = "errors" if report.cell_errors else "graded"
    return {**record, "status": status, "cells": len(cells), "run": plan.run, "edited": plan.edited,
            "report": asdict(report)}


# --- the journal (resume) -------------------------------------------------------------------------------------

class Journal:
    """OUT/journal.jsonl: one JSON line per graded notebook, flushed and synced as each finishes."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.records: dict[tuple[str, str], dict] = {}
        if path.exists():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                    self.records[(rec["student"], rec["notebook"])] = rec      # the last line for a key wins
                except (ValueError, KeyError, TypeError):
                    continue                                                   # a line cut by kill -9
        self.file = open(path, "a", encoding="utf-8")
        if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            self.file.write("\n")                        # a line cut by kill -9 stays on its own

    def done(self, student: str, stem: str, sha256: str, grader: str, lang: str = "en") -> dict | None:
        """The record of a notebook graded with this sha256, grader hash and language (messages), else None."""
        rec = self.records.get((student, stem))
        ok = rec and rec.get("sha256") == sha256 and rec.get("grader") == grader and rec.get("lang", "en") == lang
        return rec if ok else None

    def add(self, rec: dict) -> None:
        with self.lock:
            self.records[(rec["student"], rec["notebook"])] = rec
            self.file.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.file.flush()
            os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


# --- the outputs ----------------------------------------------------------------------------------------------

def _earned(row: dict) -> int:
    return int(row["points"]) if row.get("passed") else 0


def build_grades(subs: list[Submission], journal: Journal, exercises: list[str], settings: dict, grader: str,
                 failures: dict | None = None) -> dict:
    """grades.json's content: every student, notebook and exercise, with hashes and seeds."""
    import torch
    import tformer
    chapters = sorted({n.split(".")[0] for n in exercises})
    students = []
    for sub in subs:
        earned = {n: 0 for n in exercises}
        status = {n: "missing" for n in exercises}
        notebooks, problems = [], []
        stems = sorted({n_stem for n_stem in sub.notebooks})
        for stem in stems:
            rec = journal.records.get((sub.student, stem))
            if rec is None or rec.get("grader") != grader:        # not graded by this grader: say so
                why = (failures or {}).get((sub.student, stem), "not graded (the run was interrupted?)")
                problems.append(stem)
                notebooks.append({"notebook": stem, "file": os.path.relpath(sub.notebooks[stem], sub.folder),
                                  "sha256": "", "status": "not graded", "ignored": sub.ignored.get(stem, []),
                                  "seconds": 0.0, "cells": 0, "cells_run": [], "cells_edited": [],
                                  "cell_errors": [why], "exercises": []})
                continue
            rep = rec["report"]
            for row in rep["rows"]:
                earned[row["exercise"]] = _earned(row)
                status[row["exercise"]] = row["status"]
            if rec["status"] != "graded":
                problems.append(stem)
            notebooks.append({"notebook": stem, "file": os.path.relpath(rec["file"], sub.folder), "sha256": rec["sha256"],
                              "status": rec["status"], "ignored": sub.ignored.get(stem, []),
                              "seconds": round(rep.get("seconds", 0.0), 2), "cells": rec.get("cells", 0),
                              "cells_run": rec.get("run", []), "cells_edited": rec.get("edited", []),
                              "cell_errors": rep["cell_errors"],
                              "exercises": [{**row, "earned": _earned(row)} for row in rep["rows"]]})
        missing = sorted({stem for stem in settings["notebooks"]} - set(sub.notebooks))
        total = sum(earned.values())
        students.append({
            "student": sub.student, "canvas_id": sub.canvas_id, "total": total, "possible": sum(REGISTRY[n].points for n in exercises),
            "chapters": {ch: sum(v for n, v in earned.items() if n.startswith(ch + ".")) for ch in chapters},
            "exercises": {n: {"earned": earned[n], "status": status[n]} for n in exercises},
            "notebooks": notebooks, "missing_notebooks": missing, "unrecognized_files": sub.unrecognized,
            "notebooks_with_errors": problems})
    return {"grader": grader, "tformer": getattr(tformer, "__version__", ""), "torch": torch.__version__,
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "settings": settings,
            "exercises": [{"id": n, "chapter": n.split(".")[0], "points": REGISTRY[n].points} for n in exercises],
            "students": students}


def gradebook_rows(grades: dict) -> list[list]:
    """gradebook.csv as rows: the header, then one row per student."""
    ids = [e["id"] for e in grades["exercises"]]
    chapters = sorted({e["chapter"] for e in grades["exercises"]})
    rows = [["student", *ids, *chapters, "total", "possible"]]
    for s in grades["students"]:
        rows.append([s["student"], *(s["exercises"][n]["earned"] for n in ids), *(s["chapters"][c] for c in chapters),
                     s["total"], s["possible"]])
    return rows


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_outputs(out: Path, grades: dict) -> None:
    _write_atomic(out / "grades.json", json.dumps(grades, indent=1, ensure_ascii=False) + "\n")
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(gradebook_rows(grades))
    _write_atomic(out / "gradebook.csv", buf.getvalue())


def summary(grades: dict, seconds: float | None = None) -> str:
    """Students, mean score, the exercises with the lowest pass rate, the students with errors."""
    st = grades["students"]
    lines = []
    if not st:
        return "no students"
    possible = st[0]["possible"] or 1
    mean = sum(s["total"] for s in st) / len(st)
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    lines.append(f"{len(st)} student(s) graded{took}; mean score {mean:.1f}/{possible} ({100 * mean / possible:.0f}%)")
    rates = []
    for e in grades["exercises"]:
        passed = sum(s["exercises"][e["id"]]["earned"] > 0 for s in st)
        rates.append((passed / len(st), e["id"], passed))
    rates.sort()
    if rates:
        lines.append("lowest pass rates: " + ", ".join(f"{n} {p}/{len(st)}" for _, n, p in rates[:5]))
    bad = [s for s in st if s["notebooks_with_errors"]]
    if bad:
        lines.append(f"{len(bad)} student(s) with notebook errors (see grades.json): "
                     + ", ".join(f"{s['student']} ({', '.join(s['notebooks_with_errors'])})" for s in bad[:10])
                     + (", ..." if len(bad) > 10 else ""))
    else:
        lines.append("no notebook errors")
    similar = grades.get("similar") or {}
    if similar.get("pairs") or similar.get("reference"):
        lines.append(f"answers that look alike: {len(similar.get('pairs', []))} pair(s); equal to the published "
                     f"solution: {len(similar.get('reference', []))} (report.html; grades unchanged)")
    return "\n".join(lines)


# --- the whole class ------------------------------------------------------------------------------------------

def _preload_modules() -> list[str]:
    """The torch, tformer, numpy, matplotlib, transformers and tqdm modules the released notebooks import (the warm
    process loads them once, so a notebook's import cell takes milliseconds)."""
    import ast
    mods = set()
    for cells in cellplan.released_cells().values():
        for src in cells:
            try:
                tree = ast.parse(cellplan._python(src))
            except Exception:
                continue
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
                mods |= {n for n in names if n.split(".")[0] in ("tformer", "torch", "numpy", "matplotlib", "transformers", "tqdm")}
    return sorted(mods)


def in_warm_workers(tasks: list, one, workers: int, limits, small: bool = True, log=print) -> int | None:
    """Call one(task, spawn) for every task, `workers` at a time; spawn(folder, own, class_folder) forks a
    worker for a notebook in `folder`, allowed to read only `own` of the class (tformer/grading/sandbox.py),
    from one warm process started only when there is work. Returns the Landlock ABI the workers ran under
    (0: none; None: no work)."""
    from .sandbox import WarmProcess
    if not tasks:
        return None
    env = {"TFORMER_GRADE": "learner", "TFORMER_SMALL": "1" if small else "0", "MPLBACKEND": "Agg",
           "TQDM_DISABLE": "1", "TFORMER_LANG": os.environ.get("TFORMER_LANG") or "en"}
    warm = WarmProcess(env, limits, _preload_modules())
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    try:
        for f in concurrent.futures.as_completed([pool.submit(one, t, warm.spawn) for t in tasks]):
            f.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        if warm.namespaced is False:
            log("tformer grade: this kernel gives no unprivileged PID namespace; a subreaper kills what notebooks start")
        if warm.landlock == 0:
            log("tformer grade: this kernel has no Landlock; workers could read other students' folders and write "
                "wherever this user can")
        warm.close()
    pool.shutdown()
    return warm.landlock


def grade_class(path: Path, out: Path, timeout: float = CLASS_TIMEOUT, workers: int | None = None,
                memory: int | None = None, small: bool = True, skip: bool = True, progress: bool = True,
                log=print, lms: str | None = None, roster: Path | None = None,
                shard: tuple[int, int] | None = None, weights: dict | None = None,
                overrides: list | None = None, only: str | None = None) -> dict:
    """Grade every student's notebooks under `path` into `out` (resuming from out/journal.jsonl); return grades."""
    from . import exercises  # noqa: F401  (every module of the grader loaded before any learner code runs)
    from .sandbox import available_cores, machine_limits
    t0 = time.perf_counter()
    subs = read_class(path)
    if shard is not None:                                      # K/N: the students of shard K, by id
        subs = [s for s in subs if shard_of(s.student, shard[1]) == shard[0] - 1]
        overrides = [o for o in overrides or [] if o["student"] in {s.student for s in subs}]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    workers = workers or available_cores()
    limits = machine_limits(workers, memory)
    grader = grader_hash()
    stems = sorted({s for sub in subs for s in sub.notebooks}, key=lambda s: (s[:2], s))
    exercises_ = course_exercises(stems)
    settings = {"timeout": timeout, "workers": workers, "memory": limits.memory, "file_size": limits.file_size,
                "threads_per_worker": limits.threads, "small": small, "skip_released_cells": skip, "notebooks": stems,
                "shard": f"{shard[0]}/{shard[1]}" if shard else None}
    if skip and not cellplan.released_cells():
        log("tformer grade: no released notebooks found next to the package (notebooks/): every cell runs")
    journal = Journal(out / "journal.jsonl")
    lang = "zh" if (os.environ.get("TFORMER_LANG") or "").lower().startswith("zh") else "en"
    tasks, left = [], {}
    for sub in subs:
        left[sub.student] = 0
        for stem, nb in sub.notebooks.items():
            sha = _sha256(nb)
            redo = only is not None and only in exercises_of(Path(stem + ".ipynb"))
            if redo or journal.done(sub.student, stem, sha, grader, lang) is None:
                tasks.append((sub, stem, nb))
                left[sub.student] += 1
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(subs), unit="student", desc="grading", file=sys.stderr, dynamic_ncols=True)
        bar.update(sum(1 for sub in subs if left[sub.student] == 0))
    lock = threading.Lock()
    failures: dict[tuple[str, str], str] = {}

    def one(task, spawn):
        sub, stem, nb = task
        old = journal.done(sub.student, stem, _sha256(nb), grader, lang) if only else None
        try:
            own = list(sub.notebooks.values()) if sub.canvas_id else [sub.folder]   # a Canvas folder is shared
            rec = grade_notebook(nb, stem, lambda: spawn(nb.parent.resolve(), own, path), timeout, skip,
                                 only=only if old else None)
            if rec is not None and old is not None:             # --only: this exercise's row replaces its old one
                new = {r["exercise"]: r for r in rec["report"]["rows"]}
                rows = [new.get(r["exercise"], r) for r in old["report"]["rows"]]
                rec = {**old, "report": {**old["report"], "rows": rows}}
        except Exception as e:                        # the grader's own failure: not journaled, so a rerun retries
            failures[(sub.student, stem)] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            log(f"tformer grade: {sub.student}/{nb.name} was not graded: {failures[(sub.student, stem)]}")
            rec = None
        if rec is not None:
            journal.add({"student": sub.student, "notebook": stem, "grader": grader, "lang": lang, **rec})
        with lock:
            left[sub.student] -= 1
            if left[sub.student] == 0 and bar is not None:
                bar.update(1)

    try:
        settings["landlock_abi"] = in_warm_workers(tasks, one, workers, limits, small, log)   # 0: no sandbox
    finally:
        journal.close()
        if bar is not None:
            bar.close()
    grades = build_grades(subs, _reload(out / "journal.jsonl"), exercises_, settings, grader, failures)
    from . import similarity
    finish(out, grades, similarity.answers_of(subs), lms, roster, log, weights, overrides)
    log(summary(grades, time.perf_counter() - t0))
    return grades


def read_weights(path: Path) -> dict[str, int]:
    """A teacher's points per exercise, one `ch01.attention = 5` (or `ch01.attention,5`) per line; # comments."""
    weights = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, _sep, value = line.replace(",", "=").partition("=")
        name = name.strip()
        if name not in REGISTRY:
            raise ClassError(f"{path}:{n}: no exercise named {name!r} (e.g. ch01.attention)")
        try:
            weights[name] = int(value)
        except ValueError:
            raise ClassError(f"{path}:{n}: expected `exercise = points`, with whole points, got {line!r}") from None
        if weights[name] < 0:
            raise ClassError(f"{path}:{n}: points must be >= 0, got {weights[name]}")
    return weights


def read_overrides(path: Path) -> list[dict]:
    """Manual grades: a CSV with the columns student, exercise, points, reason; each wins over the autograde."""
    rows = []
    with Path(path).open(encoding="utf-8", newline="") as f:
        for n, row in enumerate(csv.DictReader(f), 2):
            if set(row) < {"student", "exercise", "points", "reason"}:
                raise ClassError(f"{path}: expected the columns student, exercise, points, reason")
            if row["exercise"] not in REGISTRY:
                raise ClassError(f"{path}:{n}: no exercise named {row['exercise']!r}")
            try:
                points = int(row["points"])
            except ValueError:
                raise ClassError(f"{path}:{n}: points must be a whole number, got {row['points']!r}") from None
            rows.append({"student": row["student"], "exercise": row["exercise"], "points": points,
                         "reason": row["reason"].strip()})
    return rows


def apply_teacher(grades: dict, weights: dict[str, int] | None = None, overrides: list[dict] | None = None) -> None:
    """Reweight the exercises (a passed exercise earns its weight) and apply the manual overrides, in place;
    every total, chapter total and `possible` follows. The autograde's status stays beside an override."""
    weights, overrides = weights or {}, overrides or []
    for x in grades["exercises"]:
        x["points"] = weights.get(x["id"], x["points"])
    points = {x["id"]: x["points"] for x in grades["exercises"]}
    by_student = {s["student"]: s for s in grades["students"]}
    unknown = sorted({o["student"] for o in overrides} - set(by_student))
    if unknown:
        raise ClassError(f"overrides name students not in the class: {', '.join(unknown)}")
    for s in grades["students"]:
        for n, x in s["exercises"].items():
            x["earned"] = points[n] if x["status"] == "passed" else 0
            x.pop("override", None)
        for nb in s["notebooks"]:
            for x in nb["exercises"]:
                x["earned"] = points.get(x["exercise"], x["points"]) if x["status"] == "passed" else 0
    for o in overrides:
        x = by_student[o["student"]]["exercises"].get(o["exercise"])
        if x is None:
            raise ClassError(f"override for {o['student']}: {o['exercise']} is not an exercise of this class")
        x["earned"], x["override"] = o["points"], {"points": o["points"], "reason": o["reason"]}
    for s in grades["students"]:
        s["total"] = sum(x["earned"] for x in s["exercises"].values())
        s["possible"] = sum(points.values())
        s["chapters"] = {ch: sum(x["earned"] for n, x in s["exercises"].items() if n.startswith(ch + "."))
                         for ch in s["chapters"]}
    grades["settings"]["weights"], grades["overrides"] = weights, overrides


def finish(out: Path, grades: dict, answers: dict, lms: str | None = None, roster: Path | None = None,
           log=print, weights: dict | None = None, overrides: list | None = None) -> None:
    """Add each student's answer records and the class's similar answers (a report; no grade changes) to
    `grades`, apply the teacher's weights and overrides, then write OUT: grades.json, gradebook.csv, the
    feedback pages, report.html, canvas.csv."""
    from . import feedback, similarity
    apply_teacher(grades, weights, overrides)
    for s in grades["students"]:
        s["answers"] = answers.get(s["student"], s.get("answers", {}))
    grades["similar"] = similarity.flag_answers({s["student"]: s["answers"] for s in grades["students"]})
    write_outputs(out, grades)
    feedback.write_pages(out, grades)
    written = ["gradebook.csv", "grades.json", "report.html", "feedback/"]
    if lms == "canvas":
        _write_atomic(out / "canvas.csv", feedback.canvas_csv(grades, feedback.read_roster(roster) if roster else None))
        written.append("canvas.csv")
    log(f"wrote {', '.join(written)} in {out}")


def verify(grades_path: Path, path: Path, timeout: float = CLASS_TIMEOUT, workers: int | None = None,
           memory: int | None = None, log=print) -> dict:
    """Grade CLASS again with the seeds grades.json recorded: every notebook whose sha256 changed (or that is
    gone), and every exercise whose status or named mistakes differ. A learner can show their own work so."""
    from .sandbox import available_cores, machine_limits
    grades = json.loads(Path(grades_path).read_text(encoding="utf-8"))
    subs = {s.student: s for s in read_class(path)}
    result = {"changed": [], "gone": [], "differ": [], "checked": 0,
              "same_grader": grades.get("grader") == grader_hash()}
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
                tasks.append((st["student"], where, nb, file))
    workers = workers or available_cores()
    lock = threading.Lock()

    def one(task, spawn):
        student, where, nb, file = task
        seeds = {x["exercise"]: {"cases": x["seeds"], "torch_seed": x["torch_seed"]} for x in nb["exercises"]
                 if x.get("torch_seed") is not None}
        sub = subs[student]
        own = list(sub.notebooks.values()) if sub.canvas_id else [sub.folder]
        rec = grade_notebook(file, nb["notebook"], lambda: spawn(file.parent.resolve(), own, path), timeout,
                             grades["settings"].get("skip_released_cells", True), seeds)
        again = {r["exercise"]: r for r in rec["report"]["rows"]}
        with lock:
            result["checked"] += 1
            for x in nb["exercises"]:
                y = again.get(x["exercise"], {})
                if (x["status"], x.get("mistakes", [])) != (y.get("status"), y.get("mistakes", [])):
                    result["differ"].append({"notebook": where, "exercise": x["exercise"], "recorded": x["status"],
                                             "now": y.get("status"), "mistakes": [x.get("mistakes", []),
                                                                                  y.get("mistakes", [])]})

    in_warm_workers(tasks, one, workers, machine_limits(workers, memory), grades["settings"].get("small", True), log)
    if not result["same_grader"]:
        log("tformer grade --verify: grades.json was written by other grader code; verdicts may differ for that reason")
    log(f"tformer grade --verify: {result['checked']} notebook(s) graded again with the recorded seeds; "
        f"{len(result['differ'])} verdict(s) differ; {len(result['changed'])} notebook(s) changed since, "
        f"{len(result['gone'])} gone")
    for d in result["differ"]:
        log(f"  {d['notebook']} {d['exercise']}: recorded {d['recorded']}, now {d['now']}")
    for w in result["changed"]:
        log(f"  {w}: changed since it was graded (another sha256)")
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


def merge(outs: list[Path], out: Path, lms: str | None = None, roster: Path | None = None, log=print) -> dict:
    """Combine the grades.json of shards (`--shard K/N` runs) into OUT, as one run over the whole class."""
    parts = []
    for o in outs:
        f = Path(o) / "grades.json"
        if not f.is_file():
            raise ClassError(f"{o} holds no grades.json (a folder written by tformer grade CLASS --out)")
        parts.append((Path(o), json.loads(f.read_text(encoding="utf-8"))))
    first = parts[0][1]
    seen: dict[str, Path] = {}
    for o, g in parts:
        if g["grader"] != first["grader"]:
            raise ClassError(f"{o} was graded by other grader code than {parts[0][0]}: grade every shard with "
                             "the same release")
        for s in g["students"]:
            if s["student"] in seen:
                raise ClassError(f"student {s['student']!r} is in both {seen[s['student']]} and {o}")
            seen[s["student"]] = o
    stems = sorted({n for _, g in parts for n in g["settings"]["notebooks"]}, key=lambda s: (s[:2], s))
    exercises = course_exercises(stems)                        # the whole class's, as one run would have
    chapters = sorted({n.split(".")[0] for n in exercises})
    students = sorted((s for _, g in parts for s in g["students"]), key=lambda s: s["student"])
    for st in students:                                        # a shard may lack a notebook the class has
        st["exercises"] = {n: st["exercises"].get(n, {"earned": 0, "status": "missing"}) for n in exercises}
        st["total"] = sum(v["earned"] for v in st["exercises"].values())
        st["possible"] = sum(REGISTRY[n].points for n in exercises)
        st["chapters"] = {ch: sum(v["earned"] for n, v in st["exercises"].items() if n.startswith(ch + "."))
                          for ch in chapters}
        st["missing_notebooks"] = sorted(set(stems) - {nb["notebook"] for nb in st["notebooks"]})
    settings = {**first["settings"], "shard": None, "merged": [str(o) for o, _ in parts], "notebooks": stems}
    grades = {**first, "settings": settings, "students": students,
              "exercises": [{"id": n, "chapter": n.split(".")[0], "points": REGISTRY[n].points} for n in exercises],
              "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    Path(out).mkdir(parents=True, exist_ok=True)
    overrides = [o for _, g in parts for o in g.get("overrides", [])]
    finish(Path(out), grades, {}, lms, roster, log, first["settings"].get("weights"), overrides)
    log(summary(grades))
    return grades


def _reload(path: Path) -> Journal:
    j = Journal(path)
    j.close()
    return j


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
