"""Build the chapter notebooks from their reviewable sources.

Sources are jupytext "percent" files, `notebooks/src/NN_slug.py`: cells start with `# %%` (code) or
`# %% [markdown]`. Inside an exercise, the reference solution sits between two marker lines:

    def my_attention(q, k, v, mask=None):
        ### BEGIN SOLUTION
        ...
        ### END SOLUTION

The learner notebook (`notebooks/NN_slug.ipynb`, committed without outputs) gets a stub in its place,
`raise NotImplementedError(...)`, at the same indentation; the solution notebook keeps the code and drops
the markers. A question's answer is a line ending in `### ANSWER`:

    answer = "B"  ### ANSWER

which the learner notebook gets as `answer = ...  # your answer` (the stub its check reads as "not
attempted"), and the solution notebook without the marker.

    python -m tools.notebooks build                          # learner notebooks -> notebooks/
    python -m tools.notebooks build --solutions --out DIR    # solution notebooks -> DIR
    python -m tools.notebooks check                          # fail if notebooks/ is out of date

Every generated notebook opens with its title cell, then the launch path, from one table (`launch()`): a
markdown cell (a Colab and a Kaggle badge when the repository is on GitHub, and what the next cell does)
and the guarded setup cell (`setup_cell()`). The repository is `Repository` under pyproject.toml's
`[project.urls]` (a fork changes that line); `TFORMER_REPO` (anything `git clone` accepts) overrides it,
when the notebooks are built and again when the setup cell runs; `TFORMER_REF` names a branch instead of
the tag of the package's version (`v` + pyproject's version: a committed notebook cannot name its own
commit). Without a GitHub URL no badge is written. `build` also writes the badges of each chapter in the
README's chapter map (`readme_badges`), and tools/i18n.py those of the Chinese README (the Chinese notebooks).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("Exercise: replace this line with your code")'
ANSWER = "### ANSWER"
ANSWER_STUB = "...  # your answer"
ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"


def strip_solutions(text: str, solutions: bool) -> str:
    """Keep the solution code (markers dropped) or replace each solution block by the stub."""
    out, inside = [], False
    for n, line in enumerate(text.splitlines(), 1):
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise ValueError(f"line {n}: {BEGIN} inside another solution block")
            inside = True
            if not solutions:
                out.append(line[: len(line) - len(line.lstrip())] + STUB)
            continue
        if marker == END:
            if not inside:
                raise ValueError(f"line {n}: {END} without {BEGIN}")
            inside = False
            continue
        if line.rstrip().endswith(ANSWER):
            line = answer_line(line, solutions, n)
        if solutions or not inside:
            out.append(line)
    if inside:
        raise ValueError(f"unclosed {BEGIN}")
    return "\n".join(out) + "\n"


def answer_line(line: str, solutions: bool, n: int) -> str:
    """`answer = "B"  ### ANSWER` -> `answer = "B"` (solution) or `answer = ...  # your answer` (learner)."""
    code = line.rstrip()[: -len(ANSWER)].rstrip()
    target, eq, value = code.partition("=")
    if not eq or not target.strip().isidentifier() or not value.strip():
        raise ValueError(f"line {n}: {ANSWER} ends a line `name = value`, got {line.strip()!r}")
    return code if solutions else f"{target.rstrip()} = {ANSWER_STUB}"


# The markdown cell before the setup cell (translated: each chapter's catalog has it, tools/i18n.py).
LAUNCH_NOTE = ("**Run the next cell first.** On Colab or Kaggle it installs the course (a clone of its repository, "
               "then `pip install -e .`, keeping the runtime's torch) and picks the mode: small on a CPU runtime, "
               "full on a GPU. Where `import tformer` already works (`make lab`, a local install) it does nothing. "
               "On Kaggle, turn the notebook's internet on first (Settings > Internet): it is off by default.")
CHECKOUT = "tformer-course"     # the setup cell's clone, beside the notebook (never `tformer`: a folder of that
                                # name would pass for the package)
GITHUB = re.compile(r"^(?:https://github\.com/|git@github\.com:)([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"


def _pyproject() -> dict:
    import tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def launch() -> dict:
    """The one table behind the badges and the setup cell: the repository's URL ("" if none), the ref the
    install and the badges point at, and the GitHub owner/name when the URL is a GitHub repository."""
    project = _pyproject()["project"]
    repo = os.environ.get("TFORMER_REPO") or (project.get("urls") or {}).get("Repository") or ""
    ref = os.environ.get("TFORMER_REF") or f"v{project['version']}"
    m = GITHUB.match(repo.strip())
    return {"repo": repo.strip(), "ref": ref, "github": f"{m.group(1)}/{m.group(2)}" if m else None}


def badges(path: str, table: dict | None = None) -> str:
    """The Colab and Kaggle badges of the notebook at `path` (relative to the repository's root), or ""
    when the repository is not on GitHub (both open notebooks from GitHub only)."""
    t = table or launch()
    if not t["github"]:
        return ""
    blob = f"{t['github']}/blob/{t['ref']}/{path}"
    return (f"[![Open in Colab]({COLAB_BADGE})](https://colab.research.google.com/github/{blob}) "
            f"[![Open in Kaggle]({KAGGLE_BADGE})](https://kaggle.com/kernels/welcome?src=https://github.com/{blob})")


# A chapter-map row of the README: `| 1 | `01_attention` ...|`, the badges (if any) after the notebook's name.
MAP_ROW = re.compile(r"^(\| *\d+ *\| *`(\d\d_\w+)`)((?: *\[!\[Open in (?:Colab|Kaggle)\]\([^)]*\)\]\([^)]*\))*)( *\|)", re.M)
BADGE = re.compile(r" *\[!\[Open in (?:Colab|Kaggle)\]\([^)]*\)\]\([^)]*\)")


def strip_badges(text: str) -> str:
    """`text` without its Colab and Kaggle badges: what the translation catalogs hold (a badge is not prose,
    and the Chinese README's open the Chinese notebooks)."""
    return BADGE.sub("", text)


def readme_badges(text: str, lang: str = "en", table: dict | None = None) -> str:
    """The README (or its Chinese edition, lang "zh") with each chapter-map row's notebook followed by its
    badges, from the same table as the notebooks' (none without a GitHub repository). Idempotent."""
    t = table or launch()

    def row(m):
        path = f"notebooks/zh/{m.group(2)}.ipynb"          # a chapter not yet translated opens in English
        head = badges(path if lang == "zh" and (ROOT / path).is_file() else f"notebooks/{m.group(2)}.ipynb", t)
        return m.group(1) + (f" {head}" if head else "") + m.group(4)
    return MAP_ROW.sub(row, text)


SETUP = """\
# Setup. Where `import tformer` works, this cell does nothing. On Colab or Kaggle it installs the course.
import importlib.util, os, subprocess, sys
REPO = os.environ.get("TFORMER_REPO", @REPO@)  # the course's git URL: pyproject.toml's [project.urls]
REF = os.environ.get("TFORMER_REF", @REF@)  # the tag of tformer's version, or a branch
CODE = os.path.abspath(@CHECKOUT@)  # the clone, beside this notebook
colab = importlib.util.find_spec("google") and importlib.util.find_spec("google.colab")
HOST = "Kaggle" if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") else "Colab" if colab else None
if HOST and not importlib.util.find_spec("tformer"):
    clone = ["git", "clone", "-q", "--depth", "1", "-b", REF, REPO, CODE]
    if not REPO:
        print("No repository named: set os.environ['TFORMER_REPO'] to the course's git URL, rerun this cell.")
    elif not os.path.isdir(CODE) and subprocess.run(clone).returncode:
        print(f"git clone -b {REF} {REPO} failed" + ": on Kaggle, turn the internet on (Settings > Internet)" * (HOST == "Kaggle"))
    else:  # pip keeps the runtime's torch where pyproject.toml's range allows it
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", CODE], check=True)
        sys.path.insert(0, CODE)  # the editable install is seen by a new interpreter only
        importlib.invalidate_caches()
if HOST and importlib.util.find_spec("tformer"):
    import torch
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    small = os.environ.setdefault("TFORMER_SMALL", "0" if gpu else "1").lower() not in ("0", "", "false", "no")
    print(f"{HOST}, {gpu or 'no GPU'}: " + ("small mode (TFORMER_SMALL=1)" if small else "full mode (the GPU tier)")
          + f"; to change it: restart the session, run `%env TFORMER_SMALL={int(not small)}`, then this cell.")
elif not HOST and not importlib.util.find_spec("tformer"):
    print(f"tformer is not installed here: clone the course ({REPO or 'its git URL'}) and run `make lab` in it.")
"""


def setup_cell(table: dict | None = None) -> str:
    """The guarded setup cell: nothing where tformer imports; on Colab or Kaggle, clone, install, choose the
    mode. Its logic is in the cell, not in a file it fetches: nothing of the course is on a fresh runtime
    before it runs, and a file fetched from the repository would be a second download from the URL the cell
    has anyway (and one more thing to break when the repository moves), for a cell of 25 lines."""
    t = table or launch()
    import json
    quote = json.dumps                      # a Python string literal in double quotes, as the rest of the cell
    return SETUP.replace("@REPO@", quote(t["repo"])).replace("@REF@", quote(t["ref"])).replace("@CHECKOUT@", quote(CHECKOUT))


def launch_cells(stem: str, path: str | None = None, note: str = LAUNCH_NOTE, table: dict | None = None) -> list:
    """The markdown cell (badges of the notebook at `path`, if any, and `note`) and the setup cell, with ids
    of their own: the chapter's cells keep theirs (`NN-iii`, from their index in the source)."""
    import nbformat
    t = table or launch()
    head = badges(path, t) if path else ""
    return [nbformat.v4.new_markdown_cell(f"{head}\n\n{note}" if head else note, id=f"{stem[:2]}-launch"),
            nbformat.v4.new_code_cell(setup_cell(t), id=f"{stem[:2]}-setup")]


def build_notebook(src: Path, solutions: bool, launch_path: bool | str = True, note: str = LAUNCH_NOTE):
    """Source file -> nbformat notebook (no outputs, Python 3 kernel). With `launch_path`, the launch cells
    follow the title cell; a string is the notebook's path in the repository, which its badges open (the
    learner notebook's by default; False: the chapter's own cells only, as tools/i18n.py reads them)."""
    import jupytext

    try:
        text = strip_solutions(src.read_text(), solutions)
    except ValueError as e:
        raise ValueError(f"{src}: {e}") from None
    nb = jupytext.reads(text, fmt="py:percent")
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    for i, cell in enumerate(nb.cells):
        cell.metadata = {}
        cell["id"] = f"{src.stem[:2]}-{i:03d}"           # stable ids: rebuilding gives identical files
    if launch_path:
        path = launch_path if isinstance(launch_path, str) else None if solutions else f"notebooks/{src.stem}.ipynb"
        nb.cells[1:1] = launch_cells(src.stem, path, note)
    return nb


def render(src: Path, solutions: bool) -> str:
    import nbformat
    return nbformat.writes(build_notebook(src, solutions)) + "\n"


def sources() -> list[Path]:
    return sorted(p for p in SRC.glob("[0-9][0-9]_*.py"))


def drop_stale(folder: Path, suffix: str, stems: set[str]) -> list[Path]:
    """Remove chapter files (NN_slug + suffix) in `folder` whose chapter is not in `stems`: what a chapter
    renamed or split since the last build left behind (other files are never touched)."""
    gone = [p for p in folder.glob(f"[0-9][0-9]_*{suffix}") if p.name[: -len(suffix)] not in stems]
    for p in gone:
        p.unlink()
    return gone


README = ROOT / "README.md"


def build(out: Path, solutions: bool) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if not solutions and README.read_text() != readme_badges(README.read_text()):
        README.write_text(readme_badges(README.read_text()))      # the chapter map's badges
        written.append(README)
    for src in sources():
        dst = out / (src.stem + ".ipynb")
        dst.write_text(render(src, solutions))
        written.append(dst)
    drop_stale(out, ".ipynb", {src.stem for src in sources()})
    return written


def stale(out: Path = ROOT / "notebooks") -> list[str]:
    """Learner notebooks that differ from what their sources generate (or are missing)."""
    bad = []
    for src in sources():
        dst = out / (src.stem + ".ipynb")
        if not dst.exists() or dst.read_text() != render(src, solutions=False):
            bad.append(dst.name)
    if README.read_text() != readme_badges(README.read_text()):
        bad.append("README.md (its chapter map's badges)")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.notebooks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write notebooks from notebooks/src")
    b.add_argument("--solutions", action="store_true", help="keep the solutions (teacher notebooks)")
    b.add_argument("--out", type=Path, default=None, help="output folder (default: notebooks/)")
    sub.add_parser("check", help="exit 1 if a learner notebook is out of date")
    args = p.parse_args(argv)
    if args.cmd == "build":
        out = args.out or (ROOT / "notebooks")
        if args.solutions and out.resolve() == (ROOT / "notebooks").resolve():
            p.error("write solution notebooks elsewhere (--out), not over the learner notebooks")
        for path in build(out, args.solutions):
            print(path)
        return 0
    bad = stale()
    if bad:
        print("out of date (run `make notebooks`):", ", ".join(bad))
        return 1
    print("learner notebooks are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
