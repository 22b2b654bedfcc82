"""A check's verdict: `Result`, what `check` returns and prints, for an exercise and a question alike."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Result:
    exercise: str
    points: int
    passed: bool
    status: str          # "passed", "failed", "not attempted", "error", "timeout"
    message: str
    cases_run: int = 0
    fraction: float | None = None     # partial credit: the share of the points earned (None: all or nothing)
    mistakes: list[str] = field(default_factory=list)   # a question's named misconceptions (English messages)

    def __bool__(self) -> bool:
        return self.passed

    def _repr_markdown_(self) -> str:  # shown in Jupyter when the result is the cell's last value
        return f"**{self.exercise}**: {self.message}".replace("\n", "  \n")
