"""BLEU against training minutes for a translation run: score its weight snapshots on a test set.

Each snapshot (RUN/snapshot_*.pt, keep them with `--set keep_snapshots=25` when training) is decoded
greedily; the training minutes come from RUN/log.jsonl. Then the averaged and last weights are scored
with greedy and beam search. Not run by CI.

    python benchmarks/translate_bleu_vs_time.py --run runs/m30k \
        --src ../shared/data/multi30k/test_2016_flickr.de --ref ../shared/data/multi30k/test_2016_flickr.en
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import tformer.utils.runtime
from tformer.translate import load_run, score_lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--points", type=int, default=5, help="snapshots to score (evenly spaced, always the last)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    tformer.utils.runtime.set_threads(args.threads)   # explicit: benchmarks choose their threads (None = every core), not small mode
    run = Path(args.run)
    src = Path(args.src).read_text(encoding="utf-8").rstrip("\n").split("\n")
    ref = Path(args.ref).read_text(encoding="utf-8").rstrip("\n").split("\n")
    log = [json.loads(line) for line in open(run / "log.jsonl")]
    minutes = {r["step"]: r["minutes"] for r in log if "minutes" in r}
    model, bpe, _ = load_run(run, "last")
    snaps = sorted(run.glob("snapshot_*.pt"))
    picked = sorted(set(snaps[:: max(1, len(snaps) // max(args.points - 1, 1))] + snaps[-1:]))
    for path in picked:
        step = int(path.stem.split("_")[1])
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        res = score_lines(model, bpe, src, ref, beam=1)
        near = min(minutes, key=lambda s: abs(s - step))
        print(json.dumps({"step": step, "minutes": round(minutes[near], 1), "greedy_sacrebleu": round(res["bleu"], 2)}))
    for weights in ("averaged", "last"):
        if weights == "averaged" and not (run / "averaged.pt").exists():
            continue
        model, bpe, _ = load_run(run, weights)
        for beam in (1, args.beam):
            res = score_lines(model, bpe, src, ref, beam=beam)
            print(json.dumps({"weights": weights, "beam": beam, "sacrebleu": round(res["bleu"], 2),
                              "tokenized_bleu": round(res["tokenized_bleu"], 2), "signature": res["signature"],
                              "seconds": round(res["seconds"], 1)}))


if __name__ == "__main__":
    main()
