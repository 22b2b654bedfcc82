"""`tformer capstone NAME [--out DIR] [--time-budget MIN] [--data DIR] [--text FILE] [--threads N]`."""
from __future__ import annotations

import argparse

from ..cli import add_debug, positive_float, positive_int
from .runfolder import CAPSTONES, default_out, run_capstone


def add_cli(sub) -> None:
    p = sub.add_parser("capstone", help="run a chapter's capstone to its result (CPU tier on a CPU, GPU tier on CUDA)",
                       description="Run (or resume) a capstone into a run folder; ends with DIR/result.json and "
                                   "DIR/report.md. Ignores TFORMER_SMALL. Capstones: " +
                                   "; ".join(f"{k} (ch. {c}): {d}" for k, (_, c, d) in CAPSTONES.items()))
    p.add_argument("name", metavar="NAME", help=f"one of {', '.join(CAPSTONES)}")
    p.add_argument("--out", default=None, help="run folder (default runs/capstone-NAME in the checkout)")
    p.add_argument("--time-budget", type=positive_float, default=None, metavar="MIN",
                   help="minutes for the whole capstone (default: the recipe's; more on a slower machine)")
    p.add_argument("--data", default=None, metavar="DIR", help="translate: a folder with the Multi30k files")
    p.add_argument("--text", default=None, metavar="FILE", help="moe: a UTF-8 text file instead of the stdlib corpus")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch CPU threads (default: all cores; 1 is faster on a machine other jobs keep busy)")
    p.add_argument("--max-steps", type=positive_int, default=None, metavar="N",
                   help="stop every part after N steps (a smoke test; the result is not the capstone's)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)    # the tests' size
    add_debug(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..utils.errors import UserError
    if args.name not in CAPSTONES:
        raise UserError(f"unknown capstone {args.name!r}; choose one of {', '.join(CAPSTONES)}")
    res = run_capstone(args.name, args.out or default_out(args.name), time_budget=args.time_budget, data=args.data,
                       text=args.text, max_steps=args.max_steps, threads=args.threads,
                       tiny=args.tiny)
    if res is None:
        return 130
    out = args.out or default_out(args.name)
    print(f"{args.name}: {res['metric']} = {res['value']} after {res['wall_minutes']} wall min "
          f"({res['cpu_minutes']} CPU min) on {res['device']}; {out}/result.json and {out}/report.md")
    return 0
