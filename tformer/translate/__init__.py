"""The translation capstone (chapter 10): presets, the train/score pipeline and the `tformer translate` CLI."""
from .pipeline import Seq2SeqLoss, build_model, load_run, score_files, score_lines, train_run
from .presets import PRESETS, TranslatePreset, get_preset

__all__ = ["PRESETS", "TranslatePreset", "get_preset", "Seq2SeqLoss", "build_model", "train_run", "load_run",
           "score_files", "score_lines"]
