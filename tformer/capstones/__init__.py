"""The capstones: one command per chapter's culminating run, `tformer capstone NAME --out DIR`.

    runfolder  CapstoneRun: a run folder (config.json, state.json, one Trainer folder per part, the run
               lock, wall and CPU minutes over resumes, result.json, report.md)
    vision     the `vit` (digits) and `clip` (digits, LiT on vit's frozen tower) recipes
    translate  the `translate` recipe (Multi30k de->en through `tformer.translate.train_run`)
    moe        the `moe` recipe (dense vs MoE on the Python standard library's source)
    grpo       the `grpo` recipe (chapter 11: GRPO from an SFT model on verifiable tasks, 3 seeds)
    show       show(NAME, folder): what a chapter's capstone cell prints and plots for a finished run, or
               the committed reference under data/capstones/NAME when no local run exists
    cli        `tformer capstone NAME [--out DIR] [--time-budget MIN] [--data DIR] [--text FILE]`

Every capstone is a list of parts (a seed, a model); each part trains with `tformer.training.Trainer`
into its own subfolder, so a kill resumes exactly where it stopped (atomic last.pt, RNG state, data
position), a finished part is never trained again, and `RunLock` keeps a second job out of the folder.
"""
from .runfolder import CAPSTONES, CapstoneRun, default_out, reference_dir, run_capstone
from .show import load_result, show

__all__ = ["CAPSTONES", "CapstoneRun", "default_out", "reference_dir", "run_capstone", "load_result", "show"]
