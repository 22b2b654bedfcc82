"""Sphinx configuration of the course website (`make book`, see tools/book.py).

tools/book.py stages this folder with the learner notebooks (built from notebooks/src), README sections
and the tformer sources into build/book_src/, then runs Sphinx on it. MyST-NB executes each chapter in
small mode with the exercise stubs in place (TFORMER_GRADE=blank: every check cell reports, nothing
raises) and caches the executed notebook with jupyter-cache, so an unchanged chapter is not run again.
Everything the pages load is in the site: MathJax is bundled, no widget or font comes from a CDN.
The same configuration builds the Chinese site (TFORMER_BOOK_LANG=zh, from build/book_src_zh/): Sphinx's
Chinese labels and its Chinese search (words split by jieba); the executions come from the same cache.
"""
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))  # the tformer_book extension

project = "tformer"
author = "the tformer authors"
copyright = "the tformer authors, MIT licence"
html_title = "tformer: Transformers, explained, built and proven"

extensions = [
    "myst_nb",
    "sphinx-mathjax-offline",          # MathJax 3 copied into _static/mathjax (no CDN)
    "tformer_book",                    # links `tformer/x.py` and chapter names; figure captions
]

# What the kernels see: the chapters' small mode, learner form graded "blank"; inline figures.
os.environ.update(TFORMER_SMALL="1", TFORMER_GRADE="blank", TQDM_DISABLE="1",
                  HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
os.environ.pop("MPLBACKEND", None)     # Agg (set for pytest) would swallow the inline figures

mathjax_path = "mathjax/tex-svg.js"   # SVG output: no web fonts to load from file://

nb_execution_mode = os.environ.get("TFORMER_BOOK_EXECUTE", "cache")
nb_execution_cache_path = os.environ.get("TFORMER_BOOK_CACHE", str(HERE.parent / "book_cache"))
nb_execution_timeout = 900             # a cell; the chapters take about a minute each in small mode
nb_execution_raise_on_error = False    # a failing chapter is shown with its error, never cached;
                                       # tools/book.py then exits 1 naming it, and pytest reruns it
nb_execution_show_tb = True
nb_execution_excludepatterns = ["src/**", "_readme/**"]
nb_ipywidgets_js = {}                  # no widget scripts from a CDN
nb_merge_streams = True
nb_number_source_lines = False

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "_ext", "_readme"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["book.css", "i18n.css"]
html_copy_source = True                # the download button offers the learner notebook (.ipynb)
html_show_sourcelink = False
html_show_search_summary = False     # summaries fetch() each page: blocked from file://
html_last_updated_fmt = None
html_theme_options = {
    "use_download_button": True,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "use_source_button": False,
    "use_edit_page_button": False,
    "use_issues_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "navigation_with_keys": True,
    "search_bar_text": "Search the course...",
}
html_context = {"default_mode": "light"}

# The other language (tools/book.py sets these): every page links to the same page there.
tformer_lang = os.environ.get("TFORMER_BOOK_LANG", "en")
tformer_other_stage = os.environ.get("TFORMER_BOOK_OTHER", "")
tformer_other_url = os.environ.get("TFORMER_BOOK_OTHER_URL", "")
if tformer_lang == "zh":
    language = "zh_CN"
    html_search_language = "zh"           # sphinx.search.zh: jieba splits the words
    html_title = "tformer：讲清、实现并验证 Transformer"
    html_theme_options["search_bar_text"] = "搜索课程……"
    # a chapter the English build could not execute is shown without outputs, never executed a second time
    nb_execution_excludepatterns += [f"chapters/{c}.ipynb" for c in
                                     os.environ.get("TFORMER_BOOK_NO_EXECUTE", "").split(",") if c]
