"""How long the `tformer` command takes to answer when it has nothing to do: a usage error and --help.

    python benchmarks/bench_cli_startup.py                                   # this checkout, median of 5
    python benchmarks/bench_cli_startup.py --runs 9 --checkout OLD --checkout .    # before and after, alternating
    python benchmarks/bench_cli_startup.py --skip tformer.grading.classroom.cli    # with one command module left out

Every case is a fresh interpreter (this one's), started in a temporary folder outside every checkout with
PYTHONPATH set to the checkout, as the tests run the command:

    usage error     `python -m tformer class grade` (no CLASS, no --out); in a checkout without the `class`
                    command, `python -m tformer grade --out` (no value), the same mistake before the split
    --help          `python -m tformer --help`
    grade --help    `python -m tformer grade --help`

beside two peers measured in the same rounds: `python -c "import torch"` (what loading torch alone costs on
this machine now) and `python -c pass` (the interpreter's own start). The rounds interleave every case and
every checkout (one run each per round), so that a change in the machine's load falls on every row alike.
Each case's exit status is checked (2 for the usage error, 0 for help): a command that broke is not timed as
fast. Prints the median and the fastest of the runs, each median over the `import torch` peer's, and the load
average before and after.

`--skip MODULE` runs the command with MODULE taken out of `tformer.cli.COMMANDS` (through `python -c`), to
see what the other commands cost while one of them still loads torch; the cases it removes are left out.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TORCH = 'python -c "import torch"'
PEERS = {TORCH: ["-c", "import torch"], "python -c pass": ["-c", "pass"]}
WRAPPER = ("import sys, tformer.cli as cli; cli.COMMANDS[:] = [m for m in cli.COMMANDS if m not in {skip!r}]; "
           "raise SystemExit(cli.main(sys.argv[1:]))")


def label(checkout: Path) -> str:
    """BRANCH COMMIT of the checkout (COMMIT alone when detached), with +changes when its tracked files differ
    from the commit."""
    def git(*args):
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short=7", "HEAD") or checkout.name
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    return (f"{branch} {head}" if branch not in ("", "HEAD") else head) + (
        "+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


class Checkout:
    def __init__(self, path: Path, skip: list[str], cwd: Path):
        self.path, self.skip, self.cwd, self.name = path, skip, cwd, label(path)
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TFORMER_SMALL")}
        self.env["PYTHONPATH"] = str(path)
        commands = self.commands()
        usage = (["class", "grade"] if "class" in commands else ["grade", "--out"] if "grade" in commands
                 else ["doctor", "--no-such-flag"])
        self.cases = {"usage error": (usage, 2), "--help": (["--help"], 0)}
        if "grade" in commands:
            self.cases["grade --help"] = (["grade", "--help"], 0)

    def argv(self, args: list[str]) -> list[str]:
        if self.skip:
            return [sys.executable, "-c", WRAPPER.format(skip=sorted(self.skip)), *args]
        return [sys.executable, "-m", "tformer", *args]

    def typed(self, args: list[str]) -> str:
        return "python -m tformer " + " ".join(args)

    def commands(self) -> set[str]:
        """The subcommands this checkout's `tformer --help` lists (an untimed first run, which also warms the
        file cache)."""
        r = subprocess.run(self.argv(["--help"]), cwd=self.cwd, env=self.env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{self.path}: `tformer --help` exited {r.returncode}: {r.stderr[-2000:]}")
        found = re.search(r"\{([\w,-]+)\}", r.stdout)
        return set(found.group(1).split(",")) if found else set()


def timed(argv: list[str], cwd: Path, env: dict, expect: int | None) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if expect is not None and r.returncode != expect:
        sys.exit(f"`{' '.join(argv)}` exited {r.returncode}, expected {expect}:\n{r.stderr[-2000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each case (the median is shown; default 5)")
    ap.add_argument("--checkout", action="append", type=Path,
                    help="a checkout to measure (repeatable; default: this one)")
    ap.add_argument("--skip", action="append", default=[], metavar="MODULE",
                    help="leave this module out of tformer.cli.COMMANDS (repeatable)")
    args = ap.parse_args(argv)
    paths = [p.resolve() for p in (args.checkout or [ROOT])]
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        cwd = Path(tmp)
        if any(cwd.is_relative_to(p) for p in paths):
            sys.exit("the temporary folder is inside a checkout: set TMPDIR elsewhere")
        checkouts = [Checkout(p, args.skip, cwd) for p in paths]
        peer_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.runs):
            for c in checkouts:
                for case, (cmd, expect) in c.cases.items():
                    times.setdefault((c.name, c.typed(cmd)), []).append(timed(c.argv(cmd), cwd, c.env, expect))
            for peer, cmd in PEERS.items():
                times.setdefault(("peer", peer), []).append(timed([sys.executable, *cmd], cwd, peer_env, 0))
    load1 = os.getloadavg()

    torch_median = statistics.median(times[("peer", TORCH)])
    width = max(len(cmd) for _, cmd in times)
    print(f"{os.cpu_count()} CPUs, load average {load0[0]:.2f} before and {load1[0]:.2f} after; median and fastest "
          f"of {args.runs} runs" + (f"; left out of COMMANDS: {', '.join(args.skip)}" if args.skip else ""))
    print(f"| checkout | command{' ' * (width - 7)} | median s | fastest s | / import torch |")
    print(f"|---|{'-' * (width + 2)}|---:|---:|---:|")
    for (who, cmd), ts in times.items():
        med = statistics.median(ts)
        print(f"| {who} | {cmd:<{width}} | {med:8.3f} | {min(ts):9.3f} | {med / torch_median:14.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
