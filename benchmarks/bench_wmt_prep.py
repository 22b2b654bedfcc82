"""WMT14 EN-DE data preparation at full size on this machine: minutes and memory before the first step.

It writes a synthetic parallel corpus of WMT14 EN-DE's size (4.5M pairs) and runs on it the data
preparation that `tformer translate train --dataset wmt14 --preset base` runs, through the pipeline's own
functions (`tformer.translate.pipeline`): read the text, train the shared 37k BPE (`tokenizers`), encode
both sides into packed uint16 arrays and save them in the run folder (what a resumed run reads instead),
filter (max_len) and cut token-based batches (25k padded tokens a side), then iterate the batches as the
Trainer does. It prints each stage's minutes and peak memory, and the
batches per second the loader sustains against what one GPU consumes.

    python benchmarks/bench_wmt_prep.py --pairs 4500000                  # the full size (disk: about 2.5 GB)
    python benchmarks/bench_wmt_prep.py --pairs 100000 --lengths-from ../shared/data/newstest2014/newstest2014.en

The corpus. Words are drawn from a Zipf law (p(rank) ~ 1/(rank + 2.7)) over --types made-up word types a
language (1M by default: English- and German-looking syllables, German ones longer and often capitalised,
a few punctuation types among the most frequent), so the BPE has a real vocabulary to compress. Sentence
lengths in words follow newstest2014's: from --lengths-from FILE (one file for both sides, or two: source
then target) or from the histograms below; the two sides' lengths are coupled (a Gaussian copula, rho 0.95:
Pearson about 0.93, as newstest2014's own pairs). What it is not: real text. Real WMT14 (Europarl, Common
Crawl, News Commentary) has a longer tail of long and noisy lines, which max_len filters.

Time: wall minutes, and CPU minutes of the process (all its threads: `tokenizers` uses both cores), which
say how much of the wall time went to other jobs on a shared machine. Memory: peak resident set size (RSS) of this process during each stage, from a thread sampling
psutil's RSS every 20 ms (`tokenizers`' Rust threads are in the same process); the last line also gives
the kernel's own peak (ru_maxrss), which covers the moments between samples.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

# Word counts (whitespace-separated) of newstest2014's 3,003 sentence pairs, length: number of lines,
# computed from ../shared/data/newstest2014/newstest2014.en and .de (the WMT14 test set, sacreBLEU's copy).
NEWSTEST2014_EN = {
    1: 2, 2: 4, 3: 7, 4: 20, 5: 43, 6: 65, 7: 76, 8: 93, 9: 95, 10: 120, 11: 118, 12: 138, 13: 137, 14: 135,
    15: 130, 16: 138, 17: 117, 18: 111, 19: 116, 20: 116, 21: 102, 22: 96, 23: 92, 24: 100, 25: 74, 26: 71,
    27: 63, 28: 64, 29: 55, 30: 70, 31: 41, 32: 50, 33: 45, 34: 39, 35: 39, 36: 30, 37: 31, 38: 24, 39: 10,
    40: 20, 41: 16, 42: 12, 43: 10, 44: 12, 45: 9, 46: 5, 47: 3, 48: 9, 49: 5, 50: 4, 52: 6, 53: 3, 54: 2,
    56: 1, 57: 1, 58: 3, 60: 1, 61: 1, 63: 1, 65: 1, 68: 1}
NEWSTEST2014_DE = {
    1: 1, 2: 7, 3: 13, 4: 27, 5: 63, 6: 99, 7: 81, 8: 120, 9: 136, 10: 132, 11: 141, 12: 147, 13: 144,
    14: 133, 15: 115, 16: 123, 17: 131, 18: 129, 19: 105, 20: 114, 21: 93, 22: 83, 23: 89, 24: 77, 25: 81,
    26: 72, 27: 55, 28: 49, 29: 57, 30: 45, 31: 36, 32: 35, 33: 36, 34: 33, 35: 22, 36: 26, 37: 31, 38: 13,
    39: 11, 40: 13, 41: 9, 42: 20, 43: 10, 44: 9, 45: 8, 46: 4, 47: 4, 48: 3, 49: 4, 50: 1, 51: 1, 52: 3,
    53: 2, 55: 2, 57: 1, 58: 1, 62: 1, 63: 1, 64: 1}

# What one GPU consumes (benchmarks/RESULTS.md, "GPU": a development run of benchmarks/gpu_check.py on one
# H200, bf16: the encoder-decoder base takes 46.4 ms a training step at B=256 x T=64, i.e. 353k padded
# target tokens/s; transformer-base at length 64 trains at about 390k target tokens/s there).
GPU_TOKENS_PER_S = 390_000
FIRST_RUN = ("read", "bpe", "encode", "save", "batch")      # what a new run does before its first step
H200_STEP_MS, H200_STEP_TOKENS = 46.4, 256 * 64

SYLLABLES = {
    "en": (["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "y", "bl",
            "br", "ch", "cl", "cr", "dr", "fl", "fr", "gr", "pl", "pr", "sh", "sl", "sp", "st", "str", "th", "tr",
            "wh"],
           ["a", "e", "i", "o", "u", "ea", "ee", "ai", "ou", "oo", "y", "io"],
           ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "rt", "ll", "ss", "nt", "ght"]),
    "de": (["", "b", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "w", "z", "sch", "schw",
            "st", "sp", "pf", "kn", "br", "gr", "kr", "tr", "fr", "fl", "gl", "bl", "ch", "v"],
           ["a", "e", "i", "o", "u", "ä", "ö", "ü", "ei", "ie", "au", "eu", "ah", "eh"],
           ["", "", "", "n", "r", "s", "t", "l", "m", "ch", "cht", "ß", "tz", "ng", "rn", "lt", "nd", "ck", "st"]),
}
PUNCTUATION = {"en": [",", ".", '"', "-", ":", "'s", "(", ")", "?", "%"],
               "de": [",", ".", '"', "-", ":", "(", ")", "?", "%", "„"]}


def make_types(lang: str, n: int, seed: int) -> list[str]:
    """n distinct word types, most frequent first: shorter for frequent ranks (Zipf's law of abbreviation)."""
    rng = np.random.default_rng(seed)
    onsets, nuclei, codas = SYLLABLES[lang]
    syllables = [o + v + c for o in onsets for v in nuclei for c in codas]
    slope, caps = (0.2, 0.05) if lang == "en" else (0.25, 0.3)
    punct = dict(zip((1, 2, 5, 9, 14, 30, 31, 60, 90, 120), PUNCTUATION[lang]))
    words: dict[str, None] = {}
    while len(words) < n:
        m = int((n - len(words)) * 1.05) + 10
        ranks = np.arange(len(words), len(words) + m)
        k = np.clip(np.rint(0.4 + slope * np.log(ranks + 1) + rng.normal(0, 0.6, m)), 1, 8).astype(np.int64)
        picks = rng.integers(len(syllables), size=int(k.sum())).tolist()
        upper = (rng.random(m) < caps).tolist()
        ends = np.cumsum(k).tolist()
        start = 0
        for i, end in enumerate(ends):
            rank = len(words)
            if rank in punct:
                words.setdefault(punct[rank])
            w = "".join([syllables[j] for j in picks[start:end]])
            words.setdefault(w.capitalize() if upper[i] else w)
            start = end
            if len(words) >= n:
                break
    return list(words)[:n]


def quantiles(hist: dict[int, int], u: np.ndarray) -> np.ndarray:
    """The lengths at probabilities u of a histogram {length: count}."""
    lengths = np.array(sorted(hist), dtype=np.int64)
    cum = np.cumsum([hist[k] for k in lengths]) / sum(hist.values())
    return lengths[np.minimum(np.searchsorted(cum, u, side="right"), len(lengths) - 1)]


def histogram(path: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        n = len(line.split())
        if n:
            counts[n] = counts.get(n, 0) + 1
    return counts


def sentence_lengths(n: int, hists: tuple[dict, dict], rng: np.random.Generator, rho: float = 0.95):
    """(source, target) word counts of n pairs: each side's marginal is its histogram, coupled by a
    Gaussian copula with correlation rho."""
    from math import erf, sqrt
    ndtr = np.frompyfunc(lambda x: 0.5 * (1 + erf(x / sqrt(2))), 1, 1)
    z = rng.standard_normal(n)
    z2 = rho * z + np.sqrt(1 - rho * rho) * rng.standard_normal(n)
    return (quantiles(hists[0], ndtr(z).astype(np.float64)), quantiles(hists[1], ndtr(z2).astype(np.float64)))


class Side:
    """One language's word types as bytes (each followed by a space) and its Zipf sampler."""

    def __init__(self, lang: str, n_types: int, seed: int, s: float = 1.0, q: float = 2.7):
        words = make_types(lang, n_types, seed)
        raw = [(w + " ").encode() for w in words]
        self.lens = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
        self.starts = np.cumsum(self.lens) - self.lens
        self.buf = np.frombuffer(b"".join(raw), dtype=np.uint8)
        p = 1.0 / (np.arange(n_types) + q) ** s
        self.cdf = np.cumsum(p / p.sum())
        self.counts = np.zeros(n_types, dtype=np.int64)

    def text(self, lengths: np.ndarray, rng: np.random.Generator) -> bytes:
        """Sentences of `lengths` words, one a line, as UTF-8 bytes, without a Python loop over words."""
        w = np.minimum(np.searchsorted(self.cdf, rng.random(int(lengths.sum()))), len(self.cdf) - 1)
        self.counts += np.bincount(w, minlength=len(self.cdf))
        lens = self.lens[w]
        first = np.cumsum(lens) - lens
        out = self.buf[np.repeat(self.starts[w] - first, lens) + np.arange(int(lens.sum()))]
        out[np.cumsum(lens)[np.cumsum(lengths) - 1] - 1] = ord("\n")      # each sentence's last space
        return out.tobytes()


def write_corpus(folder: Path, pairs: int, n_types: int, hists, seed: int, val_pairs: int = 3000,
                 chunk: int = 200_000, progress: bool = True) -> dict:
    from tqdm import tqdm
    folder.mkdir(parents=True, exist_ok=True)
    sides = {"en": Side("en", n_types, seed), "de": Side("de", n_types, seed + 1)}
    rng = np.random.default_rng(seed + 2)
    words = {"en": 0, "de": 0}
    for split, n in (("train", pairs), ("val", val_pairs)):
        files = {lang: open(folder / f"{split}.{lang}", "wb") for lang in sides}
        with tqdm(total=n, desc=f"corpus {split}", unit=" pairs", unit_scale=True, disable=not progress,
                  mininterval=1.0) as bar:
            for start in range(0, n, chunk):
                m = min(chunk, n - start)
                for lang, lengths in zip(("en", "de"), sentence_lengths(m, hists, rng)):
                    files[lang].write(sides[lang].text(lengths, rng))
                    if split == "train":
                        words[lang] += int(lengths.sum())
                bar.update(m)
        for f in files.values():
            f.close()
    return {"words": words, "types_used": {lang: int((s.counts > 0).sum()) for lang, s in sides.items()},
            "bytes": sum((folder / f"train.{lang}").stat().st_size for lang in sides)}


class PeakRSS:
    """The largest resident set size seen while the block runs, sampled every `every` seconds."""

    def __init__(self, every: float = 0.02):
        import psutil
        self.proc, self.every = psutil.Process(), every

    def __enter__(self):
        self.peak, self.stop = self.proc.memory_info().rss, threading.Event()

        def sample():
            while not self.stop.wait(self.every):
                self.peak = max(self.peak, self.proc.memory_info().rss)
        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.cpu0                  # every thread of the process
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4_500_000, help="training sentence pairs (WMT14 EN-DE: 4.5M)")
    ap.add_argument("--types", type=int, default=1_000_000, help="word types a language (Zipf law over them)")
    ap.add_argument("--lengths-from", nargs="+", metavar="FILE", default=None,
                    help="sentence lengths from these files' word counts (one file: both sides; two: source, target); "
                         "default: newstest2014's, carried in this script")
    ap.add_argument("--dir", default=None, help="where to write the corpus and the tokenizer (default: a temporary "
                                                "folder, removed at the end)")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--loader-seconds", type=float, default=30.0, help="how long to iterate the batches")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    import torch
    from tformer.data import read_parallel
    from tformer.translate.pipeline import (data_key, encode_corpus, load_encoded, make_batchers, save_encoded,
                                            train_tokenizer, _load_bpe)
    from tformer.translate.presets import get_preset

    if args.pairs < 1 or args.types < 100:
        ap.error("--pairs must be >= 1 and --types >= 100")
    if args.lengths_from and len(args.lengths_from) > 2:
        ap.error("--lengths-from takes one file (both sides) or two (source, target)")
    hists = ((histogram(args.lengths_from[0]), histogram(args.lengths_from[-1])) if args.lengths_from
             else (NEWSTEST2014_EN, NEWSTEST2014_DE))
    p = get_preset(args.preset)
    progress = not args.no_progress
    tmp = args.dir is None
    folder = Path(tempfile.mkdtemp(prefix="wmt_prep_") if tmp else args.dir)
    rows: list[dict] = []

    def stage(name: str, what: str = ""):
        class _Stage(PeakRSS):
            def __exit__(self, *exc):
                super().__exit__(*exc)
                rows.append({"stage": name, "minutes": self.seconds / 60, "seconds": self.seconds,
                             "cpu_minutes": self.cpu / 60,
                             "peak_rss_gib": self.peak / 2**30, "what": what})
                if progress:
                    print(f"  {name}: {self.seconds:.1f} s, peak RSS {self.peak / 2**30:.2f} GiB", file=sys.stderr)
        return _Stage()

    load0 = os.getloadavg()
    try:
        with stage("corpus", f"{args.pairs:,} pairs, synthetic (not the pipeline)") as st:
            info = write_corpus(folder / "data", args.pairs, args.types, hists, args.seed, progress=progress)
        rows[-1]["what"] += (f"; {info['words']['en'] / args.pairs:.1f} / {info['words']['de'] / args.pairs:.1f} "
                             f"words a line, {info['types_used']['en']:,} / {info['types_used']['de']:,} types used, "
                             f"{info['bytes'] / 1e9:.2f} GB")
        with stage("read", "read_parallel: train + val text"):
            train_src, train_tgt = read_parallel(folder / "data", "en", "de", "train")
            val_src, val_tgt = read_parallel(folder / "data", "en", "de", "val")
        tok = folder / "tokenizer.json"
        with stage("bpe", f"train_tokenizer: shared byte-level BPE, {p.vocab_size:,} tokens"):
            train_tokenizer(tok, train_src, train_tgt, p.vocab_size, progress=progress)
        bpe = _load_bpe(tok)
        with stage("encode", "encode_corpus: 4 sides into PackedIds"):
            enc = [encode_corpus(bpe, lines, progress, f"encode {name}") for name, lines in
                   (("train.en", train_src), ("train.de", train_tgt), ("val.en", val_src), ("val.de", val_tgt))]
            del train_src, train_tgt, val_src, val_tgt
        n_tok = [len(e.ids) for e in enc[:2]]
        rows[-1]["what"] += (f"; {n_tok[0] / args.pairs:.1f} / {n_tok[1] / args.pairs:.1f} tokens a line, "
                             f"{sum(e.nbytes for e in enc) / 2**20:,.0f} MiB ({enc[0].ids.dtype})")
        info_run = {"data": str(folder / "data"), "src": "en", "tgt": "de"}
        with stage("save", "save_encoded: RUN/encoded.npz, for resume"):
            save_encoded(folder / "encoded.npz", enc, data_key(folder, info_run))
        with stage("resume", "load_encoded: what a resumed run reads instead of read + encode"):
            again = load_encoded(folder / "encoded.npz", data_key(folder, info_run))
        assert again is not None and all(np.array_equal(a.ids, b.ids) for a, b in zip(enc, again))
        del again
        with stage("batch", f"make_batchers: filter max_len {p.max_len}, cut <= {p.max_tokens:,} padded tokens"):
            batches, val_batches = make_batchers(p, bpe, enc)
        rows[-1]["what"] += f"; {batches.n_pairs:,} pairs kept in {len(batches):,} batches"
        batches.set_epoch(0)
        n, real, padded = 0, 0, 0
        with stage("loader", "iterate the training batches (collate_packed)") as ld:
            t0 = time.perf_counter()
            for b in batches:
                n += 1
                real += int((b.tgt_out != bpe.pad_id).sum())
                padded += b.tgt_out.numel()
                if time.perf_counter() - t0 > args.loader_seconds:
                    break
        secs = rows[-1]["seconds"]
        per_s, tok_s = n / secs, real / secs
        rows[-1]["what"] += (f"; {n:,} batches, {per_s:,.0f} batches/s, {tok_s / 1e6:.1f}M target tokens/s "
                             f"({real / n:,.0f} a batch, {1 - real / padded:.0%} padding)")
        gpu_batches = GPU_TOKENS_PER_S / (real / n)
        summary = {
            "pairs": args.pairs, "types": args.types, "preset": args.preset, "rows": rows,
            "loader_batches_per_s": per_s, "loader_target_tokens_per_s": tok_s,
            "gpu_target_tokens_per_s": GPU_TOKENS_PER_S, "gpu_batches_per_s": gpu_batches,
            "loader_over_gpu": tok_s / GPU_TOKENS_PER_S,
            "minutes_before_first_step": sum(r["minutes"] for r in rows if r["stage"] in FIRST_RUN),
            "minutes_before_resumed_step": sum(r["minutes"] for r in rows if r["stage"] in ("resume", "batch")),
            "peak_rss_gib": max(r["peak_rss_gib"] for r in rows if r["stage"] != "corpus"),
            "ru_maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "load_before": load0, "load_after": os.getloadavg(), "torch_threads": torch.get_num_threads(),
        }
    finally:
        if tmp:
            shutil.rmtree(folder, ignore_errors=True)

    print(f"\nWMT14-size data preparation, preset {args.preset}: {args.pairs:,} pairs, {args.types:,} word types a "
          f"language, {os.cpu_count()} CPUs, load {load0[0]:.2f} before / {summary['load_after'][0]:.2f} after")
    print(f"| {'stage':<7} | {'minutes':>7} | {'CPU min':>7} | {'peak RSS GiB':>12} | what |")
    print(f"|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 14}|{'-' * 6}|")
    for r in rows:
        print(f"| {r['stage']:<7} | {r['minutes']:>7.2f} | {r['cpu_minutes']:>7.2f} | {r['peak_rss_gib']:>12.2f} | "
              f"{r['what']} |")
    print(f"before the first step ({' + '.join(FIRST_RUN)}): {summary['minutes_before_first_step']:.1f} min, "
          f"peak RSS {summary['peak_rss_gib']:.2f} GiB (kernel's peak for the whole process, corpus writing included: "
          f"{summary['ru_maxrss_gib']:.2f} GiB); a resumed run (resume + batch): "
          f"{summary['minutes_before_resumed_step']:.1f} min")
    print(f"loader: {per_s:,.1f} batches/s = {tok_s:,.0f} target tokens/s on one thread; one GPU consumes about "
          f"{GPU_TOKENS_PER_S:,} target tokens/s (transformer-base at length 64 on an H200; RESULTS.md: "
          f"{H200_STEP_MS} ms a step at B=256 x T=64) = {gpu_batches:.1f} of these batches/s: the loader is "
          f"{summary['loader_over_gpu']:.1f}x what the GPU takes")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
