"""Due dates and late days, as typed: the assignment's `due` and `[late]` rule applied after everything else,
with submission times from nbgrader's timestamp.txt (both of its forms), from --submitted, moved by
--extensions, from Canvas's LATE mark, and grace days. The class is graded once; each rule after that reuses
its journal (the late rule changes no verdict, so nothing is graded again)."""
from __future__ import annotations

import csv
import json
import shutil

import pytest

from test_grade_cli import one_line_error, tformer, tiny

RULE = ('notebooks = ["01_attention"]\ndue = 2026-12-01T23:59:00Z\n\n'
        "[late]\nper_day = 0.1\nmax_days = 3\ngrace_days = 1\ncanvas_late_days = 3\n")


@pytest.fixture(scope="module")
def late_class(tmp_path_factory):
    """Five students, each with the solved chapter-1 notebook (4 points): ann's timestamp.txt 1 day 10 hours
    late (nbgrader's form with microseconds), ben's 31 minutes late (without; written in CET, the zone of the
    teacher's nbgrader), cat has none (her time comes
    from --submitted), dan is 2 days late with an extension, eve 6 days late."""
    root = tmp_path_factory.mktemp("late")
    cls = root / "class"
    for student, stamp in (("ann", "2026-12-03 10:00:00.123456 UTC"), ("ben", "2026-12-02 01:30:00 CET"),
                           ("cat", None), ("dan", "2026-12-03 12:00:00 UTC"), ("eve", "2026-12-07 09:00:00 UTC")):
        tiny(cls / student)
        if stamp:
            (cls / student / "timestamp.txt").write_text(stamp + "\n")
    (root / "week1.toml").write_text(RULE, encoding="utf-8")
    (root / "submitted.csv").write_text("student,submitted\ncat,2026-12-05T00:00:00+00:00\n")
    (root / "extensions.csv").write_text("student,due\ndan,2026-12-04T00:00:00+00:00\n")
    out = root / "out"
    proc = tformer("class", "grade", cls, "--out", out, "--assignment", root / "week1.toml", "--submitted",
                   root / "submitted.csv", "--extensions", root / "extensions.csv", "--lms", "canvas",
                   "--workers", 2, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, cls, out


def book(out):
    head, *body = list(csv.reader((out / "gradebook.csv").open(encoding="utf-8")))
    return head, {r[0]: dict(zip(head, r)) for r in body}


def test_the_late_rule_comes_last(late_class):
    root, cls, out = late_class
    head, b = book(out)
    assert head[-5:] == ["total", "possible", "late_days", "penalty", "final"]
    got = {s: (b[s]["total"], b[s]["late_days"], b[s]["penalty"], b[s]["final"]) for s in b}
    assert got == {
        "ann": ("7", "2", "0.7", "6.3"),      # 2 started days, 1 of them grace: 10%
        "ben": ("7", "1", "0", "7"),          # 1 day, the grace day covers it
        "cat": ("7", "4", "2.1", "4.9"),      # --submitted: 4 days, 3 after grace: 30%
        "dan": ("7", "0", "0", "7"),          # --extensions moved his due date past his time
        "eve": ("7", "6", "7", "0"),          # 5 days after grace, past max_days: 0
    }, got
    canvas = {r[0]: r for r in csv.reader((out / "canvas.csv").open(encoding="utf-8"))}
    assert canvas["ann"][5] == "6.3" and canvas["eve"][5] == "0"                 # Canvas gets the final points
    page = (out / "feedback" / "ann.html").read_text(encoding="utf-8")
    assert "2 day(s) late (1 grace day(s) used): 0.7 point(s) off, 6.3 in the end" in page
    assert "Late submissions" in (out / "report.html").read_text(encoding="utf-8")


def test_canvas_late_mark_counts_its_days(tmp_path):
    """No submission time in a Canvas download: a LATE mark counts canvas_late_days (3, 2 after grace: 20%)."""
    dl = tmp_path / "submissions"
    dl.mkdir()
    good = tiny(tmp_path / "g")
    shutil.copy(good, dl / "müllerjürgen_LATE_123_456_01_attention.ipynb")
    shutil.copy(good, dl / "张伟_124_457_01_attention.ipynb")
    (tmp_path / "week1.toml").write_text(RULE, encoding="utf-8")
    proc = tformer("class", "grade", dl, "--out", tmp_path / "out", "--assignment", tmp_path / "week1.toml", "--workers", 2,
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, b = book(tmp_path / "out")
    assert (b["müllerjürgen_123"]["penalty"], b["müllerjürgen_123"]["final"]) == ("1.4", "5.6")
    assert (b["张伟_124"]["penalty"], b["张伟_124"]["final"]) == ("0", "7")


def test_without_a_due_date_the_gradebook_is_unchanged(late_class, tmp_path):
    """The same class and journal without `due`: no late columns, totals as before (3, not 3.0)."""
    root, cls, out = late_class
    again = tmp_path / "out"
    again.mkdir()
    shutil.copy(out / "journal.jsonl", again / "journal.jsonl")
    (tmp_path / "plain.toml").write_text('notebooks = ["01_attention"]\n', encoding="utf-8")
    proc = tformer("class", "grade", cls, "--out", again, "--assignment", tmp_path / "plain.toml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, b = book(again)
    assert head[-2:] == ["total", "possible"] and b["eve"]["total"] == "7"
    assert json.loads((again / "grades.json").read_text())["settings"]["late"] is None


def test_late_rule_errors(late_class, tmp_path):
    root, cls, _ = late_class
    (tmp_path / "naive.toml").write_text('notebooks = ["01_attention"]\ndue = 2026-12-01T23:59:00\n')
    (tmp_path / "nodue.toml").write_text('notebooks = ["01_attention"]\n[late]\nper_day = 0.1\n')
    (tmp_path / "bad.toml").write_text('notebooks = ["01_attention"]\ndue = 2026-12-01T23:59:00Z\n[late]\nper_day = 2\n')
    (tmp_path / "plain.toml").write_text('notebooks = ["01_attention"]\n')
    (tmp_path / "when.csv").write_text("student,submitted\nann,yesterday\n")
    out = tmp_path / "o"
    one_line_error(tformer("class", "grade", cls, "--out", out, "--assignment", tmp_path / "naive.toml", cwd=tmp_path), "offset")
    one_line_error(tformer("class", "grade", cls, "--out", out, "--assignment", tmp_path / "nodue.toml", cwd=tmp_path), "due")
    one_line_error(tformer("class", "grade", cls, "--out", out, "--assignment", tmp_path / "bad.toml", cwd=tmp_path), "per_day")
    one_line_error(tformer("class", "grade", cls, "--out", out, "--assignment", tmp_path / "plain.toml", "--submitted",
                           root / "submitted.csv", cwd=tmp_path), "--submitted", "due date")
    one_line_error(tformer("class", "grade", cls, "--out", out, "--assignment", root / "week1.toml", "--submitted",
                           tmp_path / "when.csv", cwd=tmp_path), "ISO time", "yesterday")
    assert not out.exists()


@pytest.mark.parametrize("stamp,iso", [("2026-12-03 10:00:00.000000 CET", "2026-12-03T10:00:00+01:00"),
                                       ("2026-07-03 10:00:00 CEST", "2026-07-03T10:00:00+02:00"),
                                       ("2026-12-03 10:00:00 PST", "2026-12-03T10:00:00-08:00"),
                                       ("2026-12-03 10:00:00 +0530", "2026-12-03T10:00:00+05:30"),
                                       ("2026-12-03 10:00:00 Europe/Berlin", "2026-12-03T10:00:00+01:00"),
                                       ("2026-12-03 10:00:00.5 UTC", "2026-12-03T10:00:00.500000+00:00")])
def test_nbgraders_zones_are_read(tmp_path, stamp, iso):
    from tformer.grading.classroom.late import nbgrader_timestamp
    (tmp_path / "timestamp.txt").write_text(stamp + "\n")
    assert nbgrader_timestamp(tmp_path) == iso


@pytest.mark.parametrize("zone,words", [("CST", ("ambiguous", "China")), ("IST", ("ambiguous", "India")),
                                        ("XYZ", ("unknown zone", "'XYZ'"))])
def test_an_ambiguous_or_unknown_zone_is_refused_in_one_line(late_class, tmp_path, zone, words):
    root, cls, _ = late_class
    one = tmp_path / "class"
    shutil.copytree(cls / "ann", one / "ann")
    (one / "ann" / "timestamp.txt").write_text(f"2026-12-03 10:00:00 {zone}\n")
    out = tmp_path / "o"
    one_line_error(tformer("class", "grade", one, "--out", out, "--assignment", root / "week1.toml", cwd=tmp_path),
                   "timestamp.txt", "--submitted", *words)
    assert not out.exists()
