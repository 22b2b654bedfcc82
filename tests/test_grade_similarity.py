"""Answers that look alike (tformer/grading/similarity.py): the same program under other names, comments and
formatting is flagged as a pair; the untouched stub, a short answer and an answer most students share are not;
an answer equal to the published solution is listed apart. Nothing here runs a notebook."""
import json
from pathlib import Path

import nbformat

from tformer.grading.classroom import similarity
from tformer.grading.classroom.submissions import Submission

ATTENTION = '''
def my_attention(q, k, v, mask=None):
    """Scaled dot-product attention."""
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)     # (B, T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ v, w
'''
# the same program: other names, no comments or docstring, other formatting, type hints
RENAMED = '''
def attn(query: torch.Tensor, key, value, m=None):
    dk = query.shape[-1]
    s = query @ key.transpose(-2, -1) / math.sqrt( dk )
    if m is not None: s = s.masked_fill(~m, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return p @ value, p
'''
# a different program (the scale applied to q first)
OTHER = '''
def my_attention(q, k, v, mask=None):
    q = q / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v, weights
'''
STUB = "def my_attention(q, k, v, mask=None):\n    raise NotImplementedError\n"
SHORT = "def my_softmax(x):\n    return torch.softmax(x, dim=-1)\n"


def notebook(folder: Path, *cells: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = folder / "01_attention.ipynb"
    nbformat.write(nb, path)
    return path


def sub(root: Path, student: str, fn: str, name: str = "my_attention", extra: str = "") -> Submission:
    path = notebook(root / student, "import math\nimport torch", fn, f'check("ch01.attention", {name})', extra)
    return Submission(student, path.parent, {"01_attention": path})


def released(root: Path) -> tuple[Path]:
    notebook(root / "released", "import math\nimport torch", STUB, 'check("ch01.attention", my_attention)')
    return (root / "released",)


def test_the_same_program_under_other_names_is_a_pair_and_a_different_one_is_not(tmp_path):
    subs = [sub(tmp_path, "ana", ATTENTION), sub(tmp_path, "ben", RENAMED, name="attn"),
            sub(tmp_path, "cai", OTHER), sub(tmp_path, "dee", STUB), sub(tmp_path, "eve", OTHER.replace("weights", "w2")),
            *[sub(tmp_path, f"s{i}", OTHER.replace("scores", f"s{i}")) for i in range(3)]]
    got = similarity.flag(subs, released(tmp_path))
    pairs = [tuple(p["students"]) for p in got["pairs"] if p["exercise"] == "ch01.attention"]
    assert ("ana", "ben") in pairs                               # renamed, reformatted, comments gone: a pair
    assert not any("dee" in p for p in pairs)                     # the untouched stub is nobody's answer
    assert not any("cai" in p for p in pairs)                     # 5 of 7 answered OTHER: common, not flagged
    json.dumps(got)                                               # grades.json holds it as it is


def test_short_answers_are_not_distinctive(tmp_path):
    one = sub(tmp_path, "ana", SHORT, name="my_softmax")
    two = sub(tmp_path, "ben", SHORT.replace("x", "t"), name="my_softmax")
    for s in (one, two):                                          # check the softmax instead
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in (
            "import torch", SHORT if s is one else SHORT.replace("x", "t"), 'check("ch01.softmax", my_softmax)')]),
            s.notebooks["01_attention"])
    assert similarity.flag([one, two], released(tmp_path))["pairs"] == []


def test_an_answer_equal_to_the_published_solution_is_listed_apart():
    solution = (similarity.SOURCES / "01_attention.py").read_text()
    shapes = similarity.answer_shapes([solution])
    assert "ch01.attention" in shapes and shapes["ch01.attention"][1] >= similarity.MIN_NODES


def test_reference_copies_are_reported(tmp_path):
    src = (similarity.SOURCES / "01_attention.py").read_text()
    start = src.index("def my_attention(")
    body = src[start:src.index("\n# %%", start)]
    subs = [sub(tmp_path, "ana", body), sub(tmp_path, "ben", OTHER)]
    got = similarity.flag(subs, released(tmp_path))
    assert got["reference"] == [{"exercise": "ch01.attention", "student": "ana"}]
