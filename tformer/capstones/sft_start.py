"""The SFT start (chapter 11): the small GPT that the chapter's post-training begins from, made one way.

Notebook 11_fine_tuning trains it and saves it to runs/11_fine_tuning/; notebook 11_preference_rl loads
that run folder, or trains the same model when it is missing; `tformer capstone grpo` trains it longer.
The recipe is a dict in the capstone's RECIPE shape:

    {"model": dict(d_model, n_layers, n_heads, context_length),      GPTConfig's fields but the vocabulary
     "vocab_size": 1024,                                              the byte-level BPE's size
     "pretrain": dict(steps, batch_size, lr, weight_decay),           next-token pretraining on the corpus
     "sft": dict(n_train, steps, batch_size, lr)}                     SFT on the chapter's conversations

and the steps are

    recipe = notebook_recipe(small=True)                  # the notebooks' sizes, small or full mode
    base, pre_losses = pretrain(tok, text, recipe)        # a GPT trained on 90% of text's tokens, seed 0
    chats = training_chats(recipe["sft"]["n_train"])      # the instruction set + the GRPO tasks' training prompts
    X, Y = encode_chats(tok, chats, pad_id=end_id)        # (N, T) ids, (N, T) labels: IGNORE off the answers
    batches = sft_batches(X, Y, 16)                       # [((b, T), (b, T)), ...] in order
    start = train_sft_start(tok, text, recipe)            # all of it, then SFT of a copy of base (sft_step_loss)
    save_sft_start(start.model, tok, recipe, small) / load_sft_start(tok, recipe, small)   # the run folder

Every run goes through `tformer.training.train_steps` (the Trainer), seeded as the notebooks are.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.text import LMBatches, encode, split_stream
from ..models.gpt import GPT, GPTConfig
from ..training import grpo
from ..training.losses import lm_loss
from ..training.sft import KINDS, RUNS, Turn, encode_chats, instruction_set, load_run, save_run, sft_step_loss
from ..training.trainer import train_steps
from ..utils.runtime import seed_everything

RUN_FOLDER = RUNS / "11_fine_tuning"          # where notebook 11_fine_tuning leaves its SFT model


def notebook_recipe(small: bool) -> dict:
    """The two chapter-11 notebooks' recipe: a 2-layer, 64-wide GPT in small mode, 6 layers x 384 otherwise."""
    if small:
        return {"model": dict(d_model=64, n_layers=2, n_heads=4, context_length=64), "vocab_size": 1024,
                "pretrain": dict(steps=150, batch_size=16, lr=3e-3, weight_decay=0.1),
                "sft": dict(n_train=2000, steps=400, batch_size=16, lr=3e-3)}
    return {"model": dict(d_model=384, n_layers=6, n_heads=6, context_length=256), "vocab_size": 8192,
            "pretrain": dict(steps=3000, batch_size=16, lr=3e-3, weight_decay=0.1),
            # 12,000 problems: the train split holds about 7,090 distinct two-digit additions, half of them
            "sft": dict(n_train=12000, steps=2000, batch_size=32, lr=3e-3)}


def pretrain(tok, text: str, recipe: dict, device=None) -> tuple[GPT, list[float]]:
    """The base model: a GPT of recipe["model"] trained on the next token of the first 90% of `text`
    (windows of context_length tokens, seed 0). Returns it with its logged training losses."""
    train_ids, _ = split_stream(encode(tok, text), 0.9)
    cfg = GPTConfig(vocab_size=tok.get_vocab_size(), **recipe["model"])
    p = recipe["pretrain"]
    seed_everything(0)
    base = GPT(cfg) if device is None else GPT(cfg).to(device)
    batches = LMBatches(train_ids, p["batch_size"], cfg.context_length - 1, p["steps"], seed=0)   # (B, T + 1) each
    losses = train_steps(base, lm_loss, batches, p["steps"], p["lr"], weight_decay=p["weight_decay"], device=device)
    return base, losses


def training_chats(n_train: int) -> list[list[Turn]]:
    """The SFT data: n_train conversations of the instruction set (seed 0) and as many training problems of
    the two GRPO tasks (never a held-out prompt), shuffled together (seed 0)."""
    chats = instruction_set(n_train, seed=0) + grpo.sft_chats(grpo.problems(n_train, seed=0))
    random.Random(0).shuffle(chats)
    return chats


def sft_batches(ids: torch.Tensor, labels: torch.Tensor, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """ids, labels (N, T) -> consecutive (ids (b, T), labels (b, T)) slices of batch_size rows (the last may be
    shorter), in order: the Trainer cycles through them."""
    return [(ids[i:i + batch_size], labels[i:i + batch_size]) for i in range(0, len(ids), batch_size)]


@dataclass
class SFTStart:
    base: GPT                    # the pretrained model
    model: GPT                   # its SFT copy
    pre_losses: list[float]
    sft_losses: list[float]


def train_sft_start(tok, text: str, recipe: dict, device=None) -> SFTStart:
    """Pretrain on `text`, then SFT a copy of the base model on `training_chats` (seed 0 before each)."""
    base, pre_losses = pretrain(tok, text, recipe, device)
    s = recipe["sft"]
    X, Y = encode_chats(tok, training_chats(s["n_train"]), pad_id=tok.token_to_id("<|endoftext|>"))   # (N, T)
    if X.shape[1] > base.cfg.context_length:
        raise ValueError(f"train_sft_start: the conversations need {X.shape[1]} tokens, more than the model's "
                         f"context_length {base.cfg.context_length}")
    seed_everything(0)
    model = copy.deepcopy(base)
    sft_losses = train_steps(model, sft_step_loss, sft_batches(X, Y, s["batch_size"]), s["steps"], s["lr"],
                             device=device)
    return SFTStart(base, model, pre_losses, sft_losses)


def sft_meta(tok, recipe: dict, small: bool) -> dict:
    """What the run folder records of the recipe: a later notebook loads the model only when it matches."""
    return {"notebook": "11_fine_tuning", "small": small, "vocab_size": tok.get_vocab_size(),
            "d_model": recipe["model"]["d_model"], "pre_steps": recipe["pretrain"]["steps"],
            "sft_steps": recipe["sft"]["steps"], "n_train": recipe["sft"]["n_train"],
            "tasks": list(KINDS) + list(grpo.TASKS)}


def save_sft_start(model, tok, recipe: dict, small: bool, folder: str | Path = RUN_FOLDER) -> Path:
    """Write the SFT model, its tokenizer and `sft_meta` to the run folder (`sft.save_run`)."""
    return save_run(folder, model, tok, sft_meta(tok, recipe, small))


def load_sft_start(tok, recipe: dict, small: bool, device=None, folder: str | Path = RUN_FOLDER) -> GPT | None:
    """The SFT model saved by `save_sft_start` with this recipe, mode and tokenizer, else None."""
    loaded = load_run(folder, sft_meta(tok, recipe, small), device=device)
    if loaded is None or loaded[1].to_str() != tok.to_str():
        return None
    return loaded[0]


__all__ = ["RUN_FOLDER", "notebook_recipe", "pretrain", "training_chats", "sft_batches", "SFTStart", "train_sft_start",
           "sft_meta", "save_sft_start", "load_sft_start"]
