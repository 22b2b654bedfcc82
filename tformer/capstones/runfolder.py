"""One run folder for every capstone, built on the Trainer's checkpoints (`tformer.training.checkpoint`).

    DIR/config.json     the capstone's name and recipe (a resume with another recipe is refused)
    DIR/state.json      wall and CPU seconds over all sessions; each finished part's result
    DIR/.lock           `RunLock`: one job at a time
    DIR/PART/           one Trainer folder per part (last.pt, last.prev.pt, log.jsonl): exact resume
    DIR/result.json     the headline ("metric", "value"), config, steps, tokens, minutes, machine, commit
    DIR/report.md       the result in words, with the plots beside it (DIR/*.png)

`run_capstone(name, out)` is what `tformer capstone NAME` calls. It ignores TFORMER_SMALL: a capstone is
its CPU tier on a CPU and its GPU tier on CUDA, by definition.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..training.checkpoint import RunLock, atomic_write_text

CAPSTONES = {          # name -> (module, chapter, one line)
    "vit": ("vision", 12, "a ViT from scratch on scikit-learn's digits: test accuracy, mean of 3 seeds"),
    "clip": ("vision", 12, "a CLIP-style aligner on digits (LiT: vit's tower frozen): zero-shot accuracy"),
    "translate": ("translate", 10, "a Transformer on Multi30k de->en in 30 minutes: sacreBLEU beam-4"),
    "moe": ("moe", 13, "dense vs MoE 8x top-2 GPTs on the Python standard library: validation loss"),
    "grpo": ("grpo", 11, "GRPO from an SFT model on verifiable tasks, 3 seeds: held-out exact answers gained"),
}
ROOT = Path(__file__).resolve().parents[2]


def default_out(name: str) -> Path:
    """runs/capstone-NAME in the checkout: where the command writes and the chapter looks."""
    return ROOT / "runs" / f"capstone-{name}"


def reference_dir(name: str) -> Path:
    """data/capstones/NAME: the committed reference of a CPU-tier run (result.json, curves as data)."""
    return ROOT / "data" / "capstones" / name


class Stopped(Exception):
    """A part stopped on purpose (`stop_after`) before its end: the run resumes with the same command."""


@dataclass
class Options:
    time_budget: float | None = None     # minutes for the whole capstone; None = the recipe's
    data: str | None = None              # --data DIR (translate)
    text: str | None = None              # --text FILE (moe)
    max_steps: int | None = None         # cap every part's steps (a smoke test at a tiny size)
    stop_after: int | None = None        # stop a part after this many steps in this session (tests)
    progress: bool = True
    tiny: bool = False                   # the test size: the smallest model that runs the real code
    threads: int | None = None           # torch CPU threads; None = every core


def git_commit() -> str:
    """The checkout's commit, with "+changes" when the working tree differs from it; "unknown" outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+changes" if dirty else "")) if head else "unknown"


def cpu_model() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) Platinum 8488C"), from /proc/cpuinfo on Linux, else platform."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    from ..utils.device import device as policy_device
    dev = policy_device(capstone=True)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else (platform.processor() or platform.machine())
    return {"device": dev.type, "device_name": name, "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


class CapstoneRun:
    """An open run folder (a context manager that holds its lock). Recipes call `part(key, train)`."""

    def __init__(self, name: str, out: str | os.PathLike, config: dict, opts: Options):
        self.name, self.out, self.config, self.opts = name, Path(out), config, opts
        self.lock = RunLock(self.out)
        self.state: dict = {"wall_s": 0.0, "cpu_s": 0.0, "sessions": 0, "parts": {}}
        self._t0 = self._c0 = 0.0

    def __enter__(self) -> "CapstoneRun":
        if self.out.exists() and not self.out.is_dir():
            from ..utils.errors import UserError
            raise UserError(f"--out {self.out} is a file, not a run folder")
        self.lock.acquire()                                    # RunInUseError: a second job is refused
        try:
            cfg_path = self.out / "config.json"
            want = {"capstone": self.name, "recipe": self.config}
            if cfg_path.exists():
                have = json.loads(cfg_path.read_text(encoding="utf-8"))
                if have != json.loads(json.dumps(want)):
                    from ..utils.errors import UserError
                    raise UserError(f"{self.out} holds a {have.get('capstone')} run with another recipe "
                                    f"(config.json differs); train into another --out, or delete the folder")
            else:
                atomic_write_text(cfg_path, json.dumps(want, indent=2))
            if (self.out / "state.json").exists():
                self.state = json.loads((self.out / "state.json").read_text(encoding="utf-8"))
        except BaseException:
            self.lock.release()
            raise
        self.state["sessions"] += 1
        self._t0, self._c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        try:
            self.save_state()
        finally:
            self.lock.release()

    # -- time and parts ----------------------------------------------------------------------------------
    def save_state(self) -> None:
        t, c = time.perf_counter(), time.process_time()
        self.state["wall_s"] += t - self._t0
        self.state["cpu_s"] += c - self._c0
        self._t0, self._c0 = t, c
        atomic_write_text(self.out / "state.json", json.dumps(self.state, indent=1))

    def part_dir(self, key: str) -> Path:
        return self.out / key

    def part(self, key: str, train: Callable[[Path], dict | None], label: str = "") -> dict:
        """The result of part `key`: from state.json when it finished before, else `train(folder)`.
        `train` returns None when it stopped early on purpose (then `Stopped` ends this session)."""
        if key in self.state["parts"]:
            return self.state["parts"][key]
        if self.opts.progress:
            done = len(self.state["parts"])
            print(f"capstone {self.name}: {key}{' (' + label + ')' if label else ''}; {done} part(s) done, "
                  f"{self.state['wall_s'] / 60 + (time.perf_counter() - self._t0) / 60:.1f} min so far",
                  file=sys.stderr, flush=True)
        res = train(self.part_dir(key))
        if res is None:
            raise Stopped(key)
        self.state["parts"][key] = res
        self.save_state()
        return res

    def part_budget(self, share: float, default_minutes: float) -> float:
        """Minutes of training for a part that takes `share` of the capstone's budget."""
        total = self.opts.time_budget if self.opts.time_budget is not None else default_minutes
        return total * share

    def command(self) -> str:
        """The command line that makes (or resumes) this run."""
        o = self.opts
        return " ".join([f"tformer capstone {self.name}"] + [f"{flag} {v}" for flag, v in (
            ("--time-budget", None if o.time_budget is None else f"{o.time_budget:g}"), ("--data", o.data),
            ("--text", o.text), ("--threads", o.threads), ("--max-steps", o.max_steps)) if v is not None])

    # -- the end ------------------------------------------------------------------------------------------
    def finish(self, result: dict, report: str, figures: dict[str, Any] | None = None) -> dict:
        """Write result.json (the recipe's fields plus the common ones) and report.md with its plots."""
        self.save_state()
        full = {"capstone": self.name, **result, "config": self.config,
                "wall_minutes": round(self.state["wall_s"] / 60, 2), "cpu_minutes": round(self.state["cpu_s"] / 60, 2),
                "sessions": self.state["sessions"], **machine(), "git_commit": git_commit(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": self.command()}
        atomic_write_text(self.out / "result.json", json.dumps(full, indent=1))
        lines = [f"# Capstone `{self.name}`", "", report.strip(), ""]
        for fname, fig in (figures or {}).items():
            fig.savefig(self.out / fname, dpi=90, bbox_inches="tight")
            lines += [f"![{fname}]({fname})", ""]
            import matplotlib.pyplot as plt
            plt.close(fig)
        lines += [f"Command: `{full['command']}`; {full['wall_minutes']} wall min, {full['cpu_minutes']} CPU min on "
                  f"{full['device']} ({full['cpu_model']}, {full['cpu_count']} cores, {full['threads']} threads), "
                  f"torch {full['torch']}, {full['date']}.", ""]
        atomic_write_text(self.out / "report.md", "\n".join(lines))
        return full


def run_capstone(name: str, out: str | os.PathLike | None = None, **options) -> dict | None:
    """Run (or resume) capstone `name` in `out`; returns result.json's content, or None when a part
    stopped early on purpose (`stop_after`). Raises RunInUseError when another job holds the folder."""
    if name not in CAPSTONES:
        from ..utils.errors import UserError
        raise UserError(f"unknown capstone {name!r}; choose one of {', '.join(CAPSTONES)}")
    opts = Options(**options)
    if opts.time_budget is not None and not opts.time_budget > 0:
        from ..utils.errors import UserError
        raise UserError(f"--time-budget must be > 0 minutes, got {opts.time_budget}")
    module = importlib.import_module(f"{__package__}.{CAPSTONES[name][0]}")
    recipe = module.prepare(name, opts)                # checks the input before anything is written
    from ..utils.runtime import set_threads
    set_threads(opts.threads)                           # the CPU tier: every core (or --threads), whatever TFORMER_SMALL says
    out = Path(out) if out is not None else default_out(name)
    with CapstoneRun(name, out, recipe.config, opts) as run:
        try:
            return recipe.run(run)
        except Stopped as e:
            if opts.progress:
                print(f"capstone {name}: stopped in part {e}; the same command resumes it", file=sys.stderr)
            return None
