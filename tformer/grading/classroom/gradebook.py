"""The gradebook: what a class's grading records and writes, and the teacher's say over it.

    Journal          OUT/journal.jsonl, one line per graded notebook as it finishes (resume after kill -9)
    build_grades     the journal -> grades.json's content: every student, notebook and exercise, with seeds
    score            partial credit, the teacher's points and overrides, every total, then the late penalty
                     (late.py): the one place totals are computed
    read_weights, read_overrides    the teacher's files, checked line by line
    finish           writes OUT: grades.json, gradebook.csv, the feedback pages, report.html, the LMS file
    merge            the OUT folders of shards as one run over the class

An exercise whose notebook was not graded (NOT_GRADED: the sandbox failed, the grader failed) is blank in
gradebook.csv and the LMS files, and so are its chapter's and the student's totals: never a 0 that looks like a
grade. The summary names those notebooks and why, the cells flagged for review (scan.py), the notebooks their
time budget stopped, and the warnings the run gave.
"""
from __future__ import annotations

import csv
import datetime
import io
import json
import os
import threading
from pathlib import Path

from ..core import REGISTRY
from . import late
from .lms import NOT_GRADED, ungraded_chapters
from .notebooks import chapter_order, course_exercises, exercises_of
from .submissions import ClassError, Submission


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

    def done(self, student: str, stem: str, sha256: str, grader: str, lang: str = "en",
             exercises: str = "") -> dict | None:
        """The record of a notebook graded with this sha256, grader hash, teacher's exercises hash and language
        (messages), else None."""
        rec = self.records.get((student, stem))
        ok = (rec and rec.get("sha256") == sha256 and rec.get("grader") == grader and rec.get("lang", "en") == lang
              and rec.get("exercises_hash", "") == exercises)
        return rec if ok else None

    def graded(self, student: str, stem: str, sha256: str, grader: str, lang: str = "en") -> dict | None:
        """The record of a notebook graded with this sha256, grader hash and language, whatever the teacher's
        files were (--only keeps its other verdicts), else None."""
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


def build_grades(subs: list[Submission], journal: Journal, settings: dict, grader: str,
                 failures: dict | None = None) -> dict:
    """grades.json's content: every student, notebook and exercise, with hashes and seeds. The notebooks graded
    are `settings["notebooks"]` (an assignment's, in its order, or whatever the class handed in); a notebook
    outside them is listed as extra. `failures`: (student, stem) -> (status, why) of notebooks not graded."""
    import torch
    import tformer
    stems = settings["notebooks"]
    exercises = course_exercises(stems, ordered=settings.get("assignment") is not None)
    students = []
    for sub in subs:
        status = {n: "missing" for n in exercises}
        fraction: dict[str, float | None] = {}
        notebooks, problems, ungraded = [], [], []
        for stem in [s for s in stems if s in sub.notebooks]:
            rec = journal.records.get((sub.student, stem))
            chosen = {"ignored": sub.ignored.get(stem, []), "chosen_by": sub.chosen_by.get(stem, ""),
                      "canvas_late": stem in sub.late}
            if rec is None or rec.get("grader") != grader:        # not graded by this grader: say so
                state, why = (failures or {}).get((sub.student, stem), ("not graded", "not graded (the run was interrupted?)"))
                problems.append(stem)
                ungraded.append({"notebook": stem, "why": why})
                notebooks.append({"notebook": stem, "file": os.path.relpath(sub.notebooks[stem], sub.folder),
                                  "sha256": "", "status": state, **chosen,
                                  "seconds": 0.0, "cells": 0, "cells_run": [], "cells_edited": [],
                                  "cell_errors": [why], "exercises": [], "flags": [], "stopped": ""})
                continue
            rep = rec["report"]
            for row in rep["rows"]:
                status[row["exercise"]] = row["status"]
                fraction[row["exercise"]] = row.get("fraction")
            if rec["status"] != "graded":
                problems.append(stem)
            notebooks.append({"notebook": stem, "file": os.path.relpath(rec["file"], sub.folder), "sha256": rec["sha256"],
                              "status": rec["status"], **chosen,
                              "seconds": round(rep.get("seconds", 0.0), 2), "cells": rec.get("cells", 0),
                              "cells_run": rec.get("run", []), "cells_edited": rec.get("edited", []),
                              "cell_errors": rep["cell_errors"], "exercises": rep["rows"],
                              "flags": rep.get("flags", []), "stopped": rep.get("stopped", ""),
                              "stub_rule": rec.get("stub_rule", "")})
        for u in ungraded:                                        # a blank in gradebook.csv and the LMS files
            for n in exercises_of(Path(u["notebook"] + ".ipynb")):
                if status.get(n) == "missing":
                    status[n] = NOT_GRADED
        students.append({                                         # earned, total, possible, chapters: score()'s
            "student": sub.student, "canvas_id": sub.canvas_id, "total": 0, "possible": 0, "chapters": {},
            "exercises": {n: {"earned": 0, "status": status[n], **({"fraction": fraction[n]}
                                                                     if fraction.get(n) is not None else {})}
                          for n in exercises},
            "notebooks": notebooks, "missing_notebooks": [s for s in stems if s not in sub.notebooks],
            "extra_notebooks": sorted(s for s in sub.notebooks if s not in stems),
            "unrecognized_files": sub.unrecognized, "notebooks_with_errors": problems, "warnings": sub.warnings(),
            "not_graded": ungraded,
            "submitted": sub.submitted})
    return {"grader": grader, "tformer": getattr(tformer, "__version__", ""), "torch": torch.__version__,
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "settings": settings,
            "exercises": [exercise_entry(n) for n in exercises],
            "students": students}


def exercise_entry(name: str) -> dict:
    """grades.json's entry for an exercise or a question (its `entry()`)."""
    return REGISTRY[name].entry()


def class_warnings(grades: dict) -> list[str]:
    """What a teacher must look at before trusting the gradebook: files no evidence chose between, and (without
    an assignment) notebooks fewer than half the class handed in, which set everyone's `possible`."""
    st = grades["students"]
    warnings = [w for s in st for w in s.get("warnings", [])]
    if grades["settings"].get("assignment") is None and len(st) > 1:
        for stem in grades["settings"]["notebooks"]:
            n = sum(stem in {nb["notebook"] for nb in s["notebooks"]} for s in st)
            if n < len(st) / 2:
                warnings.append(f"{stem} was handed in by {n} of {len(st)} students, and everyone is graded out of "
                                f"its points: say what was assigned with --assignment FILE")
    return warnings


def gradebook_rows(grades: dict) -> list[list]:
    """gradebook.csv as rows: the header, then one row per student. An exercise not graded is blank, never 0,
    and so are its chapter's total and the student's total (and the late columns): they would not be grades."""
    ids = [e["id"] for e in grades["exercises"]]
    chapters = sorted({e["chapter"] for e in grades["exercises"]})
    late = ["late_days", "penalty", "final"] if grades["settings"].get("late") else []
    rows = [["student", *ids, *chapters, "total", "possible", *late]]
    for s in grades["students"]:
        blank = ungraded_chapters(s)
        rows.append([s["student"],
                     *("" if s["exercises"][n].get("status") == NOT_GRADED and "override" not in s["exercises"][n]
                       else s["exercises"][n]["earned"] for n in ids),
                     *("" if c in blank else s["chapters"][c] for c in chapters),
                     "" if blank else s["total"], s["possible"], *("" if blank else s[k] for k in late)])
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
    whole = [s for s in st if not s.get("not_graded")]          # a total with a notebook not graded is no grade
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    if whole:
        mean = sum(s["total"] for s in whole) / len(whole)
        over = f" (of the {len(whole)} graded in full)" if len(whole) < len(st) else ""
        lines.append(f"{len(st)} student(s) graded{took}; mean score {mean:.1f}/{possible} "
                     f"({100 * mean / possible:.0f}%){over}")
    else:
        lines.append(f"{len(st)} student(s){took}; no mean score: no student's notebooks were all graded")
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
    from .sandbox import lost_guarantees
    lost = lost_guarantees(grades.get("settings", {}).get("isolation") or {})
    if lost:
        lines.append("isolation: the workers ran without " + "; ".join(lost))
    ungraded = [(s["student"], u) for s in st for u in s.get("not_graded", [])]
    if ungraded:
        lines.append(f"{len(ungraded)} notebook(s) not graded (blank in gradebook.csv and the LMS files, not 0; the "
                     f"next run tries again):")
        lines += [f"  not graded: {student}/{u['notebook']}: {u['why']}" for student, u in ungraded[:20]]
        if len(ungraded) > 20:
            lines.append(f"  ... and {len(ungraded) - 20} more (grades.json)")
    failure = grades["settings"].get("sandbox_failure")
    if failure:
        lines.append(f"the sandbox failed: {failure}")
    flagged = [f"{s['student']}/{nb['notebook']}: {f}" for s in st for nb in s["notebooks"] for f in nb.get("flags", [])]
    if flagged:
        lines.append(f"{len(flagged)} cell(s) reach into the grader (grades unchanged; a scan names the obvious, it "
                     f"proves nothing either way):")
        lines += [f"  flagged for review: {f}" for f in flagged[:20]]
        if len(flagged) > 20:
            lines.append(f"  ... and {len(flagged) - 20} more (grades.json: each notebook's flags)")
    stopped = [f"{s['student']}/{nb['notebook']}: {nb['stopped']}" for s in st for nb in s["notebooks"]
               if nb.get("stopped")]
    if stopped:
        lines.append(f"{len(stopped)} notebook(s) stopped by their time budget (--notebook-timeout), graded from what "
                     f"they finished: " + ", ".join(stopped[:10]) + (", ..." if len(stopped) > 10 else ""))
    stubs = sum(1 for s in st for nb in s["notebooks"] for x in nb["exercises"] if x.get("stub"))
    if stubs:
        lines.append(f"{stubs} exercise(s) handed in as the released stub: 0 points whatever the notebook's process "
                     f"reported")
    rule = grades["settings"].get("stub_rule") or {}
    if rule.get("not_applied"):
        lines.append(f"the released-stub rule was not applied to {', '.join(rule['not_applied'])}: "
                     f"{rule.get('why', 'no released notebook found')}")
    if grades["settings"].get("network_warning"):
        lines.append(f"warning: {grades['settings']['network_warning']}")
    for w in grades.get("warnings", []):
        lines.append(f"warning: {w}")
    extra = [s for s in st if s.get("extra_notebooks")]
    if extra:
        lines.append(f"{len(extra)} student(s) handed in notebooks outside the assignment (listed as extra, not "
                     f"graded): " + ", ".join(f"{s['student']} ({', '.join(s['extra_notebooks'])})" for s in extra[:5])
                     + (", ..." if len(extra) > 5 else ""))
    similar = grades.get("similar") or {}
    if similar.get("pairs") or similar.get("reference"):
        lines.append(f"answers that look alike: {len(similar.get('pairs', []))} pair(s); equal to the published "
                     f"solution: {len(similar.get('reference', []))} (report.html; grades unchanged)")
    return "\n".join(lines)


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
            raise ClassError(f"{path}:{n}: no exercise or question named {name!r} (e.g. ch01.attention)")
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
                raise ClassError(f"{path}:{n}: no exercise or question named {row['exercise']!r}")
            try:
                points = int(row["points"])
            except ValueError:
                raise ClassError(f"{path}:{n}: points must be a whole number, got {row['points']!r}") from None
            rows.append({"student": row["student"], "exercise": row["exercise"], "points": points,
                         "reason": row["reason"].strip()})
    return rows


def _number(value: float, digits: int) -> int | float:
    """A points figure as the gradebook writes it: a whole number as an int (3, not 3.0), else rounded."""
    value = round(value, digits)
    return int(value) if float(value).is_integer() else value


def earned(points: int, x: dict, digits: int = 2) -> int | float:
    """What an exercise earns: all its points when passed; with partial credit (`fraction`, the share of its
    groups of cases passed) that share of them, rounded to `digits`; else 0."""
    if x.get("status") == "passed":
        return points
    if x.get("fraction"):
        return _number(points * x["fraction"], digits)
    return 0


def score(grades: dict, weights: dict[str, int] | None = None, overrides: list[dict] | None = None) -> None:
    """Reweight the exercises (a passed exercise earns its weight), apply the manual overrides, then compute
    every total, chapter total and `possible`, and last the late penalty (late.py: `penalty`, `final`), in
    place: the one place totals are computed. The order: the autograde, partial credit, the points, the
    overrides, the late penalty. The autograde's status stays beside an override."""
    weights, overrides = weights or {}, overrides or []
    for x in grades["exercises"]:
        x["points"] = weights.get(x["id"], x["points"])
    points = {x["id"]: x["points"] for x in grades["exercises"]}
    by_student = {s["student"]: s for s in grades["students"]}
    unknown = sorted({o["student"] for o in overrides} - set(by_student))
    if unknown:
        raise ClassError(f"overrides name students not in the class: {', '.join(unknown)}")
    digits = int((grades["settings"].get("assignment") or {}).get("round", 2))
    for s in grades["students"]:
        for n, x in s["exercises"].items():
            x["earned"] = earned(points[n], x, digits)
            x.pop("override", None)
        for nb in s["notebooks"]:
            for x in nb["exercises"]:
                x["points"] = points.get(x["exercise"], x["points"])
                x["earned"] = earned(x["points"], x, digits)
    for o in overrides:
        x = by_student[o["student"]]["exercises"].get(o["exercise"])
        if x is None:
            raise ClassError(f"override for {o['student']}: {o['exercise']} is not an exercise of this class")
        x["earned"], x["override"] = o["points"], {"points": o["points"], "reason": o["reason"]}
    chapters = sorted({x["chapter"] for x in grades["exercises"]})
    for s in grades["students"]:
        s["total"] = _number(sum(x["earned"] for x in s["exercises"].values()), digits)
        s["possible"] = sum(points.values())
        s["chapters"] = {ch: _number(sum(x["earned"] for n, x in s["exercises"].items() if n.startswith(ch + ".")),
                                     digits) for ch in chapters}
        if grades["settings"].get("late"):           # the late penalty comes last
            late.apply(s, grades["settings"]["late"], digits, _number)
        else:
            s["final"] = s["total"]
    grades["settings"]["weights"], grades["overrides"] = weights, overrides


def finish(out: Path, grades: dict, answers: dict, lms: str | None = None, roster: Path | None = None,
           log=print, weights: dict | None = None, overrides: list | None = None) -> None:
    """Add each student's answer records and the class's similar answers (a report; no grade changes) to
    `grades`, apply the teacher's weights and overrides, then write OUT: grades.json, gradebook.csv, the
    feedback pages, report.html and the LMS file `lms` names (lms.write_export: no other LMS file stays)."""
    from . import feedback, lms as lms_files, similarity
    score(grades, weights, overrides)
    for s in grades["students"]:
        s["answers"] = answers.get(s["student"], s.get("answers", {}))
    grades["similar"] = similarity.flag_answers({s["student"]: s["answers"] for s in grades["students"]})
    grades["warnings"] = class_warnings(grades)
    write_outputs(out, grades)
    feedback.write_pages(out, grades)
    lms_file = lms_files.write_export(out, grades, lms, roster, log)
    written = ["gradebook.csv", "grades.json", "report.html", "feedback/"] + ([lms_file] if lms_file else [])
    log(f"wrote {', '.join(written)} in {out}")


def merge(outs: list[Path], out: Path, lms: str | None = None, roster: Path | None = None, log=print) -> dict:
    """Combine the grades.json of shards (`class grade --shard K/N` runs) into OUT, as one run over the whole
    class. The run each shard recorded (settings.Run.recorded: the assignment, the teacher's files, loaded again
    and checked against their hash, the points, the late rule, the limits that change a verdict) must be the
    same; a difference is a ClassError naming it."""
    from .settings import Run
    parts = []
    for o in outs:
        f = Path(o) / "grades.json"
        if not f.is_file():
            raise ClassError(f"{o} holds no grades.json (a folder written by tformer class grade CLASS --out)")
        parts.append((Path(o), json.loads(f.read_text(encoding="utf-8"))))
    first = parts[0][1]
    seen: dict[str, Path] = {}
    run = None
    for o, g in parts:
        if g["grader"] != first["grader"]:
            raise ClassError(f"{o} was graded by other grader code than {parts[0][0]}: grade every shard with "
                             "the same release")
        if g["settings"].get("exercises_hash", "") != first["settings"].get("exercises_hash", ""):
            raise ClassError(f"{o} was graded with other exercise files than {parts[0][0]}: grade every shard "
                             "with the same files")
        this = Run.recorded(g["settings"], g.get("overrides", []), where=str(Path(o) / "grades.json"))
        differ = run.differences(this) if run is not None else []
        if differ:
            raise ClassError(f"{o} was graded with another {', '.join(differ)} than {parts[0][0]}: grade every shard "
                             f"with the same assignment, files and settings")
        run = run or this
        for s in g["students"]:
            if s["student"] in seen:
                raise ClassError(f"student {s['student']!r} is in both {seen[s['student']]} and {o}")
            seen[s["student"]] = o
    if run.assignment is not None:
        stems = list(run.assignment.notebooks)
    else:
        stems = sorted({n for _, g in parts for n in g["settings"]["notebooks"]}, key=chapter_order)
    exercises = course_exercises(stems, ordered=run.assignment is not None)   # the whole class's, as one run's
    students = sorted((s for _, g in parts for s in g["students"]), key=lambda s: s["student"])
    for st in students:                                        # a shard may lack a notebook the class has
        st["exercises"] = {n: st["exercises"].get(n, {"earned": 0, "status": "missing"}) for n in exercises}
        st["missing_notebooks"] = [s for s in stems if s not in {nb["notebook"] for nb in st["notebooks"]}]
    settings = {**first["settings"], "shard": None, "merged": [str(o) for o, _ in parts], "notebooks": stems}
    grades = {**first, "settings": settings, "students": students,
              "exercises": [exercise_entry(n) for n in exercises],
              "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    Path(out).mkdir(parents=True, exist_ok=True)
    overrides = [o for _, g in parts for o in g.get("overrides", [])]
    finish(Path(out), grades, {}, lms, roster, log, run.points, overrides)
    log(summary(grades))
    return grades


def reload_journal(path: Path) -> Journal:
    j = Journal(path)
    j.close()
    return j
