"""The launch path: the badges and the guarded setup cell every notebook opens with (tools/notebooks.py).

* Where `import tformer` works, the setup cell does nothing: no output, no change to the environment.
* Where it cannot install anything, it says in one line what to run.
* No badge without a GitHub repository; with one, each badge opens a notebook that exists (English and Chinese).
* A fresh Colab and a fresh Kaggle runtime, simulated without a network: a venv with torch and the other
  dependencies but not tformer, a `google.colab` stand-in (Colab) or `KAGGLE_KERNEL_RUN_TYPE` (Kaggle), an
  empty folder holding one notebook, the repository a local git clone of this working tree, pip offline. The
  setup cell clones and installs the course, then the chapter's next cells run in small mode.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tools import notebooks

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "01_attention"
BADGE_LINK = re.compile(r"\]\((https://(?:colab\.research\.google\.com/github|kaggle\.com/kernels/welcome\?src="
                        r"https://github\.com)/x/y/blob/([^/]+)/([^)]+))\)")


def _setup_source(nb) -> str:
    cells = [c for c in nb.cells if c.get("id", "").endswith("-setup")]
    assert len(cells) == 1 and cells[0].cell_type == "code"
    return cells[0].source


@pytest.fixture
def no_launch_env(monkeypatch):
    for name in ("TFORMER_REPO", "TFORMER_REF", "KAGGLE_KERNEL_RUN_TYPE"):
        monkeypatch.delenv(name, raising=False)


def test_every_notebook_opens_with_the_launch_cells_and_keeps_its_ids(no_launch_env):
    """Title, launch note, setup cell, then the chapter: the chapter's cells keep the ids of their index."""
    for src in notebooks.sources():
        nb = notebooks.build_notebook(src, solutions=False)
        bare = notebooks.build_notebook(src, solutions=False, launch_path=False)
        nn = src.stem[:2]
        assert [c.id for c in nb.cells[1:3]] == [f"{nn}-launch", f"{nn}-setup"], src.stem
        assert nb.cells[0].source.startswith("# Chapter")
        assert [c.id for c in nb.cells[:1] + nb.cells[3:]] == [c.id for c in bare.cells]
        setup = _setup_source(nb)
        assert sum(1 for line in setup.splitlines() if line.strip()) <= 25
        compile(setup, f"{src.stem} setup cell", "exec")


def test_the_setup_cell_does_nothing_where_tformer_imports(no_launch_env, capsys):
    """As in `make lab`, a local install, nbval and the grader's sandbox: quiet, fast, nothing changed."""
    import importlib.util
    assert importlib.util.find_spec("tformer") is not None
    source = _setup_source(notebooks.build_notebook(ROOT / "notebooks" / "src" / f"{CHAPTER}.py", solutions=False))
    env, path, modules = dict(os.environ), list(sys.path), set(sys.modules)
    t0 = time.perf_counter()
    exec(compile(source, "setup", "exec"), {"__name__": "__main__"})
    took = time.perf_counter() - t0
    assert capsys.readouterr() == ("", "")
    assert dict(os.environ) == env and sys.path == path
    assert not {m for m in set(sys.modules) - modules if m.split(".")[0] in ("torch", "tformer", "google")}
    assert took < 0.5, f"the setup cell took {took:.2f} s where it has nothing to do"


def test_the_grader_reads_the_setup_cell_as_harmless():
    """`tformer grade` runs the released setup cell (a notebook's first code cell always runs): its scan of
    what reaches into the grader finds nothing in it."""
    from tformer.grading.classroom.scan import flags
    assert flags([notebooks.setup_cell()]) == []


def _run_bare(source: str, cwd: Path, quiet: bool = True, **env) -> str:
    """The cell in an interpreter without site-packages: tformer, torch and google are not importable."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TFORMER_", "KAGGLE_"))}
    out = subprocess.run([sys.executable, "-I", "-S", "-c", source], cwd=cwd, env={**clean, **env},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and (not quiet or not out.stderr), out.stderr
    return out.stdout


def test_the_setup_cell_says_what_to_run_where_it_can_do_nothing(no_launch_env, tmp_path):
    source = notebooks.setup_cell()
    lines = _run_bare(source, tmp_path).splitlines()       # a laptop without tformer
    assert len(lines) == 1 and "make lab" in lines[0] and "tformer is not installed" in lines[0]
    lines = _run_bare(source, tmp_path, KAGGLE_KERNEL_RUN_TYPE="Interactive").splitlines()   # no repository named
    assert len(lines) == 1 and "TFORMER_REPO" in lines[0]
    lines = _run_bare(source, tmp_path, quiet=False, KAGGLE_KERNEL_RUN_TYPE="Interactive",
                      TFORMER_REPO=(tmp_path / "nowhere").as_uri()).splitlines()   # Kaggle, internet off
    assert lines and "Settings > Internet" in lines[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_no_badge_without_a_github_repository(no_launch_env, monkeypatch):
    assert notebooks.launch()["github"] is None, "pyproject.toml names a GitHub repository: update this test"
    for folder in (ROOT / "notebooks", ROOT / "notebooks" / "zh"):
        for path in folder.glob("[0-9][0-9]_*.ipynb"):
            text = path.read_text(encoding="utf-8")
            assert "colab.research.google.com" not in text and "kaggle.com/kernels" not in text, path
    monkeypatch.setenv("TFORMER_REPO", "file:///srv/git/tformer.git")      # a git URL, not GitHub: no badge
    nb = notebooks.build_notebook(ROOT / "notebooks" / "src" / f"{CHAPTER}.py", solutions=False)
    assert nb.cells[1].source == notebooks.LAUNCH_NOTE
    assert '"TFORMER_REPO", "file:///srv/git/tformer.git")' in _setup_source(nb)


@pytest.mark.parametrize("url", ["https://github.com/x/y", "https://github.com/x/y.git", "git@github.com:x/y.git"])
def test_badges_open_notebooks_that_exist(no_launch_env, monkeypatch, url):
    """With a GitHub repository, both badges of every notebook (both editions) open that notebook, at the tag
    of the package's version; a badge to a path that does not exist fails here."""
    from tools import i18n
    monkeypatch.setenv("TFORMER_REPO", url)
    version = notebooks._pyproject()["project"]["version"]
    translated = set(i18n.translated_chapters())
    for src in notebooks.sources():
        editions = [("notebooks", notebooks.build_notebook(src, solutions=False))]
        if src.stem in translated:
            editions.append(("notebooks/zh", i18n.build_zh_notebook(src)))
        for folder, nb in editions:
            links = BADGE_LINK.findall(nb.cells[1].source)
            assert len(links) == 2, (src.stem, folder, nb.cells[1].source)
            for _, ref, path in links:
                assert ref == f"v{version}"
                assert path == f"{folder}/{src.stem}.ipynb" and (ROOT / path).is_file(), path
        solution = notebooks.build_notebook(src, solutions=True)     # not committed: no badge to open it
        assert not BADGE_LINK.findall(solution.cells[1].source)


@pytest.mark.parametrize("url", ["https://github.com/x/y", "git@github.com:x/y.git"])
def test_the_readmes_chapter_maps_open_every_chapter(no_launch_env, monkeypatch, url):
    """Each chapter-map row of README.md (README.zh-CN.md) gets the two badges of its English (Chinese)
    notebook, which exists; rewriting is idempotent, and the catalogs never see a badge."""
    from tools import i18n
    monkeypatch.setenv("TFORMER_REPO", url)
    stems = [src.stem for src in notebooks.sources()]
    for lang, folder, text in (("en", "notebooks", notebooks.readme_badges(notebooks.README.read_text())),
                               ("zh", "notebooks/zh", i18n.render_readme_zh())):
        rows = [line for line in text.splitlines() if notebooks.MAP_ROW.match(line)]
        assert sorted(notebooks.MAP_ROW.match(r).group(2) for r in rows) == sorted(stems), lang
        for line in rows:
            stem = notebooks.MAP_ROW.match(line).group(2)
            links = BADGE_LINK.findall(line)
            assert [path for _, _, path in links] == [f"{folder}/{stem}.ipynb"] * 2, line
            assert (ROOT / links[0][2]).is_file()
        assert notebooks.readme_badges(text, lang) == text
    assert not any(BADGE_LINK.findall(m) for m in i18n.readme_messages())


def test_the_committed_readmes_carry_the_badges_of_the_committed_table(no_launch_env):
    """README.md is what `python -m tools.notebooks build` writes (no badge while pyproject.toml names no
    GitHub repository); `tools.notebooks check` fails otherwise, as for a stale notebook."""
    from tools import i18n
    text = notebooks.README.read_text()
    assert notebooks.readme_badges(text) == text
    assert i18n.README_ZH.read_text() == i18n.render_readme_zh()
    assert not notebooks.launch()["github"] or BADGE_LINK.findall(text)
    assert notebooks.stale() == []


# --- a fresh Colab / Kaggle runtime, simulated -------------------------------------------------------------

SITE = Path(sysconfig.get_paths()["purelib"])       # this interpreter's site-packages: torch and the rest


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """The repository the setup cell clones: this working tree (committed or not) as a git repository, tagged
    with the package's version as a release would be."""
    repo = tmp_path_factory.mktemp("course")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "course"], cwd=repo, check=True)
    version = notebooks._pyproject()["project"]["version"]
    subprocess.run([*git, "tag", f"v{version}"], cwd=repo, check=True)
    return repo


@pytest.fixture(scope="module")
def runtime_packages(tmp_path_factory) -> Path:
    """What a hosted runtime has: every package of this environment but tformer (links, not copies)."""
    site = tmp_path_factory.mktemp("runtime-site")
    for entry in SITE.iterdir():
        if "tformer" not in entry.name.lower() and entry.suffix != ".pth":
            (site / entry.name).symlink_to(entry)
    return site


def _fresh_runtime(tmp_path: Path, packages: Path) -> Path:
    """A venv whose packages are `packages` (torch included, tformer not): its python."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "runtime.pth").write_text(f"{packages}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    probe = subprocess.run([py, "-c", "import importlib.util as u; print(bool(u.find_spec('torch')), "
                                      "bool(u.find_spec('tformer')))"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["True", "False"], probe.stdout
    return py


RUN = """\
import sys, nbformat
from nbclient import NotebookClient
path, upto = sys.argv[1], int(sys.argv[2])
nb = nbformat.read(path, as_version=4)
full = list(nb.cells)
nb.cells = full[:upto]                    # the title, the launch cells and the chapter's first code cells
NotebookClient(nb, timeout=600, kernel_name="fresh-runtime", resources={"metadata": {"path": sys.argv[3]}}).execute()
nb.cells += full[upto:]
nbformat.write(nb, path)
"""


@pytest.mark.slow
@pytest.mark.parametrize("host", ["Colab", "Kaggle"])
def test_a_fresh_hosted_runtime_installs_the_course_and_runs_in_small_mode(host, course, runtime_packages, tmp_path):
    import nbformat
    py = _fresh_runtime(tmp_path, runtime_packages)
    folder = tmp_path / "content"
    folder.mkdir()
    shutil.copy(ROOT / "notebooks" / f"{CHAPTER}.ipynb", folder)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFORMER_", "KAGGLE_", "PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(TFORMER_REPO=course.as_uri(), PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0",
               PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1", MPLBACKEND="Agg", TQDM_DISABLE="1")
    if host == "Colab":
        stub = tmp_path / "colab-stub" / "google" / "colab"   # `google` stays a namespace package
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text('"""Stands in for Colab\'s google.colab."""\n')
        env["PYTHONPATH"] = str(tmp_path / "colab-stub")
    else:
        env["KAGGLE_KERNEL_RUN_TYPE"] = "Interactive"
    kernels = tmp_path / "jupyter" / "kernels" / "fresh-runtime"     # the kernel runs this venv's python
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({"argv": [str(py), "-m", "ipykernel_launcher", "-f",
                                                              "{connection_file}"], "language": "python",
                                                     "display_name": "fresh runtime"}))
    env["JUPYTER_PATH"] = str(tmp_path / "jupyter")
    nb_path = folder / f"{CHAPTER}.ipynb"
    code = [i for i, c in enumerate(nbformat.read(nb_path, as_version=4).cells) if c.cell_type == "code"]
    upto = code[2] + 1                                  # the setup cell, the imports, the first experiment
    t0 = time.perf_counter()
    out = subprocess.run([py, "-c", RUN, str(nb_path), str(upto), str(folder)], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cells = nbformat.read(nb_path, as_version=4).cells
    text = lambda cell: "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")  # noqa: E731
    setup = [c for c in cells if c.id.endswith("-setup")][0]
    lines = text(setup).splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{host}, no GPU: small mode"), text(setup)
    assert "small mode: True" in text(cells[code[1]])
    assert "weights:" in text(cells[code[2]])
    assert sorted(p.name for p in folder.iterdir()) == [f"{CHAPTER}.ipynb", notebooks.CHECKOUT]
    # a new interpreter (a restarted session) imports the editable install; torch is the runtime's own
    check = subprocess.run([py, "-c", "import tformer, torch; print(tformer.__file__); print(torch.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert Path(check[0]).is_relative_to(folder / notebooks.CHECKOUT)
    assert Path(check[1]).is_relative_to(runtime_packages), "pip reinstalled torch"
    print(f"\n{host}: the first {len(code[:3])} code cells (clone, pip install -e, imports) in {took:.1f} s")
