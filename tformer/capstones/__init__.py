"""The capstones: one command per chapter's culminating run, `tformer capstone NAME --out DIR`.

A capstone is one `Capstone` subclass in one module of this folder (base.py says what it holds); the
registry finds it there, so adding one is adding a module (CONTRIBUTING: "Adding a capstone").

    base                the protocol: Capstone (name, chapter, summary, RECIPE, TINY, GPU, its own options,
                        prepare, config, run, show); capstones() (the registry, discovered); run_capstone
    runfolder           CapstoneRun: a run folder (config.json, state.json, one Trainer folder per part, the run
                        lock, wall and CPU minutes over resumes, result.json, report.md); Options
    show                show(NAME, folder): what a chapter's capstone cell prints and plots for a finished run,
                        or the committed reference under data/capstones/NAME when no local run exists
    cli                 `tformer capstone NAME [--out DIR] [--time-budget MIN] [--threads N] [NAME's options]`
    sft_start           chapter 11's SFT start: its recipe, pretraining, SFT data and run, the run folder (the
                        notebooks' and the grpo capstone's)
    vision_training     chapter 12's notebook recipes: train_classifier (ViT), train_clip, predict

and one module per capstone, named for what it trains (translate_multi30k: `translate`, Multi30k de->en;
vit_digits and clip_digits: `vit` and `clip` on scikit-learn's digits; ...): its docstring says what it
does, `tformer capstone --help` lists them all with their chapter.

Every capstone is a list of parts (a seed, a model); each part trains with `tformer.training.Trainer`
into its own subfolder, so a kill resumes exactly where it stopped (atomic last.pt, RNG state, data
position), a finished part is never trained again, and `RunLock` keeps a second job out of the folder.
"""
from .base import Capstone, capstones, run_capstone
from .runfolder import CapstoneRun, Options, default_out, reference_dir
from .show import load_result, show

__all__ = ["CAPSTONES", "Capstone", "CapstoneRun", "Options", "capstones", "default_out", "reference_dir",
           "run_capstone", "load_result", "show"]


def __getattr__(name: str):
    # CAPSTONES (name -> Capstone subclass, in chapter order) imports every capstone, and torch with them: on
    # first use, so that `tformer capstone`'s place in the command's parser imports neither
    if name == "CAPSTONES":
        return capstones()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
