"""What a chapter's capstone cell shows: a finished run (runs/capstone-NAME), else the committed reference.

    load_result       the run's result.json, else data/capstones/NAME/result.json
    describe, show    the headline, its provenance and the training curves, then what the capstone's own
                      `Capstone.show` adds (translate: the examples and a cross-attention heat map)
    save_reference    a finished run -> data/capstones/NAME/, without the dataset's own text (the
                      capstone's NOT_SHIPPED)
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .base import capstones, local_path
from .runfolder import default_out, reference_dir


def load_result(name: str, folder: str | os.PathLike | None = None) -> tuple[dict | None, str]:
    """(result, where): the run in `folder` (default runs/capstone-NAME) if it finished, else the committed
    reference data/capstones/NAME/result.json, else (None, "none")."""
    run = Path(folder) if folder is not None else default_out(name)
    if (run / "result.json").exists():
        return json.loads((run / "result.json").read_text(encoding="utf-8")), f"run {run}"
    ref = reference_dir(name) / "result.json"
    if ref.exists():
        return json.loads(ref.read_text(encoding="utf-8")), "reference"
    return None, "none"


def public_command(command: str, name: str) -> str:
    """The command as a learner types it: the value of each of capstone `name`'s options that is a path on
    the machine that ran it (`type=local_path`) becomes the option's metavar (`--data DIR`)."""
    for a in capstones()[name].own_options() if name in capstones() else []:
        if a.type is local_path:
            flag = re.escape(a.option_strings[0])
            command = re.sub(rf"({flag})(=|\s+)\S+", lambda m: f"{m[1]}{m[2]}{a.metavar}", command)
    return command


def machine_line(res: dict) -> str:
    """'on a CPU (Intel Xeon ..., 2 cores, 2 threads), torch 2.13.0, 2026-12-02': what made a result."""
    cpu = res.get("cpu_model") or res.get("device_name")
    cores = f"{res['cpu_count']} cores, " if res.get("cpu_count") else ""
    where = res["device_name"] if res.get("device") == "cuda" else cpu
    return (f"on {'a GPU' if res.get('device') == 'cuda' else 'a CPU'} ({where}, {cores}{res['threads']} thread{'s' * (res['threads'] != 1)}), "
            f"torch {res.get('torch', '?').split('+')[0]}, {str(res['date'])[:10]}")


def describe(res: dict, where: str) -> str:
    """One paragraph: the headline, its seeds, the machine and the command that made it."""
    label = (f"your run ({where[4:]})" if where.startswith("run ") else
             f"the committed reference (data/capstones/{res['capstone']}), made with "
             f"`{public_command(res['command'], res['capstone'])}` {machine_line(res)}")
    per = f" per seed {res['per_seed']}" if "per_seed" in res else ""
    return (f"{res['capstone']}: {res['metric']} = {res['value']}{per}; {res['wall_minutes']} wall min, "
            f"{res['cpu_minutes']} CPU min. Source: {label}.")


def show(name: str, folder: str | os.PathLike | None = None, plot: bool = True) -> dict | None:
    """Print what the capstone reached (the learner's run if there is one, else the reference) and plot
    its curves, then what the capstone itself shows (`Capstone.show`); returns the result (None when
    neither exists, after saying how to make one)."""
    if name not in capstones():
        raise ValueError(f"unknown capstone {name!r}; choose one of {', '.join(capstones())}")
    res, where = load_result(name, folder)
    if res is None:
        print(f"no {name} run yet: `tformer capstone {name}` makes one (in runs/capstone-{name})")
        return None
    print(describe(res, where))
    if plot and res.get("curves"):
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3))
        for key, c in res["curves"].items():
            ax.plot(c["step"], c["loss"], label=key)
        ax.set_xlabel("step"), ax.set_ylabel("training loss"), ax.legend(fontsize=7)
        ax.set_title(f"{name}: {where if where == 'reference' else 'your run'}")
        plt.show()
    capstones()[name].show(res, where, plot)
    if where == "reference":
        print(f"the real one on this machine: `tformer capstone {name}` (writes runs/capstone-{name})")
    return res


def save_reference(name: str, run: str | os.PathLike | None = None) -> Path:
    """Copy a finished run's result.json to data/capstones/NAME/ (minus the capstone's NOT_SHIPPED) with a
    report.md of its headline; returns the folder. `python -m tools.capstones reference NAME [RUN]`."""
    from ..training.checkpoint import atomic_write_text
    from .runfolder import reference_dir
    not_shipped = capstones()[name].NOT_SHIPPED
    run = Path(run) if run is not None else default_out(name)
    res = json.loads((run / "result.json").read_text(encoding="utf-8"))
    for key, fields in not_shipped.items():
        items = res.get(key)
        for item in items if isinstance(items, list) else [items] if items else []:
            for f in fields:
                item.pop(f, None)
    out = reference_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "result.json", json.dumps(res, indent=1) + "\n")
    report = (run / "report.md").read_text(encoding="utf-8").split("\n\n")
    # no plots shipped; a capstone that ships less also drops its report's list (the examples, in translate's)
    keep = [p for p in report if not p.startswith("![") and not (not_shipped and p.startswith("- "))]
    atomic_write_text(out / "report.md", "\n\n".join(keep).rstrip() + "\n")
    return out
