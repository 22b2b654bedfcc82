"""What a class's grading writes for people: each student's feedback page and the teacher's report.

    OUT/feedback/<student>.html   one page per student: each exercise's verdict and the checker's message
                                  (the smallest failing case, the named mistake; a question's title, the
                                  learner's answer and the misconception it names), the cells that raised
    OUT/report.html               the score distribution (an inline SVG figure), the pass rate per exercise,
                                  the named mistakes by count, the students whose notebooks errored or timed out

The pages are self-contained (no script, no font, no image file, no network) and read offline. Their labels
are in the class's language (`--lang zh`: Chinese, from the checker's catalog); the checker's messages are in
the language they were graded in, with the assignment's points where they state an exercise's (message_of: the
worker knows only the course's). Everything is built from grades.json's content (tformer/grading/classroom/run.py).
"""
from __future__ import annotations

import functools
import gettext
import html
import re
from collections import Counter
from pathlib import Path

from ..messages import LOCALE_DIR, _, language

_CSS = """body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;width:100%;margin:.5rem 0 1.5rem}
th,td{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}th{background:#f4f4f4}
pre{white-space:pre-wrap;margin:0;font:13px/1.4 ui-monospace,monospace}
.passed{color:#176f2c;font-weight:600}.failed,.error,.timeout{color:#b3261e;font-weight:600}
.bar{background:#4a7bd0;height:.8rem}.muted{color:#666}"""
_SAFE = re.compile(r"[^\w.\-]+")
_UNGRADED = ("invalid", "not graded", "sandbox failed")
# the checker's messages that state the points (core.py: an exercise passed; questions.py: a right answer). The
# worker knows the course's points only; the assignment's ([points], --weights) are grades.json's.
POINTS_MESSAGES = ("passed all {total} cases. {points} point(s).", "right ({answer}). {points} point(s).")


def _tag(tag: str, text: str, cls: str = "") -> str:
    """<tag class=cls>text</tag>, the text escaped."""
    attr = f" class='{cls}'" if cls else ""
    return f"<{tag}{attr}>{html.escape(text)}</{tag}>"


def _list(items: list[str], code: bool = False) -> str:
    return "<ul>" + "".join(f"<li>{f'<code>{html.escape(t)}</code>' if code else html.escape(t)}</li>"
                            for t in items) + "</ul>"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A table; the header is escaped here, the rows' cells are HTML already."""
    head = "".join(_tag("th", h) for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, body: str) -> str:
    lang = "zh-CN" if language() == "zh" else "en"
    return (f'<!DOCTYPE html>\n<html lang="{lang}"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n{_tag('h1', title)}\n{body}\n</body></html>\n")


def feedback_name(student: str) -> str:
    """The feedback file's name for a student id (characters a file system may refuse replaced)."""
    return (_SAFE.sub("_", student).strip("._") or "student") + ".html"


@functools.lru_cache(maxsize=1)
def _points_patterns() -> tuple[re.Pattern, ...]:
    """POINTS_MESSAGES in English and in Chinese (the catalog), each ending the text, the points their group."""
    zh = gettext.translation("tformer", localedir=str(LOCALE_DIR), languages=["zh_CN"], fallback=True)
    patterns = []
    for template in dict.fromkeys(t for m in POINTS_MESSAGES for t in (m, zh.gettext(m))):
        parts = re.split(r"\{(\w+)\}", template)          # text, name, text, name, ..., text
        regex = "".join(re.escape(p) if i % 2 == 0 else r"(?P<points>-?\d+(?:\.\d+)?)" if p == "points" else ".*"
                        for i, p in enumerate(parts))
        patterns.append(re.compile(regex + r"\Z", re.S))
    return tuple(patterns)


def message_of(x: dict, points: int | float) -> str:
    """An exercise row's message, with `points` (the assignment's) where a passed one states the course's."""
    message = x.get("message") or ""
    if x.get("status") != "passed":
        return message
    for pattern in _points_patterns():
        m = pattern.search(message)
        if m:
            shown = int(points) if float(points).is_integer() else points
            return message[:m.start("points")] + str(shown) + message[m.end("points"):]
    return message


def _exercise_row(x: dict, points: int, title: str = "") -> list[str]:
    status = _tag("span", _(x["status"]), x["status"].replace(" ", "-"))
    name = html.escape(x["exercise"]) + (f"<br>{_tag('span', _(title), 'muted')}" if title else "")
    return [name, f"{x['earned']}/{points}", status, _tag("pre", message_of(x, points))]


def feedback_page(student: dict, exercises: list[dict]) -> str:
    """One student's page: per notebook, each exercise's verdict and message, and the cells that raised."""
    points = {x["id"]: x["points"] for x in exercises}
    titles = {x["id"]: x.get("title", "") for x in exercises if x.get("kind") == "question"}   # the question asked
    score = _("{earned} of {possible} points").format(earned=student["total"], possible=student["possible"])
    parts = [f"<p>{_tag('b', score)}</p>"]
    if student.get("late_days"):
        parts.append(_tag("p", _("Handed in {days} day(s) late ({grace} grace day(s) used): {penalty} point(s) off, "
                                 "{final} in the end.").format(days=student["late_days"], grace=student["grace_days_used"],
                                                               penalty=student["penalty"], final=student["final"]), "late"))
    for nb in student["notebooks"]:
        parts.append(f"<h2>{html.escape(nb['notebook'])} {_tag('span', '(' + nb['file'] + ')', 'muted')}</h2>")
        if nb["status"] in _UNGRADED:
            why = "; ".join(nb["cell_errors"])
            parts.append(_tag("p", _("This notebook could not be graded: {why}").format(why=why), "error"))
        if nb.get("canvas_late"):
            parts.append(_tag("p", _("Canvas marked this submission late."), "late"))
        if nb.get("ignored"):
            if nb.get("chosen_by") == "tie":
                older = _("Also handed in, not graded: {files}. Nothing told the files apart (no Canvas file id or "
                          "download number, the same modification time): the first by name was graded; tell your "
                          "teacher if it is the wrong one.").format(files=", ".join(nb["ignored"]))
            else:
                older = _("Also handed in, not graded (an older file, by its {why}): {files}").format(
                    files=", ".join(nb["ignored"]), why=_(nb.get("chosen_by") or "modification time"))
            parts.append(_tag("p", older, "muted"))
        rows = [_exercise_row(x, points.get(x["exercise"], x["points"]), titles.get(x["exercise"], ""))
                for x in nb["exercises"]]
        for row, x in zip(rows, nb["exercises"]):
            o = student["exercises"].get(x["exercise"], {}).get("override")
            if o:                                         # the teacher's grade wins, with its reason
                row[1] = f"{o['points']}/{points.get(x['exercise'], x['points'])}"
                row[3] += _tag("p", _("Set by your teacher: {reason}").format(reason=html.escape(o["reason"])), "override")
        parts.append(_table([_("exercise"), _("points"), _("verdict"), _("message")], rows))
        if nb["cell_errors"] and nb["status"] not in _UNGRADED:
            parts.append(_tag("h3", _("Cells that raised")) + _list(nb["cell_errors"], code=True))
    if student.get("missing_notebooks"):
        names = ", ".join(student["missing_notebooks"])
        parts.append(_tag("p", _("Notebooks not handed in: {names}").format(names=names)))
    if student.get("extra_notebooks"):
        names = ", ".join(student["extra_notebooks"])
        parts.append(_tag("p", _("Handed in but not part of this assignment (not graded): {names}").format(names=names),
                          "muted"))
    return _page(_("Feedback for {student}").format(student=student["student"]), "\n".join(parts))


def _histogram_svg(totals: list[int], possible: int) -> str:
    """The score distribution as an inline SVG bar chart (bins of a tenth of the possible points)."""
    bins = 10 if possible >= 10 else max(1, possible)
    width = max(1, possible) / bins
    counts = [0] * bins
    for t in totals:
        counts[min(bins - 1, int(t / width))] += 1
    top = max(counts) or 1
    w, h, pad = 600, 220, 30
    bw = (w - 2 * pad) / bins
    bars = []
    for i, c in enumerate(counts):
        bh = (h - 2 * pad) * c / top
        x, y = pad + i * bw, h - pad - bh
        lo, hi = round(i * width, 1), round((i + 1) * width, 1)
        bars.append(f'<rect x="{x + 2:.1f}" y="{y:.1f}" width="{bw - 4:.1f}" height="{bh:.1f}" fill="#4a7bd0">'
                    f"<title>{lo:g}-{hi:g}: {c}</title></rect>"
                    f'<text x="{x + bw / 2:.1f}" y="{y - 4:.1f}" font-size="11" text-anchor="middle">{c}</text>'
                    f'<text x="{x + bw / 2:.1f}" y="{h - pad + 14:.1f}" font-size="10" text-anchor="middle">{lo:g}</text>')
    axis = f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#444"/>'
    label = html.escape(_("points"))
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img">'
    return (f"{svg}{axis}{''.join(bars)}"
            f'<text x="{w - pad}" y="{h - 2}" font-size="11" text-anchor="end">{label} (/{possible})</text></svg>')


def _mistake_counts(grades: dict) -> list[str]:
    """"ch01.attention: 12 of 60, missing 1/sqrt(d_k) scale", the most frequent first."""
    named = Counter()
    for s in grades["students"]:
        for nb in s["notebooks"]:
            for x in nb["exercises"]:
                for m in x.get("mistakes", []):
                    named[(x["exercise"], m)] += 1
    order = {x["id"]: i for i, x in enumerate(grades["exercises"])}
    ranked = sorted(named.items(), key=lambda kv: (-kv[1], order.get(kv[0][0], 0), kv[0][1]))
    n = len(grades["students"])
    return [_("{exercise}: {n} of {total}, {mistake}").format(exercise=ex, n=c, total=n, mistake=_(m))
            for (ex, m), c in ranked]


def _troubled(s: dict) -> list[str]:
    """A student's notebook errors and timed-out exercises, one line each."""
    lines = [f"{nb['notebook']}: {'; '.join(nb['cell_errors'])}" for nb in s["notebooks"] if nb["cell_errors"]]
    return lines + [f"{x}: {_('timeout')}" for x, v in s["exercises"].items() if v["status"] == "timeout"]


def report_page(grades: dict) -> str:
    """What the class got wrong: scores, pass rates, named mistakes by count, students with broken notebooks."""
    st = grades["students"]
    n = len(st)
    possible = st[0]["possible"] if st else 0
    mean = f"{sum(s['total'] for s in st) / n:.1f}" if n else "0"
    summary = _("{n} students, mean score {mean} of {possible} points").format(n=n, mean=mean, possible=possible)
    parts = [_tag("p", summary)]
    if grades.get("warnings"):
        parts += [_tag("h2", _("Warnings")), _list(grades["warnings"])]
    parts += [_tag("h2", _("Score distribution")), _histogram_svg([s["total"] for s in st], possible)]
    rows = []
    for x in grades["exercises"]:
        passed = sum(s["exercises"][x["id"]]["earned"] > 0 for s in st)
        bar = f"<div class='bar' style='width:{100 * passed / max(1, n):.0f}%'></div>"
        rows.append([html.escape(x["id"]), f"{passed}/{n}", bar])
    parts += [_tag("h2", _("Pass rate per exercise")), _table([_("exercise"), _("students"), _("pass rate")], rows)]
    mistakes = _mistake_counts(grades)
    parts += [_tag("h2", _("Named mistakes")), _list(mistakes) if mistakes else _tag("p", _("none"))]
    troubled = [(s["student"], _troubled(s)) for s in st]
    items = "".join(f"<li>{_tag('b', who)}{_list(lines, code=True)}</li>" for who, lines in troubled if lines)
    parts += [_tag("h2", _("Students whose notebooks errored or timed out")),
              f"<ul>{items}</ul>" if items else _tag("p", _("none"))]
    ungraded = [f"{s['student']}/{u['notebook']}: {u['why']}" for s in st for u in s.get("not_graded", [])]
    if ungraded:
        parts += [_tag("h2", _("Notebooks not graded (blank in the gradebook, not 0)")), _list(ungraded, code=True)]
    flagged = [f"{s['student']}/{nb['notebook']}: {f}" for s in st for nb in s["notebooks"] for f in nb.get("flags", [])]
    if flagged:
        parts += [_tag("h2", _("Flagged for review")),
                  _tag("p", _("Cells that reach into the grader. A scan names the obvious forgeries; it changes no "
                              "grade and proves nothing either way.")), _list(flagged, code=True)]
    similar = grades.get("similar") or {}
    pairs = [f"{p['exercise']}: {p['students'][0]} & {p['students'][1]}" for p in similar.get("pairs", [])]
    parts += [_tag("h2", _("Answers that look alike")), _tag("p", _("A report, not a verdict: the same program "
              "after names, comments and formatting are set aside; grades are unchanged.")),
              _list(pairs, code=True) if pairs else _tag("p", _("none"))]
    same = [f"{r['exercise']}: {r['student']}" for r in similar.get("reference", [])]
    if same:
        parts += [_tag("h2", _("Answers equal to the published solution")), _list(same, code=True)]
    late = [f"{s['student']}: {s['late_days']} day(s), -{s['penalty']} ({s['final']})" for s in st if s.get("late_days")]
    if late:
        parts += [_tag("h2", _("Late submissions")), _list(late)]
    missing = [f"{s['student']}: {', '.join(s['missing_notebooks'])}" for s in st if s.get("missing_notebooks")]
    if missing:
        parts += [_tag("h2", _("Notebooks not handed in: {names}").format(names="").rstrip(" :：")), _list(missing)]
    return _page(_("Class report"), "\n".join(parts))


def write_pages(out: Path, grades: dict) -> None:
    """OUT/feedback/<student>.html for every student, and OUT/report.html."""
    folder = Path(out) / "feedback"
    folder.mkdir(parents=True, exist_ok=True)
    for s in grades["students"]:
        (folder / feedback_name(s["student"])).write_text(feedback_page(s, grades["exercises"]), encoding="utf-8")
    (Path(out) / "report.html").write_text(report_page(grades), encoding="utf-8")
