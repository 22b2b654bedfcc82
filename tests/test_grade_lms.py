"""Grades where the course is run: `tformer grade CLASS --out OUT --lms moodle` (Moodle's CSV grade import),
through the command as typed (a subprocess started in a folder outside the checkout), checked by the files it
wrote and its exit code."""
from __future__ import annotations

import csv
from concurrent.futures import ThreadPoolExecutor

from test_grade_cli import NO_SCALE, one_line_error, tformer, tiny


# --- Moodle ------------------------------------------------------------------------------------------------

MOODLE_EXPORT = ("First name,Last name,ID number,Institution,Department,Email address,"
                 "Assignment: Week 1 (Real),Last downloaded from this course\n"
                 "Ada,Lovelace,S-001,,,ada@uni.edu,-,1700000000\n"
                 "Bob,Babbage,S-002,,,bob@uni.edu,-,1700000000\n"
                 "Eve,Adams,S-005,,,eve@uni.edu,-,1700000000\n")


def test_moodle_csv_with_a_matched_and_an_unmatched_student(tmp_path):
    """--lms moodle --roster (a Moodle grades export): S-001 is matched by ID number, Bob's Moodle download folder
    by the name in it; both are identified by the roster's email. cy matches no row: listed on the terminal in
    one line and left out of moodle.csv (Moodle aborts a whole import on a row it cannot match). Nobody handed
    in chapter 2: "-", Moodle's no grade. A roster with no email or ID number column is one line and exit 2."""
    cls = tmp_path / "class"
    tiny(cls / "S-001")
    tiny(cls / "Bob Babbage_4102_assignsubmission_file_", NO_SCALE)
    tiny(cls / "cy")
    (tmp_path / "week1.toml").write_text('notebooks = ["01_attention", "02_self_attention"]\n', encoding="utf-8")
    (tmp_path / "moodle.csv").write_text(MOODLE_EXPORT, encoding="utf-8")
    (tmp_path / "canvas.csv").write_text("Student,ID,SIS User ID,SIS Login ID,Section\n", encoding="utf-8")
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(tformer, "grade", cls, "--out", tmp_path / "bad", "--lms", "moodle", "--roster",
                          tmp_path / "canvas.csv", cwd=tmp_path)
        proc = tformer("grade", cls, "--out", tmp_path / "out", "--assignment", tmp_path / "week1.toml",
                       "--lms", "moodle", "--roster", tmp_path / "moodle.csv", "--workers", 2, cwd=tmp_path)
    one_line_error(bad.result(), "--roster", "canvas.csv", "Email address", "ID number")
    assert not (tmp_path / "bad").exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.reader((tmp_path / "out" / "moodle.csv").open(encoding="utf-8")))
    assert rows == [["Email address", "tformer ch01", "tformer ch02"],
                    ["bob@uni.edu", "1", "-"],
                    ["ada@uni.edu", "4", "-"]], rows
    said = [line for line in proc.stdout.splitlines() if "moodle.csv" in line and "cy" in line]
    assert len(said) == 1 and "matches no row" in said[0], proc.stdout[-3000:]
    assert not [line for line in proc.stdout.splitlines() if "left out of moodle.csv" in line and "cy" not in line]
    assert "moodle.csv" in proc.stdout and not (tmp_path / "out" / "canvas.csv").exists()
