"""The translation capstone (chapter 10).

    presets   TranslatePreset: small (a CPU), gpu (one GPU), base and big (WMT14, the paper)
    pipeline  build_model, train_run (BPE, batches, Trainer, run folder), load_run, score_files (sacreBLEU);
              a published Marian model converted and scored: load_published, score_published, card_bleu
    peer      TorchTransformer: nn.Transformer of the same size, the capstone's peer (`--set arch=torch`)
    cli       `tformer translate train | score | translate`
"""
from .pipeline import (Seq2SeqLoss, build_model, card_bleu, load_published, load_run, score_files, score_lines,
                       score_published, train_run)
from .presets import PRESETS, TranslatePreset, get_preset

__all__ = ["PRESETS", "TranslatePreset", "get_preset", "Seq2SeqLoss", "build_model", "train_run", "load_run",
           "score_files", "score_lines", "load_published", "score_published", "card_bleu"]
