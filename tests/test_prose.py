"""The course speaks to the learner: no narration of the project's own history in what a learner reads.

The chapters (their sources and both languages' catalogs) and both READMEs are scanned for phrases that
narrate how the project got its numbers: earlier sessions, development runs, machines of other days,
internal targets. Such text belongs in `benchmarks/RESULTS.md` (CONTRIBUTING, "Where measurements go").
"""
import json
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



def test_the_readme_gives_each_capstone_its_references_command():
    """A Results row's `tformer capstone NAME ...` is the command that made the committed reference
    (data/capstones/NAME/result.json), paths written as the option's metavar: typing it reproduces the row."""
    from tformer.capstones.show import public_command
    section = results_section((ROOT / "README.md").read_text())
    commands = {name: cmd for cmd, name in re.findall(r"`(tformer capstone (\w+)[^`]*)`", section)}
    assert set(commands) >= {"translate", "vit", "clip", "moe", "grpo"}, commands
    for name, command in commands.items():
        ref = json.loads((ROOT / "data" / "capstones" / name / "result.json").read_text())
        assert command == public_command(ref["command"], name), f"README: `{command}`; reference: `{ref['command']}`"

# -- the pages' last mile: a summary at the end, a caption on every figure, no clutter in the outputs -------

import ast                                                  # noqa: E402
import html                                                 # noqa: E402

import jupytext                                             # noqa: E402
import nbformat                                             # noqa: E402

SOURCES = sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
TRAINER_LOG = re.compile(r"step=\d+ .*(val_loss|test_acc)=")              # a Trainer's validation line
MODULE_REPR = re.compile(r"^[A-Z]\w+\($")                                # `CLIP(` opening a module's repr


def chapter(path: Path):
    return jupytext.read(path)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_every_chapter_ends_with_a_summary(path):
    """The last cell is markdown starting `## Summary`: 3-6 bullets of what the reader measured (or a table)."""
    last = chapter(path).cells[-1]
    assert last.cell_type == "markdown" and last.source.startswith("## Summary\n"), \
        f"{path.name} does not end with a '## Summary' cell"
    lines = last.source.splitlines()[1:]
    bullets = [line for line in lines if line.startswith("* ")]
    table = [line for line in lines if line.startswith("|")]
    assert 3 <= len(bullets) <= 6 or len(table) >= 4, f"{path.name}: the summary has {len(bullets)} bullets"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_every_chinese_chapter_ends_with_a_summary(path):
    zh = ROOT / "notebooks" / "zh" / f"{path.stem}.ipynb"
    if not zh.exists():
        pytest.skip(f"{zh.name}: no Chinese notebook")
    last = nbformat.read(zh, as_version=4).cells[-1]
    assert last.cell_type == "markdown" and last.source.startswith("## 小结\n"), f"{zh.name} does not end with '## 小结'"


# A code cell shows a figure when, outside the functions it defines, it calls plt.show(), plt.figure(),
# plt.subplots(), a plotting helper of the package (tformer.utils.plot's heatmap, heads_grid, curves;
# tformer.capstones.show) or a function of the chapter that does one of these (directly or not).
PLT_CALLS = {"plt.show", "plt.figure", "plt.subplots"}
PLOTTERS = {"heatmap", "heads_grid", "curves", "show"}


def _called(nodes, into_defs: bool) -> set[str]:
    out, stack = set(), list(nodes)
    while stack:
        n = stack.pop()
        if not into_defs and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                out.add(f"{f.value.id}.{f.attr}")
            elif isinstance(f, ast.Name):
                out.add(f.id)
        stack.extend(ast.iter_child_nodes(n))
    return out


def figure_cells(code: list[str]) -> list[int]:
    """Indices (into `code`, a chapter's code cells in order) of the cells that show a figure."""
    trees = [ast.parse(c) for c in code]
    plotting = set(PLOTTERS)
    grew = True
    while grew:                                             # the chapter's own functions that plot
        grew = False
        for n in (n for t in trees for n in ast.walk(t)):
            if isinstance(n, ast.FunctionDef) and n.name not in plotting and \
                    _called(n.body, True) & (PLT_CALLS | plotting):
                plotting.add(n.name)
                grew = True
    return [i for i, t in enumerate(trees) if _called(t.body, False) & (PLT_CALLS | plotting)]


def test_the_figure_rule_finds_what_it_means_to():
    code = ["def draw(w):\n    heatmap(w)\n", "x = 1\ndraw(x)\n", "plt.plot([1])\nplt.show()\n", "y = 2\n",
            "def later():\n    plt.show()\n", "res = show('vit')\n", "fig, ax = plt.subplots()\n"]
    assert figure_cells(code) == [1, 2, 5, 6]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_every_cell_that_shows_a_figure_has_a_caption(path):
    cells = [c.source for c in chapter(path).cells if c.cell_type == "code"]
    missing = [cells[i].splitlines()[0][:70] for i in figure_cells(cells)
               if not any(line.startswith("# Figure: ") for line in cells[i].splitlines())]
    assert not missing, f"{path.name}: cells that show a figure without a '# Figure: ...' caption: {missing}"


def _in_full_mode_branch(node, parents) -> bool:
    """Inside `if not SMALL:` or the `else` of `if SMALL...:` (the built pages run small mode)."""
    child = node
    for p in parents:
        if isinstance(p, ast.If):
            names = {n.id for n in ast.walk(p.test) if isinstance(n, ast.Name)} | \
                    {n.attr for n in ast.walk(p.test) if isinstance(n, ast.Attribute)}
            negated = isinstance(p.test, ast.UnaryOp) and isinstance(p.test.op, ast.Not)
            if "SMALL" in names and ((child in p.orelse) != negated):
                return True
        child = p
    return False


QUIET = {"TrainConfig", "train_run", "train_classifier", "train_clip"}


def _false_in_small_mode(value) -> bool:
    """`False`, or `not SMALL` / `not tformer.SMALL`."""
    if isinstance(value, ast.Constant):
        return value.value is False
    return isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not) and \
        getattr(value.operand, "id", getattr(value.operand, "attr", None)) == "SMALL"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_training_in_small_mode_writes_no_log_lines(path):
    """A Trainer with a progress bar writes a line per validation (`step=100 minutes=0.12 val_loss=2.1`):
    the chapters' small-mode runs pass progress=False (or a ** of options holding it) and plot instead."""
    loud, cells = [], [c for c in chapter(path).cells if c.cell_type == "code"]
    quiet_dicts = {t.id for c in cells for n in ast.walk(ast.parse(c.source)) if isinstance(n, ast.Assign)
                   for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Call)
                   and getattr(n.value.func, "id", None) == "dict"
                   and any(k.arg == "progress" and _false_in_small_mode(k.value) for k in n.value.keywords)}
    for cell in cells:
        tree = ast.parse(cell.source)
        parents = {}
        for p in ast.walk(tree):
            for ch in ast.iter_child_nodes(p):
                parents[ch] = p
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in QUIET:
                chain, p = [], parents.get(n)
                while p is not None:
                    chain.append(p)
                    p = parents.get(p)
                quiet = any(k.arg == "progress" and _false_in_small_mode(k.value) for k in n.keywords) or \
                    any(k.arg is None and getattr(k.value, "id", None) in quiet_dicts for k in n.keywords)
                if not quiet and not _in_full_mode_branch(n, chain):
                    loud.append(f"line {n.lineno} of a cell: {n.func.id}(...)")
    assert not loud, f"{path.name}: small-mode training that prints validation lines: {loud}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_no_cell_ends_on_a_bare_module(path):
    """A cell whose last line is `model.eval()` (or .train(), .to(...), .cpu(), .cuda()) prints the module's repr."""
    bare = []
    for cell in (c for c in chapter(path).cells if c.cell_type == "code"):
        body = ast.parse(cell.source).body
        last = body[-1] if body else None
        if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and \
                isinstance(last.value.func, ast.Attribute) and last.value.func.attr in {"eval", "train", "to", "cpu", "cuda"} \
                and not cell.source.rstrip().endswith(";"):
            bare.append(ast.get_source_segment(cell.source, last))
    assert not bare, f"{path.name}: cells ending on an expression that returns a module (its repr is printed): {bare}"


def test_the_built_pages_carry_no_log_lines_or_module_reprs():
    book = ROOT / "build" / "book"
    if not book.exists():
        pytest.skip("build/book does not exist (`make book` builds it); the static checks above cover the sources")
    found = []
    for page in sorted(book.rglob("*.html")):
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text(errors="replace")))
        for line in text.splitlines():
            if TRAINER_LOG.search(line) or MODULE_REPR.match(line.strip()):
                found.append(f"{page.relative_to(book)}: {line.strip()[:80]}")
    assert not found, f"clutter on the built pages: {found[:10]}"


def test_the_clutter_patterns_match_what_they_mean_to():
    assert TRAINER_LOG.search("step=100  minutes=0.0877  val_loss=2.102")
    assert TRAINER_LOG.search("step=43  minutes=0.008829  test_acc=0.2489")
    assert not TRAINER_LOG.search("step 100: loss 2.1")
    assert MODULE_REPR.match("CLIP(") and not MODULE_REPR.match("CLIP(config)") and not MODULE_REPR.match("print(")


# -- the README starts the course: a learner's page first, the teachers' material in TEACHING.md -------------

def _prose(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_the_readme_is_a_learners_page_of_short_paragraphs():
    """Quick start, then the Chapter map, before any teachers' material (which is TEACHING.md's); under 2,500
    words outside code blocks; no paragraph over 120 words, no sentence over 50."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    sections = [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["Quick start", "Chapter map"], sections
    assert sections.index("Exercises") < sections.index("For teachers") == len(sections) - 2, sections
    assert "TEACHING.md" in text.split("## For teachers", 1)[1]
    for word in ("Landlock", "SLURM", "Kubernetes", "--shard", "journal.jsonl"):
        assert word not in text, f"the README carries teachers' material ({word}): it belongs in TEACHING.md"
    prose = _prose(text)
    assert len(prose.split()) < 2500, f"README has {len(prose.split())} words outside code blocks"
    for para in re.split(r"\n\s*\n", prose):
        if not para.strip() or para.lstrip().startswith(("|", "#")):
            continue
        assert len(para.split()) <= 120, f"a README paragraph of {len(para.split())} words: {para[:80]!r}"
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", " ".join(para.split())):
            assert len(sentence.split()) <= 50, f"a README sentence of {len(sentence.split())} words: {sentence[:80]!r}"
