"""The translation capstone end to end: data -> shared BPE -> token batches -> Trainer -> averaging -> BLEU.

A run folder holds everything needed to resume, translate and score:

    RUN/config.json      preset, languages, data folder
    RUN/tokenizer.json   the shared BPE, trained on the run's training data
    RUN/last.pt          full training state (resume point), written atomically
    RUN/snapshot_*.pt    the last weight snapshots; RUN/averaged.pt is their average
    RUN/choice.json      averaged or last weights, whichever validates better (what `score` uses)
    RUN/log.jsonl        loss, lr, tokens/s, validation, minutes

    train_run(out="runs/tiny", preset="tiny")            # built-in offline corpus
    train_run(out="runs/m30k", preset="small", data="../shared/data/multi30k", src="de", tgt="en",
              time_budget=30)
    model, bpe, info = load_run("runs/m30k")
    score_files("runs/m30k", "test_2016_flickr.de", "test_2016_flickr.en", beam=4)
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..data import SharedBPE, TokenBatcher, multi30k, read_parallel, wmt14, write_offline_corpus
from ..decode import translate
from ..metrics import sacrebleu_score, tokenized_bleu
from ..models.transformer import Transformer, TransformerConfig
from ..train import Trainer, TrainConfig, average_checkpoints, label_smoothed_cross_entropy, setup_distributed
from .presets import TranslatePreset, get_preset


class Seq2SeqLoss:
    """loss_fn for the Trainer: label-smoothed cross-entropy summed over target tokens, and their count."""

    def __init__(self, smoothing: float, pad_id: int):
        self.smoothing, self.pad_id = smoothing, pad_id

    def __call__(self, model, batch):
        logits = model(batch.src, batch.tgt_in)                                # (B, T, V)
        loss = label_smoothed_cross_entropy(logits, batch.tgt_out, self.smoothing, self.pad_id, reduction="sum")
        return loss, (batch.tgt_out != self.pad_id).sum()


def build_model(p: TranslatePreset, vocab_size: int, pad_id: int = 0) -> Transformer:
    cfg = TransformerConfig(src_vocab_size=vocab_size, d_model=p.d_model, n_heads=p.n_heads, d_ff=p.d_ff,
                            n_encoder_layers=p.n_layers, n_decoder_layers=p.n_layers, dropout=p.dropout,
                            attn_dropout=p.attn_dropout, ffn_dropout=p.ffn_dropout,
                            norm_first=p.norm_first, max_len=max(p.max_len + 64, 320), pad_id=pad_id)
    return Transformer(cfg)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _resolve_data(out: Path, data, dataset, pair, p: TranslatePreset, rank: int) -> Path:
    if data is not None and dataset not in (None, "multi30k"):
        raise ValueError("give either --data FOLDER or --dataset wmt14, not both")
    if dataset in ("wmt14", "multi30k"):
        def fetch() -> Path:
            return wmt14(pair) if dataset == "wmt14" else multi30k(data)
        if rank == 0:                                   # one process downloads; the others then read the cache
            fetch()
        _barrier()
        return fetch()
    if dataset is not None:
        raise ValueError(f"unknown dataset {dataset!r}; choose wmt14 or multi30k, or pass --data FOLDER")
    if data is not None:
        return Path(data)
    folder = out / "data"
    if rank == 0 and not (folder / "train.en").exists():
        write_offline_corpus(folder, n_train=p.offline_pairs, n_val=300, n_test=300, seed=p.seed)
    return folder


def train_run(out: str | os.PathLike, preset: str = "tiny", *, data: str | os.PathLike | None = None,
              dataset: str | None = None, pair: str = "en-de", src: str | None = None, tgt: str | None = None,
              time_budget: float | None = None, max_steps: int | None = None, device: str | None = None,
              progress: bool = True, stop_after: int | None = None, **overrides) -> dict:
    """Train (or resume) the run in `out`; returns the final log record (loss, lr, tokens/s, val_loss).

    Without `data`/`dataset` it trains on the built-in offline corpus (English -> German unless src/tgt
    say otherwise). `stop_after` stops after that many steps in this call (to show an interruption).
    """
    rank, world, local = setup_distributed()
    out = Path(out)
    cfg_path = out / "config.json"
    if cfg_path.exists():                               # resuming: the run's own settings win
        info = json.loads(cfg_path.read_text())
        p = TranslatePreset.from_dict(info["preset"])
        if max_steps is not None:
            p.max_steps = max_steps
    else:
        p = get_preset(preset, max_steps=max_steps, **overrides)
        if dataset == "wmt14":
            a, b = pair.split("-")
            src, tgt = src or a, tgt or b
        elif data is None and dataset is None:
            src, tgt = src or "en", tgt or "de"
        else:
            src, tgt = src or "de", tgt or "en"
        folder = _resolve_data(out, data, dataset, pair, p, rank)
        info = {"preset_name": preset, "preset": p.to_dict(), "src": src, "tgt": tgt, "data": str(folder)}
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            cfg_path.write_text(json.dumps(info, indent=2))
        _barrier()
    src, tgt, folder = info["src"], info["tgt"], Path(info["data"])
    dev = torch.device(device) if device else (torch.device("cuda", local) if torch.cuda.is_available()
                                               else torch.device("cpu"))
    train_src, train_tgt = read_parallel(folder, src, tgt, "train")
    val_src, val_tgt = read_parallel(folder, src, tgt, "val")
    tok_path = out / "tokenizer.json"
    if rank == 0 and not tok_path.exists():
        t0 = time.perf_counter()
        SharedBPE.train(train_src + train_tgt, p.vocab_size).save(tok_path)
        if progress:
            print(f"trained a shared BPE of {p.vocab_size} tokens in {time.perf_counter() - t0:.1f} s")
    _barrier()
    bpe = SharedBPE.load(tok_path)
    enc = [bpe.encode(x) for x in (train_src, train_tgt, val_src, val_tgt)]
    batches = TokenBatcher(enc[0], enc[1], p.max_tokens // max(p.accum_steps, 1), seed=p.seed, max_len=p.max_len,
                           rank=rank, world=world)
    val_batches = TokenBatcher(enc[2], enc[3], p.max_tokens, shuffle=False, max_len=4 * p.max_len)
    torch.manual_seed(p.seed)                           # same initial weights on every rank and every restart
    model = build_model(p, bpe.vocab_size, bpe.pad_id)
    tc = TrainConfig(max_steps=p.max_steps, time_budget=time_budget, lr=p.lr, warmup=p.warmup, schedule=p.schedule,
                     grad_clip=p.grad_clip, accum_steps=p.accum_steps, eval_every=p.eval_every,
                     save_every=p.save_every, snapshot_every=p.snapshot_every, snapshot_minutes=p.snapshot_minutes,
                     keep_snapshots=max(p.keep_snapshots or 0, p.average_last), seed=p.seed, progress=progress)
    trainer = Trainer(model, Seq2SeqLoss(p.label_smoothing, bpe.pad_id), batches, tc, val_data=val_batches,
                      out_dir=out, device=dev, extra_state={"run": info})
    if progress and rank == 0:
        print(f"{src}->{tgt}: {batches.n_pairs} training pairs in {len(batches)} batches of <= {p.max_tokens} tokens; "
              f"model {model.num_params() / 1e6:.1f}M parameters; "
              + (f"resuming at step {trainer.state.step}" if trainer.state.step else "starting"))
    result = trainer.fit(steps=stop_after)
    finished = trainer.state.step >= p.max_steps or (time_budget is not None
                                                     and trainer.state.elapsed >= time_budget * 60)
    if finished:
        finish_run(out, trainer)
    _barrier()
    return result


def finish_run(out: Path, trainer: Trainer) -> None:
    """Write averaged.pt (the average of the last snapshots, the final weights among them) and choose.

    Averaging helps a converged run (the paper: +0.2-0.5 BLEU) but hurts one stopped early, while its
    weights still move fast; so both are validated and `choice.json` records the one with the lower
    validation loss, which `load_run(weights="auto")` then uses.
    """
    if trainer.rank != 0:
        return
    final = out / f"snapshot_{trainer.state.step:07d}.pt"
    if not final.exists():
        trainer._snapshot()
    p = TranslatePreset.from_dict(trainer.extra_state["run"]["preset"])
    snaps = trainer.snapshots()[-p.average_last:]
    averaged = average_checkpoints(snaps)
    torch.save(averaged, out / "averaged.pt")
    last = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    val_last = trainer.evaluate().get("val_loss")
    trainer.module.load_state_dict(averaged)
    val_avg = trainer.evaluate().get("val_loss")
    trainer.module.load_state_dict(last)
    choice = "averaged" if val_last is None or val_avg <= val_last else "last"
    (out / "choice.json").write_text(json.dumps({"weights": choice, "val_loss_averaged": val_avg,
                                                 "val_loss_last": val_last, "snapshots": [q.name for q in snaps]}))


def load_run(run: str | os.PathLike, weights: str = "auto", device: str | None = None):
    """(model in eval mode, bpe, info) from a run folder. weights: "averaged", "last" or "auto"
    (the one with the lower validation loss at the end of training; "last" while training runs)."""
    run = Path(run)
    if not (run / "config.json").exists():
        raise FileNotFoundError(f"{run} is not a translation run (no config.json); train one with "
                                f"`tformer translate train --out {run}`")
    info = json.loads((run / "config.json").read_text())
    p = TranslatePreset.from_dict(info["preset"])
    bpe = SharedBPE.load(run / "tokenizer.json")
    model = build_model(p, bpe.vocab_size, bpe.pad_id)
    if weights == "auto":                               # what finish_run chose by validation loss
        choice = run / "choice.json"
        weights = json.loads(choice.read_text())["weights"] if choice.exists() else "last"
    path = run / ("averaged.pt" if weights == "averaged" else "last.pt")
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (weights={weights!r})")
    sd = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(sd["model"] if "model" in sd else sd)
    dev = torch.device(device) if device else (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    info["weights"] = weights
    return model.to(dev).eval(), bpe, info


def score_lines(model, bpe, src_lines, ref_lines, *, beam: int = 4, alpha: float = 0.6, max_tokens: int = 4000,
                progress: bool = False) -> dict:
    """Translate and score: sacreBLEU (with signature) and the paper's tokenized BLEU."""
    t0 = time.perf_counter()
    hyps = translate(model, bpe, src_lines, beam=beam, alpha=alpha, max_tokens=max_tokens, progress=progress)
    secs = time.perf_counter() - t0
    sb, tb = sacrebleu_score(hyps, ref_lines), tokenized_bleu(hyps, ref_lines)
    return {"bleu": sb.score, "signature": sb.signature, "detail": sb.detail, "tokenized_bleu": tb.score,
            "beam": beam, "alpha": alpha, "sentences": len(hyps), "seconds": secs, "hypotheses": hyps}


def score_files(run, src_file, ref_file, *, beam: int = 4, alpha: float = 0.6, weights: str = "auto",
                progress: bool = False) -> dict:
    model, bpe, info = load_run(run, weights)
    src_lines = Path(src_file).read_text(encoding="utf-8").rstrip("\n").split("\n")
    ref_lines = Path(ref_file).read_text(encoding="utf-8").rstrip("\n").split("\n")
    res = score_lines(model, bpe, src_lines, ref_lines, beam=beam, alpha=alpha, progress=progress)
    res["weights"] = info["weights"]
    return res
