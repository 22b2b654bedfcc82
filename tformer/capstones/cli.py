"""`tformer capstone NAME [--out DIR] [--time-budget MIN] [--threads N] [--recipe CLASS] [--max-steps N] [NAME's own options]`.

One subcommand per capstone, built from the registry (`capstones()`): the options every capstone takes,
then the capstone's own (`Capstone.add_arguments`: translate's `--data DIR`, moe's `--text FILE`).
"""
from __future__ import annotations

import argparse

from ..cli import add_debug, positive_float, positive_int
from ..measure.machine import NAMES


def add_common(p: argparse.ArgumentParser) -> None:
    """The options every capstone takes."""
    p.add_argument("--out", default=None, metavar="DIR", help="run folder (default runs/capstone-NAME in the checkout)")
    p.add_argument("--time-budget", type=positive_float, default=None, metavar="MIN",
                   help="minutes for the whole capstone (default: the recipe's; more on a slower machine)")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch CPU threads (default: all cores; 1 is faster on a machine other jobs keep busy)")
    p.add_argument("--max-steps", type=positive_int, default=None, metavar="N",
                   help="stop every part after N steps (a smoke test; the result is not the capstone's)")
    p.add_argument("--recipe", choices=NAMES, default=None, metavar="CLASS",
                   help="the recipe of this machine class instead of the one the probe of this machine picks "
                        f"(one of {', '.join(NAMES)}; `tformer doctor` shows this machine's)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)    # the tests' size
    add_debug(p)


def add_cli(sub) -> None:
    p = sub.add_parser("capstone", help="run a chapter's capstone to its result (CPU tier on a CPU, GPU tier on CUDA)",
                       description="Run (or resume) a capstone into a run folder; ends with DIR/result.json and "
                                   "DIR/report.md. Ignores TFORMER_SMALL. `tformer capstone NAME --help` lists "
                                   "NAME's options.")
    add_debug(p)
    p.fill_later(add_capstones)       # listing the capstones imports them (and torch): only for `tformer capstone`


def add_capstones(p: argparse.ArgumentParser) -> None:
    """One subcommand per capstone of the registry, with the common options and the capstone's own."""
    from .base import capstones
    names = p.add_subparsers(dest="name", metavar="NAME", required=True, title="capstones")
    for name, cls in capstones().items():
        c = names.add_parser(name, help=f"(ch. {cls.chapter}) {cls.summary}",
                             description=f"Chapter {cls.chapter}'s capstone: {cls.summary}. Ends with "
                                         f"DIR/result.json and DIR/report.md; the same command resumes it.")
        add_common(c)
        cls.add_arguments(c)
        c.set_defaults(func=_run, own=[a.dest for a in cls.own_options()])


def _run(args: argparse.Namespace) -> int:
    from .base import run_capstone
    from .runfolder import default_out
    res = run_capstone(args.name, args.out, time_budget=args.time_budget, max_steps=args.max_steps,
                       threads=args.threads, tiny=args.tiny, recipe=args.recipe,
                       **{d: getattr(args, d) for d in args.own})
    if res is None:
        return 130
    out = args.out or default_out(args.name)
    print(f"{args.name}: {res['metric']} = {res['value']} after {res['wall_minutes']} wall min "
          f"({res['cpu_minutes']} CPU min) on {res['device']}; {out}/result.json and {out}/report.md")
    return 0
