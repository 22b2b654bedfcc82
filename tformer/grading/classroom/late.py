"""Due dates and late days: the assignment's `due` and `[late]` rule, applied last, after the autograde,
partial credit, the assignment's points and the overrides (gradebook.score).

    due = 2026-12-01T23:59:00+01:00        # a TOML offset date-time
    [late]
    per_day = 0.1            # the share of a notebook's earned points lost per started day late
    max_days = 5             # later than this (after grace days) the notebook scores 0
    grace_days = 2           # free days per student, counted per assignment
    canvas_late_days = 1     # the days Canvas's LATE mark counts for when no submission time is known

A student's submission time comes from `--submitted CSV` (student,submitted: an ISO time), else from nbgrader's
`timestamp.txt` in the student's folder (`%Y-%m-%d %H:%M:%S.%f %Z` or `%Y-%m-%d %H:%M:%S %Z`, UTC). Without a
time, a notebook Canvas marked LATE counts `canvas_late_days`. `--extensions CSV` (student,due) moves a
student's due date.
"""
from __future__ import annotations

import csv
import datetime
import math
from pathlib import Path

from .submissions import ClassError

RULE = {"per_day": float, "max_days": int, "grace_days": int, "canvas_late_days": int}
DEFAULTS = {"per_day": 0.0, "max_days": 0, "grace_days": 0, "canvas_late_days": 1}
TIMESTAMP_FORMATS = ("%Y-%m-%d %H:%M:%S.%f %Z", "%Y-%m-%d %H:%M:%S %Z")


def read_rule(table: object, where: str) -> dict:
    """The `[late]` table, checked key by key (ClassError naming the key)."""
    if not isinstance(table, dict):
        raise ClassError(f"{where}: [late] must be a table (per_day, max_days, grace_days, canvas_late_days)")
    unknown = sorted(set(table) - set(RULE))
    if unknown:
        raise ClassError(f"{where}: [late]: unknown key {unknown[0]!r} (known: {', '.join(RULE)})")
    rule = dict(DEFAULTS)
    for key, value in table.items():
        kind = RULE[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise ClassError(f"{where}: [late]: {key} must be {'a whole number' if kind is int else 'a number'}, "
                             f"got {value!r}")
        if value < 0 or (key == "per_day" and value > 1):
            raise ClassError(f"{where}: [late]: {key} must be {'between 0 and 1' if key == 'per_day' else '>= 0'}, "
                             f"got {value!r}")
        rule[key] = kind(value)
    return rule


def aware(when: datetime.datetime) -> datetime.datetime:
    """A time with a zone (a naive one is UTC)."""
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def parse_time(text: str, where: str) -> datetime.datetime:
    """An ISO time ("2026-12-01T23:59:00+01:00"; without a zone, UTC); ClassError naming `where` otherwise."""
    try:
        return aware(datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00")))
    except ValueError:
        raise ClassError(f"{where}: expected an ISO time such as 2026-12-01T23:59:00+01:00, got {text!r}") from None


def read_times(path: Path, column: str) -> dict[str, str]:
    """A CSV of `student,<column>` ISO times (--submitted, --extensions) as {student: ISO time, UTC}."""
    out = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not {"student", column} <= set(reader.fieldnames or []):
            raise ClassError(f"{path}: expected the columns student,{column}")
        for n, row in enumerate(reader, 2):
            out[row["student"].strip()] = parse_time(row[column], f"{path}:{n}").isoformat()
    return out


def nbgrader_timestamp(folder: Path) -> str | None:
    """The submission time nbgrader's `timestamp.txt` in a student's folder records (ISO, UTC), else None."""
    f = Path(folder) / "timestamp.txt"
    if not f.is_file():
        return None
    text = f.read_text(encoding="utf-8", errors="replace").strip()
    for fmt in TIMESTAMP_FORMATS:
        try:
            return aware(datetime.datetime.strptime(text, fmt)).isoformat()
        except ValueError:
            continue
    raise ClassError(f"{f}: not an nbgrader timestamp (e.g. 2026-12-01 23:59:00.123456 UTC), got {text[:60]!r}")


def days_late(submitted: str | None, due: str) -> int:
    """Started days after `due` (0 when on time or unknown)."""
    if not submitted:
        return 0
    seconds = (datetime.datetime.fromisoformat(submitted) - datetime.datetime.fromisoformat(due)).total_seconds()
    return max(0, math.ceil(seconds / 86400))


def share_lost(days: int, rule: dict) -> float:
    """The share of a notebook's earned points lost at `days` late after grace days: per_day a started day, all
    of it past max_days."""
    days = max(0, days - rule["grace_days"])
    if days == 0:
        return 0.0
    if rule["max_days"] and days > rule["max_days"]:
        return 1.0
    return min(1.0, rule["per_day"] * days)


def apply(student: dict, late: dict, digits: int, number) -> None:
    """Add `late_days`, `penalty` and `final` (and `chapters_final`) to a scored student, in place. `late` is
    grades.json's settings.late: due, the rule, the students' submission times and extensions."""
    rule = late["rule"]
    due = late["extensions"].get(student["student"], late["due"])
    known = late["submitted"].get(student["student"]) or student.get("submitted")
    days = days_late(known, due)
    lost = {}                                         # exercise -> the share of its points lost
    counted = 0
    for nb in student["notebooks"]:
        nb_days = days if known else (rule["canvas_late_days"] if nb.get("canvas_late") else 0)
        counted = max(counted, nb_days)
        for x in nb["exercises"]:
            lost[x["exercise"]] = share_lost(nb_days, rule)
    penalty = {n: x["earned"] * lost.get(n, 0.0) for n, x in student["exercises"].items()}
    student["late_days"] = counted
    student["grace_days_used"] = min(counted, rule["grace_days"])
    student["penalty"] = number(sum(penalty.values()), digits)
    student["final"] = number(student["total"] - sum(penalty.values()), digits)
    student["chapters_final"] = {ch: number(v - sum(p for n, p in penalty.items() if n.startswith(ch + ".")), digits)
                                 for ch, v in student["chapters"].items()}
