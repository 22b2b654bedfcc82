"""The translation capstone beside its peer: the same 30 minutes, the same machine, at the same time.

Two processes start together, each on `--threads` CPU threads (1 + 1 on a 2-core machine):
  * ours: `tformer capstone translate --recipe CLASS` (BPE, training, averaging, greedy and beam-4 scoring),
    CLASS the machine class the probe finds (or `--recipe`),
  * the peer: `tformer translate train --preset P --set arch=torch`, P the preset that class's recipe
    trains (small-avx2 on a CPU without bf16 units, small with them): `torch.nn.Transformer` of the
    same size (tformer/translate/peer.py) through the same pipeline, so the data, the BPE, the batches,
    the loss, the schedule and the budget are the same; the model differs, and the precision: ours takes
    the preset's bf16 autocast where the CPU has bf16 matrix units (AMX, AVX512-BF16), the peer trains in
    float32 as a user would write it (`--peer-bf16` gives it the same autocast; bench_translate.py times
    both ways).
Then the peer is scored like ours (test_2016_flickr, greedy and beam 4 at the recipe's length penalty;
test_2017_flickr as well when the data folder has it) and one table compares them: BLEU with the steps and
tokens/s beside, since machines differ. Re-running with the same --out resumes both runs. Not run by CI
(about 35 minutes).

    python benchmarks/translate_vs_peer.py --data ../shared/data/multi30k [--minutes 30] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def _score(run: Path, data: Path, tests: list[str], alpha: float) -> dict:
    from tformer.translate import score_files
    out = {}
    for test in tests:
        for beam in (1, 4):
            s = score_files(run, data / f"{test}.de", data / f"{test}.en", beam=beam, alpha=alpha)
            out[f"{test} beam{beam}"] = round(s["bleu"], 2)
    return out


def _training(run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "loss" in r and "step" in r]
    tps = [r["tokens_per_s"] for r in steps[-20:]]
    return {"steps": steps[-1]["step"], "minutes": round(steps[-1]["minutes"], 2),
            "tokens_per_s": round(sum(tps) / max(len(tps), 1), 1)}


def recipe(out: Path, threads: int, name: str | None, tiny: bool = False) -> tuple[str, dict]:
    """The machine class the capstone in `out` follows and its recipe, decided as the capstone decides them
    (`choose_recipe`: `name`, else the class a resumed run recorded, else the probe's at `threads` threads;
    then `config()`, with the GPU and --tiny overlays): the peer trains that recipe's preset and is scored
    with its length penalty."""
    from tformer.capstones.base import choose_recipe
    from tformer.capstones.runfolder import Options
    from tformer.capstones.translate_multi30k import TranslateMulti30k
    from tformer.utils.runtime import threads as torch_threads
    opts = Options(recipe=name, threads=threads, tiny=tiny)
    with torch_threads(threads):
        choose_recipe(opts, out)
    return opts.machine_class, TranslateMulti30k(opts).config()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="folder with the Multi30k files")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of each of the two processes")
    ap.add_argument("--out", default="runs/translate-vs-peer")
    ap.add_argument("--recipe", default=None, help="the machine class whose recipe both follow (default: the probe's)")
    ap.add_argument("--peer-bf16", action="store_true", help="the peer under bf16 autocast too (same precision)")
    ap.add_argument("--smoke", action="store_true", help="both at the tiny size for a few steps (tests the script)")
    args = ap.parse_args()
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "tformer"]
    common = ["--data", str(data), "--time-budget", f"{args.minutes:g}", "--threads", str(args.threads)]
    machine_class, config = recipe(out / "tformer", args.threads, args.recipe, tiny=args.smoke)
    print(f"recipe {machine_class}: preset {config['preset']} for both, length penalty {config['alpha']:g}",
          flush=True)
    smoke = ["--max-steps", "4"] if args.smoke else []
    ours = subprocess.Popen(py + ["capstone", "translate", "--out", str(out / "tformer"), "--recipe", machine_class,
                                  *(["--tiny"] if args.smoke else []), *common, *smoke],
                            stdout=open(out / "tformer.log", "a"), stderr=subprocess.STDOUT)
    precision = "true" if args.peer_bf16 else "false"
    # nn.Transformer has one dropout for everything: the peer drops attention weights and FFN units at the
    # preset's `dropout` where small-avx2 leaves them (a choice the peer's user does not have)
    peer = subprocess.Popen(py + ["translate", "train", "--preset", config["preset"], *smoke, "--set", "arch=torch",
                                  "--set", f"cpu_bf16={precision}", "--set", "attn_dropout=none",
                                  "--set", "ffn_dropout=none", "--no-progress", "--out", str(out / "torch"), *common],
                            stdout=open(out / "torch.log", "a"), stderr=subprocess.STDOUT)
    print(f"training both for {args.minutes:g} min (logs: {out}/tformer.log, {out}/torch.log) ...", flush=True)
    if peer.wait() or ours.wait():
        sys.exit(f"a run failed: see {out}/tformer.log and {out}/torch.log")
    import tformer.utils.runtime
    tformer.utils.runtime.set_threads(2 * args.threads)
    tests = ["test_2016_flickr"] + (["test_2017_flickr"] if (data / "test_2017_flickr.de").exists() else [])
    res = json.loads((out / "tformer" / "result.json").read_text())
    rows = {"tformer": {**_training(out / "tformer" / "train"), "test_2016_flickr beam1": res["greedy_bleu"],
                        "test_2016_flickr beam4": res["value"]},
            "nn.Transformer": {**_training(out / "torch"), **_score(out / "torch", data, tests, config["alpha"])}}
    if len(tests) > 1:
        rows["tformer"].update(_score(out / "tformer" / "train", data, tests[1:], config["alpha"]))
    (out / "result.json").write_text(json.dumps(rows, indent=1))
    keys = ["steps", "minutes", "tokens_per_s"] + [f"{t} beam{b}" for t in tests for b in (1, 4)]
    print("| model | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(str(r.get(k)) for k in keys) + " |")
    d = rows["tformer"]["test_2016_flickr beam4"] - rows["nn.Transformer"]["test_2016_flickr beam4"]
    print(f"tformer - nn.Transformer, beam 4, test_2016_flickr: {d:+.2f} BLEU")


if __name__ == "__main__":
    main()
