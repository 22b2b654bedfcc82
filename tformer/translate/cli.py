"""`tformer translate`: train, score, or translate stdin.

    tformer translate train [--data DIR | --dataset wmt14 --pair en-de] --src de --tgt en \\
                            --preset {tiny,small,small-avx2,gpu,base,big} --out RUN [--time-budget MIN] [--max-steps N]
    tformer translate score --run RUN --src FILE --ref FILE [--beam 4] [--json]
    tformer translate score --hf NAME_OR_DIR --src FILE --ref FILE [--beam 4] [--testset newstest2014]
    tformer translate --run RUN [--beam 4] < sentences.txt

Re-running `train` with the same RUN resumes it (settings that define the model, the data or the
tokenizer cannot change then; the time budget, --max-steps and the evaluation and snapshot cadence
can). One job per RUN at a time. Errors are one line on stderr (exit 2: bad input, 1: the job failed);
--debug or TFORMER_DEBUG=1 shows the traceback. Under `torchrun --nproc-per-node N` the same train
command trains with DistributedDataParallel.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .presets import PRESETS

TESTSETS_WITH_CARDS = ["newstest2014", "newstest2016", "newstest2017", "newstest2018"]   # pipeline.CARD_BLEU's


def add_cli(subparsers) -> None:
    from ..cli import add_debug, nonnegative_float, positive_float, positive_int
    p = subparsers.add_parser("translate", help="train and score a translation Transformer (chapter 10)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run folder to translate stdin with (one sentence a line)")
    p.add_argument("--beam", type=positive_int, default=4, help="beam size (1 = greedy)")
    p.add_argument("--alpha", type=nonnegative_float, default=0.6, help="length penalty")
    add_debug(p)
    p.set_defaults(func=_stdin, action=None)
    sub = p.add_subparsers(dest="action")

    t = sub.add_parser("train", help="train (or resume) a run")
    t.add_argument("--data", help="folder with line-aligned train.<lang> and val.<lang> (Multi30k layout)")
    t.add_argument("--dataset", choices=["wmt14", "multi30k"], help="fetch real data instead of --data")
    t.add_argument("--pair", choices=["en-de", "de-en", "en-fr", "fr-en"],
                   help="with --dataset wmt14: the pair (default en-de); --src/--tgt choose the direction elsewhere")
    t.add_argument("--src", help="source language (default: de with --data, the pair's first, en offline)")
    t.add_argument("--tgt", help="target language")
    t.add_argument("--preset", choices=sorted(PRESETS), help="model and recipe (default: tiny; on resume the run's)")
    t.add_argument("--out", required=True, help="run folder (re-run with the same folder to resume)")
    t.add_argument("--time-budget", type=positive_float, help="minutes of training (may change on resume)")
    t.add_argument("--max-steps", type=positive_int, help="training steps (default: the preset's; may change on resume)")
    t.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: tformer.utils.device: CUDA, else MPS, else CPU)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--threads", type=positive_int, help="CPU threads for torch (1 is fastest on a crowded CPU)")
    t.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a preset field, e.g. --set max_tokens=6000 (repeatable)")
    add_debug(t)
    t.set_defaults(func=_train)

    s = sub.add_parser("score", help="translate FILE and print sacreBLEU with its signature")
    which = s.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="a run folder (tformer translate train --out RUN)")
    which.add_argument("--hf", metavar="NAME_OR_DIR", help="a published Marian model, converted into tformer's "
                       "Transformer: a Hugging Face name (Helsinki-NLP/opus-mt-de-en) or a save_pretrained folder; "
                       "needs the translate extra")
    s.add_argument("--src", required=True, help="source sentences, one a line")
    s.add_argument("--ref", required=True, help="reference translations, aligned")
    s.add_argument("--beam", type=positive_int, default=4, help="beam size (1 = greedy)")
    s.add_argument("--alpha", type=nonnegative_float, default=0.6, help="length penalty")
    s.add_argument("--weights", choices=["auto", "averaged", "last"], help="a run's weights (default: auto)")
    s.add_argument("--testset", choices=TESTSETS_WITH_CARDS, help="with --hf: also print the model card's sacreBLEU "
                   "on this WMT test set (give its sentences as --src and --ref)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--out", help="also write the translations to this file")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    add_debug(s)
    s.set_defaults(func=_score)


def _parse_sets(items: list[str]) -> dict:
    """--set FIELD=VALUE ... -> {field: value of the field's type}; UserError naming the field."""
    from ..utils.errors import UserError
    from .presets import parse_field
    overrides = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise UserError(f"--set {item}: expected FIELD=VALUE, e.g. --set lr=1e-3")
        try:
            overrides[key.strip()] = parse_field(key.strip(), value)
        except ValueError as e:
            raise UserError(str(e)) from None
    return overrides


def _train(args) -> int:
    from .pipeline import train_run
    from ..utils.errors import UserError
    overrides = _parse_sets(args.set)                   # before anything is loaded or written
    if args.pair is not None and args.dataset != "wmt14":
        other = "--data" if args.data else f"--dataset {args.dataset}" if args.dataset else "the built-in corpus"
        raise UserError(f"--pair {args.pair} chooses a WMT14 pair: it goes with --dataset wmt14; with {other} give "
                        f"--src and --tgt")
    max_steps = args.max_steps
    if "max_steps" in overrides:
        if max_steps is not None and max_steps != overrides["max_steps"]:
            raise UserError(f"--max-steps {max_steps} and --set max_steps={overrides['max_steps']} disagree; give one")
        max_steps = overrides.pop("max_steps")
    if args.device is not None:                         # a device this machine lacks: one line, before a folder
        from ..utils.device import resolve
        resolve(args.device)
    if args.threads:
        from ..utils.runtime import set_threads
        set_threads(args.threads)
    res = train_run(args.out, args.preset, data=args.data, dataset=args.dataset, pair=args.pair, src=args.src,
                    tgt=args.tgt, time_budget=args.time_budget, max_steps=max_steps, device=args.device,
                    progress=not args.no_progress, **overrides)
    print(json.dumps({k: v for k, v in res.items() if isinstance(v, (int, float, str))}))
    return 0


def _score(args) -> int:
    from ..utils.errors import UserError
    from .pipeline import score_files
    if args.out:
        out = Path(args.out)
        if out.is_dir() or not out.parent.is_dir():
            raise UserError(f"--out {out}: {'is a folder' if out.is_dir() else 'its folder does not exist'}; "
                            f"give a file path to write the translations to")
    if args.hf is not None:
        if args.weights is not None:
            raise UserError("--weights chooses among a run's weights; it does not go with --hf")
        from .pipeline import score_published
        res = score_published(args.hf, args.src, args.ref, beam=args.beam, alpha=args.alpha, testset=args.testset,
                              progress=not args.no_progress)
    else:
        if args.testset is not None:
            raise UserError("--testset prints a published model's card figure: give it with --hf")
        res = score_files(args.run, args.src, args.ref, beam=args.beam, alpha=args.alpha,
                          weights=args.weights or "auto", progress=not args.no_progress)
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
        if "card_bleu" in res:
            print(f"the model card: sacreBLEU {res['card_bleu']:.1f} on {args.testset} ({res['card_source']}); "
                  f"tformer's beam search is not Marian's decoder: within about 0.5 BLEU is a reproduction")
    return 0


def _stdin(args) -> int:
    from ..utils.errors import UserError
    if args.run is None:
        raise UserError("give a run: tformer translate --run RUN < sentences.txt   (or: tformer translate "
                        "train|score ...; see tformer translate --help)")
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
    from ..inference.decode import translate
    from .pipeline import decode_utf8, load_run
    lines = decode_utf8(raw, "standard input").splitlines()
    model, bpe, _ = load_run(args.run)                  # the run is checked even when the input is empty
    if not lines:
        return 0
    for hyp in translate(model, bpe, lines, beam=args.beam, alpha=args.alpha):
        print(hyp)
    return 0
