"""One run folder for every capstone, built on the Trainer's checkpoints (`tformer.training.checkpoint`).

    DIR/config.json     the capstone's name and recipe (a resume with another recipe is refused)
    DIR/state.json      wall and CPU seconds over all sessions; each finished part's result
    DIR/.lock           `RunLock`: one job at a time
    DIR/PART/           one Trainer folder per part (last.pt, last.prev.pt, log.jsonl): exact resume
    DIR/result.json     the headline ("metric", "value"), config, steps, tokens, minutes, machine, commit
    DIR/report.md       the result in words, with the plots beside it (DIR/*.png)

`run_capstone(name, out)` (base.py) opens one for the capstone `name` and runs it there.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..measure.machine import cpu_model

# torch and the checkpoint module load when a run starts, not on import: `tformer capstone` is in the command's
# parser, which imports no torch
ROOT = Path(__file__).resolve().parents[2]


def default_out(name: str) -> Path:
    """runs/capstone-NAME in the checkout: where the command writes and the chapter looks."""
    return ROOT / "runs" / f"capstone-{name}"


def reference_dir(name: str) -> Path:
    """data/capstones/NAME: the committed reference of a CPU-tier run (result.json, curves as data)."""
    return ROOT / "data" / "capstones" / name


@dataclass
class Options:
    """How this session runs a capstone: the options every capstone takes, and the capstone's own."""
    time_budget: float | None = None     # minutes for the whole capstone; None = the recipe's
    max_steps: int | None = None         # cap every part's steps (a smoke test at a tiny size)
    stop_after: int | None = None        # stop a part after this many steps in this session (tests)
    progress: bool = True
    tiny: bool = False                   # the test size: the smallest model that runs the real code
    threads: int | None = None           # torch CPU threads; None = every core
    recipe: str | None = None            # `--recipe CLASS`: follow that machine class's recipe, not the probe's
    machine_class: str | None = None     # the class whose recipe this run follows (run_capstone decides)
    probe: dict | None = None            # what the probe of this machine measured (tformer.measure.machine)
    own: dict = field(default_factory=dict)   # the capstone's own options given, by dest: {"data": "DIR"}


class Stopped(Exception):
    """A part stopped on purpose (`stop_after`) before its end: the run resumes with the same command."""


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


def machine() -> dict:
    import torch

    from ..utils.device import device as policy_device
    dev = policy_device(capstone=True)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else (platform.processor() or platform.machine())
    return {"device": dev.type, "device_name": name, "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "host": platform.node()}


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, rounded: other jobs on the machine show here."""
    return [round(x, 2) for x in os.getloadavg()]


class CapstoneRun:
    """An open run folder (a context manager that holds its lock). Capstones call `part(key, train)`, then
    `finish`. `command` is the command line that makes (or resumes) the run, for result.json."""

    def __init__(self, name: str, out: str | os.PathLike, config: dict, opts: Options, command: str = ""):
        self.name, self.out, self.config, self.opts = name, Path(out), config, opts
        self.command = command or f"tformer capstone {name}"
        from ..training.checkpoint import RunLock
        self.lock = RunLock(self.out)
        self.state: dict = {"wall_s": 0.0, "cpu_s": 0.0, "sessions": 0, "parts": {}}
        self._t0 = self._c0 = 0.0

    def __enter__(self) -> "CapstoneRun":
        from ..training.checkpoint import atomic_write_text
        if self.out.exists() and not self.out.is_dir():
            from ..utils.errors import UserError
            raise UserError(f"--out {self.out} is a file, not a run folder")
        self.lock.acquire()                                    # RunInUseError: a second job is refused
        try:
            cfg_path = self.out / "config.json"
            want = {"capstone": self.name, "machine_class": self.opts.machine_class, "recipe": self.config}
            if cfg_path.exists():
                have = json.loads(cfg_path.read_text(encoding="utf-8"))
                have.setdefault("machine_class", want["machine_class"])     # a folder from before the classes
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
        self.state.setdefault("load_average_at_start", load_average())     # the first session's start
        self._t0, self._c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        try:
            self.save_state()
        finally:
            self.lock.release()

    # -- time and parts ----------------------------------------------------------------------------------
    def save_state(self) -> None:
        from ..training.checkpoint import atomic_write_text
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

    def parts(self, jobs: dict[str, tuple[Callable[..., dict | None], tuple]], workers: int) -> dict[str, dict]:
        """The results of independent parts {key: (train, args)}, `train(folder, *args)` a module-level
        function (it runs in another process): finished parts from state.json, the others `workers` at a time,
        each in a spawned process of one thread. For small models, where a second thread shares one step's
        small products and gains little, one seed per core finishes sooner than the seeds one after another
        on every core. workers <= 1 trains them here, in order, as `part` does. A part's result does not
        depend on `workers`: a seed trains on one thread either way (at --threads 1, or in its process)."""
        todo = [k for k in jobs if k not in self.state["parts"]]
        if workers <= 1 or not todo:
            return {k: self.part(k, lambda folder, k=k: jobs[k][0](folder, *jobs[k][1])) for k in jobs}
        import concurrent.futures as cf
        import multiprocessing as mp
        import resource
        from ..utils.runtime import set_threads        # each worker: one torch thread, a core to itself
        workers = min(workers, len(todo))
        if self.opts.progress:
            print(f"capstone {self.name}: {', '.join(todo)} side by side, {workers} at a time, one thread each; "
                  f"{len(self.state['parts'])} part(s) done", file=sys.stderr, flush=True)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        stopped = []
        with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=set_threads,
                                    initargs=(1,)) as pool:
            running = {pool.submit(jobs[k][0], self.part_dir(k), *jobs[k][1]): k for k in todo}
            for done in cf.as_completed(running):
                key, res = running[done], done.result()          # a part's error is raised here, as in `part`
                if res is None:
                    stopped.append(key)
                    continue
                self.state["parts"][key] = res
                self.save_state()
                if self.opts.progress:
                    print(f"capstone {self.name}: {key} done", file=sys.stderr, flush=True)
        now = resource.getrusage(resource.RUSAGE_CHILDREN)          # the workers' CPU time, once they have exited
        self.state["cpu_s"] += (now.ru_utime + now.ru_stime) - (children.ru_utime + children.ru_stime)
        if stopped:
            raise Stopped(stopped[0])
        return {k: self.state["parts"][k] for k in jobs}

    def part_budget(self, share: float, default_minutes: float) -> float:
        """Minutes of training for a part that takes `share` of the capstone's budget."""
        total = self.opts.time_budget if self.opts.time_budget is not None else default_minutes
        return total * share

    # -- the end ------------------------------------------------------------------------------------------
    def finish(self, result: dict, report: str, figures: dict[str, Any] | None = None) -> dict:
        """Write result.json (the recipe's fields plus the common ones) and report.md with its plots."""
        from ..training.checkpoint import atomic_write_text
        self.save_state()
        full = {"capstone": self.name, **result, "config": self.config,
                "wall_minutes": round(self.state["wall_s"] / 60, 2), "cpu_minutes": round(self.state["cpu_s"] / 60, 2),
                "sessions": self.state["sessions"], **machine(),
                "load_average_at_start": self.state.get("load_average_at_start"),   # before any training
                "load_average_at_end": load_average(),                              # this run's own load in it
                "machine_class": self.opts.machine_class,
                "probe": self.opts.probe, "git_commit": git_commit(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": self.command}
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
        if self.opts.probe:
            lines += [f"Machine: {self.opts.probe['line']}; recipe `{self.opts.machine_class}`.", ""]
        atomic_write_text(self.out / "report.md", "\n".join(lines))
        return full
