"""The Chinese edition (tools/i18n.py): complete catalogs for the translated chapters, generated notebooks in
sync with the English sources, numbers, formulas and code identical, typography, terminology, the checker's
Chinese messages and README.zh-CN.md."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat
import polib
import pytest
import torch

from tools import i18n
from tformer.grading import REGISTRY, Case, Exercise, check, register, set_mode
from tformer.grading import core
from tformer.grading import load_exercises

load_exercises()                                        # registers every chapter

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = i18n.translated_chapters()
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
# inline math may run over a line break, as MyST and MathJax allow inside a paragraph
MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+?\$", re.S)
CODE = re.compile(r"`[^`]+`")
CJK = re.compile(r"[\u4e00-\u9fff]")
LATIN = re.compile(r"[A-Za-z]")


YI = re.compile(r"(\d+(?:\.\d+)?)\s*亿")      # Chinese counts in 亿 (1e8): 3890 亿 is the English 389 B


def _numbers_zh(text: str) -> set[str]:
    """The numbers of a Chinese text, with N 亿 also read as the English N/10 billion."""
    return set(NUMBER.findall(text)) | {f"{float(n) / 10:g}" for n in YI.findall(text)}


# A multiple in Chinese is "是……的 N 倍": "多 N 倍" / "快了 N 倍" read as N+1 times, and "Nx" is not Chinese.
N_PLUS_ONE = re.compile(r"(?:多|少|快了|慢了|高了|大了|增加了)\s*\d[\d.]*\s*倍")
X_FOR_TIMES = re.compile(r"(?<![\w.])\d[\d.,]*(?:-\d[\d.]*)?x(?!\s*[A-Za-z0-9])")


def _prose(text: str) -> str:
    """The text without its formulas and inline code (what the typography rules apply to)."""
    return CODE.sub(" ", MATH.sub(" ", text))


def _entries(stem: str) -> list[polib.POEntry]:
    return [e for e in polib.pofile(str(i18n.PO_DIR / f"{stem}.po")) if not e.obsolete]


def test_the_translated_list_names_existing_chapters():
    assert CHAPTERS, "locale/translated.txt lists no chapter"
    for stem in CHAPTERS:
        assert (i18n.SRC / f"{stem}.py").exists(), stem


@pytest.mark.parametrize("stem", CHAPTERS)
def test_every_message_translated_not_fuzzy_not_stale(stem):
    assert i18n.problems(i18n.SRC / f"{stem}.py") == []


def test_a_stale_a_fuzzy_and_a_missing_entry_fail(tmp_path):
    src = i18n.SRC / f"{CHAPTERS[0]}.py"
    po = polib.pofile(str(i18n.PO_DIR / f"{src.stem}.po"))
    po.append(polib.POEntry(msgid="An English paragraph that was deleted.", msgstr="已删除的段落。"))
    active = [e for e in po if not e.obsolete]
    active[1].flags.append("fuzzy")
    active[2].msgstr = ""
    po.save(str(tmp_path / "x.po"))
    found = "\n".join(i18n.problems(src, tmp_path / "x.po"))
    assert "stale entry" in found and "fuzzy" in found and "untranslated" in found, found


def test_update_marks_a_changed_message_fuzzy_and_keeps_its_translation(tmp_path):
    path = tmp_path / "ch.po"
    i18n.merge(path, [("The first paragraph, unchanged.", "a:1"), ("Attention reads 3 keys at once.", "a:2")])
    po = polib.pofile(str(path))
    for e in po:
        e.msgstr = "译文"
    po.save(str(path))
    counts = i18n.merge(path, [("The first paragraph, unchanged.", "a:1"), ("Attention reads 4 keys at once.", "a:2")])
    assert counts == dict(kept=1, fuzzy=1, new=0, obsolete=0)
    changed = next(e for e in polib.pofile(str(path)) if "4 keys" in e.msgid)
    assert "fuzzy" in changed.flags and changed.msgstr == "译文" and "3 keys" in changed.previous_msgid


@pytest.mark.parametrize("stem", CHAPTERS)
def test_every_number_of_the_english_appears_in_the_chinese(stem):
    for e in _entries(stem):
        missing = set(NUMBER.findall(e.msgid)) - _numbers_zh(e.msgstr)
        assert not missing, f"{stem}: {sorted(missing)} missing from the translation of {e.msgid[:70]!r}"


@pytest.mark.parametrize("stem", CHAPTERS + ["README", "index"])
def test_multiples_read_as_times(stem):
    """1.71x is "是……的 1.71 倍", never "多 1.71 倍" (which reads as 2.71x) nor "1.71x" in Chinese prose."""
    bad = [(m.group(0), e.msgid[:50]) for e in _entries(stem) for pattern in (N_PLUS_ONE, X_FOR_TIMES)
           for m in pattern.finditer(_prose(e.msgstr))]
    assert not bad, f"{stem}: multiples written as N+1 or with 'x' in Chinese prose: {bad}"


def test_the_multiple_patterns_catch_what_they_mean_to():
    assert N_PLUS_ONE.search("步数多 1.71 倍") and N_PLUS_ONE.search("快了 1.16 倍")
    assert X_FOR_TIMES.search("用时是它的 4.4x，") and X_FOR_TIMES.search("快 2-4x；")
    for fine in ("是它的 1.71 倍", "16 x 16 个位置", "224x224x3 的图像", "MoE 8x top-2", "6 x 激活参数"):
        assert not N_PLUS_ONE.search(fine) and not X_FOR_TIMES.search(fine), fine
    assert _numbers_zh("共 3890 亿个参数，激活 520 亿个") >= {"389", "52"}


def test_the_zh_notebooks_are_in_sync_and_the_checker_catalog_compiled():
    assert i18n.check() == []
    assert sorted(p.stem for p in i18n.ZH_NOTEBOOKS.glob("*.ipynb")) == sorted(CHAPTERS)


@pytest.mark.parametrize("stem", CHAPTERS)
def test_zh_code_cells_equal_the_english_ones(stem):
    en = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    zh = nbformat.read(i18n.ZH_NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    assert [c.cell_type for c in zh.cells] == [c.cell_type for c in en.cells]
    assert [c.source for c in zh.cells if c.cell_type == "code"] == [c.source for c in en.cells if c.cell_type == "code"]
    assert zh.metadata["language"] == "zh-CN" and zh.metadata["kernelspec"] == en.metadata["kernelspec"]


@pytest.mark.parametrize("stem", CHAPTERS)
def test_zh_markdown_is_chinese_with_every_formula_and_code_span(stem):
    en = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    zh = nbformat.read(i18n.ZH_NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    for a, b in zip(en.cells, zh.cells):
        if a.cell_type != "markdown":
            continue
        prose = _prose(b.source)
        cjk, latin = len(CJK.findall(prose)), len(LATIN.findall(prose))
        assert cjk >= 0.3 * (cjk + latin), f"{stem}: too little Chinese in {b.source[:60]!r}"
        for span in MATH.findall(a.source) + CODE.findall(a.source):
            assert span in b.source, f"{stem}: {span!r} missing from the Chinese of {a.source[:60]!r}"


@pytest.mark.parametrize("stem", CHAPTERS)
def test_typography_full_width_punctuation_and_spacing(stem):
    """Full-width punctuation in Chinese prose; one half-width space between Chinese and Latin letters or digits
    (inline code and formulas included), none between Chinese and full-width punctuation."""
    for e in _entries(stem):
        text = e.msgstr
        prose = _prose(text)
        bad = re.findall(r"[\u4e00-\u9fff][,;:?!]|[,;:?!][\u4e00-\u9fff]|[\u4e00-\u9fff]\(|\)[\u4e00-\u9fff]", prose)
        assert not bad, f"{stem}: half-width punctuation in Chinese prose {bad} in {text[:60]!r}"
        glued = re.findall(r"[\u4e00-\u9fff][A-Za-z0-9`$]|[A-Za-z0-9`$][\u4e00-\u9fff]", text)
        assert not glued, f"{stem}: no space between Chinese and Latin {glued} in {text[:60]!r}"
        assert not re.search(r"[\u4e00-\u9fff] [，。：；、！？（）]|[，。：；、！？（）] [\u4e00-\u9fff]", prose), text[:60]


def _glossary() -> list[tuple[str, str, str]]:
    rows = []
    for line in (i18n.LOCALE / LANG_DIR / "glossary.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and not set(cells[0]) <= set("-:") and cells[0] != "术语":
            rows.append((cells[0], cells[1], cells[2]))
    return rows


LANG_DIR = "zh_CN"


def test_glossary_terms_are_the_ones_the_chapters_use():
    rows = _glossary()
    assert len(rows) >= 20
    source = (Path("/work/shared/seed/transformer-topics.zh.txt"))
    for term, english, chapter in rows:
        stem = re.search(r"\d\d_\w+", chapter).group(0)
        assert (i18n.SRC / f"{stem}.py").exists(), chapter
        if stem in CHAPTERS:
            zh = "".join(e.msgstr for e in _entries(stem))
            assert any(t in zh for t in term.split(" / ")), f"{term} ({english}) not used in {stem}"
    if source.exists():   # the course's Chinese source text, where it is present
        text = source.read_text()
        for term in ("查询", "键", "值", "缩放点积注意力", "自注意力", "交叉注意力", "位置编码", "掩码", "因果掩码"):
            assert term in text and any(term in r[0] for r in rows), term


# ---- the checker in Chinese: one test per message kind, through check() with a wrong answer ----

@pytest.fixture
def zh(monkeypatch):
    monkeypatch.setenv("TFORMER_LANG", "zh")
    set_mode("learner")
    yield
    set_mode(None)


@pytest.fixture
def temp_exercise():
    names = []

    def add(ex: Exercise) -> Exercise:
        names.append(ex.name)
        return register(ex)
    yield add
    for n in names:
        REGISTRY.pop(n, None)


def _softmax(x):
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def _one(x):
    return [Case("one", (x,))]


def test_every_checker_message_has_a_chinese_text():
    po = polib.pofile(str(i18n.GRADING_PO))
    assert {e.msgid for e in po if not e.obsolete} >= {m for m, _ in i18n.grading_messages()}
    for e in po:
        if not e.obsolete:
            assert e.msgstr and "fuzzy" not in e.flags, e.msgid
            assert set(re.findall(r"\{\w+\}", e.msgid)) == set(re.findall(r"\{\w+\}", e.msgstr)), e.msgid
            assert set(NUMBER.findall(e.msgid)) <= set(NUMBER.findall(e.msgstr)), e.msgid


def test_zh_passed(zh, capsys):
    r = check("ch01.softmax", lambda x: _softmax(x))
    assert r.passed and "全部" in r.message and "个用例通过" in r.message
    out = capsys.readouterr().out
    assert "[通过] ch01.softmax" in out and "在最后一维上数值稳定的 softmax" in out, out   # the title in Chinese too


def test_every_exercise_title_has_a_chinese_text():
    """The check line names the exercise by its title: every registered title is in the checker's catalog."""
    zh = {e.msgid: e.msgstr for e in polib.pofile(str(i18n.GRADING_PO)) if not e.obsolete and e.msgstr}
    missing = [name for name, ex in sorted(REGISTRY.items()) if not name.startswith("test.") and ex.title not in zh]
    assert not missing, f"exercise titles without a Chinese text (run `python -m tools.i18n update`): {missing}"


def test_zh_not_attempted(zh):
    def stub(x):
        raise NotImplementedError
    r = check("ch01.softmax", stub)
    assert r.status == "not attempted" and r.message.startswith("尚未作答") and "`raise NotImplementedError`" in r.message


def test_zh_wrong_shape_with_smallest_case_and_hint(zh):
    r = check("ch01.softmax", lambda x: _softmax(x)[..., :1])
    assert r.status == "failed" and r.message.startswith("未通过：") and "最小的失败用例" in r.message
    assert re.search(r"形状应为 \([\d, ]*\)，实际为 \([\d, ]*\)", r.message), r.message
    assert "提示：先减去每行的最大值" in r.message and "dim=-1" in r.message


def test_zh_largest_difference_and_named_mistake(zh):
    r = check("ch01.softmax", lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True))
    assert r.status == "failed", r.message
    assert "常见错误" in r.message and "没有减去最大值" in r.message, r.message
    r = check("ch01.softmax", lambda x: _softmax(x) * 1.01)
    assert "但数值不同：最大差值" in r.message and "应为" in r.message and "相对误差" in r.message, r.message


def test_zh_dtype(zh):
    r = check("ch01.softmax", lambda x: _softmax(x).double())
    assert "dtype 应为 torch.float32，实际为 torch.float64" in r.message, r.message


def test_zh_error_points_to_the_line(zh):
    def broken(x):
        return x / undefined_name  # noqa: F821
    r = check("ch01.softmax", broken)
    assert r.status == "error" and "抛出了 NameError" in r.message and "你的代码第" in r.message, r.message


def test_zh_reference_called(zh):
    import tformer
    r = check("ch01.attention", lambda q, k, v, mask=None: tformer.scaled_dot_product_attention(q, k, v, mask))
    assert r.status == "error" and "参考实现" in r.message, r.message


def test_zh_in_place(zh, temp_exercise):
    temp_exercise(Exercise("test.zh_inplace", "t", reference=lambda x: x + 1, edge_cases=lambda: _one(torch.zeros(2)),
                           random_case=None, n_random=0))

    def in_place(x):
        return x.add_(1)
    r = check("test.zh_inplace", in_place)
    assert "原地修改了输入 `x`" in r.message, r.message


def test_zh_time_limit(zh, temp_exercise, capsys):
    temp_exercise(Exercise("test.zh_loop", "t", reference=lambda x: x, edge_cases=lambda: _one(torch.ones(1)),
                           random_case=None, n_random=0, time_limit=0.3))

    def swallows(x):
        for _ in range(4):
            try:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    time.sleep(0.01)
            except:  # noqa: E722  (the point of the test)
                pass
        return x
    r = check("test.zh_loop", swallows)
    assert r.status == "timeout" and "运行 0.3 秒后被停止" in r.message and "裸 `except:`" in r.message, r.message
    assert "请中断内核" in capsys.readouterr().err


def test_zh_unknown_exercise(zh, capsys):
    r = check("ch01.no_such_thing", lambda x: x)
    assert r.status == "error" and "没有名为 'ch01.no_such_thing' 的练习" in r.message
    assert "[未通过]" in capsys.readouterr().out


def test_language_from_the_notebook_metadata(monkeypatch):
    monkeypatch.delenv("TFORMER_LANG", raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", str(i18n.ZH_NOTEBOOKS / f"{CHAPTERS[0]}.ipynb"))
    assert core.language() == "zh"
    monkeypatch.setenv("JPY_SESSION_NAME", str(ROOT / "notebooks" / f"{CHAPTERS[0]}.ipynb"))
    assert core.language() == "en"
    monkeypatch.setenv("TFORMER_LANG", "zh_CN")
    assert core.language() == "zh"


# ---- README.zh-CN.md against README.md ----

def _sections(text: str) -> list[str]:
    return [l for l in text.splitlines() if l.startswith("## ")]


def test_readme_zh_has_the_english_sections_and_numbers():
    en, zh = (ROOT / "README.md").read_text(), (ROOT / "README.zh-CN.md").read_text()
    assert "README.zh-CN.md" in en.split("\n## ")[0], "README.md links the Chinese README at its top"
    for heading in ("快速开始", "章节地图", "练习", "结果", "教师"):
        assert any(heading in s for s in _sections(zh)), heading
    table = lambda text, title: [l for l in text.split(title, 1)[1].split("\n## ", 1)[0].splitlines() if l.startswith("|")]
    en_rows, zh_rows = table(en, "## Chapter map"), table(zh, "## 章节地图")
    assert len(en_rows) == len(zh_rows)
    stems = re.findall(r"\d\d[a-z]?_\w+", "\n".join(en_rows))
    assert stems and all(s in zh for s in stems)
    en_results = "\n".join(table(en, "## Results"))
    zh_results = "\n".join(table(zh, "## 结果"))
    assert set(NUMBER.findall(en_results)) <= set(NUMBER.findall(zh_results)), \
        sorted(set(NUMBER.findall(en_results)) - set(NUMBER.findall(zh_results)))
    for command in re.findall(r"^(make \w+|python -m [\w.]+)", en, re.M):
        assert command in zh, command


def test_contributing_says_english_prose_changes_fail_until_translated():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert "python -m tools.i18n update" in text and "python -m tools.i18n build" in text
    assert "locale/translated.txt" in text


# ---- the Chinese site reuses the English executions ----

@pytest.mark.parametrize("stem", CHAPTERS)
def test_the_chinese_site_hashes_like_the_english_one(stem, tmp_path, monkeypatch):
    """jupyter-cache keys an execution by the code cells (source and metadata) and the kernelspec: the staged
    Chinese chapter must give the English one's key, so `make book` serves both from one execution."""
    from jupyter_cache import get_cache
    from tools import book
    monkeypatch.setattr(book, "STAGE", tmp_path / "en")
    monkeypatch.setattr(book, "STAGE_ZH", tmp_path / "zh")
    book.stage_chapters([stem])
    book.stage_chapters_zh([stem])
    cache = get_cache(str(tmp_path / "cache"))
    en = nbformat.read(tmp_path / "en" / "chapters" / f"{stem}.ipynb", as_version=4)
    zh = nbformat.read(tmp_path / "zh" / "chapters" / f"{stem}.ipynb", as_version=4)
    assert cache.create_hashed_notebook(en)[1] == cache.create_hashed_notebook(zh)[1]
    assert any(CJK.search(c.source) for c in zh.cells if c.cell_type == "markdown")


def test_every_readme_message_is_translated():
    """The whole README, Results rows included, is translated and not fuzzy, and each translation keeps its
    English numbers: a changed README row fails until its Chinese is updated, as a chapter's prose does."""
    zh = i18n.translations("README")
    text = i18n.README.read_text()
    missing = [m[:60] for m in i18n.readme_messages() if m in text and m not in zh]
    assert not missing, missing
    for e in polib.pofile(str(i18n.PO_DIR / "README.po")):
        if e.msgstr and not e.obsolete:
            assert "fuzzy" not in e.flags or e.msgid not in text, e.msgid[:60]
            lost = set(NUMBER.findall(e.msgid)) - set(NUMBER.findall(e.msgstr))
            assert not lost, (sorted(lost), e.msgid[:60])


def test_tformer_grade_passes_the_language_to_its_worker(tmp_path, capsys, monkeypatch):
    """TFORMER_LANG=zh tformer grade: the worker's text (the error its notebook's function raised) and the
    grader's (the verdict around it) are both Chinese; numbers and names unchanged."""
    from tformer.cli import main
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import torch\nfrom tformer.grading import check\n"
        "def sm(x):\n    return x / 0 if x.numel() > 10**9 else {}['missing']\ncheck('ch01.softmax', sm)")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                  "language": "zh-CN"})
    nbformat.write(nb, tmp_path / "01_zh.ipynb")
    monkeypatch.setenv("TFORMER_LANG", "zh")
    out = tmp_path / "report.json"
    main(["grade", str(tmp_path), "--json", str(out), "--timeout", "120"])
    row = next(r for r in json.loads(out.read_text())["notebooks"][0]["exercises"] if r["exercise"] == "ch01.softmax")
    assert row["status"] == "error" and "抛出了 KeyError: 'missing'" in row["message"], row["message"]
    assert "你的函数在用例" in row["message"] and "你的代码第 4 行" in row["message"], row["message"]


def test_tformer_grade_report_in_chinese(tmp_path, capsys, monkeypatch):
    """`tformer grade --lang zh` (or TFORMER_LANG=zh): the table's column headers, statuses and totals are
    Chinese, aligned by terminal width; the exercise names, points and the JSON's keys and statuses stay English."""
    from tformer.cli import main
    from tformer.grading.classroom.runner import NotebookReport, Row, format_table
    monkeypatch.delenv("TFORMER_LANG", raising=False)       # restored after the test: --lang sets it
    rep = NotebookReport("notebooks/01_attention.ipynb", "ch01",
                         [Row("ch01.softmax", 2, True, "passed"), Row("ch01.attention", 3, False, "not attempted")],
                         ["ZeroDivisionError: division by zero"])
    assert "TOTAL 2/5 points" in format_table([rep]) and "exercise" in format_table([rep])
    monkeypatch.setenv("TFORMER_LANG", "zh")
    table = format_table([rep]).splitlines()
    assert table[1].split() == ["练习", "分值", "通过", "状态"], table[1]
    assert table[2].split() == ["ch01.softmax", "2", "是", "通过"] and table[3].split()[-2:] == ["否", "未作答"]
    assert table[4] == "  单元格出错：ZeroDivisionError: division by zero" and table[5].split() == ["本章合计", "2/5"]
    assert table[-1] == "总计 2/5 分"
    wide = lambda s: sum(2 if CJK.match(c) else 1 for c in s)     # terminal columns: a Chinese character takes two
    assert wide(table[1][: table[1].index("状态")]) == wide(table[2][: table[2].rindex("通过")]) == 47
    assert wide(table[1][: table[1].index("通过")]) == wide(table[2][: table[2].index("是")])
    # through the CLI: `--lang zh` sets the language for the grader and its workers (the worker's side is the
    # test above); the notebook's run is replaced by the report above, so no worker starts here
    monkeypatch.delenv("TFORMER_LANG")
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "01_attention.ipynb")
    monkeypatch.setattr("tformer.grading.classroom.runner.run_notebook", lambda path, timeout, small, **kw: rep)
    out = tmp_path / "report.json"
    assert main(["grade", str(tmp_path), "--json", str(out), "--lang", "zh"]) == 0
    printed = capsys.readouterr().out
    assert "练习" in printed and "本章合计" in printed and "总计 2/5 分" in printed, printed
    rows = json.loads(out.read_text())["notebooks"][0]["exercises"]
    assert [r["status"] for r in rows] == ["passed", "not attempted"], rows


# Terms of the seed text (../shared/seed, the course's Chinese source) that a chapter's Chinese must use where it
# discusses them, and the words the seed does not use for the same ideas.
SEED_TERMS = {"08_long_sequences": ["外推", "稀疏注意力"], "11_llms": ["自回归", "适配"],
              "11_fine_tuning": ["自回归"], "11_preference_rl": ["自回归"],
              "15_transformer_vs_rnn": ["循环神经网络", "召回"], "07_parallelism": ["腾讯混元"]}
NOT_THE_SEEDS = ["毕业项目", "回忆", "腾讯的 Hunyuan"]


@pytest.mark.parametrize("stem", CHAPTERS)
def test_the_seed_texts_terms(stem):
    text = "\n".join(e.msgstr for e in _entries(stem))
    missing = [t for t in SEED_TERMS.get(stem, []) if t not in text]
    other = [t for t in NOT_THE_SEEDS if t in text]
    assert not missing and not other, f"{stem}: seed terms missing {missing}; words the seed does not use {other}"
