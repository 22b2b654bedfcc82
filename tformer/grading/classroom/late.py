"""Due dates and late days: the assignment's `due` and `[late]` rule, applied last, after the autograde,
partial credit, the assignment's points and the overrides (gradebook.score).

    due = 2026-12-01T23:59:00+01:00        # a TOML offset date-time
    [late]
    per_day = 0.1            # the share of a notebook's earned points lost per started day late
    max_days = 5             # later than this (after grace days) the notebook scores 0
    grace_days = 2           # free days per student, counted per assignment
    canvas_late_days = 1     # the days Canvas's LATE mark counts for when no submission time is known

A student's submission time comes from `--submitted CSV` (student,submitted: an ISO time), else from nbgrader's
`timestamp.txt` in the student's folder (`%Y-%m-%d %H:%M:%S.%f %Z` or `%Y-%m-%d %H:%M:%S %Z`: nbgrader writes `%Z` of
its configured zone, so the zone is UTC, an offset, an IANA name or an abbreviation of ZONES; an ambiguous
abbreviation such as CST or IST is refused in one line, never guessed). Without a
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
TIMESTAMP_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")      # then a zone (nbgrader's %Z)
# the zone abbreviations nbgrader writes (`%Z` of its `timezone` setting) that name one offset, in hours
ZONES = {"UTC": 0, "GMT": 0, "UT": 0, "Z": 0, "WET": 0, "WEST": 1, "BST": 1, "CET": 1, "CEST": 2, "MET": 1,
         "MEST": 2, "EET": 2, "EEST": 3, "MSK": 3, "EST": -5, "EDT": -4, "CDT": -5, "MST": -7, "MDT": -6, "PST": -8,
         "PDT": -7, "AKST": -9, "AKDT": -8, "HST": -10, "NST": -3.5, "NDT": -2.5, "JST": 9, "KST": 9, "HKT": 8,
         "SGT": 8, "PHT": 8, "WIB": 7, "AWST": 8, "ACST": 9.5, "ACDT": 10.5, "AEST": 10, "AEDT": 11, "NZST": 12,
         "NZDT": 13, "SAST": 2, "WAT": 1, "CAT": 2, "EAT": 3, "BRT": -3, "ART": -3}
AMBIGUOUS = {"CST": "US Central (-6), China (+8) or Cuba (-5)", "IST": "India (+5:30), Ireland (+1) or Israel (+2)",
             "AST": "Atlantic (-4) or Arabia (+3)", "ADT": "Atlantic (-3) or Arabia (+4)"}


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


def _zone(name: str) -> datetime.tzinfo | None:
    """The zone nbgrader's `%Z` wrote: an abbreviation of ZONES, an offset (+0100, -05:30), an IANA name
    (Europe/Berlin); None if unknown. ValueError(why) for an ambiguous abbreviation."""
    import re
    import zoneinfo
    if name.upper() in AMBIGUOUS:
        raise ValueError(f"{name} may mean {AMBIGUOUS[name.upper()]}")
    if name.upper() in ZONES:
        return datetime.timezone(datetime.timedelta(hours=ZONES[name.upper()]))
    m = re.fullmatch(r"(?:UTC|GMT)?([+-])(\d{2}):?(\d{2})?", name, re.I)
    if m:
        minutes = int(m.group(2)) * 60 + int(m.group(3) or 0)
        return datetime.timezone(datetime.timedelta(minutes=minutes if m.group(1) == "+" else -minutes))
    try:
        return zoneinfo.ZoneInfo(name) if "/" in name else None
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def nbgrader_timestamp(folder: Path) -> str | None:
    """The submission time nbgrader's `timestamp.txt` in a student's folder records (ISO, with its offset), else
    None. ClassError (one line) for a time or zone that cannot be read without a guess."""
    f = Path(folder) / "timestamp.txt"
    if not f.is_file():
        return None
    text = f.read_text(encoding="utf-8", errors="replace").strip()
    stamp, _, zone = text.rpartition(" ")
    fix = "give the students' times with --submitted CSV (student,submitted: ISO times with their offset)"
    try:
        tz = _zone(zone)
    except ValueError as e:
        raise ClassError(f"{f}: the zone of {text[:60]!r} is ambiguous ({e}); {fix}") from None
    for fmt in TIMESTAMP_FORMATS:
        try:
            when = datetime.datetime.strptime(stamp, fmt)
        except ValueError:
            continue
        if tz is None:
            raise ClassError(f"{f}: unknown zone {zone[:20]!r} in {text[:60]!r} (known: UTC, an offset such as +0100, "
                             f"an IANA name such as Europe/Berlin, an abbreviation such as CET); {fix}")
        return when.replace(tzinfo=tz).isoformat()
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
