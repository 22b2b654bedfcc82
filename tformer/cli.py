"""The `tformer` command. Each topic module that has a command line adds its subcommand here.

A module listed in COMMANDS defines `add_cli(subparsers)`, which adds a subparser and sets
`func=handler` (handler(args) -> exit code). The module and its add_cli import no torch and nothing heavy: the
handler imports what it needs, so that `tformer --help` and a usage error answer before torch would load.

Errors, the same for every subcommand (`tformer.utils.errors`). A handler raises `UserError("what was wrong;
what to do")` for bad input; `main` prints it as one line on stderr and exits with status 2. A missing
optional dependency is one line naming the extra that installs it. A job that started and then
failed (disk full while saving, ...) exits with status 1. Nobody sees a traceback, unless they ask with
`--debug` (before or after the subcommand) or TFORMER_DEBUG=1, for a bug report. Usage mistakes that
argparse catches (a missing option, `--beam 0`) are one line and status 2 as well.
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import traceback

COMMANDS = [
    "tformer.grading.classroom.cli",   # tformer grade PATH
    "tformer.translate.cli",      # tformer translate ...
    "tformer.doctor",       # tformer doctor [--json]
    "tformer.serve.cli",          # tformer serve, tformer export
    "tformer.capstones.cli",      # tformer capstone NAME
]

from .utils.errors import EXIT_FAILED, EXIT_USER, EXTRAS, JobFailed, MissingExtra, UserError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the subcommand, what was wrong, where help is), exit 2.

    A subcommand whose arguments cost an import to list (`tformer capstone` finds its capstones by importing
    them) gives them with `fill_later(add)`: `add(parser)` runs when that subcommand is parsed or its help or
    usage is shown, so building the whole parser imports no torch."""

    _later = None

    def fill_later(self, add) -> None:
        self._later = add

    def _fill(self) -> None:
        add, self._later = self._later, None
        if add is not None:
            add(self)

    def parse_known_args(self, args=None, namespace=None):
        self._fill()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._fill()
        return super().format_usage()

    def format_help(self) -> str:
        self._fill()
        return super().format_help()

    def error(self, message: str):
        self.exit(EXIT_USER, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_debug(p: argparse.ArgumentParser) -> None:
    """`--debug` on a (sub)parser; SUPPRESS keeps a subparser from resetting the top-level flag."""
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the full traceback on errors (also TFORMER_DEBUG=1)")


# argparse `type=` helpers: the value's type and range in one place, the option named in the error
def _number(kind, lo=None, hi=None, lo_open=False, what=""):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}"
                                             f"{what}, got {text!r}") from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected a finite number{what}, got {text!r}")
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise argparse.ArgumentTypeError(f"expected {'>' if lo_open else '>='} {lo}{what}, got {text}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"expected <= {hi}{what}, got {text}")
        return v
    parse.__name__ = kind.__name__                     # argparse names the type in some messages
    return parse


def positive_int(text: str) -> int:
    return _number(int, lo=1)(text)


def tcp_port(text: str) -> int:
    return _number(int, lo=0, hi=65535, what=" (a TCP port)")(text)


def positive_float(text: str) -> float:
    return _number(float, lo=0, lo_open=True)(text)


def nonnegative_float(text: str) -> float:
    return _number(float, lo=0)(text)


def version_text() -> str:
    """`tformer --version`: the package's version, the commit when run from a git checkout (with `+changes` when
    the working tree differs from it), and the grader's hash (what grades.json records; `tformer class verify`
    and `tformer class merge` refuse another)."""
    import subprocess
    from pathlib import Path
    from . import __version__
    from .grading.classroom.run import grader_hash
    root = Path(__file__).resolve().parents[1]
    commit = ""
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            commit = f" (commit {head}{'+changes' if dirty else ''})" if head else ""
        except (OSError, subprocess.SubprocessError):
            commit = ""
    return f"tformer {__version__}{commit}\ngrader {grader_hash()}"


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="tformer", description="tformer: the course's command line")
    p.add_argument("--version", action=_Version, help="print the version, the commit of a git checkout and the "
                   "grader's hash (grades.json records it), then exit")
    p.add_argument("--debug", action="store_true", default=False,
                   help="show the full traceback on errors (also TFORMER_DEBUG=1)")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(name).add_cli(sub)
    return p


def _debug_wanted(args) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("TFORMER_DEBUG", "0").lower() not in (
        "0", "", "false", "no")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text


def classify(e: BaseException) -> tuple[int, str]:
    """(exit status, message) for an exception that reached `main`."""
    from .training.checkpoint import CheckpointError, CheckpointWriteError, RunInUseError
    from .utils.device import DeviceError
    if isinstance(e, (UserError, JobFailed, DeviceError)):
        return getattr(e, "exit_code", EXIT_USER), _one_line(e)
    if isinstance(e, (CheckpointError, RunInUseError)):          # the run folder given is unusable now
        return EXIT_USER, _one_line(e)
    if isinstance(e, CheckpointWriteError):
        return EXIT_FAILED, _one_line(e)
    if isinstance(e, ModuleNotFoundError) and e.name and e.name.split(".")[0] in EXTRAS:
        return EXIT_USER, str(MissingExtra(e.name))
    if isinstance(e, UnicodeDecodeError):
        return EXIT_USER, f"input is not UTF-8 text ({e.reason} at byte {e.start}); convert it to UTF-8"
    if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        return EXIT_USER, _one_line(e)
    try:
        from .data import DataUnavailableError
    except ImportError:  # pragma: no cover
        DataUnavailableError = ()                                  # noqa: N806
    if isinstance(e, DataUnavailableError):
        return EXIT_USER, _one_line(e)
    if isinstance(e, OSError):                                     # disk full, I/O error: the job failed
        return EXIT_FAILED, _one_line(e)
    return EXIT_FAILED, (f"failed: {type(e).__name__}: {_one_line(e)} (this looks like a bug in tformer: rerun "
                         f"with --debug and report the traceback)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    prog = " ".join(["tformer", args.command] + ([args.action] if getattr(args, "action", None) else []))
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if _debug_wanted(args):
            traceback.print_exc()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        code, message = classify(e)
        if _debug_wanted(args):
            traceback.print_exc()
        print(f"{prog}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
