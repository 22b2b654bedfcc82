"""A class's hand-ins: who the students are and which file is each one's notebook for each chapter.

CLASS holds one folder per student (the folder's name is the student's id), each with that student's
notebooks under any name a download gives them (tformer/grading/classroom/notebooks.py's rule), or is a
Canvas bulk download (one flat folder of `name_userid_submissionid_original.ipynb`: its students are
`name_userid`), or is one learner's folder (chapter notebooks directly inside: a class of one). A folder with
both chapter notebooks and student folders is refused. Where a student has two files for one notebook, the
newest is graded and the other listed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .notebooks import known_stems, notebook_stem

_SKIP_DIRS = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}


class ClassError(ValueError):
    """CLASS cannot be graded (the message is one line)."""


# Canvas's bulk download of submissions: one flat folder of `name_userid_submissionid_original.ipynb`
# (`name_LATE_userid_...` when late; the original name may carry `-1` for a resubmission)
_CANVAS_NAME = re.compile(r"^(?P<name>[A-Za-z0-9]+?)(?:_late)?_(?P<uid>\d+)_(?P<sub>\d+)_(?P<file>.+\.ipynb)$", re.IGNORECASE)


@dataclass
class Submission:
    student: str
    folder: Path
    notebooks: dict[str, Path] = field(default_factory=dict)          # stem -> the file graded
    ignored: dict[str, list[str]] = field(default_factory=dict)       # stem -> older files for the same notebook
    unrecognized: list[str] = field(default_factory=list)             # .ipynb files naming no chapter
    canvas_id: str = ""                                               # Canvas's user id (a Canvas download)


def _notebook_files(folder: Path, recursive: bool) -> list[Path]:
    found = folder.rglob("*.ipynb") if recursive else folder.glob("*.ipynb")
    return sorted(p for p in found if p.is_file() and not _SKIP_DIRS & set(p.relative_to(folder).parts[:-1]))


def _submission(student: str, folder: Path, files: list[Path], known: list[str], canvas_id: str = "") -> Submission:
    sub = Submission(student, folder, canvas_id=canvas_id)
    by_stem: dict[str, list[Path]] = {}
    for f in files:
        m = _CANVAS_NAME.match(f.name) if canvas_id else None
        stem = notebook_stem(m.group("file") if m else f.name, known)
        if stem is None:
            sub.unrecognized.append(str(f.relative_to(folder)))
        else:
            by_stem.setdefault(stem, []).append(f)
    for stem, paths in sorted(by_stem.items()):
        paths.sort(key=lambda p: (p.stat().st_mtime, p.name), reverse=True)   # the newest first
        sub.notebooks[stem] = paths[0]
        if paths[1:]:
            sub.ignored[stem] = [str(p.relative_to(folder)) for p in paths[1:]]
    return sub


def read_class(path: Path) -> list[Submission]:
    """The students of CLASS: one per subfolder, or the folder itself when the notebooks are directly inside."""
    path = Path(path)
    if not path.is_dir():
        raise ClassError(f"{path} is not a folder" if path.exists() else f"{path} does not exist")
    known = known_stems()
    files = _notebook_files(path, recursive=False)
    canvas = [p for p in files if _CANVAS_NAME.match(p.name)]
    direct = [p for p in files if notebook_stem(p.name, known)]
    folders = sorted(d for d in path.iterdir() if d.is_dir() and d.name not in _SKIP_DIRS
                     and not d.name.startswith(".") and _notebook_files(d, recursive=True))
    if direct and folders:
        raise ClassError(f"{path} holds both chapter notebooks ({direct[0].name}, ...) and student folders "
                         f"({folders[0].name}/, ...): put each student's notebooks in their own folder")
    if canvas and len(canvas) == len(direct):        # a Canvas bulk download: students by their Canvas id
        by_id: dict[str, list[Path]] = {}
        names: dict[str, str] = {}
        for f in canvas:
            m = _CANVAS_NAME.match(f.name)
            by_id.setdefault(m.group("uid"), []).append(f)
            names.setdefault(m.group("uid"), m.group("name").lower())
        return [_submission(f"{names[uid]}_{uid}", path, fs, known, canvas_id=uid) for uid, fs in sorted(by_id.items())]
    if direct:
        return [_submission(path.resolve().name, path, direct, known)]
    if not folders:
        raise ClassError(f"no student folders with notebooks and no chapter notebooks (NN_name.ipynb) in {path}")
    return [_submission(d.name, d, _notebook_files(d, recursive=True), known) for d in folders]


def has_student_folders(path: Path) -> bool:
    """True when `path` is a folder with subfolders holding notebooks (a class, not one learner)."""
    path = Path(path)
    return path.is_dir() and any(d.is_dir() and d.name not in _SKIP_DIRS and not d.name.startswith(".")
                                 and _notebook_files(d, recursive=True) for d in path.iterdir())
