"""The repository's map of itself stays true: the module map in tformer/__init__.py names every module,
data/ has a README per dataset, and downloads are cached in data/cache/ (ignored by git) by default."""
import importlib
import pkgutil
import subprocess
from pathlib import Path

import tformer
from tformer.data import cache_dir

ROOT = Path(__file__).resolve().parents[1]


def test_module_map_names_every_module_and_subpackage():
    doc = tformer.__doc__
    names = [m.name for m in pkgutil.iter_modules(tformer.__path__) if not m.name.startswith("_")]
    missing = [n for n in names if f"{n}/" not in doc and f" {n} " not in doc and f" {n}," not in doc
               and f", {n} " not in doc]
    assert not missing, f"tformer/__init__.py's module map does not mention: {missing}"


def test_the_top_level_is_small_and_every_folder_lists_its_modules():
    top = [m.name for m in pkgutil.iter_modules(tformer.__path__) if not m.name.startswith("_")]
    # what the chapters build (8), the package folders (models, training, inference, data, utils) and the
    # commands learners and teachers type (capstones, translate, serve, grading, cli)
    assert len(top) <= 18, f"tformer/ has {len(top)} entries at the top; group them into its folders: {top}"
    for m in pkgutil.iter_modules(tformer.__path__):
        if not m.ispkg or m.name == "grading":
            continue
        pkg = importlib.import_module(f"tformer.{m.name}")
        inner = [s.name for s in pkgutil.iter_modules(pkg.__path__) if not s.name.startswith("_")]
        unnamed = [s for s in inner if not any(w in (pkg.__doc__ or "") for w in (f" {s} ", f" {s},", f", {s} ", f"{s}/"))]
        assert not unnamed, f"tformer/{m.name}/__init__.py's docstring does not mention: {unnamed}"


def test_data_has_a_readme_per_dataset_with_source_license_and_offline_fallback():
    folders = ["multi30k", "wmt14", "digits", "cifar10", "flickr8k", "lm_corpora", "generated"]
    index = (ROOT / "data" / "README.md").read_text()
    for name in folders:
        text = (ROOT / "data" / name / "README.md").read_text()
        assert f"({name}/README.md)" in index, f"data/README.md does not link {name}/"
        for word in ("License", "offline"):
            assert word.lower() in text.lower(), f"data/{name}/README.md says nothing about {word}"


def test_downloads_are_cached_in_data_cache_ignored_by_git(monkeypatch):
    monkeypatch.delenv("TFORMER_CACHE", raising=False)
    assert cache_dir() == ROOT / "data" / "cache"
    ignored = subprocess.run(["git", "check-ignore", "-q", "data/cache/x"], cwd=ROOT)
    assert ignored.returncode == 0, "data/cache/ must be ignored by git"
    monkeypatch.setenv("TFORMER_CACHE", "/tmp/elsewhere")
    assert cache_dir() == Path("/tmp/elsewhere")


def test_progress_bars_are_plain_tqdm():
    # tqdm.auto prints "TqdmWarning: IProgress not found. Please update jupyter and ipywidgets" at the top
    # of a chapter when ipywidgets is missing, and its widget bars ignore TQDM_DISABLE (the site's switch)
    sources = [*(ROOT / "tformer").rglob("*.py"), *(ROOT / "notebooks" / "src").glob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in sources
                 if any(m in p.read_text(encoding="utf-8") for m in ("tqdm.auto", "tqdm.notebook", "tqdm.autonotebook"))]
    assert offenders == [], f"use `from tqdm import tqdm` (text bars), not tqdm.auto, in {offenders}"
