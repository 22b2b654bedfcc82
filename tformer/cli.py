"""The `tformer` command. Each topic module that has a command line adds its subcommand here.

A module listed in COMMANDS defines `add_cli(subparsers)`, which adds a subparser and sets
`func=handler` (handler(args) -> exit code).
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = [
    "tformer.grading.cli",        # tformer grade PATH
    "tformer.translate.cli",      # tformer translate ...
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tformer", description="tformer: the course's command line")
    sub = p.add_subparsers(dest="command")
    for name in COMMANDS:
        importlib.import_module(name).add_cli(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
