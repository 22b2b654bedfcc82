"""Supervised fine-tuning (chapter 11): a chat template, prompt-masked labels, a generated instruction set.

A conversation is a list of turns (user text, assistant text). The chat template writes it as

    User: What is 3 + 4?
    Assistant: 7<|endoftext|>

and only the assistant's tokens (and the end token that closes each answer) carry loss: the prompt is
given, not predicted. Labels are the token ids with IGNORE (-100) at every other position, and the loss
is the ordinary next-token loss `tformer.training.losses.causal_lm_loss(model(ids), labels)`.

    data = instruction_set(500, seed=0)               # list of conversations (add, code, recall, read)
    ids, labels = encode_chats(tok, data)             # (N, T) each, padded
    loss = causal_lm_loss(model(ids), labels)        # = sft_step_loss(model, (ids, labels))[0], the Trainer's form
    save_run(folder, model, tok, meta) / load_run(folder, meta)   # one notebook's SFT model for the next
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.text import IGNORE
from ..models.gpt import GPT, GPTConfig
from .checkpoint import atomic_save, atomic_write_text, load_checkpoint
from .losses import causal_lm_loss

USER, ASSISTANT, END = "User: ", "\nAssistant: ", "<|endoftext|>"

Turn = tuple[str, str]            # (user, assistant)


def sft_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits[b, t] against targets[b, t] (already aligned) where loss_mask is True.

    It is `causal_lm_loss` on already-shifted targets, with the prompt's targets set to IGNORE."""
    return causal_lm_loss(logits, targets=targets.masked_fill(~loss_mask, IGNORE))


def sft_step_loss(model, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The SFT loss of one batch (ids (B, T), labels (B, T) from `encode_chats`) in the Trainer's
    (sum, count) shape: (the mean over the answer tokens, 1)."""
    ids, labels = batch
    return causal_lm_loss(model(ids), labels), 1


def render(turns: list[Turn]) -> list[tuple[str, bool]]:
    """The chat template as pieces of text, each marked True where the model is trained to write it."""
    pieces = []
    for i, (user, assistant) in enumerate(turns):
        pieces += [(("\n" if i else "") + USER + user + ASSISTANT, False), (assistant, True), (END, True)]
    return pieces


def encode_chat(tok, turns: list[Turn]) -> tuple[list[int], list[bool]]:
    """Token ids of a conversation and, per token, whether it is the assistant's (trained on)."""
    ids, mask = [], []
    for text, trained in render(turns):
        piece = tok.encode(text).ids
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def encode_chats(tok, chats: list[list[Turn]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Conversations -> (ids (N, T), labels (N, T)), right-padded; labels = ids on the assistant's tokens,
    IGNORE on the prompt and the padding."""
    enc = [encode_chat(tok, c) for c in chats]
    t = max(len(i) for i, _ in enc)
    ids = torch.full((len(enc), t), pad_id, dtype=torch.long)
    labels = torch.full((len(enc), t), IGNORE, dtype=torch.long)
    for row, (i, m) in enumerate(enc):
        ids[row, :len(i)] = torch.tensor(i)
        labels[row, :len(i)] = torch.where(torch.tensor(m), torch.tensor(i), IGNORE)
    return ids, labels


def prompt_ids(tok, turns: list[Turn]) -> list[int]:
    """The conversation up to the last answer (what the model is asked to continue)."""
    ids, mask = encode_chat(tok, turns)
    start = max(i for i in range(1, len(mask)) if mask[i] and not mask[i - 1])   # where the last answer begins
    return ids[:start]


@torch.no_grad()
def exact_match(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(N,) True where every trained token is the model's argmax given the tokens before it. This is
    exactly "greedy decoding writes every answer and its end token", computed in one forward pass."""
    was = model.training
    model.eval()
    pred = model(ids)[:, :-1].argmax(-1)
    model.train(was)
    tgt = labels[:, 1:]
    return ((pred == tgt) | (tgt == IGNORE)).all(1)


def sequence_logprob(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(N,) sum of log p(token | tokens before) over the labelled (non-IGNORE) tokens: a whole answer's log-probability."""
    logp = F.log_softmax(model(ids)[:, :-1].float(), dim=-1)
    tgt = labels[:, 1:]
    keep = tgt != IGNORE
    return (logp.gather(-1, tgt.clamp(min=0)[..., None])[..., 0] * keep).sum(1)


# --- a generated instruction set: tasks a small model learns in a few hundred steps ----------------------

NAMES = ["Alice", "Bob", "Carol", "Dave", "Emma", "Frank", "Grace", "Henry", "Ivy", "Jack", "Kate", "Leo",
         "Mia", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tina", "Victor"]
PLACES = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Dublin", "Madrid", "Vienna", "Berlin", "Prague",
          "Athens", "Lisbon", "Warsaw", "Moscow", "Delhi", "Sydney", "Boston", "Chicago", "London"]
COLOURS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
OPS = {"sum": "+", "difference": "-", "product": "*", "quotient": "/", "power": "**", "remainder": "%"}
VARS = ["x", "y"]


def fact(name: str, place: str) -> str:
    return f"{name} lives in {place}."


def read_turn(name: str, place: str | None) -> Turn:
    """The reading task: with a passage, answer from it (retrieval puts the passage there, chapter 11)."""
    context = fact(name, place) + "\n" if place is not None else ""
    return f"{context}Where does {name} live?", place or ""


def make_task(kind: str, rng: random.Random) -> list[Turn]:
    """One conversation of a kind: add (arithmetic), code (the answer is Python), recall (two turns:
    the answer comes from the first turn), read (the answer comes from a passage in the prompt)."""
    if kind == "add":
        a, b = rng.randrange(10), rng.randrange(10)
        return [(f"What is {a} + {b}?", str(a + b))]
    if kind == "code":
        op = rng.choice(list(OPS))
        u, v = rng.sample(VARS, 2)                                    # x and y, or y and x
        return [(f"Write Python that returns the {op} of {u} and {v}.", f"return {u} {OPS[op]} {v}")]
    if kind == "recall":
        c = rng.choice(COLOURS)
        return [(f"My colour is {c}.", "OK."), ("What is my colour?", c)]
    if kind == "read":
        return [read_turn(rng.choice(NAMES), rng.choice(PLACES))]
    raise ValueError(f"make_task: kind must be one of add, code, recall, read; got {kind!r}")


KINDS = ("add", "code", "recall", "read")


def instruction_set(n: int, seed: int = 0, kinds: tuple[str, ...] = KINDS) -> list[list[Turn]]:
    """n conversations, kinds in turn, from `seed` alone."""
    rng = random.Random(seed)
    return [make_task(kinds[i % len(kinds)], rng) for i in range(n)]


# --- one notebook's SFT model for the next ---------------------------------------------------------------

RUNS = Path(__file__).resolve().parents[2] / "runs"


def save_run(folder: str | Path, model, tok, meta: dict) -> Path:
    """Write folder/model.pt (weights and GPTConfig fields), folder/tokenizer.json and folder/meta.json
    (what the run was: the mode, the recipe), so that a later notebook can start from this model."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_save({"model": model.state_dict(), "config": asdict(model.cfg)}, folder / "model.pt")
    atomic_write_text(folder / "tokenizer.json", tok.to_str())
    atomic_write_text(folder / "meta.json", json.dumps(meta, indent=1, sort_keys=True))
    return folder


def load_run(folder: str | Path, meta: dict, device=None):
    """(model, tokenizer) saved by `save_run` with exactly this `meta`, else None (no run there, or a run
    of another mode or recipe)."""
    from tokenizers import Tokenizer
    folder = Path(folder)
    try:
        have = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if have != json.loads(json.dumps(meta, sort_keys=True)):
            return None
        d = load_checkpoint(folder / "model.pt", weights_only=False)
        tok = Tokenizer.from_str((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RuntimeError):          # missing, unreadable or another format
        return None
    model = GPT(GPTConfig(**d["config"]))
    model.load_state_dict(d["model"])
    return model.to(device) if device is not None else model, tok


__all__ = ["sft_loss", "sft_step_loss", "render", "encode_chat", "encode_chats", "prompt_ids", "exact_match", "sequence_logprob",
           "instruction_set", "make_task", "read_turn", "fact", "KINDS", "USER", "ASSISTANT", "END", "save_run", "load_run",
           "RUNS"]
