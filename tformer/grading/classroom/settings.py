"""What a class run is, as one value: the Assignment (what is graded and for how many points) with the run's
flags applied, and RunSettings (how it is graded). `tformer class grade` builds it from what the teacher typed;
grades.json's `settings` records it; `tformer class verify` and `tformer class merge` read it back from there, so
no command reads the exercises, points or limits its own way.

    RunSettings       time limits, workers, memory, small mode, skipped cells, network, shard, --only, the LMS
    Run               the Assignment, the teacher's exercise files (the assignment's and --exercises), the
                      points (the assignment's, then --weights), overrides, submission times and extensions
    Run.record()      grades.json's settings (the keys feedback, gradebook and lms read)
    Run.recorded()    the run a grades.json recorded: its teacher's files loaded again, refused if they changed

This module imports no torch: the command line reads its defaults before anything heavy is imported.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

CLASS_TIMEOUT = 120           # seconds per cell for a class (a learner's own folder: 600); small mode's slowest cell, one
                              # thread on a busy 2-core machine: 52 s (chapter 10)
NOTEBOOK_TIMEOUT = 600        # seconds per notebook for a class, cells and exercises together (--notebook-timeout)


@dataclass
class RunSettings:
    """How a class is graded. What changes a verdict (the time limits, small mode, the cells skipped, the
    network) must agree between the shards `class merge` combines; the rest may differ per machine."""
    timeout: float = CLASS_TIMEOUT                  # seconds per cell
    notebook_timeout: float | None = NOTEBOOK_TIMEOUT    # seconds per notebook, cells and exercises together
    workers: int | None = None                      # notebooks at once (None: the machine's cores)
    memory: int | None = None                       # bytes of address space per worker (None: memory / workers)
    small: bool = True                              # TFORMER_SMALL=1 in the workers (--full: False)
    skip: bool = True                               # skip released cells no exercise needs (--every-cell: False)
    allow_network: bool = False                     # hidden cases may reach workers that keep some network
    shard: tuple[int, int] | None = None            # grade only shard K of N
    only: str | None = None                         # grade this exercise again, keep every other verdict
    lms: str | None = None                          # also write this LMS's import (lms.EXPORTS)
    roster: Path | None = None                      # the LMS's roster export

    VERDICT = ("timeout", "notebook_timeout", "small", "skip", "allow_network")   # what shards must agree on


@dataclass
class Run:
    """A class run: what is graded (`assignment`, `exercise_files`, `points`) and how (`settings`), with the
    teacher's say over the result (`overrides`, `submitted`, `extensions`)."""
    assignment: object = None                       # assignment.Assignment, or None: what the class handed in
    settings: RunSettings = field(default_factory=RunSettings)
    exercise_files: list[str] = field(default_factory=list)   # absolute paths: the assignment's and --exercises
    points: dict[str, int] = field(default_factory=dict)      # the assignment's [points], then --weights
    overrides: list[dict] = field(default_factory=list)       # manual grades (gradebook.read_overrides)
    submitted: dict[str, str] = field(default_factory=dict)   # {student: ISO time} (--submitted)
    extensions: dict[str, str] = field(default_factory=dict)  # {student: ISO due} (--extensions)

    @classmethod
    def of(cls, assignment=None, exercises: list = (), weights: dict | None = None, settings: RunSettings | None = None,
           **teacher) -> "Run":
        """A run of `assignment` (or of what the class handed in), with --exercises FILE... and --weights applied
        over it; `teacher`: overrides, submitted, extensions."""
        files = sorted({str(Path(f).resolve()) for f in exercises}
                       | set(assignment.exercise_files if assignment is not None else []))
        points = {**(assignment.points if assignment is not None else {}), **(weights or {})}
        return cls(assignment, settings or RunSettings(), files, points,
                   **{k: v for k, v in teacher.items() if v is not None})

    @property
    def released(self) -> str:
        return self.assignment.released if self.assignment is not None else ""

    @property
    def hidden(self) -> list[str]:
        return self.assignment.hidden if self.assignment is not None else []

    @property
    def show_hidden(self) -> bool:
        return self.assignment.show_hidden_mistakes if self.assignment is not None else False

    @property
    def late(self) -> dict | None:
        a = self.assignment
        if a is None or not a.due:
            return None
        return {"due": a.due, "rule": a.late, "submitted": self.submitted, "extensions": self.extensions}

    def load(self) -> str:
        """Load the teacher's files into this process (ClassError on a bad one); return their hash."""
        from .assignment import exercises_hash, use_teacher_files
        use_teacher_files(self.exercise_files, self.released, self.hidden)
        return exercises_hash(self.exercise_files, self.released, self.hidden)

    def with_settings(self, **changes) -> "Run":
        """This run with some settings changed (a command's flags over a recorded run)."""
        given = {k: v for k, v in changes.items() if v is not None}
        return replace(self, settings=replace(self.settings, **given))

    def record(self, teacher_hash: str) -> dict:
        """grades.json's settings: what this run graded and how (run.grade_class adds the workers' limits and
        isolation, which only the run knows)."""
        s = self.settings
        return {"timeout": s.timeout, "notebook_timeout": s.notebook_timeout, "allow_network": s.allow_network,
                "small": s.small, "skip_released_cells": s.skip,
                "shard": f"{s.shard[0]}/{s.shard[1]}" if s.shard else None, "only": s.only,
                "assignment": self.assignment.record() if self.assignment is not None else None,
                "exercise_files": list(self.exercise_files), "exercises_hash": teacher_hash,
                "weights": dict(self.points), "late": self.late}

    @classmethod
    def recorded(cls, settings: dict, overrides: list | None = None, where: str = "grades.json") -> "Run":
        """The run `settings` (grades.json's) recorded, its teacher's files loaded. ClassError when those files
        changed since (their hash differs): the verdicts could differ for that reason alone."""
        from .assignment import Assignment
        from .submissions import ClassError
        rec = dict(settings.get("assignment") or {})
        assignment = None
        if rec:
            a = {k: rec[k] for k in ("notebooks", "points", "canvas_column", "moodle_column", "released", "hidden",
                                     "show_hidden_mistakes", "round", "due", "late") if k in rec}
            assignment = Assignment(**a, path=rec.get("file", ""), sha256=rec.get("sha256", ""),
                                    exercise_files=list(rec.get("exercises", [])))
        late = settings.get("late") or {}
        run = cls(assignment, RunSettings(
            timeout=settings.get("timeout") or CLASS_TIMEOUT, notebook_timeout=settings.get("notebook_timeout"),
            memory=settings.get("memory"), small=settings.get("small", True),
            skip=settings.get("skip_released_cells", True), allow_network=settings.get("allow_network", False)),
            list(settings.get("exercise_files", [])), dict(settings.get("weights") or {}), list(overrides or []),
            dict(late.get("submitted") or {}), dict(late.get("extensions") or {}))
        try:
            now = run.load()
        except ClassError as e:
            raise ClassError(f"{where}: the teacher's files it was graded with cannot be loaded now: {e}") from None
        if now != settings.get("exercises_hash", ""):
            files = [*run.exercise_files, *run.hidden] + ([run.released] if run.released else [])
            raise ClassError(f"{where} was graded with other exercise files than those there now "
                             f"({', '.join(files)}): use the files that graded it")
        return run

    def differences(self, other: "Run") -> list[str]:
        """What another run (a shard) graded differently: the names of the fields that differ."""
        mine, theirs = self.record(""), other.record("")
        keys = ["assignment", "exercise_files", "weights", "late", *RunSettings.VERDICT]
        names = {"skip": "skip_released_cells"}
        return [k for k in keys if mine.get(names.get(k, k)) != theirs.get(names.get(k, k))]
