"""A trained tformer GPT as a Hugging Face GPT-2 folder: config.json, model.safetensors, tokenizer files.

    tformer export --to hf runs/ch11 exported/
    transformers.AutoModelForCausalLM.from_pretrained("exported/")     # the same logits

The mapping is `GPT.from_hf_gpt2` run backwards: GPT-2 keeps its Linear weights as Conv1D (in, out), so
each is transposed. GPT-2's format has learned positions, GELU/ReLU FFNs, one key/value head per query
head and dense FFNs; a model with RoPE, SwiGLU, GQA/MQA or MoE cannot be written in it and is refused,
naming the feature (vLLM and TGI load Llama-style folders for those). Models without biases get zero
biases, which compute the same function.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

ACT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def gpt2_incompatibility(cfg) -> str | None:
    """Why GPT-2's format cannot hold a model with this GPTConfig, or None if it can."""
    if cfg.positional != "learned":
        return f"positional={cfg.positional!r} (RoPE): GPT-2 has learned position embeddings only"
    if cfg.activation == "swiglu":
        return "activation='swiglu' (SwiGLU): GPT-2's FFN is one hidden layer with GELU"
    if cfg.activation not in ACT:
        return f"activation={cfg.activation!r}: GPT-2 supports {sorted(ACT)}"
    if cfg.n_kv_heads not in (None, cfg.n_heads):
        return f"n_kv_heads={cfg.n_kv_heads} of n_heads={cfg.n_heads} (GQA/MQA): GPT-2 has one key/value head per query head"
    if cfg.moe is not None:
        return "a mixture of experts (MoE): GPT-2's FFNs are dense"
    return None


def to_hf_gpt2(model, tokenizer, folder) -> Path:
    """Write `model` (a tformer GPT) and `tokenizer` (a `tokenizers.Tokenizer`) as a GPT-2 folder."""
    from safetensors.torch import save_file
    cfg = model.cfg
    why = gpt2_incompatibility(cfg)
    if why:
        raise ValueError(f"cannot export to GPT-2 format: {why}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    d, d_ff = cfg.d_model, cfg.d_ff or 4 * cfg.d_model

    def bias(name, n):
        return sd.get(name, torch.zeros(n))
    out = {"transformer.wte.weight": sd["tok_embed.weight"], "transformer.wpe.weight": sd["pos_embed.weight"],
           "transformer.ln_f.weight": sd["final_norm.weight"], "transformer.ln_f.bias": bias("final_norm.bias", d)}
    names = {"ln_1": ("norm1", d), "ln_2": ("norm2", d), "attn.c_attn": ("attn.qkv", 3 * d),
             "attn.c_proj": ("attn.out", d), "mlp.c_fc": ("ffn.fc1", d_ff), "mlp.c_proj": ("ffn.fc2", d)}
    for i in range(cfg.n_layers):
        for hf, (me, n) in names.items():
            w = sd[f"blocks.{i}.{me}.weight"]
            out[f"transformer.h.{i}.{hf}.weight"] = w.t() if hf.startswith(("attn", "mlp")) else w
            out[f"transformer.h.{i}.{hf}.bias"] = bias(f"blocks.{i}.{me}.bias", n)
    save_file({k: v.contiguous() for k, v in out.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    eos = tokenizer.token_to_id("<|endoftext|>")
    hf_cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
              "n_positions": cfg.context_length, "n_embd": d, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
              "n_inner": d_ff, "activation_function": ACT[cfg.activation], "layer_norm_epsilon": cfg.eps,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
              "scale_attn_weights": True, "tie_word_embeddings": True, "use_cache": True,
              "bos_token_id": eos, "eos_token_id": eos, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"} \
        if eos is not None else {}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.context_length, **special}, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return folder
