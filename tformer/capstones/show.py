"""What a chapter's capstone cell shows: a finished run (runs/capstone-NAME), else the committed reference.

    load_result       the run's result.json, else data/capstones/NAME/result.json
    describe, show    the headline, its provenance, the curves (and for translate the examples and a
                      cross-attention heat map)
    save_reference    a finished run -> data/capstones/NAME/, without the dataset's own text (NOT_SHIPPED)
"""
from __future__ import annotations

import json
import os
import re
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


def public_command(command: str) -> str:
    """The command as a learner types it: a local data folder becomes DIR."""
    return re.sub(r"(--data|--text)(=|\s+)\S+", r"\1\2DIR", command)


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
             f"`{public_command(res['command'])}` {machine_line(res)}")
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
    if name == "translate":
        show_translations(res, plot)
    if where == "reference":
        print(f"the real one on this machine: `tformer capstone {name}` (writes runs/capstone-{name})")
    return res


# What a committed reference leaves out: Multi30k's sentences are the dataset's, not the course's (the model's
# own translations and the attention weights stay). A local run keeps everything.
NOT_SHIPPED = {"translate": {"examples": ("src", "ref"), "attention": ("src_tokens",)}}


def show_translations(res: dict, plot: bool = True) -> None:
    """The ten test translations (beside their sources and references when the run has them) and the
    cross-attention of the first one, target tokens against source tokens."""
    for i, e in enumerate(res.get("examples", [])):
        print(f"\n[{i}] model:     {e['hyp']}" + (f"\n    source:    {e['src']}\n    reference: {e['ref']}"
                                                   if "src" in e else ""))
    if "src" not in (res.get("examples") or [{}])[0]:
        print("\n(the sources and references are Multi30k's test_2016_flickr lines 1-10, not shipped with the "
              "course; your own run shows them)")
    att = res.get("attention")
    if not (plot and att):
        return
    import matplotlib.pyplot as plt
    w = att["weights"]
    fig, ax = plt.subplots(figsize=(0.35 * len(w[0]) + 2, 0.3 * len(w) + 1.5))
    ax.imshow(w, cmap="Blues", aspect="auto", vmin=0)
    src = att.get("src_tokens") or [str(j) for j in range(len(w[0]))]
    ax.set_xticks(range(len(src)), src, rotation=90, fontsize=8)
    ax.set_yticks(range(len(att["tgt_tokens"])), att["tgt_tokens"], fontsize=8)
    ax.set_xlabel("source token" + ("" if att.get("src_tokens") else " (position)")), ax.set_ylabel("target token (input)")
    ax.set_title("cross-attention, last decoder layer, mean of heads")
    plt.show()


def save_reference(name: str, run: str | os.PathLike | None = None) -> Path:
    """Copy a finished run's result.json to data/capstones/NAME/ (minus NOT_SHIPPED) with a report.md of
    its headline; returns the folder. `python -m tools.capstones reference NAME [RUN]`."""
    from ..training.checkpoint import atomic_write_text
    from .runfolder import reference_dir
    run = Path(run) if run is not None else default_out(name)
    res = json.loads((run / "result.json").read_text(encoding="utf-8"))
    for key, fields in NOT_SHIPPED.get(name, {}).items():
        items = res.get(key)
        for item in items if isinstance(items, list) else [items] if items else []:
            for f in fields:
                item.pop(f, None)
    out = reference_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "result.json", json.dumps(res, indent=1) + "\n")
    report = (run / "report.md").read_text(encoding="utf-8").split("\n\n")
    keep = [p for p in report if not p.startswith("![") and not (name in NOT_SHIPPED and p.startswith("- "))]  # no plots shipped
    atomic_write_text(out / "report.md", "\n\n".join(keep).rstrip() + "\n")
    return out
