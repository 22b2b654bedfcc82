"""Capstone references: `python -m tools.capstones reference NAME [RUN]` copies a finished CPU-tier run
(default runs/capstone-NAME) to data/capstones/NAME/, without the dataset's own text."""
from __future__ import annotations

import argparse

from tformer.capstones import CAPSTONES
from tformer.capstones.show import save_reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("name", choices=list(CAPSTONES))
    r.add_argument("run", nargs="?")
    args = ap.parse_args()
    print(f"wrote {save_reference(args.name, args.run)}")


if __name__ == "__main__":
    main()
