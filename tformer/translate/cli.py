"""`tformer translate`: train, score, or translate stdin.

    tformer translate train [--data DIR | --dataset wmt14 --pair en-de] --src de --tgt en \\
                            --preset {tiny,small,base,big} --out RUN [--time-budget MIN] [--max-steps N]
    tformer translate score --run RUN --src FILE --ref FILE [--beam 4] [--json]
    tformer translate --run RUN [--beam 4] < sentences.txt

Re-running `train` with the same RUN resumes it. Under `torchrun --nproc-per-node N` the same train
command trains with DistributedDataParallel.
"""
from __future__ import annotations

import argparse
import json
import sys

from .presets import PRESETS


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("translate", help="train and score a translation Transformer (chapter 10)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run folder to translate stdin with (one sentence a line)")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty")
    p.set_defaults(func=_stdin, action=None)
    sub = p.add_subparsers(dest="action")

    t = sub.add_parser("train", help="train (or resume) a run")
    t.add_argument("--data", help="folder with line-aligned train.<lang> and val.<lang> (Multi30k layout)")
    t.add_argument("--dataset", choices=["wmt14", "multi30k"], help="fetch real data instead of --data")
    t.add_argument("--pair", default="en-de", help="WMT14 pair: en-de, de-en, en-fr, fr-en")
    t.add_argument("--src", help="source language (default: de with --data, the pair's first, en offline)")
    t.add_argument("--tgt", help="target language")
    t.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    t.add_argument("--out", required=True, help="run folder (re-run with the same folder to resume)")
    t.add_argument("--time-budget", type=float, help="minutes of training")
    t.add_argument("--max-steps", type=int, help="training steps (default: the preset's)")
    t.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when present)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--threads", type=int, help="CPU threads for torch (1 is fastest on a crowded CPU)")
    t.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a preset field, e.g. --set max_tokens=6000 (repeatable)")
    t.set_defaults(func=_train)

    s = sub.add_parser("score", help="translate FILE and print sacreBLEU with its signature")
    s.add_argument("--run", required=True)
    s.add_argument("--src", required=True, help="source sentences, one a line")
    s.add_argument("--ref", required=True, help="reference translations, aligned")
    s.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    s.add_argument("--alpha", type=float, default=0.6, help="length penalty")
    s.add_argument("--weights", default="auto", choices=["auto", "averaged", "last"])
    s.add_argument("--out", help="also write the translations to this file")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_score)


def _train(args) -> int:
    from ..data import DataUnavailableError
    from .pipeline import train_run
    from .presets import TranslatePreset
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    overrides = {}
    known = TranslatePreset.__dataclass_fields__
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in known:
            print(f"error: --set {item}: unknown preset field {key!r}; fields: {', '.join(known)}", file=sys.stderr)
            return 2
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    try:
        res = train_run(args.out, args.preset, data=args.data, dataset=args.dataset, pair=args.pair, src=args.src,
                        tgt=args.tgt, time_budget=args.time_budget, max_steps=args.max_steps, device=args.device,
                        progress=not args.no_progress, **overrides)
    except DataUnavailableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in res.items() if isinstance(v, (int, float, str))}))
    return 0


def _score(args) -> int:
    from .pipeline import score_files
    res = score_files(args.run, args.src, args.ref, beam=args.beam, alpha=args.alpha, weights=args.weights)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(res["hypotheses"]) + "\n")
    if args.json:
        print(json.dumps({k: v for k, v in res.items() if k != "hypotheses"}))
    else:
        print(f"sacreBLEU {res['bleu']:.2f}  {res['signature']}")
        print(f"  {res['detail']}")
        print(f"tokenized BLEU (paper style, compound splitting) {res['tokenized_bleu']:.2f}")
        print(f"beam {res['beam']}, {res['sentences']} sentences in {res['seconds']:.1f} s, weights: {res['weights']}")
    return 0


def _stdin(args) -> int:
    if args.run is None:
        print("usage: tformer translate --run RUN < sentences.txt   (or: tformer translate train|score ...)",
              file=sys.stderr)
        return 2
    from ..decode import translate
    from .pipeline import load_run
    model, bpe, _ = load_run(args.run)
    lines = [line.rstrip("\n") for line in sys.stdin]
    for hyp in translate(model, bpe, lines, beam=args.beam, alpha=args.alpha):
        print(hyp)
    return 0
