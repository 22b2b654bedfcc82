"""Sphinx extension of the course site: links from the chapters to the package's source.

* An inline literal naming a module, `tformer/attention.py` (optionally `tformer/attention.py: name`)
  or `tformer.attention`, links to that module's source page (src/tformer/attention, written by
  tools/book.py); a chapter's name, `01_attention`, links to the chapter.
* A chapter whose text names no module gets a line under its title listing the tformer modules its code
  imports, linked the same way.
"""
from __future__ import annotations

import re

from docutils import nodes

MODULE_PATH = re.compile(r"^(tformer/[\w/]+)\.py\b")
MODULE_DOTTED = re.compile(r"^(tformer(?:\.\w+)+)\b")
CHAPTER = re.compile(r"^(\d\d[a-z]?_\w+?)(?:\.ipynb)?$")
IMPORT = re.compile(r"^\s*(?:from\s+(tformer(?:\.\w+)*)\s+import\s+([\w ,()]+)|import\s+(tformer(?:\.\w+)*))",
                    re.M)
USED = re.compile(r"\btformer(?:\.\w+)+")


def _module_doc(found: set[str], dotted: str) -> str | None:
    """tformer.models.gpt -> 'src/tformer/models/gpt' (or its package's __init__), if it exists."""
    parts = dotted.split(".")
    while len(parts) > 1:
        for doc in ("src/" + "/".join(parts), "src/" + "/".join(parts) + "/__init__"):
            if doc in found:
                return doc
        parts = parts[:-1]
    return None


def _target(found: set[str], text: str) -> str | None:
    text = text.strip()
    if m := MODULE_PATH.match(text):
        return _module_doc(found, m.group(1).replace("/", "."))
    if m := MODULE_DOTTED.match(text):
        return _module_doc(found, m.group(1))
    if (m := CHAPTER.match(text)) and f"chapters/{m.group(1)}" in found:
        return f"chapters/{m.group(1)}"
    return None


def imported_modules(found: set[str], code: str) -> list[str]:
    """Source pages of the tformer modules a chapter's code imports or names, in order of appearance."""
    names: list[str] = []
    for m in IMPORT.finditer(code):
        if m.group(3):
            names.append(m.group(3))
        else:
            names += [f"{m.group(1)}.{n.split(' as ')[0].strip()}"
                      for n in m.group(2).replace("(", "").replace(")", "").split(",") if n.strip()]
    names += [m.group(0) for m in USED.finditer(code)]        # tformer.attention.causal_mask(...)
    docs: list[str] = []
    for dotted in names:
        doc = _module_doc(found, dotted)
        if doc and doc not in docs and not doc.endswith("tformer/__init__"):
            docs.append(doc)
    return docs


def add_module_line(app, doctree):
    docname = app.env.docname
    if not docname.startswith("chapters/"):
        return
    found = app.env.found_docs
    named = [n for n in doctree.findall(nodes.literal)
             if not isinstance(n.parent, nodes.literal_block) and MODULE_PATH.match(n.astext().strip())]
    if named:
        return
    code = "\n".join(b.astext() for b in doctree.findall(nodes.literal_block)
                     if "cell_input" in (b.parent.get("classes", []) if b.parent else []))
    docs = imported_modules(found, code)
    section = next(iter(doctree.findall(nodes.section)), None)
    if not docs or section is None:
        return
    para = nodes.paragraph(classes=["tformer-modules"])
    para += nodes.strong(text="tformer modules used here: ")
    for i, doc in enumerate(docs):
        if i:
            para += nodes.Text(", ")
        para += nodes.literal(text=doc[len("src/"):] + ".py")
    title = next(iter(section.findall(nodes.title)))
    section.insert(section.index(title) + 1, para)


def link_literals(app, doctree, fromdocname):
    found = app.env.found_docs
    for lit in list(doctree.findall(nodes.literal)):
        if isinstance(lit.parent, (nodes.reference, nodes.literal_block)):
            continue
        target = _target(found, lit.astext())
        if target is None or target == fromdocname:
            continue
        ref = nodes.reference("", "", internal=True,
                              refuri=app.builder.get_relative_uri(fromdocname, target))
        lit.replace_self(ref)
        ref += lit


def setup(app):
    app.connect("doctree-read", add_module_line)
    app.connect("doctree-resolved", link_literals)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
