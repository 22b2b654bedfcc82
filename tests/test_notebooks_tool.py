"""The notebook builder: a chapter renamed or split leaves no stale output behind."""
from tools import notebooks


def test_build_drops_the_notebook_of_a_chapter_that_is_gone(tmp_path):
    stale = tmp_path / "11_post_training.ipynb"        # a chapter split since the last build
    other = tmp_path / "my_experiments.ipynb"          # not a chapter: never touched
    stale.write_text("{}")
    other.write_text("{}")
    written = notebooks.build(tmp_path, solutions=True)
    assert {p.stem for p in written} == {p.stem for p in notebooks.sources()}
    assert not stale.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.glob("[0-9][0-9]_*.ipynb")) == sorted(p.name for p in written)


def test_drop_stale_keeps_the_chapters_named():
    import tempfile
    from pathlib import Path
    d = Path(tempfile.mkdtemp())
    for name in ("01_a.html", "02_b.html", "02_b.ipynb", "index.html"):
        (d / name).write_text("")
    gone = notebooks.drop_stale(d, ".html", {"01_a"})
    assert [p.name for p in gone] == ["02_b.html"]
    assert sorted(p.name for p in d.iterdir()) == ["01_a.html", "02_b.ipynb", "index.html"]
