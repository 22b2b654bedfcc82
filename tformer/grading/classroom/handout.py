"""What students get: `tformer handout --out DIR` (`make handout`), the learner notebooks of the assigned
chapters in one edition, and nothing of `notebooks/src/` (the sources hold every exercise's solution).

    tformer handout --out handout/                               # every chapter, English
    tformer handout --out handout/ --assignment week1.toml --lang zh

The notebooks are the released learner notebooks (`notebooks/NN_*.ipynb`, `notebooks/zh/NN_*.ipynb`): each
exercise is its stub. A notebook that still carries a solution marker is refused, so a hand-out cannot leak one.

A teacher's exercise module (`exercises = ["week3.py"]`) is not handed out: its reference, and its questions'
answers, stay with the teacher. In its place goes its public file, `week3.public.pt` (tformer/grading/public.py:
the cases frozen at fixed seeds, the reference's and each named mistake's outputs on them, no code and no
answers), which a learner's `load_exercises("week3.py")` reads when there is no week3.py beside the notebook.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .notebooks import EXTRA_RELEASED, RELEASED_DIRS, released_notebooks
from .submissions import ClassError

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN")


def handout(out: Path, stems: list[str] | None = None, lang: str = "en", files: list[str] = ()) -> list[Path]:
    """Copy the learner notebooks of `stems` (default: every chapter) in edition `lang` into `out`, with the
    public file of each teacher's exercise module in `files` beside them (week3.py -> week3.public.pt, which a
    learner's `load_exercises("week3.py")` finds there; the module itself is not copied); returns the files
    written. ClassError if one is missing or carries a solution marker, an exercise cannot be made public, or
    `out` is not an empty folder. A teacher's own notebooks come from the assignment's `released` folder."""
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
    from ..core import REGISTRY, TEACHER_NAMES, load_exercises
    from ..public import NotPublic, public_bytes, public_path
    publics: dict[str, bytes] = {}                    # file name in `out` -> the public file
    for f in files:
        path = Path(f).expanduser().resolve()
        name = public_path(path).name
        if name in publics:
            raise ClassError(f"two exercise files make the public file {name}: rename one")
        try:
            load_exercises(path)
            registered = TEACHER_NAMES.get(str(path), [])
            publics[name] = public_bytes(registered)
        except NotPublic as e:
            raise ClassError(str(e)) from None
        except Exception as e:                        # the module, a case or the reference raised
            raise ClassError(f"{f}: making its public file: {type(e).__name__}: {e}".splitlines()[0]) from None
        for n in registered:
            if getattr(REGISTRY[n], "compare", None) is not None:
                print(f"note: {n} has its own `compare`, which is code: the hand-out's check compares with the "
                      f"generic one (the class grader uses yours)", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for src in notebooks:
        shutil.copyfile(src, out / src.name)
        written.append(out / src.name)
    for name, data in publics.items():
        (out / name).write_bytes(data)
        written.append(out / name)
    return written
