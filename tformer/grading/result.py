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

    def _ipython_display_(self) -> None:
        """Nothing: `check` has printed the verdict line ([PASS] name (title): message), which is what a
        terminal, the grader's worker and the tests read. A check cell, whose last value is this Result,
        then shows its verdict once, not a second time as the cell's value. `print(result.message)` shows
        it again."""
