"""Where parallel text comes from: a local folder, Multi30k's original files, WMT14 through `datasets`.

Everything ends up in one layout, a folder of line-aligned plain text files `{split}.{lang}` (the
Multi30k layout: train.de / train.en / val.de / ...), which the translation pipeline reads.

    read_parallel("../shared/data/multi30k", "de", "en", "train")   # -> (German lines, English lines)
    multi30k()                      # downloads the raw files once into the cache, returns the folder
    wmt14("en-de")                  # WMT14 through `datasets` (newstest2013 = val, newstest2014 = test)

Offline, `multi30k()` and `wmt14()` raise `DataUnavailableError` at once with what to do instead,
rather than a long series of retries; `load_hub_dataset` does this for every `datasets` loader in tformer.
"""
from __future__ import annotations

import gzip
import os
import socket
import urllib.request
from pathlib import Path

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.gz"
MULTI30K_FILES = [f"{s}.{lang}" for s in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]
WMT14_PAIRS = {"en-de": "de-en", "de-en": "de-en", "en-fr": "fr-en", "fr-en": "fr-en"}  # pair -> hub config


class DataUnavailableError(RuntimeError):
    """Real data could not be fetched (offline, or the source is gone); the message says what to do."""


_CHECKOUT_DATA = Path(__file__).resolve().parents[2] / "data"   # the repository's data/ (see data/README.md)


def cache_dir() -> Path:
    """Where downloads are cached: $TFORMER_CACHE; else data/cache/ of the repository checkout (ignored by
    git) when tformer runs from one; else ~/.cache/tformer (an installed package without the checkout)."""
    if os.environ.get("TFORMER_CACHE"):
        return Path(os.environ["TFORMER_CACHE"])
    if (_CHECKOUT_DATA / "README.md").is_file():
        return _CHECKOUT_DATA / "cache"
    return Path.home() / ".cache" / "tformer"


def read_parallel(folder: str | os.PathLike, src: str, tgt: str, split: str = "train") -> tuple[list[str], list[str]]:
    """Aligned lines of `{split}.{src}` and `{split}.{tgt}` in `folder` (trailing newline stripped)."""
    folder = Path(folder)
    paths = [folder / f"{split}.{lang}" for lang in (src, tgt)]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        have = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else "no such folder"
        raise FileNotFoundError(f"read_parallel: missing {', '.join(missing)} (the folder holds: {have}); expected "
                                f"line-aligned files {split}.{src} and {split}.{tgt}")
    a, b = (p.read_text(encoding="utf-8").rstrip("\n").split("\n") for p in paths)
    if len(a) != len(b):
        raise ValueError(f"read_parallel: {paths[0]} has {len(a)} lines but {paths[1]} has {len(b)}; they must be aligned")
    return a, b


def offline_reason(host: str) -> str | None:
    """Why the network cannot be used (None if it can): an offline switch, or no connection to `host`."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TFORMER_OFFLINE"):
        if os.environ.get(var, "0").lower() not in ("0", "", "false", "no"):
            return f"{var} is set"
    try:
        socket.create_connection((host, 443), timeout=5).close()
    except OSError as e:
        return f"cannot reach {host} ({e.__class__.__name__}: {e})"
    return None


def load_hub_dataset(path: str, *args, hint: str, local: bool = False, **kwargs):
    """`datasets.load_dataset(path, *args, **kwargs)`, failing at once with one clear message.

    Without a connection to the hub it raises `DataUnavailableError` before `datasets` starts retrying,
    unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set: then `datasets` itself reads its cache without
    the network. `local=True` (a builder such as "imagefolder" or "text" on local files) skips the check.
    Any failure becomes a `DataUnavailableError` that ends with `hint`: what to do instead. Unless a
    `cache_dir` is given, `datasets` caches under `cache_dir()/huggingface`.
    """
    if not local:
        reason = offline_reason("huggingface.co")
        hf_offline = any(os.environ.get(v, "0").lower() not in ("0", "", "false", "no")
                         for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        if reason and not hf_offline:
            raise DataUnavailableError(f"cannot load {path} through `datasets`: {reason}. {hint} (If it is "
                                       f"already cached, set HF_HUB_OFFLINE=1 to read the cache offline.)")
    if not local and kwargs.get("cache_dir") is None:
        kwargs["cache_dir"] = str(cache_dir() / "huggingface")    # data/cache/huggingface in a checkout
    try:
        import datasets
        return datasets.load_dataset(path, *args, **kwargs)
    except Exception as e:  # noqa: BLE001  (network, hub or cache errors: report them in one message)
        raise DataUnavailableError(f"could not load {path} through `datasets` ({type(e).__name__}: {e}). "
                                   f"{hint}") from e


def multi30k(folder: str | os.PathLike | None = None) -> Path:
    """The Multi30k task-1 folder (de/en train, val, test_2016_flickr).

    `folder` holding the files is used as is; otherwise the raw files are downloaded once from the
    original source (github.com/multi30k/dataset) into `cache_dir()/multi30k`.
    """
    if folder is not None and all((Path(folder) / n).exists() for n in MULTI30K_FILES):
        return Path(folder)
    out = cache_dir() / "multi30k"
    if all((out / n).exists() for n in MULTI30K_FILES):
        return out
    reason = offline_reason("raw.githubusercontent.com")
    if reason:
        raise DataUnavailableError(
            f"Multi30k is not cached and cannot be downloaded: {reason}. Offline, put the plain-text files "
            f"{', '.join(MULTI30K_FILES)} in a folder and pass it (--data FOLDER), or train on the built-in "
            f"offline corpus (no --data).")
    out.mkdir(parents=True, exist_ok=True)
    for name in MULTI30K_FILES:
        try:
            with urllib.request.urlopen(MULTI30K_URL.format(name=name), timeout=30) as r:
                text = gzip.decompress(r.read()).decode("utf-8")
        except OSError as e:
            raise DataUnavailableError(f"downloading Multi30k {name} failed: {e}") from e
        (out / name).write_text(text, encoding="utf-8")
    return out


def wmt14(pair: str = "en-de", max_train: int | None = None) -> Path:
    """WMT14 EN-DE or EN-FR as a folder of train/val/test files, through `datasets` (cached).

    val = newstest2013, test = newstest2014 (the paper's sets). `max_train` keeps the first N training
    pairs (for a quick look; the paper uses all 4.5M EN-DE / 36M EN-FR).
    """
    if pair not in WMT14_PAIRS:
        raise ValueError(f"wmt14: pair must be one of {sorted(WMT14_PAIRS)}, got {pair!r}")
    config = WMT14_PAIRS[pair]
    out = cache_dir() / (f"wmt14_{config}" + ("" if max_train is None else f"_{max_train}"))
    langs = config.split("-")
    if all((out / f"{s}.{lang}").exists() for s in ("train", "val", "test") for lang in langs):
        return out
    ds = load_hub_dataset("wmt/wmt14", config, hint=(
        f"WMT14 {pair} needs a network connection once (it is then cached under {out}); or copy line-aligned "
        f"train/val/test.{langs[0]}/.{langs[1]} files there; on a CPU without network use --data with your "
        f"own files or the built-in offline corpus."))
    write_translation_split(ds["train"], out, "train", langs, max_train)
    write_translation_split(ds["validation"], out, "val", langs)
    write_translation_split(ds["test"], out, "test", langs)
    return out


def write_translation_split(split, folder: Path, name: str, langs: list[str], limit: int | None = None) -> None:
    """Write a `datasets` split of {"translation": {lang: text}} rows as `{name}.{lang}` files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if limit is not None:
        split = split.select(range(min(limit, len(split))))
    cols = {lang: [] for lang in langs}
    for batch in split.iter(batch_size=10_000):
        for row in batch["translation"]:
            for lang in langs:
                cols[lang].append(row[lang].replace("\n", " ").strip())
    for lang, lines in cols.items():
        tmp = folder / f".{name}.{lang}.tmp"
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, folder / f"{name}.{lang}")
