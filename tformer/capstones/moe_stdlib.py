"""The `moe` capstone (chapter 13): a dense GPT against an MoE GPT (8 experts, top-2) at equal active parameters
and equal tokens, 3 seeds each, on a code corpus every machine has offline: the Python standard
library's own source.

Corpus: every `.py` file under `sysconfig.get_paths()["stdlib"]` outside test folders, site-packages,
and the generated tables of `encodings/` (PSF license). Files go to validation when the first byte of
sha1(relative path) is < 13 (about 5%), so the split never changes with the machine's file order. Its
sha256, size and file counts, and the byte-level BPE's vocabulary, are recorded in result.json. `--text
FILE` trains on any UTF-8 file instead (the last 5% of its lines are the validation split).

Equal active parameters: the dense FFN is d_ff wide; each expert is d_ff / top_k wide, so a token passes
through 2 x (d_ff / 2) hidden units either way (attention, embeddings and norms are shared).

`gpt_config` is the one place that spells a GPT with MoE feed-forward layers.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch

from ..data.text import LMBatches, encode, train_tokenizer
from ..models.gpt import GPT, GPTConfig
from ..moe import MoE, MoEConfig
from ..training.checkpoint import atomic_save, load_checkpoint
from ..training.losses import fused_lm_loss
from ..training.trainer import Trainer, TrainConfig, adamw
from .base import Capstone, local_path
from .runfolder import CapstoneRun


class MoEStdlib(Capstone):
    name, chapter = "moe", 13
    summary = "dense vs MoE 8x top-2 GPTs on the Python standard library: validation loss"
    RECIPE = {
        "model": dict(d_model=128, n_layers=4, n_heads=4, context_length=128, dropout=0.0),
        "d_ff": 512,                                   # dense FFN width = top_k x expert width
        "moe": dict(n_experts=8, top_k=2, balance_weight=0.01),
        "vocab_size": 4096,
        # 1000 steps of 32 x 128 tokens: 4.1M tokens per run, the same for both models (equal tokens)
        "train": dict(batch_size=32, max_steps=1000, lr=2e-3, warmup=60, weight_decay=0.1, schedule="cosine"),
        "val_batches": 20, "eval_every": 100,
        "seeds": [0, 1, 2],
        "budget_minutes": 60.0,
        "corpus": "python-stdlib",
    }
    TINY = {"model": dict(d_model=16, n_layers=1, n_heads=2, context_length=16, dropout=0.0), "d_ff": 32,
            "vocab_size": 300, "val_batches": 2, "eval_every": 0, "seeds": [0],
            "train": dict(batch_size=4, max_steps=6, lr=2e-3, warmup=2, weight_decay=0.1, schedule="cosine")}
    STEPS = ("train.max_steps",)

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--text", type=local_path, default=None, metavar="FILE",
                            help="a UTF-8 text file to train on instead of the Python standard library's source")

    def prepare(self) -> None:
        from ..utils.errors import UserError
        if self.own["text"] is None:
            return
        p = Path(self.own["text"])
        if not p.is_file():
            raise UserError(f"--text {p} is not a file; give a UTF-8 text file")
        raw = p.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"--text {p} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                            f"convert it, e.g. `iconv -f latin1 -t utf-8 {p}`") from None
        if not text.strip():
            raise UserError(f"--text {p} is empty: nothing to train on")

    def config(self) -> dict:
        config = super().config()
        if self.own["text"] is not None:
            config["corpus"] = f"text:{Path(self.own['text']).resolve()}"
        return config

    def run(self, run: CapstoneRun) -> dict:
        return run_moe(run, run.config, self.own["text"])

    @classmethod
    def show(cls, result: dict, where: str, plot: bool = True) -> None:
        """The two models' validation losses per seed and their training speeds."""
        for k in ("dense_val_loss", "moe_val_loss", "tokens_per_s"):
            print(f"  {k}: {result.get(k)}")


def gpt_config(model: dict, vocab_size: int, d_ff: int, moe: dict | None) -> GPTConfig:
    """A GPTConfig, dense (moe=None) or with every FFN an MoE of `moe["n_experts"]` experts of width
    d_ff // top_k, so that the top-k experts a token runs hold as many weights as the dense FFN."""
    if moe is None:
        return GPTConfig(vocab_size=vocab_size, d_ff=d_ff, **model)
    return GPTConfig(vocab_size=vocab_size, d_ff=d_ff, **model,
                     moe=MoEConfig(n_experts=moe["n_experts"], top_k=moe["top_k"], d_ff=d_ff // moe["top_k"],
                                   balance_weight=moe["balance_weight"]))


# -- the corpus ---------------------------------------------------------------------------------------
def stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "encodings", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts[:-1]))
    return root, files


def is_validation(rel: str) -> bool:
    return hashlib.sha1(rel.encode()).digest()[0] < 13         # ~5% of the files, the same on every machine


def read_corpus(text_file: str | None) -> tuple[str, str, dict]:
    """(train text, validation text, description)."""
    if text_file is not None:
        raw = Path(text_file).read_bytes()
        text = raw.decode("utf-8")                             # checked by prepare()
        lines = text.splitlines(keepends=True)
        cut = max(1, int(len(lines) * 0.95))
        train, val = "".join(lines[:cut]), "".join(lines[cut:]) or "".join(lines[-1:])
        name = str(text_file)
    else:
        root, files = stdlib_files()
        tr, va = [], []
        for p in files:
            try:
                t = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            (va if is_validation(p.relative_to(root).as_posix()) else tr).append(t)
        train, val = "\n".join(tr), "\n".join(va)
        name = f"python {root.name} stdlib source ({root})"
        raw = (train + "\0" + val).encode()
    return train, val, {"name": name, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw),
                        "train_chars": len(train), "val_chars": len(val)}


def corpus_ids(run: CapstoneRun, recipe: dict, text_file: str | None) -> dict:
    """Tokenized once per run folder (RUN/corpus.pt): train/val ids and the corpus description."""
    path = run.out / "corpus.pt"
    if path.exists():
        return load_checkpoint(path, weights_only=False)
    train, val, info = read_corpus(text_file)
    tok = train_tokenizer([train], recipe["vocab_size"])
    d = {"train": encode(tok, train), "val": encode(tok, val), "info": {**info, "vocab_size": tok.get_vocab_size()},
         "tokenizer": tok.to_str()}
    d["info"].update(train_tokens=len(d["train"]), val_tokens=len(d["val"]))
    atomic_save(d, path)
    return d


def _val_batches(ids: torch.Tensor, recipe: dict) -> LMBatches:
    b, t = recipe["train"]["batch_size"], recipe["model"]["context_length"]
    n = max(1, min(recipe["val_batches"], (len(ids) - 1) // (b * t)))
    if n * b * t + 1 > len(ids):                                  # a short --text: repeat it
        ids = ids.repeat((n * b * t + 1) // max(len(ids), 1) + 1)
    return LMBatches(ids, b, t, n, shuffle=False)


@torch.no_grad()
def busiest_expert(model: GPT, batches) -> float:
    """The busiest expert's share of the tokens routed over all `batches` over the uniform share (1.0 =
    perfect balance), the worst of the MoE layers.

    Where it is measured decides what it says. The balance loss evens the load over the batches training
    draws (windows from all over the corpus); the capstone measures there (`balance_batches`). Experts also
    specialise by content: the validation split alone (the last files, or the last lines of a `--text`)
    can send twice the uniform share to one expert, and one batch of it (4,096 consecutive tokens) more
    (benchmarks/RESULTS.md, "MoE on corpora it was not tuned on"); result.json gives that figure too."""
    model.eval()
    totals: list[torch.Tensor] = []
    for x, _ in batches:
        model(x)
        counts = [m.last_counts.float() for m in model.modules() if isinstance(m, MoE)]
        totals = counts if not totals else [t + c for t, c in zip(totals, counts)]
    return round(max(float(t.max() / t.mean()) for t in totals), 3)


def balance_batches(ids: torch.Tensor, recipe: dict) -> LMBatches:
    """As many batches as the validation split's, drawn from the training stream the way training draws
    them (random windows; their own seed, the same for every model)."""
    return LMBatches(ids, recipe["train"]["batch_size"], recipe["model"]["context_length"],
                     batches_per_epoch=recipe["val_batches"], seed=10_007)


def load_moe(run: CapstoneRun, recipe: dict, vocab: int, seed: int) -> GPT:
    """The MoE GPT of seed `seed` as its part finished (the part's last.pt)."""
    model = GPT(gpt_config(recipe["model"], vocab, recipe["d_ff"], recipe["moe"]))
    model.load_state_dict(load_checkpoint(run.part_dir(f"moe-seed{seed}") / "last.pt")["model"])
    return model


def run_moe(run: CapstoneRun, recipe: dict, text_file: str | None) -> dict:
    opts = run.opts
    corpus = corpus_ids(run, recipe, text_file)
    vocab = corpus["info"]["vocab_size"]
    tc = recipe["train"]
    seeds = recipe["seeds"]
    parts = {}
    for kind in ("dense", "moe"):
        for seed in seeds:
            def train(folder: Path, kind=kind, seed=seed):
                torch.manual_seed(seed)
                model = GPT(gpt_config(recipe["model"], vocab, recipe["d_ff"], recipe["moe"] if kind == "moe" else None))
                t = recipe["model"]["context_length"]
                batches = LMBatches(corpus["train"], tc["batch_size"], t, batches_per_epoch=1000, seed=seed)
                val = _val_batches(corpus["val"], recipe)
                budget = run.part_budget(1 / (2 * len(seeds)), recipe["budget_minutes"])
                cfg = TrainConfig(max_steps=tc["max_steps"], time_budget=budget, lr=tc["lr"], schedule=tc["schedule"],
                                  warmup=tc["warmup"], grad_clip=1.0, amp=True, eval_every=recipe["eval_every"],
                                  save_every=max(1, tc["max_steps"] // 20), log_every=10 if tc["max_steps"] >= 10 else 1,
                                  seed=seed, progress=opts.progress)
                trainer = Trainer(model, fused_lm_loss, batches, cfg, val_data=val, out_dir=folder,
                                  optimizer=adamw(model, tc["lr"], tc["weight_decay"], (0.9, 0.95)))
                rec = trainer.fit(steps=opts.stop_after)
                st = trainer.state
                if not (st.step >= tc["max_steps"] or (budget is not None and st.elapsed >= budget * 60)):
                    return None
                rows = rec["history"]                       # every record of the run, resumes included
                logged = [r for r in rows if "loss" in r]
                out = {"kind": kind, "seed": seed, "val_loss": round(rec["val_loss"], 4), "steps": st.step,
                       "tokens": int(st.tokens), "minutes": round(st.elapsed / 60, 3),
                       "tokens_per_s": round(st.tokens / max(st.elapsed, 1e-9), 1),
                       "params": model.num_params(), "active_params": model.num_params(active=True),
                       "curve": {"step": [r["step"] for r in logged], "loss": [round(r["loss"], 4) for r in logged],
                                 "minutes": [round(r["minutes"], 3) for r in logged]},
                       "val_curve": [{"step": r["step"], "minutes": round(r["minutes"], 3),
                                      "val_loss": round(r["val_loss"], 4)} for r in rows if "val_loss" in r]}
                return out
            parts[(kind, seed)] = run.part(f"{kind}-seed{seed}", train, f"{kind} GPT, seed {seed}")
    dense = [parts[("dense", s)] for s in seeds]
    moe = [parts[("moe", s)] for s in seeds]
    d_loss, m_loss = [p["val_loss"] for p in dense], [p["val_loss"] for p in moe]
    d_mean, m_mean = sum(d_loss) / len(d_loss), sum(m_loss) / len(m_loss)
    spread = max(max(d_loss) - min(d_loss), max(m_loss) - min(m_loss))
    d_tps = sum(p["tokens_per_s"] for p in dense) / len(dense)
    m_tps = sum(p["tokens_per_s"] for p in moe) / len(moe)

    def at_minutes(p: dict, minutes: float):                        # the last validation by that time
        seen = [v["val_loss"] for v in p["val_curve"] if v["minutes"] <= minutes + 1e-9]
        return seen[-1] if seen else None
    equal_wall = [at_minutes(m, d["minutes"]) for d, m in zip(dense, moe)]
    # each seed's busiest expert, from its weights (a finished run resumed measures again): on batches drawn as
    # training draws them, and on the validation split
    models = [load_moe(run, recipe, vocab, s) for s in seeds]
    busiest = [busiest_expert(m, balance_batches(corpus["train"], recipe)) for m in models]
    busiest_val = [busiest_expert(m, _val_batches(corpus["val"], recipe)) for m in models]
    result = {"metric": "moe_minus_dense_val_loss", "value": round(m_mean - d_mean, 4),
              "dense_val_loss": d_loss, "moe_val_loss": m_loss, "dense_mean": round(d_mean, 4),
              "moe_mean": round(m_mean, 4), "max_seed_spread": round(spread, 4),
              "moe_ahead_by_more_than_twice_spread": (d_mean - m_mean) > 2 * spread,
              "tokens_per_s": {"dense": round(d_tps, 1), "moe": round(m_tps, 1), "ratio": round(m_tps / d_tps, 3)},
              "busiest_expert_vs_uniform": busiest,           # worst layer, per seed, on batches drawn as in training
              "busiest_expert_on_validation": busiest_val,    # the same over the validation split
              "moe_val_loss_at_dense_minutes": equal_wall,
              "params": {"dense": dense[0]["params"], "moe": moe[0]["params"], "dense_active": dense[0]["active_params"],
                         "moe_active": moe[0]["active_params"]},
              "corpus": corpus["info"], "seeds": seeds, "steps": [p["steps"] for p in dense + moe],
              "tokens": sum(p["tokens"] for p in dense + moe),
              "curves": {f"{p['kind']}-seed{p['seed']}": p["curve"] for p in dense + moe},
              "val_curves": {f"{p['kind']}-seed{p['seed']}": p["val_curve"] for p in dense + moe}}
    report = (f"Dense vs MoE ({recipe['moe']['n_experts']} experts, top-{recipe['moe']['top_k']}) GPTs at "
              f"{dense[0]['active_params']:,} vs {moe[0]['active_params']:,} active parameters, {len(seeds)} seeds, on "
              f"{corpus['info']['name']}: final validation loss dense {d_mean:.4f} ({d_loss}), MoE {m_mean:.4f} "
              f"({m_loss}); the larger seed spread {spread:.4f}. Training tokens/s: dense {d_tps:.0f}, MoE {m_tps:.0f} "
              f"({m_tps / d_tps:.2f}x). Busiest expert vs uniform on batches drawn as in training: {busiest}; over the "
              f"validation split: {busiest_val}. "
              f"At the dense runs' wall-clock time the MoE's validation loss was {equal_wall}.")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 3))
    for p in dense + moe:
        style = "-" if p["kind"] == "dense" else "--"
        ax[0].plot(p["curve"]["step"], p["curve"]["loss"], style, label=f"{p['kind']} {p['seed']}")
        vc = p["val_curve"]
        ax[1].plot([v["minutes"] for v in vc], [v["val_loss"] for v in vc], style, marker=".", label=f"{p['kind']} {p['seed']}")
    ax[0].set_xlabel("step"), ax[0].set_ylabel("training loss"), ax[0].legend(fontsize=7)
    ax[1].set_xlabel("minutes"), ax[1].set_ylabel("validation loss")
    fig.tight_layout()
    return run.finish(result, report, {"curves.png": fig})
