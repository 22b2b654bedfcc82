"""Build the course website: `make book` (python -m tools.book) -> build/book/index.html.

1. Stage build/book_src/: book/ (Sphinx conf, landing page, extension, CSS), the learner notebooks
   generated from notebooks/src (so every chapter that exists is in, stubs never solutions), the
   README's sections for the landing page, and one page per tformer module showing its source.
   A file is rewritten only when its content changed, so Sphinx re-reads only what changed.
2. Figure captions: a plotting cell gets MyST-NB figure metadata; the caption is the cell's
   `# Figure: ...` comment, else the first sentence of the text cell just before it.
3. Sphinx with MyST-NB executes the chapters in small mode and caches them with jupyter-cache in
   build/book_cache/<hash of tformer/'s sources>: a rebuild with unchanged chapters and package
   runs no notebook, and pytest skips a learner notebook whose exact code ran there without error
   (conftest.py).

    python -m tools.book                 # build (incremental)
    python -m tools.book --clean         # from scratch: no cache, no Sphinx environment
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "book"
BUILD = ROOT / "build"
STAGE = BUILD / "book_src"
OUT = BUILD / "book"
DOCTREES = BUILD / "book_doctrees"
CACHES = BUILD / "book_cache"
PLOT = re.compile(r"\bplt\.|\bplot_\w+\(|\bshow_\w+\(|\.imshow\(|\bfig\b|\bplot\.|heatmap|subplots")
CAPTION = re.compile(r"^\s*#\s*Figure:\s*(.+)$", re.M)


def package_hash() -> str:
    """What a chapter's outputs depend on besides its own code: the package's sources."""
    h = hashlib.sha256()
    for p in sorted((ROOT / "tformer").rglob("*.py")):
        h.update(str(p.relative_to(ROOT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    return CACHES / package_hash()


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _first_sentence(markdown: str) -> str:
    text = " ".join(l.strip() for l in markdown.splitlines() if l.strip() and not l.lstrip().startswith(("#", "$$", "|")))
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return (m.group(1) if m else text)[:300]


def separate_display_math(markdown: str) -> str:
    """Display math (`$$ ... $$`, one line or several) glued to the text around it: Jupyter shows it,
    MyST only when it stands in a block of its own, so give it blank lines before and after."""
    out: list[str] = []
    inside = False
    for line in markdown.split("\n"):
        s = line.strip()
        if not inside and s.startswith("$$"):
            if out and out[-1].strip():
                out.append("")
            out.append(line)
            if len(s) > 2 and s.endswith("$$"):
                out.append("")
            else:
                inside = True
            continue
        if inside and s.endswith("$$"):
            out += [line, ""]
            inside = False
            continue
        if not inside and out and out[-1] == "" and not s and len(out) > 1 and out[-2].strip().endswith("$$"):
            continue   # the blank line the text already had
        out.append(line)
    return "\n".join(out).rstrip("\n") if not markdown.endswith("\n") else "\n".join(out)


def add_captions(nb) -> None:
    """MyST-NB figure metadata on plotting cells, so each figure output gets a numbered caption."""
    previous = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = separate_display_math(cell.source)
            previous = cell.source
            continue
        explicit = CAPTION.search(cell.source)
        if explicit or PLOT.search(cell.source):
            caption = explicit.group(1).strip() if explicit else _first_sentence(previous)
            if caption:
                cell.metadata["mystnb"] = {"figure": {"caption": caption}}


def stage_chapters() -> list[str]:
    import nbformat
    from tools.notebooks import build_notebook, sources

    names = []
    for src in sources():
        nb = build_notebook(src, solutions=False)
        add_captions(nb)
        _write(STAGE / "chapters" / f"{src.stem}.ipynb", nbformat.writes(nb) + "\n")
        names.append(src.stem)
    for old in (STAGE / "chapters").glob("*.ipynb"):   # a chapter renamed or split since the last build
        if old.stem not in names:
            old.unlink()
    return names


def stage_readme() -> None:
    """README.md -> _readme/intro.md (before the first section) and sections.md (the rest)."""
    text = (ROOT / "README.md").read_text()
    body = text.split("\n", 1)[1] if text.startswith("# ") else text
    intro, _, rest = body.partition("\n## ")
    _write(STAGE / "_readme" / "intro.md", intro.strip() + "\n")
    _write(STAGE / "_readme" / "sections.md", ("## " + rest).strip() + "\n" if rest else "\n")


def stage_sources() -> None:
    keep = set()
    for py in sorted((ROOT / "tformer").rglob("*.py")):
        rel = py.relative_to(ROOT)
        page = STAGE / "src" / rel.with_suffix(".md")
        depth = len(rel.parts)  # src/ + the module's folders
        up = "../" * depth
        _write(page, f"---\norphan: true\n---\n\n# `{rel.as_posix()}`\n\n"
                     f"```{{literalinclude}} {up}_pkg/{rel.as_posix()}\n:language: python\n:linenos:\n```\n")
        _write(STAGE / "_pkg" / rel, py.read_text())
        keep |= {page, STAGE / "_pkg" / rel}
    for folder in ("src", "_pkg"):
        for old in (STAGE / folder).rglob("*"):
            if old.is_file() and old not in keep:
                old.unlink()


def stage() -> list[str]:
    for item in CONF.rglob("*"):
        if item.is_file() and "__pycache__" not in item.parts:
            dst = STAGE / item.relative_to(CONF)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.exists() or dst.read_bytes() != item.read_bytes():
                shutil.copyfile(item, dst)
    stage_readme()
    stage_sources()
    return stage_chapters()


def unexecuted(chapters: list[str], cache: Path) -> list[str]:
    """Chapters whose code has no error-free execution in the cache (MyST-NB caches only those)."""
    import nbformat
    from jupyter_cache import get_cache

    db = get_cache(str(cache))
    missing = []
    for name in chapters:
        try:
            db.match_cache_notebook(nbformat.read(STAGE / "chapters" / f"{name}.ipynb", as_version=4))
        except KeyError:
            missing.append(name)
    return missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.book", description=__doc__.split("\n\n")[0])
    p.add_argument("--clean", action="store_true", help="drop the site, Sphinx's environment and the cache")
    p.add_argument("-j", default="1", help="Sphinx parallel jobs (default 1: the chapters use the cores)")
    args = p.parse_args(argv)
    if args.clean:
        for d in (STAGE, OUT, DOCTREES, CACHES):
            shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    chapters = stage()
    cache = cache_dir()
    for old in CACHES.glob("*"):         # executions against an older package are never reused
        if old != cache:
            shutil.rmtree(old, ignore_errors=True)
    env = dict(os.environ, TFORMER_BOOK_CACHE=str(cache),
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-j", args.j, "-q", "--keep-going",
           "-d", str(DOCTREES), str(STAGE), str(OUT)]
    print(f"book: {len(chapters)} chapters, cache {cache.relative_to(ROOT)}", flush=True)
    rc = subprocess.call(cmd, env=env, cwd=ROOT)
    failed = unexecuted(chapters, cache)
    if failed:   # shown on the site with their error; pytest reruns them (they are not in the cache)
        print(f"book: {len(failed)} chapter(s) failed to execute: {', '.join(failed)}", flush=True)
        rc = rc or 1
    print(f"book: {'built' if rc == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s -> "
          f"{(OUT / 'index.html').relative_to(ROOT)}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
