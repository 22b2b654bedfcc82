"""Build the course website: `make book` (python -m tools.book) -> build/book/index.html.

1. Stage build/book_src/: book/ (Sphinx conf, landing page, extension, CSS), the learner notebooks
   generated from notebooks/src (so every chapter that exists is in, stubs never solutions), the
   README's sections for the landing page, and one page per tformer module showing its source.
   A file is rewritten only when its content changed, so Sphinx re-reads only what changed.
2. Figure captions: a cell with a `# Figure: ...` comment gets MyST-NB figure metadata with that caption
   (its translation comes from the chapter's catalog); a figure without one is shown uncaptioned.
3. Sphinx with MyST-NB executes the chapters in small mode and caches them with jupyter-cache in
   build/book_cache/<hash of tformer/'s sources>: a rebuild with unchanged chapters and package
   runs no notebook, and pytest skips a learner notebook whose exact code ran there without error
   (conftest.py).
4. The Chinese site, build/book/zh/, from build/book_src_zh/: the same chapters with the prose of the
   catalogs (tools/i18n.py; a chapter not yet translated is shown in English with a note), the landing
   page from README.zh-CN.md, and a glossary. Its code cells are the English ones, figure metadata
   included, so jupyter-cache serves the English build's executions: no notebook runs a second time
   (a chapter that has no execution in the cache is shown without outputs, never executed here). The
   figure captions are translated in the page (book/_ext/tformer_book.py). Every page links to the
   same page in the other language.

    python -m tools.book                 # build both sites (incremental)
    python -m tools.book --clean         # from scratch: no cache, no Sphinx environment
    python -m tools.book --lang zh       # the Chinese site only (after an English build)
    python -m tools.book --chapters 01_attention,02_self_attention    # only these chapters (a quick check)
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
STAGE_ZH = BUILD / "book_src_zh"
OUT_ZH = OUT / "zh"
DOCTREES_ZH = BUILD / "book_doctrees_zh"
UNTRANSLATED_NOTE = "*本章尚未翻译，以下为英文原文（代码与英文版相同）。*"
CACHES = BUILD / "book_cache"
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
    """MyST-NB figure metadata on cells with a `# Figure: ...` line, so their figure gets a numbered caption."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = separate_display_math(cell.source)
            continue
        explicit = CAPTION.search(cell.source)
        if explicit:
            cell.metadata["mystnb"] = {"figure": {"caption": explicit.group(1).strip()}}


def _sources(only: list[str] | None):
    from tools.notebooks import sources
    return [s for s in sources() if not only or s.stem in only]


def stage_chapters(only: list[str] | None = None) -> list[str]:
    import nbformat
    from tools.notebooks import build_notebook, drop_stale

    names = []
    for src in _sources(only):
        nb = build_notebook(src, solutions=False)
        add_captions(nb)
        _write(STAGE / "chapters" / f"{src.stem}.ipynb", nbformat.writes(nb) + "\n")
        names.append(src.stem)
    drop_stale(STAGE / "chapters", ".ipynb", set(names))   # a chapter renamed or split since the last build
    return names


def caption_key(text: str) -> str:
    """A caption as the page shows it, for matching: no markdown marks, no dollar signs, one space."""
    return " ".join(re.sub(r"[`*$\\{}]", "", text).split())


def stage_chapters_zh(only: list[str] | None = None) -> list[str]:
    """The Chinese chapters: the English notebook's code cells (with their figure metadata, so the cache
    matches), the catalog's prose; captions to translate in the page go to _captions.json."""
    import copy
    import json

    import nbformat
    from tools import i18n
    from tools.notebooks import build_notebook, drop_stale

    translated = set(i18n.translated_chapters())
    names, captions = [], {}
    for src in _sources(only):
        en = build_notebook(src, solutions=False)
        add_captions(en)
        if src.stem in translated:
            zh = i18n.build_zh_notebook(src)
            zh_text = i18n.translations(src.stem)
            pairs = {}
            for a, z in zip(en.cells, zh.cells):
                if a.cell_type == "code":
                    z.metadata = copy.deepcopy(a.metadata)        # identical code cells: the cache serves them
                    ca = a.metadata.get("mystnb", {}).get("figure", {}).get("caption")
                    if ca and zh_text.get(ca):
                        pairs[caption_key(ca)] = zh_text[ca]
                elif a.cell_type == "markdown":
                    z.source = separate_display_math(z.source)
            captions[f"chapters/{src.stem}"] = pairs
        else:
            zh = en
            zh.metadata["language"] = "en"
            zh.cells.insert(1, nbformat.v4.new_markdown_cell(UNTRANSLATED_NOTE, id=f"{src.stem[:2]}-zh-note"))
        _write(STAGE_ZH / "chapters" / f"{src.stem}.ipynb", nbformat.writes(zh) + "\n")
        names.append(src.stem)
    drop_stale(STAGE_ZH / "chapters", ".ipynb", set(names))
    _write(STAGE_ZH / "_captions.json", json.dumps(captions, ensure_ascii=False, indent=1) + "\n")
    return names


def stage_landing_zh() -> None:
    """index.md from book/index.md with its prose from locale/zh_CN/LC_MESSAGES/index.po, the README's
    parts from README.zh-CN.md, and the glossary."""
    from tools import i18n
    _write(STAGE_ZH / "index.md", i18n.landing_page_zh())
    _write(STAGE_ZH / "glossary.md", (i18n.LOCALE / i18n.LANG / "glossary.md").read_text())
    stage_readme(ROOT / "README.zh-CN.md", STAGE_ZH)
    stage_teaching(ROOT / "TEACHING.zh-CN.md", STAGE_ZH)


def stage_readme(readme: Path = ROOT / "README.md", stage: Path = STAGE) -> None:
    """README.md -> _readme/intro.md (before the first section) and sections.md (the rest)."""
    text = readme.read_text()
    text = "\n".join(l for l in text.split("\n")            # the line linking the other language's README
                     if not re.fullmatch(r"\[[^\]]*\]\((README\.md|README\.zh-CN\.md)\)", l.strip()))
    text = re.sub(r"\[([^\]]*)\]\((?:README\.md|README\.zh-CN\.md)\)", r"\1", text)   # the site links pages itself
    text = re.sub(r"\]\((?:TEACHING\.md|TEACHING\.zh-CN\.md)\)", "](teaching.md)", text)    # the guide's page
    body = text.split("\n", 1)[1] if text.startswith("# ") else text
    intro, _, rest = body.partition("\n## ")
    _write(stage / "_readme" / "intro.md", intro.strip() + "\n")
    _write(stage / "_readme" / "sections.md", ("## " + rest).strip() + "\n" if rest else "\n")


def stage_sources(STAGE: Path = STAGE) -> None:
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


def _stage_conf(stage: Path, skip: tuple[str, ...] = ()) -> None:
    for item in CONF.rglob("*"):
        if item.is_file() and "__pycache__" not in item.parts and item.relative_to(CONF).as_posix() not in skip:
            dst = stage / item.relative_to(CONF)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.exists() or dst.read_bytes() != item.read_bytes():
                shutil.copyfile(item, dst)


def stage_teaching(guide: Path = ROOT / "TEACHING.md", stage: Path = STAGE) -> None:
    """TEACHING.md (or its Chinese edition) -> teaching.md, the teachers' guide's page; links between the two
    editions' files become the site's own."""
    text = "\n".join(l for l in guide.read_text().split("\n")
                     if not re.fullmatch(r"\[[^\]]*\]\((TEACHING\.md|TEACHING\.zh-CN\.md)\)", l.strip()))
    text = re.sub(r"<!-- Generated by .*? -->\n", "", text)
    _write(stage / "teaching.md", text.strip() + "\n")


def stage(only: list[str] | None = None) -> list[str]:
    _stage_conf(STAGE)
    stage_readme()
    stage_teaching()
    stage_sources()
    return stage_chapters(only)


def stage_zh(only: list[str] | None = None) -> list[str]:
    _stage_conf(STAGE_ZH, skip=("index.md",))
    stage_landing_zh()
    stage_sources(STAGE_ZH)
    return stage_chapters_zh(only)


def sphinx(stage_dir: Path, out: Path, doctrees: Path, jobs: str, env: dict) -> int:
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-j", jobs, "-q", "--keep-going",
           "-d", str(doctrees), str(stage_dir), str(out)]
    return subprocess.call(cmd, env=env, cwd=ROOT)


def unexecuted(chapters: list[str], cache: Path, stage_dir: Path = STAGE) -> list[str]:
    """Chapters whose code has no error-free execution in the cache (MyST-NB caches only those)."""
    import nbformat
    from jupyter_cache import get_cache

    db = get_cache(str(cache))
    missing = []
    for name in chapters:
        try:
            db.match_cache_notebook(nbformat.read(stage_dir / "chapters" / f"{name}.ipynb", as_version=4))
        except KeyError:
            missing.append(name)
    return missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.book", description=__doc__.split("\n\n")[0])
    p.add_argument("--clean", action="store_true", help="drop the site, Sphinx's environment and the cache")
    p.add_argument("-j", default="1", help="Sphinx parallel jobs (default 1: the chapters use the cores)")
    p.add_argument("--lang", choices=["both", "en", "zh"], default="both",
                   help="which site to build (zh reuses the English build's executions)")
    p.add_argument("--chapters", default="", help="comma-separated chapter stems: build only these (a quick check)")
    args = p.parse_args(argv)
    only = [c.strip() for c in args.chapters.split(",") if c.strip()] or None
    if args.clean:
        for d in (STAGE, OUT, DOCTREES, CACHES, STAGE_ZH, DOCTREES_ZH):
            shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    chapters = stage(only)
    chapters_zh = stage_zh(only) if args.lang != "en" else []
    if only is None:                     # Sphinx keeps the page of a removed chapter: drop it from both sites
        from tools.notebooks import drop_stale
        drop_stale(OUT / "chapters", ".html", set(chapters))
        if args.lang != "en":
            drop_stale(OUT_ZH / "chapters", ".html", set(chapters_zh))
    cache = cache_dir()
    for old in CACHES.glob("*"):         # executions against an older package are never reused
        if old != cache:
            shutil.rmtree(old, ignore_errors=True)
    env = dict(os.environ, TFORMER_BOOK_CACHE=str(cache),
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    rc = 0
    if args.lang != "zh":
        print(f"book: {len(chapters)} chapters, cache {cache.relative_to(ROOT)}", flush=True)
        rc = sphinx(STAGE, OUT, DOCTREES, args.j,
                    dict(env, TFORMER_BOOK_LANG="en", TFORMER_BOOK_OTHER=str(STAGE_ZH), TFORMER_BOOK_OTHER_URL="zh/"))
        failed = unexecuted(chapters, cache)
        if failed:   # shown on the site with their error; pytest reruns them (they are not in the cache)
            print(f"book: {len(failed)} chapter(s) failed to execute: {', '.join(failed)}", flush=True)
            rc = rc or 1
        print(f"book: English site {'built' if rc == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s -> "
              f"{(OUT / 'index.html').relative_to(ROOT)}", flush=True)
    if args.lang != "en":
        t1 = time.perf_counter()
        missing = unexecuted(chapters_zh, cache, STAGE_ZH) if (STAGE_ZH / "chapters").exists() else []
        if missing:  # never executed a second time: shown without outputs until the English build runs them
            print(f"book: {len(missing)} chapter(s) without an execution in the cache, shown without outputs "
                  f"in Chinese: {', '.join(missing)}", flush=True)
        zh_rc = sphinx(STAGE_ZH, OUT_ZH, DOCTREES_ZH, args.j,
                       dict(env, TFORMER_BOOK_LANG="zh", TFORMER_BOOK_OTHER=str(STAGE), TFORMER_BOOK_OTHER_URL="../",
                            TFORMER_BOOK_NO_EXECUTE=",".join(missing)))
        print(f"book: Chinese site {'built' if zh_rc == 0 else 'FAILED'} in {time.perf_counter() - t1:.0f} s "
              f"(no execution) -> {(OUT_ZH / 'index.html').relative_to(ROOT)}", flush=True)
        rc = rc or zh_rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
