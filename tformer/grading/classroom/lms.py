"""Grades into a learning-management system: Canvas's gradebook import (`--lms canvas`), and Canvas's
gradebook export read as a roster (`--roster`).

    OUT/canvas.csv    one row per student (Student, ID, SIS User ID, SIS Login ID, Section), one column per
                      chapter, a "Points Possible" row first
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def read_roster(path: Path) -> dict[str, dict]:
    """Canvas's gradebook export (Grades > Export) as a roster: its Canvas user ID -> the row's first five
    columns. The export's "Points Possible" row and test students without an ID are skipped."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    roster = {}
    for r in rows:
        uid = (r.get("ID") or "").strip()
        if uid.isdigit():
            roster[uid] = {c: (r.get(c) or "").strip() for c in CANVAS_COLUMNS}
    return roster


def canvas_csv(grades: dict, roster: dict[str, dict] | None = None, assignment: str = "tformer {chapter}") -> str:
    """A Canvas gradebook import: the columns Student, ID, SIS User ID, SIS Login ID and Section, then one
    assignment column per chapter (a new column creates that assignment on import), a "Points Possible"
    row first. A student is matched by the roster's ID (Canvas's user id, also in the names of a Canvas bulk
    download) when the grades carry one, else only by the folder's name in Student."""
    chapters = sorted({x["chapter"] for x in grades["exercises"]})
    possible = {c: sum(x["points"] for x in grades["exercises"] if x["chapter"] == c) for c in chapters}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CANVAS_COLUMNS + [assignment.format(chapter=c) for c in chapters])
    w.writerow(["Points Possible", "", "", "", ""] + [possible[c] for c in chapters])
    for s in grades["students"]:
        uid = str(s.get("canvas_id") or "")
        known = (roster or {}).get(uid, {})
        w.writerow([known.get("Student") or s["student"], uid, known.get("SIS User ID", ""),
                    known.get("SIS Login ID", ""), known.get("Section", "")] + [s["chapters"][c] for c in chapters])
    return buf.getvalue()
