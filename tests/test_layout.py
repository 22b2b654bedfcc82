"""The repository's map of itself stays true: the module map in tformer/__init__.py names every module (and
each folder's line every module of the folder but a capstone's own), CONTRIBUTING's "How the package is laid out" is that map,
data/ has a README per dataset, and downloads are cached in data/cache/ (ignored by git) by default."""
import importlib
import pkgutil
import subprocess
from pathlib import Path

import tformer
from tformer.data import cache_dir

ROOT = Path(__file__).resolve().parents[1]


def package_map() -> list[str]:
    """The map in tformer/__init__.py's docstring: its indented lines, without the indent."""
    return [line[4:] for line in tformer.__doc__.splitlines() if line.startswith("    ")]


def map_entries() -> dict[str, str]:
    """Each entry of the map (`attention`, `models/`) and its text, continuation lines included."""
    entries, name = {}, None
    for line in package_map():
        if not line.startswith(" "):
            name = line.split()[0]
            entries[name] = ""
        entries[name] += " " + line.strip()
    return entries


def mentions(text: str, name: str) -> bool:
    return any(w in text for w in (f" {name} ", f" {name},", f", {name} ", f"{name}/", f" {name};", f" {name})", f"({name} "))


def own_modules(pkg) -> list[str]:
    """The modules of a folder that its map line and docstring must name: all, except in capstones/ the
    module of each capstone (one module per capstone: the registry finds it, `tformer capstone --help`
    lists it, and adding one touches no shared file), and in grading/exercises/ the module of each chapter."""
    inner = [s.name for s in pkgutil.iter_modules(pkg.__path__) if not s.name.startswith("_")]
    if pkg.__name__ == "tformer.grading.exercises":             # one module per chapter, chNN.py
        inner = [s for s in inner if not (len(s) == 4 and s.startswith("ch") and s[2:].isdigit())]
    if pkg.__name__ == "tformer.capstones":
        inner = [s for s in inner if s not in {c.__module__.rpartition(".")[2] for c in pkg.CAPSTONES.values()}]
    return inner


def test_module_map_names_every_module_and_subpackage():
    names = [m.name for m in pkgutil.iter_modules(tformer.__path__) if not m.name.startswith("_")]
    entries = map_entries()
    listed = [n.rstrip("/") for n in entries]
    assert sorted(listed) == sorted(names), (f"tformer/__init__.py's map lists {sorted(set(listed) - set(names))} "
                                             f"that do not exist and lacks {sorted(set(names) - set(listed))}")
    for m in pkgutil.iter_modules(tformer.__path__):
        if not m.ispkg:
            continue
        pkg = importlib.import_module(f"tformer.{m.name}")
        inner = own_modules(pkg)
        line = entries[f"{m.name}/"] + " "
        unnamed = [s for s in inner if not mentions(line, s)]
        assert not unnamed, f"the {m.name}/ line of tformer/__init__.py's map does not name: {unnamed}"


def test_contributing_shows_the_package_map():
    guide = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = guide.split("## How the package is laid out", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 2)[1].rstrip("\n").splitlines()
    want = "\n".join(package_map())
    assert block == package_map(), ("CONTRIBUTING.md's \"How the package is laid out\" block must be the map of "
                                    f"tformer/__init__.py, without its indent:\n{want}")


def test_the_top_level_is_small_and_every_folder_lists_its_modules():
    top = [m.name for m in pkgutil.iter_modules(tformer.__path__) if not m.name.startswith("_")]
    # what the chapters build (11), the package folders (models, training, inference, measure, data, utils) and
    # the commands learners and teachers type (capstones, translate, serve, grading, doctor, cli)
    assert len(top) <= 24, f"tformer/ has {len(top)} entries at the top; group them into its folders: {top}"
    folders = [f"tformer.{m.name}" for m in pkgutil.iter_modules(tformer.__path__) if m.ispkg]
    while folders:                                            # every folder, its subfolders too (grading/classroom/)
        pkg = importlib.import_module(folders.pop())
        folders += [f"{pkg.__name__}.{s.name}" for s in pkgutil.iter_modules(pkg.__path__) if s.ispkg]
        inner = own_modules(pkg)
        unnamed = [s for s in inner if not any(w in (pkg.__doc__ or "") for w in (f" {s} ", f" {s},", f", {s} ", f"{s}/",
                                                                                  f"{s}.py"))]
        where = pkg.__name__.replace(".", "/")
        assert not unnamed, f"{where}/__init__.py's docstring does not mention: {unnamed}"


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
