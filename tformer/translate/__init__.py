"""The translation capstone (chapter 10).

    presets   TranslatePreset: small (a CPU with bf16 units), small-avx2 (one without), gpu (one GPU), base and big (WMT14, the paper)
    pipeline  build_model, train_run (BPE, batches, Trainer, run folder), load_run, score_files (sacreBLEU);
              a published Marian model converted and scored: load_published, score_published, card_bleu
    peer      TorchTransformer: nn.Transformer of the same size, the capstone's peer (`--set arch=torch`)
    cli       `tformer translate train | score | translate`
"""
from .presets import PRESETS, TranslatePreset, get_preset

# the pipeline's names load on first use (`__getattr__` below): the pipeline imports torch, and `tformer translate`'s
# place in the command's parser (cli.py, which reads PRESETS) must not
_PIPELINE = ("Seq2SeqLoss", "build_model", "card_bleu", "load_published", "load_run", "score_files", "score_lines",
             "score_published", "train_run")

__all__ = ["PRESETS", "TranslatePreset", "get_preset", "Seq2SeqLoss", "build_model", "train_run", "load_run",
           "score_files", "score_lines", "load_published", "score_published", "card_bleu"]


def __getattr__(name: str):
    if name in _PIPELINE:
        from . import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
