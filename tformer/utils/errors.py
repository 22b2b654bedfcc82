"""The errors every layer may raise, and how the `tformer` command reports them.

A command raises `UserError("what was wrong; what to do")` for bad input: one line on stderr, exit
status 2. A job that started and then failed for a reason the user can act on raises `JobFailed`: one
line, exit status 1. `MissingExtra` is the `UserError` for an optional dependency that is not installed:
it names the extra to install. This module imports nothing from the package, so any module may use it.
"""
from __future__ import annotations

EXIT_USER, EXIT_FAILED = 2, 1

# The optional-dependency groups of pyproject.toml, by the top-level module a command imports.
EXTRAS = {
    "fastapi": "serve", "uvicorn": "serve", "prometheus_client": "serve", "openai": "serve",
    "httpx": "serve", "nbclient": "lab", "nbformat": "lab", "jupytext": "lab", "ipykernel": "lab",
    "transformers": "dev", "sphinx": "book", "myst_nb": "book", "polib": "book",
    "sentencepiece": "translate", "sacremoses": "translate",
}


class UserError(Exception):
    """Bad input from the person at the keyboard: one line on stderr, exit status 2."""
    exit_code = EXIT_USER


class JobFailed(Exception):
    """The job ran and failed for a reason the user can act on: one line on stderr, exit status 1."""
    exit_code = EXIT_FAILED


class MissingExtra(UserError):
    """An optional dependency is missing: names the extra that installs it."""

    def __init__(self, module: str, what: str = "this command", extra: str | None = None):
        top = module.split(".")[0]
        extra = extra or EXTRAS.get(top)            # a command may name its own extra (transformers: translate)
        hint = (f'pip install -e ".[{extra}]" (or `make install`, which installs every extra)' if extra
                else f"pip install {top}")
        super().__init__(f"{what} needs the package {top!r}, which is not installed: {hint}")
        self.module, self.extra = top, extra
