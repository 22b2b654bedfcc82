"""What a chapter's capstone cell shows: a finished run (runs/capstone-NAME), else the committed reference."""
from __future__ import annotations

import json
import os
from pathlib import Path

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


def describe(res: dict, where: str) -> str:
    """One paragraph: the headline, its seeds, the machine and the command that made it."""
    label = (f"your run ({where[4:]})" if where.startswith("run ") else
             f"the committed reference (data/capstones/{res['capstone']}: made with `{res['command']}` at commit "
             f"{res['git_commit']} on {res['device']} ({res['device_name']}, {res['threads']} threads, "
             f"load {res.get('load_average_at_start')}), {res['date']})")
    per = f" per seed {res['per_seed']}" if "per_seed" in res else ""
    return (f"{res['capstone']}: {res['metric']} = {res['value']}{per}; {res['wall_minutes']} wall min, "
            f"{res['cpu_minutes']} CPU min. Source: {label}.")


def show(name: str, folder: str | os.PathLike | None = None, plot: bool = True) -> dict | None:
    """Print what the capstone reached (the learner's run if there is one, else the reference) and plot
    its curves; returns the result (None when neither exists, after saying how to make one)."""
    res, where = load_result(name, folder)
    if res is None:
        print(f"no {name} run yet: `tformer capstone {name}` makes one (in runs/capstone-{name})")
        return None
    print(describe(res, where))
    if name == "moe":
        for k in ("dense_val_loss", "moe_val_loss", "tokens_per_s"):
            print(f"  {k}: {res.get(k)}")
    if plot and res.get("curves"):
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3))
        for key, c in res["curves"].items():
            ax.plot(c["step"], c["loss"], label=key)
        ax.set_xlabel("step"), ax.set_ylabel("training loss"), ax.legend(fontsize=7)
        ax.set_title(f"{name}: {where if where == 'reference' else 'your run'}")
        plt.show()
    if where == "reference":
        print(f"the real one on this machine: `tformer capstone {name}` (writes runs/capstone-{name})")
    return res
