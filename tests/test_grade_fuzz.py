"""The grader's readers of untrusted input, fuzzed (hypothesis, a few hundred examples each): the names an LMS
or a download gives files, and notebook JSON cut short or mutated. Each input gets an answer of its own (a
parse, None, a ValueError for an unreadable notebook); none raises anything else, so none stops a class."""
from __future__ import annotations

import json
import os
import re
import string

import nbformat
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from tformer.grading.classroom import cells as cellplan, similarity
from tformer.grading.classroom.notebooks import check_calls, known_stems, notebook_stem, read_cells
from tformer.grading.classroom.submissions import ClassError, canvas_name, download_number, read_class

KNOWN = known_stems()
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Canvas keeps Unicode word characters of the sortable name: Latin with accents, CJK, Cyrillic, digits, "_"
WORD = st.text(alphabet=st.sampled_from("abcxyzäöüßéñøçłšžабвг张伟李娜王芳0123456789_"), min_size=1, max_size=14)
ORIGINAL = st.one_of(
    st.sampled_from(KNOWN).map(lambda s: s + ".ipynb"),
    st.tuples(st.sampled_from(KNOWN), st.sampled_from([" (1)", " (2)", "-1", "-12", " copy", ""]),
              st.sampled_from(["", "Copy of ", "copy_of_"])).map(lambda t: f"{t[2]}{t[0]}{t[1]}.ipynb"),
    st.text(alphabet=string.ascii_letters + string.digits + " _-()", min_size=1, max_size=20).map(lambda t: t + ".ipynb"),
)


@FUZZ
@given(name=WORD, late=st.booleans(), uid=st.integers(1, 10 ** 9), file_id=st.integers(1, 10 ** 12),
       original=ORIGINAL)
def test_a_canvas_name_gives_back_its_parts(name, late, uid, file_id, original):
    """Whatever the student's name (any script, digits, underscores), the user id, file id, LATE mark and the
    original file name are read back from what Canvas wrote. One ambiguity is left: a name ending in `_digits`
    before a file whose name starts with no chapter number can be split in two places (real sortable names
    carry no such ending; the course's notebooks start with their chapter, and that split wins)."""
    assume(not re.search(r"_\d+$", name) or re.match(r"\d\d[a-z]?_", original))
    assume(not re.search(r"_(LATE_)?\d+_\d+_\d\d", name, re.IGNORECASE))
    c = canvas_name(f"{name}{'_LATE' if late else ''}_{uid}_{file_id}_{original}")
    assert c is not None
    assert (c.canvas_id, c.file_id, c.late, c.original) == (str(uid), file_id, late, original)
    assert c.student == f"{name.lower()}_{uid}"


@FUZZ
@given(anon=st.text(alphabet=string.ascii_letters + string.digits, min_size=3, max_size=8), late=st.booleans(),
       file_id=st.integers(1, 10 ** 12), original=ORIGINAL)
def test_an_anonymous_canvas_name_gives_back_its_parts(anon, late, file_id, original):
    c = canvas_name(f"anon_{anon}{'_LATE' if late else ''}_{file_id}_{original}")
    assert c is not None and (c.student, c.canvas_id, c.file_id, c.late, c.original) == (
        f"anon_{anon}", "", file_id, late, original)


@FUZZ
@given(st.text(max_size=60))
def test_any_file_name_gets_an_answer(text):
    """A name is a notebook of the course, or not; a Canvas name, or not; it never raises."""
    for name in (text, text + ".ipynb"):
        stem = notebook_stem(name, KNOWN)
        assert stem is None or isinstance(stem, str)
        c = canvas_name(name)
        assert c is None or c.original.endswith(".ipynb")
        assert download_number(name) >= 0


def _notebook_bytes() -> bytes:
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import torch\nfrom tformer.grading import check"),
        nbformat.v4.new_code_cell("def my_softmax(x):\n    e = torch.exp(x - x.amax(-1, keepdim=True))\n"
                                  "    return e / e.sum(-1, keepdim=True)"),
        nbformat.v4.new_code_cell('check("ch01.softmax", my_softmax)'),
        nbformat.v4.new_markdown_cell("# notes")])
    return nbformat.writes(nb).encode()


NOTEBOOK = _notebook_bytes()


def _read_like_the_grader(path) -> str:
    """What grading does with a file before any worker starts: read its cells, plan them, find its check calls
    and the graded functions' shapes. "invalid" where the notebook cannot be read."""
    try:
        cells = read_cells(path)
    except ValueError:
        return "invalid"
    assert all(isinstance(c, str) for c in cells)
    cellplan.plan(cells, cellplan.released_cells().get("01_attention"))
    check_calls(cells)
    similarity.answer_shapes(cells)
    return "read"


@FUZZ
@given(cut=st.integers(0, len(NOTEBOOK)), flips=st.lists(st.tuples(st.integers(0, len(NOTEBOOK) - 1),
                                                                    st.integers(0, 255)), max_size=6))
def test_a_truncated_or_mutated_notebook_gets_its_own_status(tmp_path_factory, cut, flips):
    data = bytearray(NOTEBOOK[:cut] if cut < len(NOTEBOOK) else NOTEBOOK)
    for at, byte in flips:
        if at < len(data):
            data[at] = byte
    path = tmp_path_factory.mktemp("nb") / "01_attention.ipynb"
    path.write_bytes(bytes(data))
    assert _read_like_the_grader(path) in ("read", "invalid")


@FUZZ
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.sampled_from(
                        ["cells", "cell_type", "source", "metadata", "nbformat", "nbformat_minor", "outputs"]),
                        kids, max_size=5), max_leaves=20))
def test_notebook_shaped_json_of_any_content_gets_its_own_status(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("nb") / "01_attention.ipynb"
    path.write_text(json.dumps(doc))
    assert _read_like_the_grader(path) in ("read", "invalid")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.one_of(
    st.tuples(WORD, st.booleans(), st.integers(1, 99999), st.integers(1, 10 ** 6), ORIGINAL).map(
        lambda t: f"{t[0]}{'_LATE' if t[1] else ''}_{t[2]}_{t[3]}_{t[4]}"),
    ORIGINAL), min_size=1, max_size=6, unique=True))
def test_a_flat_folder_of_any_names_is_read_or_refused_in_one_line(tmp_path_factory, names):
    """A Canvas download, a learner's folder, a mix of the two: students are read, or the folder is refused
    with one line (a mix is refused: one plain file must not make the whole download one learner)."""
    folder = tmp_path_factory.mktemp("class")
    for name in names:
        (folder / name.replace(os.sep, "_")).write_bytes(NOTEBOOK)
    try:
        subs = read_class(folder)
    except ClassError as e:
        assert len(str(e).splitlines()) == 1
        return
    canvas = [n for n in names if canvas_name(n)]
    if canvas:
        assert len(canvas) == len(names)                          # never a mix
        assert {s.student for s in subs} == {canvas_name(n).student for n in canvas}
    else:
        assert len(subs) == 1


if __name__ == "__main__":                                    # pragma: no cover
    pytest.main([__file__, "-q"])
