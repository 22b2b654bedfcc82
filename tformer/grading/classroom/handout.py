"""What students get: `tformer handout --out DIR` (`make handout`), the learner notebooks of the assigned
chapters in one edition, and nothing of `notebooks/src/` (the sources hold every exercise's solution).

    tformer handout --out handout/                               # every chapter, English
    tformer handout --out handout/ --assignment week1.toml --lang zh

The notebooks are the released learner notebooks (`notebooks/NN_*.ipynb`, `notebooks/zh/NN_*.ipynb`): each
exercise is its stub. A notebook that still carries a solution marker is refused, so a hand-out cannot leak one.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from .notebooks import EXTRA_RELEASED, RELEASED_DIRS, released_notebooks
from .submissions import ClassError

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN")


def handout(out: Path, stems: list[str] | None = None, lang: str = "en", files: list[str] = ()) -> list[Path]:
    """Copy the learner notebooks of `stems` (default: every chapter) in edition `lang` into `out`, with a
    teacher's exercise `files` beside them (a learner's `load_exercises("week3.py")` finds them there); returns
    the files written. ClassError if one is missing or carries a solution marker, or `out` is not an empty
    folder. A teacher's own notebooks come from the assignment's `released` folder."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ClassError(f"--out {out}: give a new or empty folder (the hand-out is written fresh)")
    folder = RELEASED_DIRS[1] if lang == "zh" else RELEASED_DIRS[0]
    found = {stem: [p for p in paths if p.parent == folder or p.parent in EXTRA_RELEASED]
             for stem, paths in released_notebooks().items()}
    stems = stems if stems is not None else sorted(s for s, ps in found.items() if ps and ps[0].parent == folder)
    notebooks = []
    for stem in stems:
        if not found.get(stem):
            raise ClassError(f"no released notebook {stem} in {folder} (run `python -m tools.notebooks build`, or "
                             f"`python -m tools.i18n build` for the Chinese edition)")
        src = found[stem][0]
        text = src.read_text(encoding="utf-8")
        marker = next((m for m in SOLUTION_MARKERS if m in text), None)
        if marker:
            raise ClassError(f"{src} carries {marker!r}: it is not a learner notebook; rebuild the notebooks")
        notebooks.append(src)
    files = [*notebooks, *(Path(f) for f in files)]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for src in files:
        shutil.copyfile(src, out / src.name)
        written.append(out / src.name)
    return written
