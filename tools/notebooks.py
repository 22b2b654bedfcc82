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
"""
from __future__ import annotations

import argparse
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


def build_notebook(src: Path, solutions: bool):
    """Source file -> nbformat notebook (no outputs, Python 3 kernel)."""
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


def build(out: Path, solutions: bool) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
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
