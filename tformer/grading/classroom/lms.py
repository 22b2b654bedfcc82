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


def match(roster: dict[str, dict], student: str, canvas_id: str = "") -> dict | None:
    """The roster row of a student: by Canvas's user id (a Canvas download carries it), else by the student's
    id (a folder's name) as the row's SIS Login ID, SIS User ID, Canvas ID or exact name, as Canvas's own
    import matches rows."""
    if canvas_id and canvas_id in roster:
        return roster[canvas_id]
    key = student.strip()
    for column in ("SIS Login ID", "SIS User ID", "ID", "Student"):
        found = [r for r in roster.values() if r.get(column) and r[column].casefold() == key.casefold()]
        if len(found) == 1:
            return found[0]
    return None


def chapters_handed_in(student: dict, notebooks: list[str]) -> set[str]:
    """The chapters ("ch11", a teacher's "w03") of which the student handed in at least one of the assigned
    `notebooks`: the chapters of the exercises those notebooks owe."""
    from .notebooks import exercises_of
    handed = {nb["notebook"] for nb in student["notebooks"]}
    return {ex.split(".")[0] for stem in notebooks if stem in handed for ex in exercises_of(Path(stem + ".ipynb"))}


def canvas_csv(grades: dict, roster: dict[str, dict] | None = None,
               column: str = "tformer {chapter}") -> tuple[str, list[str]]:
    """(a Canvas gradebook import, the students the roster did not match). The columns Student, ID, SIS User ID,
    SIS Login ID and Section, then one assignment column per chapter (`column`, a new name creates that
    assignment on import; the points after a late penalty), a "Points Possible" row first. A chapter none of whose assigned notebooks the student
    handed in is blank, not 0, so Canvas's missing-submission policy applies; gradebook.csv keeps 0."""
    chapters = sorted({x["chapter"] for x in grades["exercises"]})
    possible = {c: sum(x["points"] for x in grades["exercises"] if x["chapter"] == c) for c in chapters}
    stems = grades["settings"]["notebooks"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CANVAS_COLUMNS + [column.format(chapter=c) for c in chapters])
    w.writerow(["Points Possible", "", "", "", ""] + [possible[c] for c in chapters])
    unmatched = []
    for s in grades["students"]:
        uid = str(s.get("canvas_id") or "")
        known = match(roster, s["student"], uid) if roster is not None else None
        if roster is not None and known is None:
            unmatched.append(s["student"])
        known = known or {}
        handed = chapters_handed_in(s, stems)
        w.writerow([known.get("Student") or s["student"], known.get("ID") or uid, known.get("SIS User ID", ""),
                    known.get("SIS Login ID", ""), known.get("Section", "")]
                   + [s.get("chapters_final", s["chapters"])[c] if c in handed else "" for c in chapters])
    return buf.getvalue(), unmatched
