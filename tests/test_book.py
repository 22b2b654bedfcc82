"""The course website (`make book` -> build/book/) read in a real browser, offline, from file://.

Headless Chromium (Debian's `chromium`, driven by Playwright's Python package; `make test` installs both)
opens the landing page and every chapter page and checks what a reader sees: no console error, no failed
request and no request leaving file://, every figure a loaded image of non-zero size with a caption, the
math typeset (no raw `$...$` left), the chapter's title and section headings, the notebook download,
the links to the package's source, and that search finds a chapter. Screenshots of the landing page
and of one chapter go to build/book_screenshots/ (not in git).

The Chinese site (build/book/zh/) passes the same tests, with its own headings (from the catalogs), a
search for a Chinese word (Sphinx's Chinese search, words split by jieba) and one more check: Chinese
text is drawn with a CJK font (the fonts Chromium used for the title, asked through the DevTools
protocol); without a CJK font installed (`fonts-noto-cjk`, which `make test` installs when root) that one
check skips with a line. Every page of either site links to the same page in the other language.

Without a built site the test skips (`make book` builds it); `make test` builds the site first and sets
TFORMER_REQUIRE_BOOK=1, which turns that skip into a failure. A site built for a few chapters only
(`python -m tools.book --chapters A,B`) is tested with TFORMER_BOOK_CHAPTERS=A,B.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("TFORMER_BOOK_DIR", ROOT / "build" / "book"))  # where `make book` writes
SHOTS = ROOT / "build" / "book_screenshots"
SRC = ROOT / "notebooks" / "src"
STAGE_ZH = ROOT / "build" / "book_src_zh"        # tools/book.py's Chinese sources (the staged notebooks)
LANGS = ["en", "zh"]
CJK_FONT = re.compile(r"CJK|Source Han|WenQuanYi|Droid Sans Fallback|Noto Sans SC|Noto Serif SC|Hei|Ming|Song|Kai", re.I)
RAW_MATH = re.compile(r"\$\$|\$[^\s$][^$\n]{0,200}?\$|\\\(|\\\[")

pytestmark = pytest.mark.book


def _browser() -> str | None:
    """Path of a Chromium that Playwright can drive: Debian's package first, then Playwright's own."""
    for path in ("/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if path and Path(path).exists():
            return path
    return None


@pytest.fixture(scope="module")
def browser_context():
    if not (SITE / "index.html").exists():
        if os.environ.get("TFORMER_REQUIRE_BOOK") == "1":
            pytest.fail("build/book/index.html is missing although `make test` built the site")
        pytest.skip("no site in build/book: run `make book` first")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright (the `book` extra) drives the browser")
    executable = _browser()
    if executable is None:
        pytest.skip("no Chromium installed (`apt-get install chromium` as root; `make test` does it when it can)")
    with playwright.sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            viewport={"width": 1280, "height": 900})
        yield context
        context.close()


class Visit:
    """One page load with everything that went wrong on the way."""

    def __init__(self, context, path: Path):
        self.problems: list[str] = []
        page = self.page = context.new_page()
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(f"failed request: {r.url} ({r.failure})"))

        def only_local(route):
            url = route.request.url
            if url.startswith(("file:", "data:", "blob:", "about:")):
                route.continue_()
            else:
                self.problems.append(f"request leaving the site: {url}")
                route.abort()

        page.route("**/*", only_local)
        page.goto(path.as_uri() if isinstance(path, Path) else path, wait_until="load")
        page.wait_for_function("!window.MathJax || !MathJax.startup || MathJax.startup.promise"
                               " && (MathJax.startup.promise.then(() => window.__typeset = true), true)")
        page.wait_for_function("!window.MathJax || !MathJax.startup || window.__typeset === true")

    def text_outside_code(self) -> str:
        return self.page.evaluate("""() => {
            const main = document.querySelector('main') || document.body;
            const copy = main.cloneNode(true);
            copy.querySelectorAll('pre, code, mjx-container, script, style, .output').forEach(n => n.remove());
            return copy.innerText;
        }""")


def _site(lang: str) -> Path:
    return SITE if lang == "en" else SITE / "zh"


def _need(lang: str) -> Path:
    site = _site(lang)
    if not (site / "index.html").exists():
        if os.environ.get("TFORMER_REQUIRE_BOOK") == "1":
            pytest.fail(f"{site}/index.html is missing although `make test` built the site")
        pytest.skip(f"no site in {site}: run `make book` first")
    return site


def _chapters(lang: str = "en") -> list[Path]:
    return sorted((_site(lang) / "chapters").glob("*.html"))


def _headings(stem: str, lang: str = "en") -> tuple[str, list[str]]:
    """The chapter's title and second-level headings, from its source (the Chinese site: from the staged
    Chinese notebook, whose markdown comes from the catalog)."""
    if lang == "zh" and (STAGE_ZH / "chapters" / f"{stem}.ipynb").exists():
        nb = json.loads((STAGE_ZH / "chapters" / f"{stem}.ipynb").read_text())
        lines = [l for c in nb["cells"] if c["cell_type"] == "markdown" for l in "".join(c["source"]).splitlines()]
    else:
        src = (SRC / f"{stem}.py").read_text()
        lines = [l[2:] if l.startswith("# ") else l for l in src.splitlines()]
    title = next(l[2:].strip() for l in lines if l.startswith("# "))
    return title, [l[3:].strip() for l in lines if l.startswith("## ")]


def _words(text: str) -> list[str]:
    """A heading's words without its math and punctuation (the page typesets one, curls the other); each
    Chinese character counts as a word."""
    return re.findall(r"[a-z0-9]+|[\u4e00-\u9fff]", re.sub(r"\$[^$]*\$", " ", text.lower()))


def _language_link(page) -> str | None:
    """Problem with the link to the same page in the other language, or None."""
    hrefs = page.eval_on_selector_all("a.tformer-lang-link", "as => as.map(a => a.href)")
    if not hrefs:
        return "no link to the other language"
    if not Path(re.sub("^file://", "", hrefs[0].split("#")[0])).exists():
        return f"broken link to the other language: {hrefs[0]}"
    return None


def _shown(heading: str, shown: list[str]) -> bool:
    words = _words(heading)
    return any(all(w in _words(s) for w in words) for s in shown)


@pytest.mark.parametrize("lang", LANGS)
def test_landing_page(browser_context, lang):
    site = _need(lang)
    SHOTS.mkdir(parents=True, exist_ok=True)
    visit = Visit(browser_context, site / "index.html")
    page = visit.page
    assert visit.problems == [], visit.problems
    assert "tformer" in page.inner_text("h1")
    text = visit.text_outside_code()
    sections = (("Chapter map", "Results", "Quick start", "Exercises") if lang == "en"
                else ("章节地图", "结果", "快速开始", "练习"))
    for section in sections:
        assert section in text, f"landing page lacks the README's {section!r} section"
    guide = page.eval_on_selector_all("a[href*='teaching']", "as => as.map(a => a.getAttribute('href'))")
    assert guide, "the landing page does not link the teachers' guide"
    teaching = (site / "teaching.html").read_text(encoding="utf-8")
    assert ("Teaching with tformer" if lang == "en" else "用 tformer 教学") in teaching
    assert _language_link(page) is None, _language_link(page)
    links = page.eval_on_selector_all("a[href*='chapters/']", "as => as.map(a => a.getAttribute('href'))")
    chapters = {Path(h.split("#")[0]).stem for h in links}
    expected = {p.stem for p in SRC.glob("[0-9][0-9]*_*.py")}
    if os.environ.get("TFORMER_BOOK_CHAPTERS"):      # a site built with `python -m tools.book --chapters ...`
        expected &= set(os.environ["TFORMER_BOOK_CHAPTERS"].split(","))
    assert expected <= chapters, f"chapters missing from the landing page: {sorted(expected - chapters)}"
    page.screenshot(path=str(SHOTS / f"landing{'' if lang == 'en' else '_' + lang}.png"), full_page=False)
    page.close()


@pytest.mark.parametrize("lang", LANGS)
def test_every_chapter_page(browser_context, lang):
    _need(lang)
    chapters = _chapters(lang)
    expected = sorted(p.stem for p in SRC.glob("[0-9][0-9]*_*.py"))
    if os.environ.get("TFORMER_BOOK_CHAPTERS"):      # a site built with `python -m tools.book --chapters ...`
        expected = sorted(set(expected) & set(os.environ["TFORMER_BOOK_CHAPTERS"].split(",")))
    assert [p.stem for p in chapters] == expected, "the site's chapters differ from notebooks/src: rebuild it"
    failures = {}
    for i, html in enumerate(chapters):
        visit = Visit(browser_context, html)
        page, problems = visit.page, visit.problems
        title, headings = _headings(html.stem, lang)
        h1 = page.inner_text("main h1")
        if not _shown(title, [h1]):
            problems.append(f"title {h1!r}, expected {title!r}")
        shown = page.eval_on_selector_all("main h2", "hs => hs.map(h => h.innerText)")
        problems += [f"heading missing: {h!r}" for h in headings if not _shown(h, shown)]
        images = page.eval_on_selector_all(
            "main img", "is => is.map(i => [i.getAttribute('src'), i.complete, i.naturalWidth, i.naturalHeight])")
        problems += [f"image not loaded: {src}" for src, done, w, h in images if not (done and w > 0 and h > 0)]
        captions = page.eval_on_selector_all(
            "main figure", "fs => fs.map(f => (f.querySelector('figcaption') || {innerText: ''}).innerText.trim())")
        problems += [f"figure {n + 1} has no caption" for n, c in enumerate(captions) if not c]
        raw = RAW_MATH.findall(visit.text_outside_code())
        problems += [f"math not rendered: {m!r}" for m in raw[:3]]
        if "$" in (SRC / f"{html.stem}.py").read_text() and not page.query_selector("mjx-container"):
            problems.append("no typeset formula although the chapter has math")
        if not page.query_selector("pre .highlight, div.highlight pre"):
            problems.append("no highlighted code")
        download = page.eval_on_selector_all("a[href$='.ipynb']", "as => as.map(a => a.href)")
        if not any(Path(re.sub("^file://", "", d)).exists() for d in download):
            problems.append(f"no working notebook download link ({download})")
        sources = page.eval_on_selector_all("a[href*='src/tformer/']", "as => as.map(a => a.href.split('#')[0])")
        if not sources:
            problems.append("no link to a tformer module's source")
        problems += [f"broken source link: {s}" for s in sources if not Path(re.sub("^file://", "", s)).exists()]
        if page.query_selector("footer .prev-next-area a, .prev-next-area a") is None:
            problems.append("no previous/next navigation")
        if (problem := _language_link(page)) is not None:
            problems.append(problem)
        if i == 0:
            page.screenshot(path=str(SHOTS / f"{html.stem}{'' if lang == 'en' else '_' + lang}.png"), full_page=False)
        if problems:
            failures[html.stem] = problems
        page.close()
    assert not failures, json.dumps(failures, indent=1)


@pytest.mark.parametrize("lang, query", [("en", "softmax"), ("zh", "注意力")])
def test_search_finds_a_chapter(browser_context, lang, query):
    site = _need(lang)
    visit = Visit(browser_context, (site / "search.html").as_uri() + "?q=" + query)
    page = visit.page
    page.wait_for_selector("#search-results li, ul.search li", timeout=30_000)
    hits = page.eval_on_selector_all("#search-results li a, ul.search li a", "as => as.map(a => a.href)")
    assert any("/chapters/" in h for h in hits), hits
    assert visit.problems == [], visit.problems
    page.close()


def test_chinese_text_renders_with_a_cjk_font(browser_context):
    site = _need("zh")
    fc = shutil.which("fc-list")
    if fc is None or not subprocess.run([fc, ":lang=zh"], capture_output=True, text=True).stdout.strip():
        pytest.skip("no CJK font installed (`apt-get install fonts-noto-cjk` as root; `make test` does it when it can)")
    visit = Visit(browser_context, _chapters("zh")[0])
    page = visit.page
    probe = page.evaluate("""() => {   // the first visible element of the chapter whose own text is Chinese
        const walker = document.createTreeWalker(document.querySelector('main'), NodeFilter.SHOW_TEXT);
        for (let n = walker.nextNode(); n; n = walker.nextNode()) {
            const el = n.parentElement;
            if (/[\\u4e00-\\u9fff]{2}/.test(n.textContent) && el.checkVisibility() && el.closest('article')) {
                n.parentElement.setAttribute('data-cjk-probe', '1');
                return n.textContent.trim().slice(0, 40);
            }
        }
        return null;
    }""")
    assert probe, "no Chinese text on the page"
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": "[data-cjk-probe]"})["nodeId"]
    fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    assert any(CJK_FONT.search(f["familyName"]) and f["glyphCount"] > 0 for f in fonts), (probe, fonts)
    page.close()
