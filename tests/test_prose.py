"""The course speaks to the learner: no narration of the project's own history in what a learner reads.

The chapters (their sources and both languages' catalogs) and both READMEs are scanned for phrases that
narrate how the project got its numbers: earlier sessions, development runs, machines of other days,
internal targets. Such text belongs in `benchmarks/RESULTS.md` (CONTRIBUTING, "Where measurements go").
"""
import re
from pathlib import Path

import polib
import pytest

ROOT = Path(__file__).resolve().parent.parent
HISTORY = [
    # English
    "earlier session", "previous session", "development run", "the day before", "evening before",
    "this vm", "aims for", "not yet measured", "when the chapter was written", "in our trials",
    "on this course's machine", "the project's 2-core machine", "an earlier run", "earlier runs",
    "not met", "+changes", "load average", "not been measured by this project", "exists yet",
    # Chinese
    "更早的会话", "之前的会话", "上一次会话", "开发运行", "开发时的运行", "前一天", "前一晚", "这台虚拟机",
    "本课程的目标是", "尚未测量", "还没有测量", "撰写本章时", "在我们的试验中", "本课程的机器上",
    "项目的 2 核机器", "更早的运行", "未达到目标", "负载均值",
]


def prose_files():
    """(name, text) of every learner-facing text: chapter sources, catalogs (live entries), READMEs."""
    for p in sorted((ROOT / "notebooks" / "src").glob("*.py")):
        yield p.relative_to(ROOT).as_posix(), p.read_text()
    for p in sorted((ROOT / "locale" / "zh_CN" / "LC_MESSAGES").glob("*.po")):
        text = "\n".join(e.msgstr for e in polib.pofile(str(p)) if not e.obsolete)
        yield p.relative_to(ROOT).as_posix(), text
    for name in ("README.md", "README.zh-CN.md"):
        yield name, (ROOT / name).read_text()


def find_history(text: str) -> list[str]:
    low = text.lower()
    return [phrase for phrase in HISTORY if phrase in low]


@pytest.mark.parametrize("name,text", list(prose_files()), ids=lambda v: v if isinstance(v, str) and
                         len(v) < 60 else "")
def test_no_narration_of_the_projects_history(name, text):
    hits = find_history(text)
    assert not hits, (f"{name} narrates the project's history ({hits}): move it to benchmarks/RESULTS.md "
                      f"or say what the page's own cells show")


def test_the_scan_finds_what_it_looks_for():
    assert find_history("In an earlier session the model reached 40.1.") == ["earlier session"]
    assert find_history("这是一次开发运行的结果。") == ["开发运行"]
    assert find_history("The model reaches 39.0 BLEU.") == []


def results_section(text: str) -> str:
    return re.search(r"^## Results\n(.*?)(?=^## )", text, re.S | re.M).group(1)


def test_the_readme_results_section_is_short_and_only_measured():
    section = results_section((ROOT / "README.md").read_text())
    words = len(section.split())
    assert words < 900, f"README's Results section has {words} words (at most 900: the log goes to benchmarks/RESULTS.md)"
    rows = [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")]
    for row in rows[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5, f"a Results row has what, ours, peer, hardware and command: {row}"
        assert all(len(c.split()) <= 40 for c in cells), f"a Results cell runs over 40 words: {row}"
        assert re.search(r"\d", cells[1]), f"a Results row without a measured figure: {row}"
    assert (ROOT / "benchmarks" / "RESULTS.md").exists()
