"""Notebook files: the one reader of their code cells, and the one rule that says which chapter's notebook
a file is (the learner's `tformer grade PATH` and a class use both).

    read_cells(path)          the sources of a notebook's code cells (ValueError: not a readable notebook)
    released_notebooks()      the course's released learner notebooks, by stem (English and Chinese)
    known_stems()             every notebook of the course by stem ("01_attention", "11_llms", ...)
    notebook_stem(name)       the notebook a file is, from its name (download suffixes and copies allowed)
    exercises_of(stem)        the exercises a notebook owes, in the order the notebook checks them
    check_calls(sources)      which function each check(...) call hands in, and where
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from ..core import REGISTRY, load_exercises

ROOT = Path(__file__).resolve().parents[3]
RELEASED_DIRS = (ROOT / "notebooks", ROOT / "notebooks" / "zh")
_CHAPTER = re.compile(r"^(\d\d)[a-z]?_")
_CHAPTER_STEM = re.compile(r"(?<![0-9])(\d\d[a-z]?_[a-z0-9_]*[a-z0-9])")
_DOWNLOAD_SUFFIX = re.compile(r"(\s*\(\d+\)|[-_ ]\d{1,3}|[-_ ]copy|\s+copy\s*\d*)+$", re.IGNORECASE)


def chapter_order(stem: str) -> tuple[str, str]:
    """Notebooks in the course's order: by chapter number, then name (11_llms, 11_fine_tuning, ... by name)."""
    return stem[:2], stem


def read_cells(path: Path) -> list[str]:
    """The sources of a notebook's code cells, in order (ValueError if it is not a readable notebook). A
    version-4 notebook is read as JSON (a tenth of nbformat's time: a class reads every notebook twice); an
    older one goes through nbformat, which converts it."""
    try:
        nb = json.loads(Path(path).read_bytes())
        if isinstance(nb, dict) and nb.get("nbformat") == 4 and isinstance(nb.get("cells"), list):
            cells = []
            for c in nb["cells"]:
                if not isinstance(c, dict):
                    raise ValueError("a cell is not a JSON object")
                if c.get("cell_type") == "code":
                    src = c.get("source", "")
                    if isinstance(src, list) and all(isinstance(s, str) for s in src):
                        src = "".join(src)
                    if not isinstance(src, str):
                        raise ValueError("a code cell's source is not text")
                    cells.append(src)
            return cells
        import nbformat
        return [c.source for c in nbformat.reads(json.dumps(nb), as_version=4).cells if c.cell_type == "code"]
    except Exception as e:                            # not JSON, not a notebook, unreadable
        raise ValueError(f"{type(e).__name__}: {e}".splitlines()[0][:200]) from None


EXTRA_RELEASED: list[Path] = []     # a teacher's own released notebooks (an assignment's `released` folder)


def add_released(folder: Path) -> None:
    """Count the notebooks in `folder` as released too: a teacher's own notebooks, as students got them."""
    folder = Path(folder).resolve()
    if folder not in EXTRA_RELEASED:
        EXTRA_RELEASED.append(folder)
        released_checks.cache_clear()


def released_dirs() -> tuple[Path, ...]:
    """The folders of released learner notebooks: the course's (English, Chinese) and a teacher's."""
    return RELEASED_DIRS + tuple(EXTRA_RELEASED)


def released_notebooks(dirs: tuple[Path, ...] | None = None) -> dict[str, list[Path]]:
    """Notebook stem -> the released learner notebooks of that stem (notebooks/, notebooks/zh/, a teacher's):
    the course's named NN_slug, a teacher's folder any notebook."""
    found: dict[str, list[Path]] = {}
    for d in dirs if dirs is not None else released_dirs():
        pattern = "*.ipynb" if Path(d).resolve() in EXTRA_RELEASED else "[0-9][0-9]*_*.ipynb"
        for path in sorted(Path(d).glob(pattern)):
            found.setdefault(path.stem, []).append(path)
    return found


def known_stems() -> list[str]:
    """The course's notebooks by stem ("01_attention", "11_llms", ...): the released ones and the sources."""
    stems = set(released_notebooks())
    stems |= {p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]*_*.py")}
    return sorted(stems)


def notebook_stem(filename: str, known: list[str]) -> str | None:
    """The notebook a file is, from its name: `04_positional_encoding (1).ipynb` -> "04_positional_encoding".
    A known stem found in the name wins (the longest); else a chapter-like name with download suffixes
    stripped ("01_tiny" from "01_tiny-2.ipynb"); None if the name holds no chapter number."""
    base = filename[:-len(".ipynb")] if filename.lower().endswith(".ipynb") else filename
    flat = re.sub(r"[\s\-]+", "_", base.lower())
    for stem in sorted(known, key=len, reverse=True):
        at = flat.find(stem)
        if at >= 0 and (at == 0 or not flat[at - 1].isdigit()) and not flat[at + len(stem):at + len(stem) + 1].isalpha():
            return stem
    stripped = _DOWNLOAD_SUFFIX.sub("", base).strip()
    m = _CHAPTER_STEM.match(stripped.lower()) if stripped[:2].isdigit() else None
    return m.group(1) if m and m.end() == len(stripped) else None


def chapter_of(nb_path: Path) -> str | None:
    m = _CHAPTER.match(nb_path.name)
    return f"ch{m.group(1)}" if m else None

def parse_cells(sources: list[str], words: tuple[str, ...] = ("check(", "def ")) -> list:
    """Each cell's syntax tree, None for a cell that does not parse or holds none of `words` (a cell without
    `check(` or `def ` defines or checks no exercise: most of a chapter's cells are not parsed at all)."""
    import ast
    trees = []
    for src in sources:
        tree = None
        if any(w in src for w in words):
            try:
                tree = ast.parse(src)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                tree = None
        trees.append(tree)
    return trees


def check_calls(sources: list[str], trees: list | None = None) -> dict[str, tuple[int, str]]:
    """exercise id -> (index of the first cell that calls check("id", name), name): the function each
    `check(...)` call hands in. Cells that do not parse are skipped; `trees`: parse_cells(sources), if made."""
    import ast
    calls: dict[str, tuple[int, str]] = {}
    for i, tree in enumerate(trees if trees is not None else parse_cells(sources, ("check(",))):
        if tree is None:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) and isinstance(node.args[1], ast.Name)):
                calls.setdefault(node.args[0].value, (i, node.args[1].id))
    return calls


@functools.lru_cache(maxsize=None)
def released_checks(stem: str) -> dict[str, str]:
    """exercise id -> the name of the function the released notebook `stem` hands to check(...) (the stub a
    learner fills in); empty where the released notebook is not next to the package."""
    for path in released_notebooks().get(stem, [])[:1]:
        try:
            return {ex: name for ex, (_, name) in check_calls(read_cells(path)).items()}
        except ValueError:
            return {}
    return {}


def exercises_of(nb_path: Path) -> list[str]:
    """The exercises a notebook owes, in the order its released notebook checks them (registration order where
    it is not found): those registered with its stem as `notebook`, else those of its chapter (name prefix
    chNN.) that name no notebook."""
    load_exercises()
    stem, chapter = Path(nb_path).stem, chapter_of(Path(nb_path))
    owed = [n for n, ex in REGISTRY.items()
            if ex.notebook == stem or (not ex.notebook and chapter and n.startswith(chapter + "."))]
    order = {ex: i for i, ex in enumerate(released_checks(stem))}
    return sorted(owed, key=lambda n: order.get(n, len(order)))


def course_exercises(stems: list[str], ordered: bool = False) -> list[str]:
    """The exercises the notebooks `stems` owe: in chapter order, or in the order given (`ordered`: an
    assignment's list)."""
    out: list[str] = []
    for stem in (stems if ordered else sorted(stems, key=chapter_order)):
        out += [n for n in exercises_of(Path(stem + ".ipynb")) if n not in out]
    return out
