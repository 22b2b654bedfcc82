"""What a capstone is: one `Capstone` subclass in one module of tformer/capstones/, found by `capstones()`.

    class VitDigits(Capstone):
        name, chapter = "vit", 12                       # `tformer capstone vit`, shown by chapter 12
        summary = "a ViT from scratch on digits: ..."   # its line in `tformer capstone --help`
        RECIPE = {...}                                  # the config: result.json's "config", checked on resume
        TINY = {...}                                    # the tests' overlay: the smallest run of the real code

        def run(self, run):                             # train its parts, then run.finish(...)
            ...

`run_capstone(NAME)` below, which `tformer capstone NAME` (cli.py) calls, then does for every capstone:

    capstone = cls(opts)            # opts: the common options, and the capstone's own (add_arguments)
    capstone.prepare()              # check its own input, find its data: before anything is written
    choose_recipe(opts, out)        # the probe of this machine, and the class whose recipe it follows (--recipe)
    config = capstone.config()      # RECIPE, overlaid by RECIPES[class], GPU on CUDA, TINY in the tests, capped
    capstone.run(CapstoneRun(...))  # in the run folder (runfolder.py), holding its lock: -> result.json's content

and the chapter's cell, `show(NAME)` (show.py), prints the headline and plots the curves that every
result holds, then calls `cls.show(result, where, plot)` for what only this capstone shows.
"""
from __future__ import annotations

import argparse
import copy
import functools
import importlib
import os
import pkgutil
import sys
from pathlib import Path

from .runfolder import CapstoneRun, Options, Stopped, default_out


def local_path(text: str) -> str:
    """The argparse `type` of an option whose value is a path on this machine (`--data DIR`): the value is
    kept as typed, and the command a committed reference shows has the option's metavar in its place."""
    return text


def overlay(base: dict, over: dict) -> dict:
    """Write `over` into `base`, nested dicts key by key (`{"model": {"d_model": 16}}` changes one field of
    the model); returns `base`."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            overlay(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


class Capstone:
    """A chapter's culminating run. Subclass it in a module of tformer/capstones/ and give it a `name`:
    `tformer capstone NAME`, `run_capstone(NAME)` and `show(NAME)` find it there."""

    name: str = ""          # the command's NAME (a class without one is a base for others, not a capstone)
    chapter: int = 0        # the chapter whose cell shows it
    summary: str = ""       # one line: what it trains and its headline metric
    RECIPE: dict = {}       # the config (CPU tier), in result.json and config.json; a change makes references stale
    TINY: dict = {}         # overlay for the tests' size (`--tiny`)
    GPU: dict = {}          # overlay for the GPU tier, applied when the capstone runs on CUDA
    RECIPES: dict = {}      # overlay per machine class (tformer.measure.machine: "cpu-avx2", ...), on RECIPE
    STEPS: tuple[str, ...] = ()   # the config's step counts that --max-steps caps, as dotted keys ("train.max_steps")
    NOT_SHIPPED: dict = {}  # what a committed reference leaves out of result.json: {key: (field, ...)}

    def __init__(self, opts: Options | None = None):
        self.opts = opts or Options()
        self.own = {**self.own_defaults(), **self.opts.own}

    # -- the command line ---------------------------------------------------------------------------------
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add this capstone's own options to its parser (`tformer capstone NAME --data DIR`); they reach it
        as `self.own[dest]`, None when not given. A path on this machine takes `type=local_path`."""

    @classmethod
    def own_options(cls) -> list[argparse.Action]:
        """The options `add_arguments` declares, as argparse actions (dest, option_strings, default, type)."""
        parser = argparse.ArgumentParser(add_help=False)
        cls.add_arguments(parser)
        return parser._actions            # argparse's list of what add_argument added

    @classmethod
    def own_defaults(cls) -> dict:
        """{dest: default} of the capstone's own options: the names `run_capstone(NAME, dest=...)` takes."""
        return {a.dest: a.default for a in cls.own_options()}

    def command(self) -> str:
        """The command line that makes (or resumes) this run, as result.json records it."""
        o = self.opts
        given = [("--time-budget", None if o.time_budget is None else f"{o.time_budget:g}")]
        given += [(a.option_strings[0], self.own.get(a.dest)) for a in self.own_options()]
        given += [("--threads", o.threads), ("--recipe", o.recipe), ("--max-steps", o.max_steps)]
        return " ".join([f"tformer capstone {self.name}"] + [f"{flag} {v}" for flag, v in given if v is not None])

    # -- the run --------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Check the capstone's own options and find its data, before anything is written; bad input raises
        `UserError` (one line: what was wrong, what to do). Default: nothing to check."""

    def config(self) -> dict:
        """The recipe this run follows: a copy of RECIPE, then RECIPES[the run's machine class], GPU on CUDA,
        TINY with `--tiny`, and with `--max-steps N` every STEPS entry capped at N and "max_steps": N recorded
        (for run() to read)."""
        config = copy.deepcopy(self.RECIPE)
        overlay(config, self.RECIPES.get(self.opts.machine_class, {}))
        if self.GPU:
            from ..utils.device import device as policy_device
            if policy_device(capstone=True).type == "cuda":
                overlay(config, self.GPU)
        if self.opts.tiny:
            overlay(config, self.TINY)
        n = self.opts.max_steps
        if n is not None:
            for dotted in self.STEPS:
                *outer, last = dotted.split(".")
                d = functools.reduce(dict.__getitem__, outer, config)
                d[last] = min(d[last], n)
            config["max_steps"] = n
        return config

    def run(self, run: CapstoneRun) -> dict:
        """Train every part through `run.part(key, train)` (a finished part is never trained again), then
        return `run.finish(result, report, figures)`. `run.config` is `config()`. The result holds at least
        "metric" and "value" (the headline), "steps" and "tokens", and "curves": {label: {"step": [...],
        "loss": [...]}} for the chapter's plot, taken from what `Trainer.fit` returns (its "history")."""
        raise NotImplementedError

    # -- the chapter's cell ---------------------------------------------------------------------------------
    @classmethod
    def show(cls, result: dict, where: str, plot: bool = True) -> None:
        """What the chapter's cell shows beyond the headline and the training curves (show.py prints and
        plots those for every capstone). `where` is "reference" or "run FOLDER". Default: nothing more."""


@functools.cache
def capstones() -> dict[str, type[Capstone]]:
    """name -> Capstone subclass, for every one defined in a module of tformer/capstones/, in chapter order.
    Adding a capstone is adding a module: nothing lists them by hand."""
    found = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        module = importlib.import_module(f"{__package__}.{info.name}")
        found += [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Capstone)
                  and c.__module__ == module.__name__ and c.name]
    return {c.name: c for c in sorted(found, key=lambda c: (c.chapter, c.name))}


def choose_recipe(opts: Options, out: Path) -> None:
    """Probe this machine (a second on a CPU) and decide the machine class whose recipe the run follows:
    `--recipe`'s, else the one an earlier session of this run folder recorded (a resumed run keeps its
    recipe, whatever the machine's load today), else the probe's class. Sets opts.machine_class, opts.probe."""
    import json

    from ..measure import machine
    from ..utils.errors import UserError
    if opts.recipe is not None and opts.recipe not in machine.NAMES:
        raise UserError(f"unknown recipe {opts.recipe!r}: expected a machine class, one of {', '.join(machine.NAMES)}")
    probe = machine.probe(seconds=0.05 if opts.tiny else 0.5, n=256 if opts.tiny else None)
    opts.probe = {**probe.as_dict(), "line": probe.line(), "class": machine.classify(probe).name}
    recorded = None
    if (out / "config.json").exists():
        recorded = json.loads((out / "config.json").read_text(encoding="utf-8")).get("machine_class")
    opts.machine_class = opts.recipe or recorded or opts.probe["class"]
    opts.probe["resumed"] = bool(recorded and not opts.recipe)


def run_capstone(name: str, out: str | os.PathLike | None = None, **options) -> dict | None:
    """Run (or resume) capstone `name` in `out` (default runs/capstone-NAME); returns result.json's content,
    or None when a part stopped early on purpose (`stop_after`). `options`: Options' fields and the
    capstone's own (`data="DIR"`). Raises RunInUseError when another job holds the folder. It ignores
    TFORMER_SMALL: a capstone is its CPU tier on a CPU and its GPU tier on CUDA, by definition."""
    from ..utils.errors import UserError
    found = capstones()
    if name not in found:
        raise UserError(f"unknown capstone {name!r}; choose one of {', '.join(found)}")
    cls = found[name]
    own = {k: options.pop(k) for k in list(options) if k in cls.own_defaults()}
    opts = Options(**options, own=own)          # a TypeError names an option neither takes
    if opts.time_budget is not None and not opts.time_budget > 0:
        raise UserError(f"--time-budget must be > 0 minutes, got {opts.time_budget}")
    capstone = cls(opts)
    capstone.prepare()                          # checks the input before anything is written
    from ..utils.runtime import set_threads
    set_threads(opts.threads)                   # the CPU tier: every core (or --threads), whatever TFORMER_SMALL says
    out = Path(out) if out is not None else default_out(name)
    choose_recipe(opts, out)
    config = capstone.config()
    with CapstoneRun(name, out, config, opts, capstone.command()) as run:
        if opts.progress:                       # once the folder is ours: a refused second job says one line
            why = "--recipe" if opts.recipe else f"as recorded in {out}" if opts.probe["resumed"] else "the probe's"
            changes = cls.RECIPES.get(opts.machine_class) or "RECIPE as it stands"
            print(f"capstone {name}: {opts.probe['line']}; recipe {opts.machine_class} ({why}): {changes}",
                  file=sys.stderr, flush=True)
        try:
            return capstone.run(run)
        except Stopped as e:
            if opts.progress:
                print(f"capstone {name}: stopped in part {e}; the same command resumes it", file=sys.stderr)
            return None
