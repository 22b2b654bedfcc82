"""Sphinx extension of the course site: links from the chapters to the package's source.

* An inline literal naming a module, `tformer/attention.py` (optionally `tformer/attention.py: name`)
  or `tformer.attention`, links to that module's source page (src/tformer/attention, written by
  tools/book.py); a chapter's name, `01_attention`, links to the chapter.
* A chapter whose text names no module gets a line under its title listing the tformer modules its code
  imports, linked the same way.
* Every page links to the same page in the other language (English <-> Chinese, `tformer_other_stage`
  names the other site's staged sources; a page it lacks links to its landing page).
* In the Chinese site, figure captions (made from the English text by tools/book.py, so that the code cells
  match the English executions in the cache) are replaced by their Chinese versions (_captions.json).
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

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
    label = "本章用到的 tformer 模块：" if app.config.tformer_lang == "zh" else "tformer modules used here: "
    para += nodes.strong(text=label)
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


def _other_docs(app) -> set[str]:
    """The other language's pages (its staged sources), computed once per run (kept on the app: the
    environment is pickled between builds and would keep an old list)."""
    if not hasattr(app, "_tformer_other_docs"):
        root = Path(app.config.tformer_other_stage) if app.config.tformer_other_stage else None
        docs = set()
        if root and root.is_dir():
            for f in root.rglob("*"):
                rel = f.relative_to(root)
                if f.suffix in (".md", ".ipynb") and not rel.parts[0].startswith("_"):
                    docs.add(rel.with_suffix("").as_posix())
        app._tformer_other_docs = docs
    return app._tformer_other_docs


def relink_when_the_other_site_changes(app, env, added, changed, removed):
    """Rewrite every page when the other language's set of pages changed since the last build (a page's link
    goes to its counterpart or, if there is none, to the landing page); otherwise nothing extra."""
    docs = sorted(_other_docs(app))
    if getattr(env, "tformer_other_docs_seen", None) == docs:
        return []
    env.tformer_other_docs_seen = docs
    return sorted(env.found_docs - set(added) - set(changed) - set(removed))


def language_link(app, pagename, templatename, context, doctree):
    """A line at the top of every page: the same page in the other language."""
    docs = _other_docs(app)
    if doctree is None or "body" not in context or not docs:
        return
    target = pagename if pagename in docs else "index"
    href = "../" * pagename.count("/") + app.config.tformer_other_url + target + ".html"
    if app.config.tformer_lang == "zh":
        text, lang = "English version of this page", "en"
    else:
        text, lang = "本页中文版", "zh-CN"
    context["body"] = (f'<p class="tformer-lang"><a class="tformer-lang-link" href="{html.escape(href)}" '
                       f'hreflang="{lang}" lang="{lang}">{text}</a></p>\n') + context["body"]


MATH_OR_CODE = re.compile(r"(\$[^$]+\$|`[^`]+`)")


def _key(text: str) -> str:
    return " ".join(re.sub(r"[`*$\\{}]", "", text).split())     # tools/book.py's caption_key


def translate_captions(app, doctree):
    if app.config.tformer_lang != "zh":
        return
    if not hasattr(app, "_tformer_captions"):
        path = Path(app.srcdir) / "_captions.json"
        app._tformer_captions = json.loads(path.read_text()) if path.exists() else {}
    pairs = app._tformer_captions.get(app.env.docname)
    if not pairs:
        return
    for cap in list(doctree.findall(nodes.caption)):
        zh = pairs.get(_key(cap.astext()))
        if zh is None:
            continue
        cap.children = []
        for part in MATH_OR_CODE.split(zh.replace("**", "")):
            if part.startswith("$") and part.endswith("$") and len(part) > 1:
                cap += nodes.math(part[1:-1], part[1:-1])
            elif part.startswith("`") and part.endswith("`") and len(part) > 1:
                cap += nodes.literal(part[1:-1], part[1:-1])
            elif part:
                cap += nodes.Text(part)


def _chinese_search_with_its_stemmer() -> None:
    """Sphinx's Chinese search stems Latin words with the English stemmer but names it `ChineseStemmer` in
    language_data.js (a page error: "ChineseStemmer is not defined"); give the class the stemmer's name."""
    from sphinx import search
    from sphinx.search.zh import SearchChinese

    class Chinese(SearchChinese):
        language_name = "English"           # only names the JS stemmer class: english-stemmer.js's EnglishStemmer

    search.languages["zh"] = Chinese


def setup(app):
    _chinese_search_with_its_stemmer()
    app.add_config_value("tformer_lang", "en", "html")
    app.add_config_value("tformer_other_stage", "", "html")
    app.add_config_value("tformer_other_url", "", "html")
    app.connect("doctree-read", add_module_line)
    app.connect("doctree-read", translate_captions)
    app.connect("doctree-resolved", link_literals)
    app.connect("html-page-context", language_link)
    app.connect("env-get-outdated", relink_when_the_other_site_changes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
