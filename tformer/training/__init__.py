"""Training (chapter 10, reused by chapters 11-13): the primitives and the methods. The recipes that use
them (the capstones, the chapters' SFT start and image training) live in tformer/capstones/.

    schedules    the paper's warmup then 1/sqrt(step) (`noam_lr`), constant, linear and cosine decay
    losses       label-smoothed cross-entropy; causal_lm_loss (the one next-token loss), lm_loss (the Trainer's
                 loss_fn for LM batches; fused_lm_loss, its head fused) and the masked-LM loss;
                 linear_cross_entropy (LM head + loss fused, no (N, V) logits kept)
    checkpoint   run folders: atomic save and load, the run lock, RNG state, checkpoint averaging
    distributed  joining the process group torchrun describes
    trainer      TrainConfig and the Trainer: accumulation, clipping, autocast, validation, exact resume
    metrics      BLEU (sacreBLEU and tokenized), accuracy, perplexity, recall@k, the power-law fit, Chinchilla N and D
    sft, lora, dpo   chat template and prompt-masked labels; low-rank adapters; preference optimisation
    grpo         GRPO: group-relative advantages, the clipped loss with a k3 KL, verifiable tasks, pass@k

`from tformer.training import Trainer, TrainConfig, noam_lr, ...` takes the first five's public names;
import the methods (`tformer.training.sft`, ...) by their module.
"""
from .checkpoint import (CheckpointError, CheckpointWriteError, RunInUseError, RunLock, acquire_run_lock,
                         atomic_save, atomic_write_text, average_checkpoints, load_checkpoint, previous_path,
                         remove_stale_temporaries)
from .distributed import setup_distributed
from .losses import (causal_lm_loss, fused_lm_loss, label_smoothed_cross_entropy, linear_cross_entropy, lm_loss,
                     masked_lm_loss)
from .schedules import (ConstantSchedule, CosineSchedule, InverseSqrtSchedule, LinearDecaySchedule, RunScheduler,
                        Schedule, make_scheduler, noam_lr)
from .trainer import TrainConfig, Trainer, TrainState, adamw, fusable, train_steps

__all__ = ["noam_lr", "Schedule", "InverseSqrtSchedule", "ConstantSchedule", "LinearDecaySchedule", "CosineSchedule",
           "RunScheduler", "make_scheduler", "adamw", "fusable", "label_smoothed_cross_entropy", "causal_lm_loss",
           "linear_cross_entropy", "masked_lm_loss", "lm_loss", "fused_lm_loss", "TrainConfig", "TrainState", "Trainer", "train_steps", "atomic_save", "average_checkpoints",
           "setup_distributed", "CheckpointError", "CheckpointWriteError", "RunInUseError", "RunLock",
           "acquire_run_lock", "remove_stale_temporaries", "load_checkpoint", "atomic_write_text", "previous_path"]
