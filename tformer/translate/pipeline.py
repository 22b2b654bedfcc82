"""The translation capstone end to end: data -> shared BPE -> token batches -> Trainer -> averaging -> BLEU.

A run folder holds everything needed to resume, translate and score:

    RUN/config.json      preset, languages, data folder
    RUN/tokenizer.json   the shared BPE, trained on the run's training data
    RUN/encoded.npz      the training and validation data encoded with it (packed uint16 ids; resume reads it)
    RUN/last.pt          full training state (resume point), written atomically
    RUN/last.prev.pt     the full state before it (resume falls back to it if last.pt is unreadable)
    RUN/.lock            held (flock) by the job training into RUN: a second job is refused
    RUN/snapshot_*.pt    the last weight snapshots; RUN/averaged.pt is their average
    RUN/choice.json      averaged or last weights, whichever validates better (what `score` uses)
    RUN/log.jsonl        loss, lr, tokens/s, validation, minutes

    train_run(out="runs/tiny", preset="tiny")            # built-in offline corpus
    train_run(out="runs/m30k", preset="small", data="../shared/data/multi30k", src="de", tgt="en",
              time_budget=30)
    model, bpe, info = load_run("runs/m30k")
    score_files("runs/m30k", "test_2016_flickr.de", "test_2016_flickr.en", beam=4)

A published model (Helsinki-NLP's opus-mt, converted by `Transformer.from_hf_marian`) scores the same way:

    score_published("Helsinki-NLP/opus-mt-de-en", "newstest2014.de", "newstest2014.en", testset="newstest2014")
    card_bleu("Helsinki-NLP/opus-mt-de-en", "newstest2014")         # (34.0, the model card it is from)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..utils.errors import MissingExtra, UserError
from ..data import PackedIds, SharedBPE, TokenBatcher, multi30k, read_parallel, wmt14, write_offline_corpus
from ..data.sources import offline_reason
from ..inference.decode import translate
from ..training.metrics import sacrebleu_score, tokenized_bleu
from ..models.transformer import Transformer, TransformerConfig
from ..training.checkpoint import (CheckpointError, acquire_run_lock, atomic_save, atomic_write_text,
                                   average_checkpoints, load_checkpoint, previous_path)
from ..training.trainer import Trainer, TrainConfig
from ..training.losses import label_smoothed_cross_entropy
from ..training.distributed import setup_distributed
from .presets import RESUMABLE, TranslatePreset, get_preset, validate
from ..utils.device import dtype_name, resolve as resolve_device


class Seq2SeqLoss:
    """loss_fn for the Trainer: label-smoothed cross-entropy summed over target tokens, and their count.

    The course's Transformer computes it with its head fused into the loss (`model(src, tgt_in,
    targets=tgt_out)`, the same value); any other model (the nn.Transformer peer) returns logits and the
    loss is taken on them."""

    def __init__(self, smoothing: float, pad_id: int):
        self.smoothing, self.pad_id = smoothing, pad_id

    def __call__(self, model, batch):
        count = (batch.tgt_out != self.pad_id).sum()
        core = getattr(model, "module", model)                                 # under DistributedDataParallel
        if isinstance(core, Transformer) and core.cfg.pad_id == self.pad_id:
            return model(batch.src, batch.tgt_in, batch.tgt_out, label_smoothing=self.smoothing), count
        logits = model(batch.src, batch.tgt_in)                                # (B, T, V)
        loss = label_smoothed_cross_entropy(logits, batch.tgt_out, self.smoothing, self.pad_id, reduction="sum")
        return loss, count


def build_model(p: TranslatePreset, vocab_size: int, pad_id: int = 0) -> Transformer:
    """The preset's model: the course's Transformer, or (arch "torch") nn.Transformer of the same size."""
    context_length = max(p.max_len + 64, 320)
    if p.arch == "torch":
        from .peer import TorchTransformer
        if p.attn_dropout not in (None, p.dropout) or p.ffn_dropout not in (None, p.dropout):
            raise RunInputError(f"arch=torch: nn.Transformer has one dropout for everything; unset attn_dropout "
                                f"({p.attn_dropout}) and ffn_dropout ({p.ffn_dropout}): --set attn_dropout=none "
                                f"--set ffn_dropout=none")
        return TorchTransformer(vocab_size, p.d_model, p.n_heads, p.n_layers, p.d_ff, p.dropout, context_length,
                                pad_id, p.norm_first)
    cfg = TransformerConfig(src_vocab_size=vocab_size, d_model=p.d_model, n_heads=p.n_heads, d_ff=p.d_ff,
                            n_encoder_layers=p.n_layers, n_decoder_layers=p.n_layers, dropout=p.dropout,
                            attn_dropout=p.attn_dropout, ffn_dropout=p.ffn_dropout,
                            norm_first=p.norm_first, context_length=context_length, pad_id=pad_id)
    return Transformer(cfg)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _resolve_data(out: Path, data, dataset, pair, p: TranslatePreset, rank: int) -> Path:
    if data is not None and dataset not in (None, "multi30k"):
        raise RunInputError("give either --data FOLDER or --dataset wmt14, not both")
    if dataset in ("wmt14", "multi30k"):
        def fetch() -> Path:
            return wmt14(pair) if dataset == "wmt14" else multi30k(data)
        if rank == 0:                                   # one process downloads; the others then read the cache
            fetch()
        _barrier()
        return fetch()
    if dataset is not None:
        raise RunInputError(f"unknown dataset {dataset!r}; choose wmt14 or multi30k, or pass --data FOLDER")
    if data is not None:
        return Path(data)
    folder = out / "data"
    if rank == 0 and not (folder / "train.en").exists():
        write_offline_corpus(folder, n_train=p.offline_pairs, n_val=300, n_test=300, seed=p.seed)
    return folder


class RunInputError(UserError, ValueError):
    """Bad input to a run (data, settings, files to score): the message says what and what to do.
    A ValueError for Python callers; the `tformer` command prints it as one line and exits with 2."""


class RunMismatchError(RunInputError):
    """A resumed run was given a setting that defines its model, data or tokenizer, and it differs."""


def _check_data(folder: Path, src: str, tgt: str) -> None:
    """The training and validation files exist and are aligned: checked before anything is written."""
    if not folder.is_dir():
        raise FileNotFoundError(f"data folder {folder} does not exist; give --data a folder with line-aligned "
                                f"train.{src}, train.{tgt}, val.{src}, val.{tgt} (the Multi30k layout)")
    for split in ("train", "val"):
        try:
            a, b = read_parallel(folder, src, tgt, split)
        except (ValueError, UnicodeDecodeError) as e:
            raise RunInputError(str(e) if isinstance(e, ValueError) and not isinstance(e, UnicodeDecodeError)
                                else f"{folder}/{split}.{src} or .{tgt} is not UTF-8 text; convert it") from None
        if not any(x.strip() for x in a):
            raise RunInputError(f"{folder / f'{split}.{src}'} is empty: nothing to train on")


def _resume_changes(out: Path, info: dict, preset, data, dataset, pair, src, tgt, given: dict) -> dict:
    """Preset fields `given` to a resumed run: refuse those that differ and define the model, data or
    tokenizer; return the others ({field: (old, new)}) to apply and log."""
    def refuse(what: str, old, new, hint: str = "") -> None:
        raise RunMismatchError(f"{out} was started with {what}={old}, this call gives {what}={new}; {hint or 'it defines the model, the data or the tokenizer, so it cannot change on resume'}: "
                               f"leave it out to resume, or train into another --out")
    if preset is not None and preset != info.get("preset_name"):
        refuse("--preset", info.get("preset_name"), preset)
    for flag, new, old in (("--src", src, info["src"]), ("--tgt", tgt, info["tgt"])):
        if new is not None and new != old:
            refuse(flag, old, new)
    if data is not None and Path(data).resolve() != Path(info["data"]).resolve():
        refuse("--data", info["data"], data)
    if dataset is not None and "dataset" in info and dataset != info["dataset"]:
        refuse("--dataset", info["dataset"], dataset)
    if pair is not None and info.get("dataset") == "wmt14" and pair != info.get("pair", pair):
        refuse("--pair", info.get("pair"), pair)
    run_p = info["preset"]
    changes = {}
    for key, new in given.items():
        old = run_p.get(key)
        if new == old:
            continue
        if key not in RESUMABLE:
            refuse(f"{key}", old, new)
        changes[key] = (old, new)
    return changes


def train_run(out: str | os.PathLike, preset: str | None = None, *, data: str | os.PathLike | None = None,
              dataset: str | None = None, pair: str | None = None, src: str | None = None, tgt: str | None = None,
              time_budget: float | None = None, max_steps: int | None = None, device: str | None = None,
              progress: bool = True, stop_after: int | None = None, **overrides) -> dict:
    """Train (or resume) the run in `out`; returns the final log record (loss, lr, tokens/s, val_loss), the
    training precision ("precision": "float32", or the autocast dtype) and "history", every record of the
    run, the steps before a resume included (`Trainer.fit`).

    Without `data`/`dataset` it trains on the built-in offline corpus (English -> German unless src/tgt
    say otherwise); `preset` defaults to "tiny" for a new run and to the run's own on resume, and `pair`
    (WMT14's, with dataset="wmt14") to "en-de" and to the run's own.
    `stop_after` stops after that many steps in this call (to show an interruption).

    On resume, a setting that defines the model, the data or the tokenizer and differs from the run's
    raises `RunMismatchError`; the time budget, max_steps and the evaluation/snapshot cadence may change
    (logged in log.jsonl). One job at a time: `RunInUseError` if another holds the run's lock.
    """
    if time_budget is not None and not time_budget > 0:
        raise RunInputError(f"time_budget must be > 0 minutes, got {time_budget}")
    if max_steps is not None and max_steps < 1:
        raise RunInputError(f"max_steps must be >= 1, got {max_steps}")
    rank, world, local = setup_distributed(device)          # backend from the run's device (gloo for cpu)
    out = Path(out)
    cfg_path = out / "config.json"
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file, not a run folder")
    given = overrides if max_steps is None else {**overrides, "max_steps": max_steps}   # preset fields; None is a value
    lock = None
    try:
        if cfg_path.exists():                           # resuming: the run's own settings win
            lock = acquire_run_lock(out)
            info = read_info(out)
            changes = _resume_changes(out, info, preset, data, dataset, pair, src, tgt, given)
            p = TranslatePreset.from_dict(info["preset"])
            for key, (_, new) in changes.items():
                setattr(p, key, new)
            try:
                validate(p)
            except ValueError as e:
                raise RunInputError(str(e)) from None
            if changes and rank == 0:
                info["preset"] = p.to_dict()
                atomic_write_text(cfg_path, json.dumps(info, indent=2))
        else:
            changes = {}
            preset, pair = preset or "tiny", pair or "en-de"
            try:
                p = get_preset(preset, **given)
            except ValueError as e:
                raise RunInputError(str(e)) from None
            if dataset == "wmt14":
                a, b = pair.split("-")
                src, tgt = src or a, tgt or b
            elif data is None and dataset is None:
                src, tgt = src or "en", tgt or "de"
            else:
                src, tgt = src or "de", tgt or "en"
            if src == tgt:
                raise RunInputError(f"source and target language are both {src!r}; give different --src and --tgt")
            if data is not None and dataset is None:
                _check_data(Path(data), src, tgt)       # before anything is written into the run folder
            fresh = not out.exists()
            if rank == 0:
                out.mkdir(parents=True, exist_ok=True)
            lock = acquire_run_lock(out)
            try:
                folder = _resolve_data(out, data, dataset, pair, p, rank)
                _check_data(folder, src, tgt)
            except BaseException:                       # e.g. offline --dataset wmt14: leave no half-made run
                if fresh and rank == 0:
                    lock.release()
                    shutil.rmtree(out, ignore_errors=True)
                raise
            info = {"preset_name": preset, "preset": p.to_dict(), "src": src, "tgt": tgt, "data": str(folder),
                    "dataset": dataset, "pair": pair}
            if rank == 0:
                atomic_write_text(cfg_path, json.dumps(info, indent=2))
            _barrier()
        return _train(out, p, info, changes, time_budget, device, progress, stop_after, rank, world, local)
    finally:
        if lock is not None:
            lock.release()


def read_info(run: Path) -> dict:
    """RUN/config.json; CheckpointError if it is unreadable."""
    try:
        info = json.loads((run / "config.json").read_text(encoding="utf-8"))
        TranslatePreset.from_dict(info["preset"])
        return info
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{run / 'config.json'} is unreadable ({type(e).__name__}: {e}); the run cannot "
                              f"be used") from e


def _load_bpe(path: Path) -> SharedBPE:
    if not path.exists():
        raise CheckpointError(f"{path} is missing: the run has no tokenizer (was its training interrupted "
                              f"before it began?); train it again with the same command")
    try:
        return SharedBPE.load(path)
    except Exception as e:
        raise CheckpointError(f"{path} is unreadable (truncated or corrupt: {str(e).splitlines()[0][:100]})") from e


def train_tokenizer(path: Path, train_src: list[str], train_tgt: list[str], vocab_size: int,
                    progress: bool = False) -> None:
    """Learn the run's shared BPE from both sides of the training data and save it to `path`."""
    t0 = time.perf_counter()
    texts = train_src + train_tgt
    SharedBPE.train(texts, vocab_size, length=len(texts), progress=progress).save(path)
    if progress:
        print(f"trained a shared BPE of {vocab_size} tokens in {time.perf_counter() - t0:.1f} s")


def encode_corpus(bpe: SharedBPE, lines: list[str], progress: bool = False, desc: str = "encode") -> PackedIds:
    """Sentences -> `PackedIds` (uint16 for a vocabulary up to 65,536), in chunks; a progress bar when
    `progress` and the corpus is large (WMT14 EN-DE: 4.5M lines a side)."""
    return bpe.encode_packed(lines, progress=progress and len(lines) >= ENCODE_BAR_LINES, desc=desc)


ENCODE_BAR_LINES = 200_000          # a progress bar for encoding from this many lines on


def make_batchers(p: TranslatePreset, bpe: SharedBPE, enc: list[PackedIds], rank: int = 0,
                  world: int = 1) -> tuple[TokenBatcher, TokenBatcher]:
    """The training batches (max_tokens / accum_steps padded tokens a side, pairs longer than max_len
    dropped, this rank's share) and the validation batches (in length order, up to 4 x max_len)."""
    batches = TokenBatcher(enc[0], enc[1], p.max_tokens // max(p.accum_steps, 1), seed=p.seed, max_len=p.max_len,
                           rank=rank, world=world, pad_id=bpe.pad_id, bos_id=bpe.bos_id, eos_id=bpe.eos_id)
    val_batches = TokenBatcher(enc[2], enc[3], p.max_tokens, shuffle=False, max_len=4 * p.max_len,
                               pad_id=bpe.pad_id, bos_id=bpe.bos_id, eos_id=bpe.eos_id)
    return batches, val_batches


ENCODED = "encoded.npz"             # RUN/encoded.npz: the encoded training and validation data (resume reads it)


def data_key(out: Path, info: dict) -> dict:
    """What the encoded data depends on: the tokenizer file's hash and each data file's size and mtime."""
    import hashlib
    folder, files = Path(info["data"]), {}
    for split in ("train", "val"):
        for lang in (info["src"], info["tgt"]):
            path = folder / f"{split}.{lang}"
            st = path.stat() if path.exists() else None
            files[f"{split}.{lang}"] = [st.st_size, st.st_mtime_ns] if st else None
    tok = out / "tokenizer.json"
    return {"tokenizer": hashlib.sha256(tok.read_bytes()).hexdigest() if tok.exists() else None,
            "data": str(folder.resolve()), "files": files}


def save_encoded(path: Path, enc: list[PackedIds], key: dict) -> None:
    """The four encoded sides (train src/tgt, val src/tgt) and `key` in one .npz, written atomically.
    The file only saves time: when it cannot be written (a full disk), a warning says so and the run goes on."""
    arrays = {f"{k}{i}": a for i, e in enumerate(enc) for k, a in (("ids", e.ids), ("offsets", e.offsets))}
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, key=np.array(json.dumps(key, sort_keys=True)), **arrays)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        print(f"warning: could not save {path} ({e.strerror or e}); a resumed run will encode the data again",
              file=sys.stderr)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_encoded(path: Path, key: dict) -> list[PackedIds] | None:
    """The encoded sides saved by `save_encoded`, or None if the file is missing, unreadable, or was made
    from another tokenizer or other data files (`key`)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if json.loads(str(z["key"])) != json.loads(json.dumps(key, sort_keys=True)):
                return None
            return [PackedIds(z[f"ids{i}"], z[f"offsets{i}"]) for i in range(4)]
    except (OSError, ValueError, KeyError, EOFError) as e:
        if path.exists():
            print(f"warning: {path} is unreadable ({type(e).__name__}); encoding the data again", file=sys.stderr)
        return None


def prepare_data(out: Path, p: TranslatePreset, info: dict, rank: int = 0, world: int = 1,
                 progress: bool = False) -> tuple[SharedBPE, TokenBatcher, TokenBatcher]:
    """Everything before the first step: read the training and validation text, train the BPE (once per
    run: RUN/tokenizer.json), encode both sides into `PackedIds`, form the token batches. The text is
    dropped once encoded; only the packed ids stay (about 2 bytes a token). The encoded data is kept in
    RUN/encoded.npz, so a resumed run skips reading and encoding while the tokenizer and the data files
    are unchanged."""
    src, tgt, folder = info["src"], info["tgt"], Path(info["data"])
    tok_path, cache = out / "tokenizer.json", out / ENCODED
    if rank == 0:
        cache.with_name(f".{cache.name}.tmp").unlink(missing_ok=True)     # left by a job killed while saving
    enc = load_encoded(cache, data_key(out, info)) if tok_path.exists() else None
    if enc is None:
        train_src, train_tgt = read_parallel(folder, src, tgt, "train")
        val_src, val_tgt = read_parallel(folder, src, tgt, "val")
        if rank == 0 and not tok_path.exists():
            train_tokenizer(tok_path, train_src, train_tgt, p.vocab_size, progress)
        _barrier()
        bpe = _load_bpe(tok_path)
        show = progress and rank == 0
        enc = [encode_corpus(bpe, lines, show, f"encode {name}") for name, lines in
               (("train." + src, train_src), ("train." + tgt, train_tgt), ("val." + src, val_src),
                ("val." + tgt, val_tgt))]
        del train_src, train_tgt, val_src, val_tgt
        if rank == 0:
            save_encoded(cache, enc, data_key(out, info))
    else:
        bpe = _load_bpe(tok_path)
    return (bpe, *make_batchers(p, bpe, enc, rank, world))


def _train(out: Path, p: TranslatePreset, info: dict, changes: dict, time_budget, device, progress, stop_after,
           rank: int, world: int, local: int) -> dict:
    src, tgt = info["src"], info["tgt"]
    dev = resolve_device(device or None, local_rank=local)     # tformer.utils.device: the policy
    bpe, batches, val_batches = prepare_data(out, p, info, rank, world, progress)
    torch.manual_seed(p.seed)                           # same initial weights on every rank and every restart
    model = build_model(p, bpe.vocab_size, bpe.pad_id)
    tc = TrainConfig(max_steps=p.max_steps, time_budget=time_budget, lr=p.lr, warmup=p.warmup, schedule=p.schedule,
                     grad_clip=p.grad_clip, accum_steps=p.accum_steps, eval_every=p.eval_every,
                     save_every=p.save_every, snapshot_every=p.snapshot_every, snapshot_minutes=p.snapshot_minutes,
                     keep_snapshots=max(p.keep_snapshots or 0, p.average_last), seed=p.seed, progress=progress,
                     cpu_bf16=p.cpu_bf16)
    trainer = Trainer(model, Seq2SeqLoss(p.label_smoothing, bpe.pad_id), batches, tc, val_data=val_batches,
                      out_dir=out, device=dev, extra_state={"run": info})
    if trainer.state.step and rank == 0:
        note = {"resume": trainer.state.step, "from": trainer.resumed_from.name if trainer.resumed_from else None,
                "time_budget": time_budget, "changed": {k: list(v) for k, v in changes.items()}}
        with open(out / "log.jsonl", "a") as f:
            f.write(json.dumps(note) + "\n")
        if changes or time_budget is not None:
            said = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items())
            print(f"resuming {out} at step {trainer.state.step}" + (f"; changed: {said}" if said else "")
                  + (f"; time budget {time_budget} min" if time_budget is not None else ""), file=sys.stderr)
    if progress and rank == 0:
        print(f"{src}->{tgt}: {batches.n_pairs} training pairs in {len(batches)} batches of <= {p.max_tokens} tokens; "
              f"model {model.num_params() / 1e6:.1f}M parameters, training in {dtype_name(trainer.amp_dtype)} "
              f"on {dev.type}; "
              + (f"resuming at step {trainer.state.step}" if trainer.state.step else "starting"))
    result = {**trainer.fit(steps=stop_after), "precision": dtype_name(trainer.amp_dtype)}
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
    atomic_save(averaged, out / "averaged.pt")
    last = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    val_last = trainer.evaluate().get("val_loss")
    trainer.module.load_state_dict(averaged)
    val_avg = trainer.evaluate().get("val_loss")
    trainer.module.load_state_dict(last)
    choice = "averaged" if val_last is None or val_avg <= val_last else "last"
    atomic_write_text(out / "choice.json", json.dumps({"weights": choice, "val_loss_averaged": val_avg,
                                                 "val_loss_last": val_last, "snapshots": [q.name for q in snaps]}))


def _weight_files(run: Path, weights: str) -> list[Path]:
    """Files to take weights from, best first: the asked-for one, then the other finished weights, the
    previous full checkpoint and the snapshots, newest first (the fall-backs when a file is unreadable)."""
    first = run / ("averaged.pt" if weights == "averaged" else "last.pt")
    rest = [run / "last.pt", run / "averaged.pt", previous_path(run / "last.pt"),
            *sorted(run.glob("snapshot_*.pt"), reverse=True)]
    return [first] + [p for p in rest if p != first]


def load_run(run: str | os.PathLike, weights: str = "auto", device: str | None = None):
    """(model in eval mode, bpe, info) from a run folder. weights: "averaged", "last" or "auto"
    (the one with the lower validation loss at the end of training; "last" while training runs).

    A weights file that cannot be read (truncated, corrupt) is named in a warning on stderr and the next
    good one is used: the other finished weights, the previous full checkpoint, then the newest snapshot;
    info["weights"] says which. CheckpointError when none is readable.
    """
    run = Path(run)
    if weights not in ("auto", "averaged", "last"):
        raise RunInputError(f"weights must be auto, averaged or last, got {weights!r}")
    if not run.is_dir():
        raise FileNotFoundError(f"run folder {run} does not exist; train one with `tformer translate train --out {run}`")
    if not (run / "config.json").exists():
        raise FileNotFoundError(f"{run} is not a translation run (no config.json); train one with "
                                f"`tformer translate train --out {run}`")
    info = read_info(run)
    p = TranslatePreset.from_dict(info["preset"])
    bpe = _load_bpe(run / "tokenizer.json")
    model = build_model(p, bpe.vocab_size, bpe.pad_id)
    if weights == "auto":                               # what finish_run chose by validation loss
        choice = run / "choice.json"
        try:
            weights = json.loads(choice.read_text())["weights"] if choice.exists() else "last"
        except (ValueError, KeyError):
            print(f"warning: {choice} is unreadable; using the last weights", file=sys.stderr)
            weights = "last"
    problems, used = [], None
    for path in _weight_files(run, weights):
        if not path.exists():
            continue
        try:
            sd = load_checkpoint(path, weights_only=False)
            model.load_state_dict(sd["model"] if isinstance(sd, dict) and "model" in sd else sd)
        except (CheckpointError, RuntimeError, TypeError, AttributeError) as e:
            why = (str(e).split(" is unreadable (", 1)[-1].rstrip(")") if isinstance(e, CheckpointError)
                   else f"does not fit the run's model: {str(e).splitlines()[0][:100]}")
            problems.append((path.name, why))
            continue
        used = path
        break
    if used is None:
        if not problems:
            raise FileNotFoundError(f"{run} has no weights yet (no last.pt, averaged.pt or snapshots); train it "
                                    f"with `tformer translate train --out {run}`")
        names = [n for n, _ in problems]
        raise CheckpointError(f"no readable weights in {run}: {', '.join(names)} "
                              f"{'is' if len(names) == 1 else 'are'} unreadable ({problems[0][1]}); "
                              f"train the run again, or restore the files")
    if problems:
        print(f"warning: {run}/{problems[0][0]} is unreadable ({problems[0][1]}); using {used.name} instead",
              file=sys.stderr)
        weights = used.name
    dev = resolve_device(device or None)                       # tformer.utils.device: the policy
    info["weights"] = weights
    return model.to(dev).eval(), bpe, info


def decode_utf8(raw: bytes, what: str, path: str | os.PathLike = "FILE") -> str:
    """`raw` as UTF-8 text, or a RunInputError naming `what`, the first bad byte and its line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise RunInputError(f"{what} is not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line}); convert it, "
                            f"e.g. `iconv -f latin1 -t utf-8 {path}`") from None


def read_lines(path: str | os.PathLike, what: str = "file") -> list[str]:
    """The lines of a UTF-8 text file (one sentence a line; a final newline does not add a line).

    Clear errors for what people really pass: a missing file, a folder, a file that is not UTF-8, an
    empty one.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a folder; give a text file, one sentence a line")
    text = decode_utf8(path.read_bytes(), f"{what} {path}", path)
    if text.endswith("\n"):
        text = text[:-1]
    if not text.strip():
        raise RunInputError(f"{what} {path} is empty: nothing to translate")
    return text.replace("\r\n", "\n").split("\n")


def score_lines(model, bpe, src_lines, ref_lines, *, beam: int = 4, alpha: float = 0.6, max_tokens: int = 4000,
                progress: bool = False, lang: str = "de") -> dict:
    """Translate and score: sacreBLEU (with signature) and the paper's tokenized BLEU (`lang`: the target
    language, for its Moses tokenizer)."""
    t0 = time.perf_counter()
    hyps = translate(model, bpe, src_lines, beam=beam, alpha=alpha, max_tokens=max_tokens, progress=progress)
    secs = time.perf_counter() - t0
    sb, tb = sacrebleu_score(hyps, ref_lines), tokenized_bleu(hyps, ref_lines, lang=lang)
    return {"bleu": sb.score, "signature": sb.signature, "detail": sb.detail, "tokenized_bleu": tb.score,
            "beam": beam, "alpha": alpha, "sentences": len(hyps), "seconds": secs, "hypotheses": hyps}


def read_aligned(src_file, ref_file, beam: int = 1) -> tuple[list[str], list[str]]:
    """The source and reference lines of `score`, read and checked (UTF-8, not empty, the same number of
    lines, beam >= 1) before anything is loaded."""
    if beam < 1:
        raise RunInputError(f"beam must be >= 1 (1 = greedy), got {beam}")
    src_lines = read_lines(src_file, "--src")
    ref_lines = read_lines(ref_file, "--ref")
    if len(src_lines) != len(ref_lines):
        raise RunInputError(f"--src {src_file} has {len(src_lines)} lines but --ref {ref_file} has {len(ref_lines)}; "
                            f"they must be line-aligned (one reference per source sentence)")
    return src_lines, ref_lines


def score_files(run, src_file, ref_file, *, beam: int = 4, alpha: float = 0.6, weights: str = "auto",
                progress: bool = False) -> dict:
    """Translate `src_file` with the run's weights and score against `ref_file`. The files are read and
    checked (UTF-8, not empty, the same number of lines) before the model is loaded."""
    src_lines, ref_lines = read_aligned(src_file, ref_file, beam)
    model, bpe, info = load_run(run, weights)
    res = score_lines(model, bpe, src_lines, ref_lines, beam=beam, alpha=alpha, progress=progress, lang=info["tgt"])
    res["weights"] = info["weights"]
    return res


# -- published models (`tformer translate score --hf`) --------------------------------------------------
# Helsinki-NLP's opus-mt models are Marian Transformers of the paper's base shape (6+6 layers, d=512).
# `load_published` loads one through `transformers` (the model and its real MarianTokenizer: two
# SentencePiece models over one vocabulary, and the Moses punctuation normaliser), converts the model into
# the course's own Transformer (`Transformer.from_hf_marian`) and wraps the tokenizer in the interface
# above (`MarianTokens`), so that tformer's beam search translates it and `score_lines` scores it. tformer's
# beam search (GNMT length penalty 0.6) is not Marian's decoder: within about 0.5 BLEU of the card's figure
# counts as a reproduction.

# The model cards' sacreBLEU figures (the "Benchmarks" table of each card on the Hugging Face hub; the
# weights and the scores of release opus-2020-02-26 in both directions, whose scores file is
# https://object.pouta.csc.fi/OPUS-MT-models/<pair>/opus-2020-02-26.eval.txt). The card names the test set
# with its WMT pair: newstest2014-deen.de.en, newstest2016-ende.de.en, ...
CARD_SOURCE = {
    "opus-mt-de-en": "huggingface.co/Helsinki-NLP/opus-mt-de-en, model card, Benchmarks (release opus-2020-02-26)",
    "opus-mt-en-de": "huggingface.co/Helsinki-NLP/opus-mt-en-de, model card, Benchmarks (release opus-2020-02-26)",
}
CARD_BLEU: dict[tuple[str, str], float] = {
    ("opus-mt-de-en", "newstest2014"): 34.0,
    ("opus-mt-de-en", "newstest2016"): 40.4,
    ("opus-mt-de-en", "newstest2017"): 35.7,
    ("opus-mt-de-en", "newstest2018"): 43.7,
    ("opus-mt-en-de", "newstest2016"): 37.0,
    ("opus-mt-en-de", "newstest2018"): 45.2,
}
TESTSETS = sorted({t for _, t in CARD_BLEU})


def card_bleu(name: str, testset: str) -> tuple[float, str]:
    """(the model card's sacreBLEU, where it is from) for a published model (a hub name or a folder named as
    the model, e.g. opus-mt-de-en) on a WMT test set; UserError naming what the table holds otherwise."""
    model = Path(name.rstrip("/\\")).name
    if (model, testset) not in CARD_BLEU:
        held = ", ".join(f"{m} on {t}" for m, t in sorted(CARD_BLEU))
        raise UserError(f"--testset {testset}: no model card figure for {model!r} on it (tformer's table holds "
                        f"{held}); leave --testset out to score without one")
    return CARD_BLEU[(model, testset)], CARD_SOURCE[model]


class MarianTokens:
    """A `MarianTokenizer` in the translation pipeline's tokenizer interface (`SharedBPE`'s): `pad_id`,
    `bos_id` (the decoder's start token, which for Marian is the pad id), `eos_id`, `vocab_size`,
    `encode(lines)` (ids without </s>: the pipeline appends it) and `decode(rows)` (up to </s>)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.pad_id = int(tokenizer.pad_token_id)
        self.bos_id = self.pad_id
        self.eos_id = int(tokenizer.eos_token_id)
        self.vocab_size = len(tokenizer)

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self.tok(list(lines), add_special_tokens=False)["input_ids"]]

    def decode(self, rows: list[list[int]]) -> list[str]:
        cut = [row[:row.index(self.eos_id)] if self.eos_id in row else row for row in rows]
        return self.tok.batch_decode(cut, skip_special_tokens=True)


def _target_language(name: str, tokenizer) -> str:
    """The target language, for the Moses tokenizer of the paper's metric: the tokenizer's, else the name's
    (opus-mt-de-en -> en), else de (what tensor2tensor's script uses)."""
    lang = getattr(tokenizer, "target_lang", None)
    m = re.search(r"opus-mt-([a-z]+)-([a-z]+)$", Path(name.rstrip("/\\")).name)
    return lang or (m.group(2) if m else "de")


def load_published(name: str, device: str | None = None):
    """(model, tokens, info) for a Hugging Face Marian model: a hub name (downloaded once into Hugging
    Face's cache) or a folder written by `save_pretrained` holding the model and its tokenizer. The model
    is converted into tformer's `Transformer` (eval mode, on `tformer.utils.device`'s device); `tokens` is a
    `MarianTokens`; info holds "name" and "tgt" (the target language). A name that cannot be fetched (offline
    and not cached) or a folder without a Marian model is a UserError."""
    try:
        import sacremoses  # noqa: F401  (MarianTokenizer's normaliser; without it, it warns and skips it)
        import sentencepiece  # noqa: F401
        import transformers
    except ModuleNotFoundError as e:
        raise MissingExtra(e.name or "transformers", "tformer translate score --hf", extra="translate") from None
    from ..models.transformer import Transformer
    from ..utils.device import resolve as resolve_device

    local = Path(name).is_dir()
    if not local and (name.startswith(".") or re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) is None):
        raise FileNotFoundError(f"--hf {name}: not a folder; give a folder written by save_pretrained or a "
                                f"Hugging Face name such as Helsinki-NLP/opus-mt-de-en")
    transformers.utils.logging.disable_progress_bar()           # stderr keeps tformer's own bar and errors
    transformers.utils.logging.set_verbosity_error()

    def load(cached_only: bool):
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=cached_only)
        if config.model_type != "marian":
            raise UserError(f"--hf {name}: a {config.model_type!r} model; `translate score --hf` takes Marian "
                            f"translation models (Helsinki-NLP/opus-mt-*)")
        return (transformers.MarianTokenizer.from_pretrained(name, local_files_only=cached_only),
                transformers.MarianMTModel.from_pretrained(name, local_files_only=cached_only))
    try:
        try:
            tokenizer, hf = load(cached_only=True)               # a folder, or a name in Hugging Face's cache
        except OSError:
            if local:
                raise
            reason = offline_reason("huggingface.co")          # fail at once, before the hub client retries
            if reason:
                raise UserError(f"--hf {name}: not in Hugging Face's cache, and {reason}; give a folder written "
                                f"by save_pretrained, or fetch the model once with a connection") from None
            tokenizer, hf = load(cached_only=False)
    except (OSError, ValueError) as e:
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise UserError(f"--hf {name}: cannot load it ({why}); give a folder written by save_pretrained holding "
                        f"a Marian model and its tokenizer, or a Hugging Face name") from None
    model = Transformer.from_hf_marian(hf).to(resolve_device(device or None))
    return model, MarianTokens(tokenizer), {"name": name, "tgt": _target_language(name, tokenizer)}


def score_published(name: str, src_file, ref_file, *, beam: int = 4, alpha: float = 0.6, testset: str | None = None,
                    progress: bool = False, device: str | None = None) -> dict:
    """Translate `src_file` with a published Marian model converted into tformer's Transformer (tformer's
    beam search, in batches) and score against `ref_file`: `score_files`'s record ("weights" is the model's
    name), with `testset` also "card_bleu" and "card_source". The files and the test set are checked before
    the model is loaded."""
    src_lines, ref_lines = read_aligned(src_file, ref_file, beam)
    card = card_bleu(name, testset) if testset is not None else None
    model, tokens, info = load_published(name, device)
    res = score_lines(model, tokens, src_lines, ref_lines, beam=beam, alpha=alpha, progress=progress, lang=info["tgt"])
    res["weights"] = name
    if card is not None:
        res["card_bleu"], res["card_source"] = card
    return res
