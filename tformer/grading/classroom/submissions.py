"""A class's hand-ins: who the students are and which file is each one's notebook for each chapter.

CLASS is one of:
- one folder per student (the folder's name is the student's id), each with that student's notebooks under
  any name a download gives them (notebooks.py's rule: `Copy of 04 positional encoding (1).ipynb` is chapter
  4's notebook);
- a Canvas bulk download: one flat folder of `name_userid_fileid_original.ipynb`, where the name is Canvas's
  sortable name with every non-word character removed (Unicode letters, digits and `_` stay: `müllerjürgen`,
  `张伟`), `LATE_` before the user id when late, and `anon_ID` in place of name and user id in an anonymous
  download. Its students are `name_userid` (or `anon_ID`). A flat folder where only some files have such
  names is refused: one plain file would otherwise make the whole folder one learner;
- one learner's folder (chapter notebooks directly inside: a class of one). A folder with both chapter
  notebooks and student folders is refused.

Two files for one notebook are decided by evidence, in this order: the higher Canvas file id (it grows with
each upload), then the download number (`name (2)` over `name (1)` over `name`; Canvas's `name-1` too),
then the modification time. Where none of them tells the files apart, the first by name is graded and the
choice is a warning (`Submission.ties`) in the terminal summary and the report; the other files are listed.

`learner_notebooks` applies the same rule to one learner's `tformer grade PATH`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..messages import N_
from .notebooks import chapter_order, known_stems, notebook_stem

# the evidence that chose one of several files for a notebook (translated where it is shown)
EVIDENCE = (N_("Canvas file id"), N_("download number"), N_("modification time"), N_("tie"))

_SKIP_DIRS = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}
# Canvas's names: `name_[LATE_]userid_fileid_original`; `\w` is Unicode-aware (letters of any script, digits, `_`)
_WORDS = re.compile(r"\w+")
_CANVAS_REST = re.compile(r"(?:(?P<late>LATE)_)?(?P<uid>\d+)_(?P<file_id>\d+)_(?P<file>.+\.ipynb)$", re.IGNORECASE)
_CHAPTER_START = re.compile(r"\d\d[a-z]?_", re.IGNORECASE)
_CANVAS_ANON = re.compile(r"^anon_(?P<anon>[A-Za-z0-9]+)_(?:(?P<late>LATE)_)?(?P<file_id>\d+)_(?P<file>.+\.ipynb)$",
                          re.IGNORECASE)
_DOWNLOAD_NUMBER = re.compile(r"(?:\s*\((\d+)\)|-(\d+))\s*$")


class ClassError(ValueError):
    """CLASS cannot be graded (the message is one line)."""


@dataclass
class CanvasName:
    """What a Canvas bulk download's file name says."""
    student: str          # "müllerjürgen_123", "anon_Ab3xZ"
    canvas_id: str        # the user id ("" in an anonymous download)
    file_id: int          # the attachment's id: a later upload has a higher one
    late: bool            # Canvas marked the submission late
    original: str         # the file's name as the student uploaded it


def canvas_name(filename: str) -> CanvasName | None:
    """The parts of a Canvas bulk download's file name; None for any other name. A sortable name that itself
    ends in `_digits` can be split in more than one place: the split whose original name starts with a chapter
    number (`01_attention.ipynb`, as the course's notebooks are named) wins, else the shortest name."""
    m = _CANVAS_ANON.match(filename)
    if m:
        return CanvasName(f"anon_{m['anon']}", "", int(m["file_id"]), bool(m["late"]), m["file"])
    splits = []
    for at in (i for i, ch in enumerate(filename) if ch == "_"):
        name, rest = filename[:at], _CANVAS_REST.match(filename, at + 1)
        if rest and _WORDS.fullmatch(name):
            splits.append((name, rest))
    if not splits:
        return None
    name, m = next(((n, r) for n, r in splits if _CHAPTER_START.match(r["file"])), splits[0])
    return CanvasName(f"{name.lower()}_{m['uid']}", m["uid"], int(m["file_id"]), bool(m["late"]), m["file"])


@dataclass
class Submission:
    student: str
    folder: Path
    notebooks: dict[str, Path] = field(default_factory=dict)          # stem -> the file graded
    ignored: dict[str, list[str]] = field(default_factory=dict)       # stem -> the other files for that notebook
    chosen_by: dict[str, str] = field(default_factory=dict)           # stem -> the evidence that chose the file
    ties: list[str] = field(default_factory=list)                     # stems whose file no evidence chose
    unrecognized: list[str] = field(default_factory=list)             # .ipynb files naming no chapter
    canvas_id: str = ""                                               # Canvas's user id (a Canvas download)
    late: set[str] = field(default_factory=set)                       # stems Canvas marked late
    flat: bool = False                                                # its files share a folder with others'
    submitted: str | None = None                                      # nbgrader's timestamp.txt (ISO), if any

    def own(self) -> list[Path]:
        """What a worker grading this student may read of the class: the student's folder, or in a shared
        flat folder (a Canvas download) the student's own files."""
        return list(self.notebooks.values()) if self.flat else [self.folder]

    def warnings(self) -> list[str]:
        """One line per notebook whose file no evidence chose."""
        return [f"{self.student}/{stem}: graded {self.notebooks[stem].name}, not {', '.join(self.ignored[stem])}: "
                f"the files have no Canvas file id or download number to tell them apart and the same "
                f"modification time" for stem in self.ties]


def _notebook_files(folder: Path, recursive: bool) -> list[Path]:
    found = folder.rglob("*.ipynb") if recursive else folder.glob("*.ipynb")
    return sorted(p for p in found if p.is_file() and not p.name.startswith(".")
                  and not _SKIP_DIRS & set(p.relative_to(folder).parts[:-1]))


def download_number(filename: str) -> int:
    """The number a download or an upload added to a name: `x (2).ipynb` -> 2, Canvas's `x-1.ipynb` -> 1, else 0."""
    base = filename[:-len(".ipynb")] if filename.lower().endswith(".ipynb") else filename
    m = _DOWNLOAD_NUMBER.search(base)
    return int(m.group(1) or m.group(2)) if m else 0


def _evidence(f: Path, canvas: bool) -> tuple[int, int, float]:
    """What says which of several files of a notebook is the newest: (Canvas file id, download number,
    modification time), each higher for a later file (-1 and 0 where a name carries none)."""
    c = canvas_name(f.name) if canvas else None
    return (c.file_id if c else -1), download_number(c.original if c else f.name), f.stat().st_mtime


def _choose(paths: list[Path], canvas: bool) -> tuple[list[Path], str]:
    """The files of one notebook, the one to grade first, and the evidence that chose it ("" if alone,
    "tie" if nothing told the first two apart)."""
    if len(paths) == 1:
        return paths, ""
    keyed = sorted(((_evidence(p, canvas), p.name, p) for p in paths), key=lambda t: (-t[0][0], -t[0][1], -t[0][2], t[1]))
    (a, _, _), (b, _, _) = keyed[0], keyed[1]
    why = ("Canvas file id" if a[0] != b[0] else "download number" if a[1] != b[1]
           else "modification time" if a[2] != b[2] else "tie")
    return [p for _, _, p in keyed], why


def _submission(student: str, folder: Path, files: list[Path], known: list[str], canvas: bool = False) -> Submission:
    sub = Submission(student, folder, flat=canvas)
    by_stem: dict[str, list[Path]] = {}
    for f in files:
        c = canvas_name(f.name) if canvas else None
        stem = notebook_stem(c.original if c else f.name, known)
        if stem is None:
            sub.unrecognized.append(str(f.relative_to(folder)))
        else:
            by_stem.setdefault(stem, []).append(f)
        if c is not None:
            sub.canvas_id = c.canvas_id
    for stem in sorted(by_stem, key=chapter_order):
        paths, why = _choose(by_stem[stem], canvas)
        sub.notebooks[stem] = paths[0]
        if paths[1:]:
            sub.ignored[stem] = [str(p.relative_to(folder)) for p in paths[1:]]
            sub.chosen_by[stem] = why
            if why == "tie":
                sub.ties.append(stem)
        c = canvas_name(paths[0].name) if canvas else None
        if c is not None and c.late:
            sub.late.add(stem)
    return sub


def read_class(path: Path) -> list[Submission]:
    """The students of CLASS: one per subfolder, one per Canvas name, or the folder itself (a class of one)."""
    path = Path(path)
    if not path.is_dir():
        raise ClassError(f"{path} is not a folder" if path.exists() else f"{path} does not exist")
    known = known_stems()
    files = _notebook_files(path, recursive=False)
    canvas = [p for p in files if canvas_name(p.name)]
    plain = [p for p in files if not canvas_name(p.name)]
    direct = [p for p in files if notebook_stem(p.name, known)]
    folders = sorted(d for d in path.iterdir() if d.is_dir() and d.name not in _SKIP_DIRS
                     and not d.name.startswith(".") and _notebook_files(d, recursive=True))
    if (direct or canvas) and folders:
        one = (direct or canvas)[0].name
        raise ClassError(f"{path} holds both chapter notebooks ({one}, ...) and student folders "
                         f"({folders[0].name}/, ...): put each student's notebooks in their own folder")
    if canvas and plain:
        raise ClassError(f"{path} mixes Canvas download names ({canvas[0].name}) with other notebooks "
                         f"({plain[0].name}): grade a Canvas download as it came, or one student folder per student")
    if canvas:                                       # a Canvas bulk download: students by their Canvas name
        by_student: dict[str, list[Path]] = {}
        for f in canvas:
            by_student.setdefault(canvas_name(f.name).student, []).append(f)
        return [_submission(s, path, fs, known, canvas=True) for s, fs in sorted(by_student.items())]
    if direct:
        return [_submission(path.resolve().name, path, files, known)]
    if not folders:
        raise ClassError(f"no student folders with notebooks and no chapter notebooks (NN_name.ipynb) in {path}")
    return [_submission(d.name, d, _notebook_files(d, recursive=True), known) for d in folders]


def has_student_folders(path: Path) -> bool:
    """True when `path` is a folder with subfolders holding notebooks (a class, not one learner)."""
    path = Path(path)
    return path.is_dir() and any(d.is_dir() and d.name not in _SKIP_DIRS and not d.name.startswith(".")
                                 and _notebook_files(d, recursive=True) for d in path.iterdir())


def learner_notebooks(path: Path) -> Submission:
    """One learner's `tformer grade PATH`: a notebook, or the chapter notebooks directly in a folder (its
    subfolders, such as the course's notebooks/zh/, are not read), one file per notebook by the class's rule."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".ipynb":
            raise ClassError(f"{path} is not a notebook (.ipynb)")
        stem = notebook_stem(path.name, known_stems()) or path.stem
        return Submission(path.parent.name, path.parent, notebooks={stem: path})
    if not path.is_dir():
        raise ClassError(f"{path} does not exist")
    sub = _submission(path.resolve().name, path, _notebook_files(path, recursive=False), known_stems())
    if not sub.notebooks:
        raise ClassError(f"no chapter notebooks (NN_name.ipynb) in {path}")
    return sub
