"""The Chinese edition, built from the English sources and gettext catalogs.

One segmentation for everything: a message per markdown cell of the jupytext sources
(`notebooks/src/NN_slug.py` -> `locale/zh_CN/LC_MESSAGES/NN_slug.po`). Code cells are never
translated or copied: the Chinese notebooks take them from the same sources, so both editions run the
same code. The checker's messages live in their own catalog (`tformer/grading/locale/`, shipped
with the package); `update` extracts them from tformer/grading/core.py's `_("...")` calls.

    python -m tools.i18n update     # extract the catalogs from the English sources: a changed cell keeps
                                    # its old translation marked fuzzy; a deleted one becomes obsolete (#~)
    python -m tools.i18n build      # notebooks/zh/NN_slug.ipynb for the translated chapters, and the
                                    # checker's compiled catalog (.mo)
    python -m tools.i18n check      # exit 1 if a translated chapter has an untranslated, fuzzy or stale
                                    # message, or notebooks/zh/ or the .mo is out of date
    python -m tools.i18n stats      # messages translated / fuzzy / untranslated per catalog

The chapters that count as translated are listed in locale/translated.txt (one stem a line); the tests
(tests/test_i18n.py) apply to them.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
LOCALE = ROOT / "locale"
LANG = "zh_CN"
PO_DIR = LOCALE / LANG / "LC_MESSAGES"
TRANSLATED = LOCALE / "translated.txt"
ZH_NOTEBOOKS = ROOT / "notebooks" / "zh"
GRADING_PO = ROOT / "tformer" / "grading" / "locale" / LANG / "LC_MESSAGES" / "tformer.po"
GRADING_SOURCES = [ROOT / "tformer" / "grading" / "core.py"]
LANDING = ROOT / "book" / "index.md"
GLOSSARY_TOCTREE = "```{toctree}\n:caption: 参考\n:maxdepth: 1\n\nglossary\n```"
NB_LANGUAGE = "zh-CN"          # the notebook metadata's `language` (BCP 47), read by the checker

HEADER = {
    "Project-Id-Version": "tformer",
    "Language": LANG,
    "MIME-Version": "1.0",
    "Content-Type": "text/plain; charset=UTF-8",
    "Content-Transfer-Encoding": "8bit",
    "Plural-Forms": "nplurals=1; plural=0;",
}


def translated_chapters() -> list[str]:
    if not TRANSLATED.exists():
        return []
    return [l.strip() for l in TRANSLATED.read_text().splitlines() if l.strip() and not l.startswith("#")]


def chapter_sources() -> list[Path]:
    return sorted(SRC.glob("[0-9][0-9]_*.py"))


def markdown_cells(src: Path) -> list[tuple[int, str]]:
    """(cell index, markdown text) of a source's markdown cells, as the notebooks show them."""
    from tools.notebooks import build_notebook
    nb = build_notebook(src, solutions=False)
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]


def landing_blocks() -> list[tuple[bool, str]]:
    """book/index.md as blocks separated by blank lines: (is prose, text). Directives (```{...}```) are kept
    as they are; every other block (the title, a paragraph) is a message of locale/.../index.po."""
    blocks, current, fenced = [], [], False
    for line in LANDING.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced if line.strip() == "```" or not fenced else fenced
        if not line.strip() and not fenced:
            if current:
                blocks.append("\n".join(current))
            current = []
        else:
            current.append(line)
    if current:
        blocks.append("\n".join(current))
    return [(not b.startswith("```"), b) for b in blocks]


def landing_page_zh() -> str:
    """The Chinese landing page: book/index.md with its prose from index.po (English where missing), and
    the glossary in its own table of contents after the chapters'."""
    zh = translations("index") if (PO_DIR / "index.po").exists() else {}
    out = []
    for prose, block in landing_blocks():
        out.append(zh.get(block, block) if prose else block)
        if block.startswith("```{toctree}") and "chapters/" in block:
            out.append(GLOSSARY_TOCTREE)
    return "\n\n".join(out) + "\n"


def grading_messages() -> list[tuple[str, str]]:
    """(msgid, where) of every `_("...")` call with a literal string in the grading sources."""
    found = []
    for path in GRADING_SOURCES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("_", "N_")
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.append((node.lineno, node.args[0].value, f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"))
    found = [(m, where) for _, m, where in sorted(found)]
    # the hints and named mistakes of the translated chapters' exercises
    from tformer.grading import core, exercises  # noqa: F401  (registers every exercise)
    chapters = {stem[:2] for stem in translated_chapters()}
    for name, ex in sorted(core.REGISTRY.items()):
        if name[2:4] in chapters:
            where = f"tformer/grading/exercises/{name.split('.')[0]}.py:{name}"
            found += [(ex.hint, where)] if ex.hint else []
            found += [(m, where) for m in ex.mistakes]
    return found


def _load(path: Path):
    import polib
    if path.exists():
        return polib.pofile(str(path), wrapwidth=0)
    po = polib.POFile(wrapwidth=0)
    po.metadata = dict(HEADER)
    return po


def merge(path: Path, messages: list[tuple[str, str]]) -> dict[str, int]:
    """Bring catalog `path` in line with `messages` (msgid, occurrence), in their order. An unchanged
    msgid keeps its translation; a new one takes the translation of the most similar vanished msgid
    (fuzzy, with its previous msgid), as msgmerge does; vanished ones become obsolete."""
    import polib
    old = _load(path)
    active = {e.msgid: e for e in old if not e.obsolete}
    wanted = {m for m, _ in messages}
    gone = [e for e in old if e.msgid not in wanted and e.msgstr]
    po = polib.POFile(wrapwidth=0)
    po.metadata = dict(HEADER, **{k: v for k, v in old.metadata.items() if k in ("Project-Id-Version",)})
    counts = dict(kept=0, fuzzy=0, new=0, obsolete=0)
    used: set[int] = set()
    for msgid, where in messages:
        if any(e.msgid == msgid for e in po):
            continue
        entry = polib.POEntry(msgid=msgid, msgstr="", occurrences=[tuple(where.rsplit(":", 1))])
        if msgid in active:
            e = active[msgid]
            entry.msgstr, entry.flags, entry.tcomment = e.msgstr, list(e.flags), e.tcomment
            entry.previous_msgid = e.previous_msgid
            counts["fuzzy" if "fuzzy" in e.flags else "kept"] += 1
        else:
            best, score = None, 0.0
            for j, e in enumerate(gone):
                if j in used:
                    continue
                r = difflib.SequenceMatcher(None, e.msgid, msgid, autojunk=False).ratio()
                if r > score:
                    best, score = j, r
            if best is not None and score >= 0.6:
                used.add(best)
                entry.msgstr, entry.flags = gone[best].msgstr, ["fuzzy"]
                entry.previous_msgid = gone[best].msgid
                counts["fuzzy"] += 1
            else:
                counts["new"] += 1
        po.append(entry)
    for j, e in enumerate(gone):
        if j not in used:
            e.obsolete = True
            po.append(e)
            counts["obsolete"] += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save(str(path))
    return counts


def update() -> None:
    for src in chapter_sources():
        path = PO_DIR / f"{src.stem}.po"
        rel = src.relative_to(ROOT).as_posix()
        c = merge(path, [(text, f"{rel}:cell {i}") for i, text in markdown_cells(src)])
        print(f"{path.relative_to(ROOT)}: {c}")
    c = merge(PO_DIR / "index.po", [(b, f"book/index.md:block {i}") for i, (prose, b) in enumerate(landing_blocks()) if prose])
    print(f"{(PO_DIR / 'index.po').relative_to(ROOT)}: {c}")
    c = merge(GRADING_PO, grading_messages())
    print(f"{GRADING_PO.relative_to(ROOT)}: {c}")


def problems(src: Path, po_path: Path | None = None) -> list[str]:
    """What keeps a chapter from counting as translated: messages untranslated, fuzzy, or stale."""
    import polib
    po_path = po_path or PO_DIR / f"{'index' if src == LANDING else src.stem}.po"
    if not po_path.exists():
        return [f"{po_path.name}: no catalog (run `python -m tools.i18n update`)"]
    po = polib.pofile(str(po_path))
    by_id = {e.msgid: e for e in po if not e.obsolete}
    out = []
    wanted = ([b for prose, b in landing_blocks() if prose] if src == LANDING
              else [t for _, t in markdown_cells(src)])
    for i, text in enumerate(wanted):
        e = by_id.get(text)
        head = text.strip().splitlines()[0][:60] if text.strip() else ""
        if e is None:
            out.append(f"{po_path.name}: message {head!r} has no entry (run `python -m tools.i18n update`)")
        elif "fuzzy" in e.flags:
            out.append(f"{po_path.name}: fuzzy (English changed, translation not updated): {head!r}")
        elif not e.msgstr.strip():
            out.append(f"{po_path.name}: untranslated: {head!r}")
    for e in by_id.values():
        if e.msgid not in wanted:
            out.append(f"{po_path.name}: stale entry, its English text is gone: {e.msgid.strip()[:60]!r}")
    return out


def translations(stem: str) -> dict[str, str]:
    import polib
    po = polib.pofile(str(PO_DIR / f"{stem}.po"))
    return {e.msgid: e.msgstr for e in po if not e.obsolete and e.msgstr and "fuzzy" not in e.flags}


def build_zh_notebook(src: Path):
    """The learner notebook of `src` with its markdown cells from the catalog (English where a message is
    missing), its code cells untouched, and its language in the metadata."""
    from tools.notebooks import build_notebook
    nb = build_notebook(src, solutions=False)
    zh = translations(src.stem) if (PO_DIR / f"{src.stem}.po").exists() else {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = zh.get(cell.source, cell.source)
    nb.metadata["language"] = NB_LANGUAGE
    nb.metadata["tformer"] = {"language": "zh"}
    return nb


def render_zh(src: Path) -> str:
    import nbformat
    return nbformat.writes(build_zh_notebook(src)) + "\n"


def compile_grading(check_only: bool = False) -> bool:
    """tformer.po -> tformer.mo beside it; True if the .mo was (or, with check_only, is) up to date."""
    import io
    import polib
    po = polib.pofile(str(GRADING_PO))
    mo = GRADING_PO.with_suffix(".mo")
    tmp = io.BytesIO()
    data = po.to_binary()
    tmp.write(data)
    same = mo.exists() and mo.read_bytes() == data
    if not check_only and not same:
        mo.write_bytes(data)
    return same


def build() -> list[Path]:
    ZH_NOTEBOOKS.mkdir(parents=True, exist_ok=True)
    names = translated_chapters()
    written = []
    for stem in names:
        src = SRC / f"{stem}.py"
        dst = ZH_NOTEBOOKS / f"{stem}.ipynb"
        text = render_zh(src)
        if not dst.exists() or dst.read_text() != text:
            dst.write_text(text)
        written.append(dst)
    for old in ZH_NOTEBOOKS.glob("*.ipynb"):
        if old.stem not in names:
            old.unlink()
    compile_grading()
    return written


def check() -> list[str]:
    bad = []
    for stem in translated_chapters():
        src = SRC / f"{stem}.py"
        if not src.exists():
            bad.append(f"locale/translated.txt lists {stem}, which has no source")
            continue
        bad += problems(src)
        dst = ZH_NOTEBOOKS / f"{stem}.ipynb"
        if not dst.exists() or dst.read_text() != render_zh(src):
            bad.append(f"notebooks/zh/{stem}.ipynb is out of date (run `python -m tools.i18n build`)")
    bad += problems(LANDING)
    if not compile_grading(check_only=True):
        bad.append("tformer/grading/locale/.../tformer.mo is out of date (run `python -m tools.i18n build`)")
    return bad


def stats() -> None:
    import polib
    for path in sorted(PO_DIR.glob("*.po")) + [GRADING_PO]:
        po = polib.pofile(str(path))
        active = [e for e in po if not e.obsolete]
        print(f"{path.relative_to(ROOT)}: {len(active)} messages, {len(po.translated_entries())} translated, "
              f"{len(po.fuzzy_entries())} fuzzy, {len(po.untranslated_entries())} untranslated, "
              f"{len(po.obsolete_entries())} obsolete")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.i18n", description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["update", "build", "check", "stats"])
    args = p.parse_args(argv)
    if args.cmd == "update":
        update()
    elif args.cmd == "build":
        for path in build():
            print(path.relative_to(ROOT))
    elif args.cmd == "stats":
        stats()
    else:
        bad = check()
        for line in bad:
            print(line)
        if bad:
            return 1
        print(f"Chinese edition up to date: {len(translated_chapters())} chapter(s) translated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
