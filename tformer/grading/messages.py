"""The checker's messages in the learner's language: `_("...")` translates through the catalog
tformer/grading/locale/zh_CN/LC_MESSAGES/tformer.po, `N_("...")` marks a message where it is defined.

The language is TFORMER_LANG (zh, zh_CN, en, ...), else the metadata of the notebook the kernel runs (the
Chinese edition's notebooks say "zh-CN"); the grading worker sets TFORMER_LANG for the notebooks it runs.
"""
from __future__ import annotations

import functools
import gettext
import json
import os
from pathlib import Path

LOCALE_DIR = Path(__file__).resolve().parent / "locale"


@functools.lru_cache(maxsize=8)
def _notebook_language(path: str) -> str:
    """The `language` in a notebook's metadata ("zh-CN" in notebooks/zh/), "" if none or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return str(json.load(f).get("metadata", {}).get("language", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def language() -> str:
    """The learner's language for the checker's messages: "zh" or "en". TFORMER_LANG (zh, zh_CN, en, ...)
    first; else the metadata of the notebook this kernel runs (Jupyter gives kernels its path in
    JPY_SESSION_NAME; the grading worker sets TFORMER_LANG from the notebook it runs)."""
    lang = os.environ.get("TFORMER_LANG", "")
    if not lang:
        nb = os.environ.get("JPY_SESSION_NAME", "")       # the notebook's path (an older server: its URL path,
        if nb.endswith(".ipynb") and not os.path.exists(nb):   # and the kernel runs in the notebook's folder)
            nb = os.path.basename(nb)
        lang = _notebook_language(nb) if nb.endswith(".ipynb") else ""
    return "zh" if lang.lower().replace("-", "_").startswith("zh") else "en"


@functools.lru_cache(maxsize=1)
def _catalog() -> gettext.NullTranslations:
    return gettext.translation("tformer", localedir=str(LOCALE_DIR), languages=["zh_CN"], fallback=True)


def N_(message: str) -> str:
    """Marks a message for the catalog where it is defined; `_()` translates it where it is shown."""
    return message


def _(message: str) -> str:
    """A checker message in the learner's language (the catalog tformer/grading/locale/zh_CN/.../tformer.po);
    placeholders ({expected}, {got}, ...) are filled after translation, so numbers and names stay as they are."""
    return _catalog().gettext(message) if language() == "zh" else message
