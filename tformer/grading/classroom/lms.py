"""Grades into a learning-management system: one `Export` class per LMS, in EXPORTS by the name `--lms` takes.

    Canvas        OUT/canvas.csv, Canvas's gradebook import: one row per student (Student, ID, SIS User ID, SIS
                  Login ID, Section), one column per chapter, a "Points Possible" row first; its roster is
                  Canvas's gradebook export (read_roster, match, canvas_csv)
    Moodle        OUT/moodle.csv, Moodle's grade import: an identifier column (Email address or ID number), one
                  column per chapter (a grade item); its roster is a Moodle grades export or participants CSV
                  (read_moodle_roster, match_moodle, moodle_csv)
    write_export  the chosen export into OUT, and no other LMS file: one an earlier run left there is removed, and
                  an export with no row the LMS can import is not written; one line says each

A new LMS is one Export subclass in EXPORTS and its test.
"""
from __future__ import annotations

import csv
import io
import os
import re
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


NOT_GRADED = "not graded"   # an exercise whose notebook was not graded (sandbox failed, the grader's failure): blank


def ungraded_chapters(student: dict) -> set[str]:
    """The chapters of which some exercise was not graded (its notebook's sandbox failed, the grader failed):
    their totals are no grade, blank in gradebook.csv and the LMS files."""
    return {n.split(".")[0] for n, x in student["exercises"].items() if x.get("status") == NOT_GRADED}


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
    handed in is blank, not 0, so Canvas's missing-submission policy applies; gradebook.csv keeps 0. A chapter
    with an exercise not graded (its notebook's sandbox failed, the grader failed) is blank too, never 0."""
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
        handed = chapters_handed_in(s, stems) - ungraded_chapters(s)
        w.writerow([known.get("Student") or s["student"], known.get("ID") or uid, known.get("SIS User ID", ""),
                    known.get("SIS Login ID", ""), known.get("Section", "")]
                   + [s.get("chapters_final", s["chapters"])[c] if c in handed else "" for c in chapters])
    return buf.getvalue(), unmatched


# --- Moodle ----------------------------------------------------------------------------------------------------
#
# Moodle's CSV grade import (Grades > Import > CSV file; docs.moodle.org "Grade import", and its reader,
# grade/import/csv/classes/load_data.php): the teacher maps one column to the user field that identifies a row
# ("Map from" Email address to "useremail", or ID number to "useridnumber") and each other column to a grade item,
# or to "new grade item" named by its header. "-" is no grade, in an existing item and in a new one (a blank
# cell is no grade only in an existing one); a row whose user Moodle cannot find aborts the whole import, so
# moodle.csv holds only the students it can identify, and lists the others.

MOODLE_FIELDS = {"email": ("email address", "email"), "idnumber": ("id number", "idnumber"),
                 "username": ("username",), "name": ("full name", "fullname", "name")}
MOODLE_FIRST, MOODLE_LAST = ("first name", "firstname"), ("last name", "surname", "lastname")
MOODLE_HEADER = {"email": "Email address", "idnumber": "ID number"}
# a folder of Moodle's "Download all submissions" (in folders): "Ada Lovelace_4101_assignsubmission_file_"
_MOODLE_FOLDER = re.compile(r"^(?P<name>.+?)_\d+_assignsubmission_[a-z]+_?$")


def read_moodle_roster(path: Path) -> list[dict]:
    """Moodle's grades export (Grades > Export > Plain text file) or the participants page's CSV download, as rows
    {"email", "idnumber", "username", "name"} (any of them may be ""). ValueError (one line) when the file has
    neither an Email address nor an ID number column: nothing in it could identify a student to Moodle."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 (export it from Moodle with the UTF-8 encoding)") from None
    try:
        dialect = csv.Sniffer().sniff(text.split("\n", 1)[0], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(io.StringIO(text), dialect)
    head = [h.strip().casefold() for h in next(reader, [])]

    def column(names) -> int | None:
        return next((head.index(n) for n in names if n in head), None)
    at = {k: column(names) for k, names in MOODLE_FIELDS.items()}
    first, last = column(MOODLE_FIRST), column(MOODLE_LAST)
    if at["email"] is None and at["idnumber"] is None:
        raise ValueError(f"{path}: no \"Email address\" or \"ID number\" column (Moodle: Grades > Export > Plain "
                         f"text file, or the participants page's CSV download, gives one)")
    rows = []
    for r in reader:
        def get(i):
            return r[i].strip() if i is not None and i < len(r) else ""
        name = get(at["name"]) or " ".join(x for x in (get(first), get(last)) if x)
        row = {"email": get(at["email"]), "idnumber": get(at["idnumber"]), "username": get(at["username"]),
               "name": name}
        if row["email"] or row["idnumber"]:
            rows.append(row)
    return rows


def match_moodle(roster: list[dict], student: str) -> dict | None:
    """The roster row of a student, as `match` finds a Canvas row: the student's id (a folder's name) as the
    row's email, ID number, username or exact name (a Moodle download's folder by the name in it), the first
    of these that one row alone has."""
    key = student.strip()
    m = _MOODLE_FOLDER.match(key)
    for field, value in (("email", key), ("idnumber", key), ("username", key), ("name", m["name"] if m else key)):
        found = [r for r in roster if r.get(field) and r[field].casefold() == value.casefold()]
        if len(found) == 1:
            return found[0]
    return None


def moodle_csv(grades: dict, roster: list[dict] | None = None,
               column: str = "tformer {chapter}") -> tuple[str, list[tuple[str, str]]]:
    """(Moodle's grade import, [(student, why) left out of it]). An identifier column, then one grade item per
    chapter (`column`; a name Moodle does not know becomes a new grade item on import). With a roster the
    identifier is the matched row's email (its ID number where the roster lacks emails); without one it is the
    student's id, as "Email address" when every id is one, else "ID number". A chapter none of whose assigned
    notebooks the student handed in is "-" (Moodle's no grade), as canvas.csv leaves it blank; so is a chapter
    with an exercise not graded."""
    chapters = sorted({x["chapter"] for x in grades["exercises"]})
    stems = grades["settings"]["notebooks"]
    students, left = [], []
    for s in grades["students"]:
        row = match_moodle(roster, s["student"]) if roster is not None else None
        if roster is not None and row is None:
            left.append((s["student"], "matches no row of the roster (by email, ID number, username or name)"))
        elif roster is None and _MOODLE_FOLDER.match(s["student"]):
            left.append((s["student"], "a Moodle download's folder name: give --roster (a Moodle grades export) to "
                                       "find the student's email"))
        else:
            students.append((s, row))
    if roster is not None:
        emails = sum(bool(r["email"]) for _, r in students)
        field = "email" if emails >= sum(bool(r["idnumber"]) for _, r in students) else "idnumber"
    else:
        field = "email" if students and all("@" in s["student"] for s, _ in students) else "idnumber"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([MOODLE_HEADER[field]] + [column.format(chapter=c) for c in chapters])
    for s, row in students:
        ident = row[field] if row is not None else s["student"]
        if not ident:
            left.append((s["student"], f"has no {MOODLE_HEADER[field]} in the roster"))
            continue
        handed = chapters_handed_in(s, stems) - ungraded_chapters(s)
        w.writerow([ident] + [s.get("chapters_final", s["chapters"])[c] if c in handed else "-" for c in chapters])
    return buf.getvalue(), left


# --- one interface ---------------------------------------------------------------------------------------------

class Export:
    """One LMS's grade import: `--lms name` writes OUT/`file`, its columns named by the assignment's [lms]
    `column_key`, its students matched to the rows of `--roster`. A subclass sets the names and gives
    read_roster and csv."""
    name = title = file = column_key = ""
    left_out = ""                                     # what the LMS does with a student the file cannot match

    def __init__(self, roster: Path | None = None):
        self.path = roster
        self.roster = self.read_roster(roster) if roster else None

    def read_roster(self, path: Path):
        """The --roster file as this LMS's rows; ValueError (one line) when it cannot be one."""
        raise NotImplementedError

    def csv(self, grades: dict, column: str) -> tuple[str, list[tuple[str, str]]]:
        """(the file's text, [(student, why) the LMS will not import])."""
        raise NotImplementedError


class Canvas(Export):
    name, title, file, column_key = "canvas", "Canvas", "canvas.csv", "canvas_column"
    left_out = "Canvas will not import that row"

    def read_roster(self, path: Path) -> dict[str, dict]:
        return read_roster(path)

    def csv(self, grades: dict, column: str) -> tuple[str, list[tuple[str, str]]]:
        text, unmatched = canvas_csv(grades, self.roster, column)
        why = f"matches no row of {self.path} (by SIS Login ID, SIS User ID, Canvas ID or name)"
        return text, [(student, why) for student in unmatched]


class Moodle(Export):
    name, title, file, column_key = "moodle", "Moodle", "moodle.csv", "moodle_column"
    left_out = "left out of moodle.csv (Moodle refuses a whole file with a row it cannot match)"

    def read_roster(self, path: Path) -> list[dict]:
        return read_moodle_roster(path)

    def csv(self, grades: dict, column: str) -> tuple[str, list[tuple[str, str]]]:
        return moodle_csv(grades, self.roster, column)


EXPORTS: dict[str, type[Export]] = {"canvas": Canvas, "moodle": Moodle}


def write_export(out: Path, grades: dict, name: str | None, roster: Path | None = None, log=print) -> str | None:
    """Write the export `name` (None: none) into OUT; return its file name, None when none was written. Every
    other LMS file in OUT is removed, and so is this one's when it is not written (no student row the LMS can
    import): OUT holds only what this run computed. One line for each file removed or not written."""
    text, file = None, None
    if name is not None:
        export = EXPORTS[name](roster)
        text = _build(export, grades, log)
        file = export.file if text is not None else None
    for other in EXPORTS.values():
        stale = Path(out) / other.file
        if other.file != file and stale.exists():
            stale.unlink()
            log(f"tformer class: removed {stale}: an earlier run wrote it, and this run's grades are not in it")
    if file is not None:
        tmp = Path(out) / (file + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, Path(out) / file)
    return file


def _build(export: Export, grades: dict, log) -> str | None:
    """The export's text, each student it leaves out named in one line; None (said in one line) when it has no
    student row the LMS can import."""
    column = (grades["settings"].get("assignment") or {}).get(export.column_key, "tformer {chapter}")
    text, left = export.csv(grades, column)
    n = len(grades["students"])
    if len(left) < n:
        for student, why in left:
            log(f"tformer class: {student} {why}: {export.left_out}")
        return text
    example = f"; e.g. {left[0][0]} {left[0][1]}" if left else ""
    log(f"tformer class: {export.file} not written: none of the {n} student(s) has a row {export.title} can "
        f"import{example}")
    return None
