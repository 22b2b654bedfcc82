"""Run folders: a trained GPT and its tokenizer, saved so that `tformer serve --run` and `tformer export` find them.

    RUN/config.json         {"model": "gpt", "gpt_config": {GPTConfig's fields}, ...anything else the saver adds}
    RUN/model.safetensors   the model's state_dict (the tied LM head stored once)
    RUN/tokenizer.json      a Hugging Face `tokenizers` file

    save_gpt_run("runs/ch11", model, tok, extra={"chapter": 11})
    model, tok, config = load_gpt_run("runs/ch11")
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

FORMAT = "gpt"


def gpt_config_dict(cfg) -> dict:
    """GPTConfig -> plain JSON-able dict (nested dataclasses such as an MoE config become dicts)."""
    return dataclasses.asdict(cfg)


def gpt_config_from_dict(d: dict):
    """The inverse of `gpt_config_dict`; lists back to tuples, a nested `moe` dict back to MoEConfig."""
    from ..models.gpt import GPTConfig
    names = {f.name for f in dataclasses.fields(GPTConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"gpt_config: unknown fields {unknown} (this tformer's GPTConfig has {sorted(names)})")
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    if isinstance(kw.get("moe"), dict):
        from ..moe import MoEConfig
        kw["moe"] = MoEConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in kw["moe"].items()})
    return GPTConfig(**kw)


def save_gpt_run(folder, model, tokenizer, extra: dict | None = None) -> Path:
    """Write a run folder: config.json, model.safetensors, tokenizer.json (a `tokenizers.Tokenizer`)."""
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "head.weight"}
    save_file(sd, str(folder / "model.safetensors"))
    tokenizer.save(str(folder / "tokenizer.json"))
    cfg = {"model": FORMAT, "gpt_config": gpt_config_dict(model.cfg), **(extra or {})}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return folder


def load_gpt_run(folder, device: str | torch.device = "cpu"):
    """Read a run folder -> (GPT in eval mode, tokenizers.Tokenizer, the config dict)."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from ..models.gpt import GPT
    folder = Path(folder)
    missing = [n for n in ("config.json", "model.safetensors", "tokenizer.json") if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: not a run folder (expected config.json, model.safetensors and "
                                f"tokenizer.json; missing {', '.join(missing)})")
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("model") != FORMAT or "gpt_config" not in cfg:
        raise ValueError(f"{folder}/config.json: expected {{\"model\": \"gpt\", \"gpt_config\": {{...}}}}, "
                         f"got model={cfg.get('model')!r}")
    model = GPT(gpt_config_from_dict(cfg["gpt_config"]))
    sd = load_file(str(folder / "model.safetensors"))
    sd["head.weight"] = sd["tok_embed.weight"]
    model.load_state_dict(sd)
    return model.to(device).eval(), Tokenizer.from_file(str(folder / "tokenizer.json")), cfg


def load_hf(folder, device: str | torch.device = "cpu"):
    """A local Hugging Face GPT-2-format folder (config.json, weights, tokenizer.json) -> (GPT, Tokenizer)."""
    from tokenizers import Tokenizer
    from transformers import GPT2LMHeadModel

    from ..models.gpt import GPT
    folder = Path(folder)
    if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder}: expected a GPT-2-format folder with config.json and tokenizer.json")
    hf = GPT2LMHeadModel.from_pretrained(str(folder), local_files_only=True)
    return GPT.from_hf_gpt2(hf).to(device).eval(), Tokenizer.from_file(str(folder / "tokenizer.json"))


def byte_tokenizer():
    """The course's byte-level tokenizer with no merges: 256 byte tokens + <|endoftext|> (id 0), built offline."""
    from ..data.text import train_tokenizer
    return train_tokenizer(["demo"], vocab_size=257)


@torch.no_grad()
def context_init_(model, gain: float = 2.0):
    """Redraw a random GPT's block matrices at gain / sqrt(fan_in), in place; returns the model.

    At GPT-2's small init a tied-embedding model mostly repeats its last input token whatever attention
    reads: a demo that answers "bbbb..." shows little, and a test that its outputs equal a reference's
    proves little. With larger block weights each next token depends on the context."""
    for w in model.blocks.parameters():
        if w.dim() == 2:
            w.normal_(0, gain / w.shape[1] ** 0.5)
    return model


def demo_model(seed: int = 0, n_layers: int = 2, d_model: int = 64, n_heads: int = 4, context_length: int = 256,
               dtype: torch.dtype = torch.float32):
    """A small randomly initialised GPT with the byte-level tokenizer, for trying the server (seconds, offline);
    its blocks drawn by `context_init_`, so its answers depend on the prompt."""
    from ..models.gpt import GPT, GPTConfig
    tok = byte_tokenizer()
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=tok.get_vocab_size(), context_length=context_length, n_layers=n_layers,
                          n_heads=n_heads, d_model=d_model))
    return context_init_(model).to(dtype).eval(), tok
