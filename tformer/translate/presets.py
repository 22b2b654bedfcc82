"""Presets for the translation capstone: model size and training recipe in one record.

    tiny   CI and the notebook's small mode: trains on the built-in corpus in seconds on a CPU
    small  Multi30k on a CPU in 30 minutes: 3+3 layers, d=256 (the size of the course's CPU peer).
           Its recipe is tuned for the budget: small batches (1,600 padded tokens a side: ~1,900 updates
           in 30 minutes instead of ~600 at 5,000) and the "linear" schedule, which decays to 0 exactly
           when the time budget runs out. Measured de->en on an idle 2-core CPU: 37.0 greedy / 38.3
           beam-4 sacreBLEU on test_2016_flickr (5,000-token batches + inverse-sqrt: 32.5 / 33.5).
           On a CPU with bf16 matrix units (Intel AMX, AVX512-BF16) it trains under bf16 autocast: about 1.8x
           the float32 step (`python benchmarks/bench_translate.py --bf16 --threads 1`); elsewhere in float32.
    small-avx2  small for a CPU without bf16 matrix units (AVX2 only: most laptops), in float32: no dropout
           on attention weights or FFN units (the paper's choice; the model is still improving when 30 minutes
           end, so it needs less regularisation) and lr 2.5e-3. Chosen by a sweep on 2 cores of an AMD EPYC
           (benchmarks/RESULTS.md, "Translation on the 2-core EPYC").
    gpu    Multi30k on one GPU in 2.5-5 minutes: base's width (d=512, 8 heads, d_ff 2048) with 3+3 layers,
           dropout 0.3, an 8k vocabulary, 8,000-token batches, lr 1e-3 with 400 warm-up steps and the
           linear schedule, gradients clipped at 1. This is a recipe first set by hand, measured on
           one H200 (`--preset base --set n_layers=3 --set dropout=0.3 ... --time-budget 2.5`): 4,449
           steps, 259k tokens/s, 40.4 greedy sacreBLEU on test_2016_flickr. As a preset it adds snapshots
           every 30 s for averaging; its 5-minute figure (target >= 42) is not yet measured.
    base   the paper's transformer-base (Table 3): 6+6 layers, d=512, 100k steps of ~25k tokens
    big    the paper's transformer-big: d=1024, 16 heads, dropout 0.3 (EN-DE), 300k steps
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace


@dataclass
class TranslatePreset:
    # model
    d_model: int = 512                # width
    n_heads: int = 8                  # attention heads
    d_ff: int = 2048                  # FFN inner width
    n_layers: int = 6                 # encoder layers = decoder layers
    dropout: float = 0.1              # P_drop, on sub-layer outputs and embeddings
    attn_dropout: float | None = None # on attention weights (None = P_drop, as nn.Transformer; the paper: 0)
    ffn_dropout: float | None = None  # on the FFN's hidden units (None = P_drop, as nn.Transformer; the paper: 0)
    norm_first: bool = False          # False = post-LN, the paper
    arch: str = "tformer"             # "tformer": the course's Transformer; "torch": the nn.Transformer peer
    max_len: int = 256                # longest sentence (BPE tokens) kept for training
    # vocabulary
    vocab_size: int = 37000           # shared BPE vocabulary (the paper: ~37k EN-DE, 32k EN-FR)
    # training
    max_tokens: int = 25000           # padded tokens per side per batch (all ranks together)
    accum_steps: int = 1              # micro-batches per step (to reach max_tokens on fewer GPUs)
    lr: float = 7.0e-4                # peak lr; 512^-0.5 * 4000^-0.5 = 7.0e-4 is the paper's schedule
    warmup: int = 4000                # warmup steps
    schedule: str = "noam"            # "noam": the paper's 1/sqrt(step); "linear": down to 0 at the end of
                                      # max_steps or the time budget, whichever comes first
    label_smoothing: float = 0.1      # epsilon_ls
    grad_clip: float | None = None    # the paper does not clip
    cpu_bf16: bool = False            # bf16 autocast on a CPU with bf16 matrix units (AMX, AVX512-BF16); a CUDA
                                      # GPU always autocasts (tformer.utils.device.amp_dtype)
    max_steps: int = 100_000          # training steps (base: 100k, big: 300k)
    eval_every: int = 2000            # validation loss every N steps
    save_every: int = 1000            # full checkpoint (resume point) every N steps
    snapshot_minutes: float = 10.0    # weights snapshot for averaging every M minutes (the paper: 10)
    snapshot_every: int = 0           # ... or every N steps (0 = by time only)
    average_last: int = 5             # snapshots averaged at the end (base: 5, big: 20)
    keep_snapshots: int | None = None # snapshots kept on disk (None = average_last; more for BLEU vs time)
    offline_pairs: int = 20000        # sentence pairs of the built-in corpus (when no data is given)
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TranslatePreset":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"TranslatePreset: unknown fields {sorted(unknown)}")
        return cls(**d)


SMALL = TranslatePreset(d_model=256, n_heads=4, d_ff=1024, n_layers=3, dropout=0.1, vocab_size=8000, max_tokens=1600,
                        lr=1.5e-3, warmup=400, schedule="linear", grad_clip=1.0, max_steps=100_000, cpu_bf16=True,
                        eval_every=500, save_every=200, snapshot_minutes=1.5, average_last=5, max_len=128)
SMALL_AVX2 = replace(SMALL, attn_dropout=0.0, ffn_dropout=0.0, lr=2.5e-3, cpu_bf16=False)

PRESETS: dict[str, TranslatePreset] = {
    "tiny": TranslatePreset(d_model=64, n_heads=4, d_ff=256, n_layers=2, dropout=0.1, vocab_size=600,
                            max_tokens=1200, lr=3e-3, warmup=40, grad_clip=1.0, max_steps=300, eval_every=100,
                            save_every=50, snapshot_minutes=0.0, snapshot_every=25, average_last=4,
                            offline_pairs=4000, max_len=64),
    "small": SMALL,
    "small-avx2": SMALL_AVX2,
    "gpu": TranslatePreset(n_layers=3, dropout=0.3, attn_dropout=0.0, ffn_dropout=0.0, vocab_size=8000,
                           max_tokens=8000, lr=1e-3, warmup=400, schedule="linear", grad_clip=1.0,
                           max_steps=100_000, eval_every=1000, save_every=1000, snapshot_minutes=0.5,
                           average_last=5),
    "base": TranslatePreset(attn_dropout=0.0, ffn_dropout=0.0),
    "big": TranslatePreset(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3, attn_dropout=0.0, ffn_dropout=0.0,
                           lr=4.9e-4, max_steps=300_000,
                           average_last=20),
}


def get_preset(name: str, **overrides) -> TranslatePreset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    d = PRESETS[name].to_dict()
    d.update(overrides)                  # None is a value here (attn_dropout=None: "as dropout")
    return validate(TranslatePreset.from_dict(d))


# ----------------------------------------------------------------------------------------------------
# Checking settings from the command line (`--set FIELD=VALUE`) and on resume

# settings that may change when a run resumes: how long it trains and how often it validates and saves.
# Every other field defines the model, the data or the tokenizer (or the recipe the saved optimizer
# state belongs to), so a resumed run refuses to change it.
ARCHS = ("tformer", "torch")       # the model: the course's, or nn.Transformer of the same size (peer.py)

RESUMABLE = ("max_steps", "eval_every", "save_every", "snapshot_every", "snapshot_minutes", "keep_snapshots",
             "average_last")

_POSITIVE = {"d_model", "n_heads", "d_ff", "n_layers", "max_len", "max_tokens", "accum_steps", "lr", "warmup",
             "max_steps", "average_last", "grad_clip", "keep_snapshots", "offline_pairs"}
_NONNEGATIVE = {"eval_every", "save_every", "snapshot_every", "snapshot_minutes", "seed"}
_PROBABILITY = {"dropout", "attn_dropout", "ffn_dropout", "label_smoothing"}     # 0 <= p < 1
_MIN_VOCAB = 300                                    # SharedBPE: 256 bytes + special tokens + some merges


def _kind(name: str) -> tuple[type, bool]:
    """(base type, None allowed) of a preset field, from its annotation ("float | None" -> (float, True))."""
    ann = str(next(f.type for f in fields(TranslatePreset) if f.name == name))
    parts = [a.strip() for a in ann.split("|")]
    base = {"int": int, "float": float, "bool": bool, "str": str}[next(a for a in parts if a != "None")]
    return base, "None" in parts


def parse_field(name: str, text: str):
    """The value of `--set name=text`, parsed to the field's type and range-checked; ValueError names the field."""
    names = [f.name for f in fields(TranslatePreset)]
    if name not in names:
        raise ValueError(f"--set {name}={text}: unknown preset field {name!r}; fields: {', '.join(names)}")
    kind, optional = _kind(name)
    raw = text.strip()
    if optional and raw.lower() in ("none", "null", ""):
        value = None
    elif kind is bool:
        low = raw.lower()
        if low not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"--set {name}={text}: {name} is true or false")
        value = low in ("true", "1", "yes")
    elif kind is int:
        try:
            value = int(raw.replace("_", ""))
        except ValueError:
            raise ValueError(f"--set {name}={text}: {name} must be an integer") from None
    elif kind is float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"--set {name}={text}: {name} must be a number") from None
    else:
        value = raw
    check_field(name, value, prefix=f"--set {name}={text}: ")
    return value


def check_field(name: str, value, prefix: str = "") -> None:
    """Range of one field: ValueError naming it and the accepted range."""
    from ..training.schedules import SCHEDULES
    if value is None:
        if not _kind(name)[1]:
            raise ValueError(f"{prefix}{name} cannot be None")
        return
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{prefix}{name} must be a finite number, got {value}")
    if name in _POSITIVE and not value > 0:
        raise ValueError(f"{prefix}{name} must be > 0, got {value}")
    if name in _NONNEGATIVE and not value >= 0:
        raise ValueError(f"{prefix}{name} must be >= 0, got {value}")
    if name in _PROBABILITY and not 0 <= value < 1:
        raise ValueError(f"{prefix}{name} must be in [0, 1), got {value}")
    if name == "vocab_size" and value < _MIN_VOCAB:
        raise ValueError(f"{prefix}vocab_size must be >= {_MIN_VOCAB} (256 bytes + special tokens), got {value}")
    if name == "arch" and value not in ARCHS:
        raise ValueError(f"{prefix}arch must be one of {', '.join(ARCHS)}, got {value!r}")
    if name == "schedule" and value not in SCHEDULES:
        raise ValueError(f"{prefix}schedule must be one of {', '.join(sorted(SCHEDULES))}, got {value!r}")


def validate(p: TranslatePreset) -> TranslatePreset:
    """Every field's range, and the ones that depend on each other (d_model divisible by n_heads)."""
    for f in fields(p):
        check_field(f.name, getattr(p, f.name))
    if p.d_model % p.n_heads:
        raise ValueError(f"d_model ({p.d_model}) must be divisible by n_heads ({p.n_heads})")
    return p
