"""Chapter sources read in small steps: every code cell holds at most 25 non-blank lines (one step, with a
sentence between steps), and every chapter opens with the tformer code it uses, as paths that exist
(`tformer/attention.py: scaled_dot_product_attention`)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
MAX_LINES = 25


def cells(path: Path) -> list[tuple[int, str, list[str]]]:
    """(first line number, 'code' or 'markdown', body lines) for every `# %%` cell of a jupytext source."""
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("# %%"):
            out.append((i, "markdown" if "[markdown]" in line else "code", []))
        elif out:
            out[-1][2].append(line)
    return out


def test_cells_are_found():
    assert len(SOURCES) >= 15
    assert all(any(kind == "code" for _, kind, _ in cells(p)) for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_code_cells_are_at_most_25_non_blank_lines(path):
    long = [(line, n) for line, kind, body in cells(path) if kind == "code"
            and (n := sum(1 for b in body if b.strip() and not b.startswith("# Figure:"))) > MAX_LINES]
    assert not long, (f"{path.name}: code cells longer than {MAX_LINES} non-blank lines (starting line, lines): "
                      f"{long}; split each into steps with a sentence between them")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_chapter_opens_with_the_tformer_code_it_uses(path):
    first = "\n".join(cells(path)[0][2])
    refs = re.findall(r"`(tformer/[\w/]+\.py)(?::\s*([\w., ]+))?`", first)
    assert refs, f"{path.name}: the first cell names no tformer code as `tformer/module.py: name`"
    for file, names in refs:
        assert (ROOT / file).is_file(), f"{path.name}: the first cell cites {file}, which does not exist"
        source = (ROOT / file).read_text(encoding="utf-8")
        for name in filter(None, (n.strip() for n in (names or "").split(","))):
            assert re.search(rf"^(def|class) {name}\b|^{name} = ", source, re.M), \
                f"{path.name}: the first cell cites {file}: {name}, which {file} does not define"


DRAWS = re.compile(r"\bplt\.show\(\)")      # a cell that draws a figure of its own


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_every_figure_has_a_written_caption(path):
    """A cell that draws a figure says what it shows in a `# Figure: ...` line: one sentence, short, the
    website's caption (translated in the chapter's catalog), never text lifted from the prose around it."""
    for line, kind, body in cells(path):
        text = "\n".join(body)
        caption = re.search(r"^# Figure: (.+)$", text, re.M)
        if kind == "code" and DRAWS.search(text):
            assert caption, f"{path.name}:{line}: a cell that draws a figure has no `# Figure: ...` caption line"
        if caption:
            words = caption.group(1).split()
            assert caption.group(1).endswith(".") and 4 <= len(words) <= 30, (
                f"{path.name}:{line}: a caption is one sentence of 4-30 words ending with a full stop: {caption.group(1)!r}")
