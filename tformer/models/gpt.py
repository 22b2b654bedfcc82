"""A decoder-only language model in the style of GPT-2, or of Llama and Qwen3 (chapters 11, 13, 14).

    idx (B, T) -> token + position embeddings -> N x pre-LN block (causal) -> LayerNorm -> logits (B, T, V)

The output projection `head` is the token embedding matrix `tok_embed` (tied) unless
`tie_embeddings=False`. `GPTConfig.llama(...)` and `GPTConfig.qwen3(...)` switch on the modern recipe:
RoPE, SwiGLU, RMSNorm, no biases, GQA, an untied head (and Qwen3's RMSNorm on queries and keys);
`GPT.from_hf_llama` / `GPT.from_hf_qwen3` load Hugging Face's `LlamaForCausalLM` / `Qwen3ForCausalLM`. With `moe=MoEConfig(...)`
the FFN of the chosen blocks (`MoEConfig.layers`) is a mixture of experts (`tformer.moe.MoE`, chapter 13);
after each forward `model.aux_loss` holds their load-balancing + z losses to add to the LM loss, and
`num_params(active=True)` counts the parameters one token uses. `GPT.from_hf_gpt2` loads weights named as
in Hugging Face's `GPT2LMHeadModel`, so the course's own model can run real GPT-2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..dropout import Dropout
from ..utils.checks import check_tokens
from ..blocks import BlockConfig, TransformerBlock, make_norm
from ..cache import KVCache, make_caches
from ..moe import MoE, MoEConfig, collect_aux_loss
from ..moe.dispatch import Experts
from ..positional import LearnedPositionalEmbedding, RotaryEmbedding
from ..sampling import sample_next


@dataclass
class GPTConfig:
    vocab_size: int = 50257            # GPT-2's byte-level BPE vocabulary
    context_length: int = 1024         # context length the model is trained for
    n_layers: int = 12                 # transformer blocks
    n_heads: int = 12                  # attention heads
    n_kv_heads: int | None = None      # None = n_heads (MHA); fewer = GQA, 1 = MQA
    d_model: int = 768                 # model width d
    d_ff: int | None = None            # FFN width; None = 4 * d_model
    dropout: float = 0.0
    bias: bool = True                  # biases in Linear and LayerNorm (GPT-2: True)
    activation: str = "gelu_tanh"      # GPT-2's GELU; "swiglu" for the Llama-style FFN
    eps: float = 1e-5                  # the norm's epsilon
    norm: str = "layernorm"            # "layernorm" (GPT-2) or "rmsnorm" (Llama, Qwen)
    head_dim: int | None = None        # attention head size; None = d_model // n_heads (Qwen3: 128 at any width)
    qk_norm: bool = False              # RMSNorm on each query and key head (Qwen3)
    tie_embeddings: bool = True        # the LM head is the token embedding matrix (GPT-2); False: its own
    positional: str = "learned"        # "learned" (GPT-2) or "rope"
    rope_base: float = 10000.0
    rope_scaling: str | None = None    # None, "linear", "ntk", "yarn" (chapter 8)
    rope_factor: float = 1.0
    moe: MoEConfig | None = None       # mixture of experts (chapter 13); None keeps every FFN dense

    def __post_init__(self):
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"GPTConfig: n_heads={self.n_heads} must divide d_model={self.d_model} "
                                 "(or give head_dim)")
            self.head_dim = self.d_model // self.n_heads

    @classmethod
    def llama(cls, **sizes) -> "GPTConfig":
        """A Llama-style model: RoPE, SwiGLU, RMSNorm (eps 1e-6), no biases, an untied head; GQA where
        `n_kv_heads` < `n_heads`. `sizes` are GPTConfig's own fields (and may override any of these)."""
        return cls(**{**dict(positional="rope", activation="swiglu", norm="rmsnorm", eps=1e-6, bias=False,
                             tie_embeddings=False), **sizes})

    @classmethod
    def qwen3(cls, **sizes) -> "GPTConfig":
        """A Qwen3-style model: Llama's recipe with RMSNorm on queries and keys and RoPE base 10^6."""
        return cls.llama(**{**dict(qk_norm=True, rope_base=1e6), **sizes})

    def moe_layer_ids(self) -> list[int]:
        """Indices of the blocks whose FFN is a mixture of experts (none without `moe`)."""
        if self.moe is None:
            return []
        ids = list(range(self.n_layers)) if self.moe.layers is None else sorted(set(self.moe.layers))
        if any(not 0 <= i < self.n_layers for i in ids):
            raise ValueError(f"MoEConfig.layers must index blocks 0..{self.n_layers - 1}, got {self.moe.layers}")
        return ids

    def block(self, i: int = 0) -> BlockConfig:
        """Block i's config: pre-LN, this model's sizes, and `moe` where block i is an MoE layer."""
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff or 4 * self.d_model,
                           dropout=self.dropout, norm_first=True, activation=self.activation,
                           n_kv_heads=self.n_kv_heads, bias=self.bias, eps=self.eps, norm=self.norm,
                           head_dim=self.head_dim, qk_norm=self.qk_norm,
                           moe=self.moe if i in self.moe_layer_ids() else None)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positional == "learned":
            self.pos_embed, self.rope = LearnedPositionalEmbedding(cfg.context_length, cfg.d_model), None
        elif cfg.positional == "rope":
            self.pos_embed = None
            self.rope = RotaryEmbedding(cfg.head_dim, cfg.context_length, cfg.rope_base, cfg.rope_scaling,
                                        cfg.rope_factor, original_max_len=cfg.context_length)
        else:
            raise ValueError(f"GPTConfig.positional must be 'learned' or 'rope', got {cfg.positional!r}")
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(cfg.block(i)) for i in range(cfg.n_layers))
        self.final_norm = make_norm(cfg.norm, cfg.d_model, cfg.eps, cfg.bias)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_embed.weight                   # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():                      # GPT-2: scale residual projections
            if name.endswith(("attn.out.weight", "ffn.fc2.weight", "ffn.experts.fc2")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers))

    @property
    def aux_loss(self) -> torch.Tensor | float:
        """The MoE layers' auxiliary losses of the last forward, summed (`tformer.moe.collect_aux_loss`);
        0.0 for a dense model."""
        return collect_aux_loss(self)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, Experts):
            for w in (m.fc1, m.gate, m.fc2):
                if w is not None:
                    nn.init.normal_(w, 0.0, 0.02)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif isinstance(m, LearnedPositionalEmbedding):
            nn.init.normal_(m.weight, 0.0, 0.01)

    def forward(self, idx: torch.Tensor, cache: list[KVCache] | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab_size). With `cache`, idx holds only new tokens.

        positions (B, T): each token's position, each row its own (the serving engine's step, whose
        sequences are at different lengths); None = the tokens follow what the cache holds."""
        return self.head(self.final_norm(self._trunk(idx, cache, positions)))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, chunk: int = 256,
             reduction: str = "mean") -> torch.Tensor:
        """Mean (or "sum") next-token cross-entropy of idx (B, T) against targets (B, T) (already shifted:
        targets[:, t] follows idx[:, t]): F.cross_entropy(self(idx).flatten(0, 1), targets.flatten()), with the
        LM head fused into the loss (tformer.training.losses.linear_cross_entropy), so the (B*T, vocab) logits
        are never kept: at GPT-2's vocabulary they are most of a small model's training step."""
        from ..training.losses import linear_cross_entropy
        h = self.final_norm(self._trunk(idx, None))                        # (B, T, d)
        return linear_cross_entropy(h.flatten(0, 1), self.head.weight, targets.flatten(),
                                    ignore_index=ignore_index, chunk=chunk, reduction=reduction)

    def _trunk(self, idx: torch.Tensor, cache: list[KVCache] | None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> the last block's output (B, T, d): embeddings, positions, the blocks."""
        check_tokens(idx, "idx")
        past = cache[0].length if cache is not None and positions is None else 0
        t = idx.shape[1]
        if positions is not None and positions.shape != idx.shape:
            raise ValueError(f"GPT: positions must have idx's shape {tuple(idx.shape)}, got {tuple(positions.shape)}")
        if self.pos_embed is not None and positions is None and past + t > self.cfg.context_length:
            raise ValueError(f"GPT: {past + t} positions exceed context_length={self.cfg.context_length} "
                             "(learned positions exist only up to context_length; crop the input)")
        x = self.tok_embed(idx)                                            # (B, T, d)
        if self.pos_embed is not None:
            x = self.pos_embed(x, past, positions)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, is_causal=True, rope=self.rope, cache=cache[i] if cache is not None else None,
                      positions=positions)
        return x

    def num_params(self, non_embedding: bool = False, active: bool = False) -> int:
        """Parameters (the tied LM head counted once). non_embedding: without position embeddings.
        active: what one token uses, counting k of the E experts in each MoE layer (dense: all)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.pos_embed is not None:
            n -= self.pos_embed.weight.numel()
        if active:
            for b in self.blocks:
                if isinstance(b.ffn, MoE):
                    total, act = b.ffn.params_total_active()
                    n -= total - act
        return n

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 use_cache: bool = True, generator: torch.Generator | None = None, top_p: float | None = None,
                 repetition_penalty: float = 1.0) -> torch.Tensor:
        """Append `max_new_tokens` tokens to idx (B, T); returns (B, T + max_new_tokens).

        temperature=0 is greedy decoding; top_k, top_p and repetition_penalty as in `tformer.sampling.sample_next`.
        With the cache each step feeds only the newest token; once the sequence outgrows context_length the
        model slides a window over the last context_length tokens (no cache), the same as use_cache=False.
        """
        check_tokens(idx, "idx")
        was_training = self.training
        self.eval()
        limit = self.cfg.context_length
        cache = make_caches(self.cfg.n_layers, limit) if use_cache and idx.shape[1] <= limit else None
        inp = idx
        for _ in range(max_new_tokens):
            if cache is not None and cache[0].length + inp.shape[1] > limit:
                cache, inp = None, idx                                # past the context: sliding window
            logits = self(inp if cache is not None else idx[:, -limit:], cache)[:, -1, :]  # (B, V)
            nxt = sample_next(logits, temperature, top_k, generator, top_p=top_p,
                              repetition_penalty=repetition_penalty, idx=idx)
            idx = torch.cat([idx, nxt], dim=1)
            inp = nxt
        self.train(was_training)
        return idx

    @classmethod
    def from_hf_gpt2(cls, model_or_state_dict, n_heads: int | None = None) -> "GPT":
        """Build a GPT from a Hugging Face `GPT2LMHeadModel` / `GPT2Model` or its state_dict.

        A state_dict does not record the number of heads: pass `n_heads` with it.
        """
        if isinstance(model_or_state_dict, nn.Module):
            hf_cfg = model_or_state_dict.config
            sd = model_or_state_dict.state_dict()
            n_heads = hf_cfg.n_head
            eps = hf_cfg.layer_norm_epsilon
            act = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                   "relu": "relu"}[hf_cfg.activation_function]
        else:
            sd, eps, act = dict(model_or_state_dict), 1e-5, "gelu_tanh"
            if n_heads is None:
                raise ValueError("GPT.from_hf_gpt2: a state_dict does not say how many heads; pass n_heads=")
        sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
        n_layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h."))
        vocab, d = sd["wte.weight"].shape
        cfg = GPTConfig(vocab_size=vocab, context_length=sd["wpe.weight"].shape[0], n_layers=n_layers, n_heads=n_heads,
                        d_model=d, d_ff=sd["h.0.mlp.c_fc.weight"].shape[1], eps=eps, activation=act)
        model = cls(cfg)
        ours = {"tok_embed.weight": sd["wte.weight"], "pos_embed.weight": sd["wpe.weight"],
                "final_norm.weight": sd["ln_f.weight"], "final_norm.bias": sd["ln_f.bias"]}
        names = {"ln_1": "norm1", "ln_2": "norm2", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.out",
                 "mlp.c_fc": "ffn.fc1", "mlp.c_proj": "ffn.fc2"}
        for i in range(n_layers):
            for hf, me in names.items():
                w, b = sd[f"h.{i}.{hf}.weight"], sd[f"h.{i}.{hf}.bias"]
                ours[f"blocks.{i}.{me}.weight"] = w.t() if hf.startswith(("attn", "mlp")) else w  # Conv1D is (in, out)
                ours[f"blocks.{i}.{me}.bias"] = b
        ours["head.weight"] = ours["tok_embed.weight"]
        missing, unexpected = model.load_state_dict(ours, strict=False)
        if missing or unexpected:
            raise ValueError(f"GPT.from_hf_gpt2: missing {missing}, unexpected {unexpected}")
        return model

    @classmethod
    def from_hf_llama(cls, model) -> "GPT":
        """Build a GPT from a Hugging Face `LlamaForCausalLM` (RoPE without scaling, SiLU, no biases)."""
        return cls._from_hf_llama_like(model, "from_hf_llama", qk_norm=False)

    @classmethod
    def from_hf_qwen3(cls, model) -> "GPT":
        """Build a GPT from a Hugging Face `Qwen3ForCausalLM` (Llama's layout plus q_norm / k_norm)."""
        return cls._from_hf_llama_like(model, "from_hf_qwen3", qk_norm=True)

    @classmethod
    def _from_hf_llama_like(cls, model, who: str, qk_norm: bool) -> "GPT":
        c = model.config
        # RoPE's settings: `rope_parameters` in transformers 5, `rope_theta` / `rope_scaling` before
        rope = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
        rope.setdefault("rope_theta", getattr(c, "rope_theta", 10000.0))
        unsupported = [f"{k}={getattr(c, k, None)!r}" for k, ok in (
            ("hidden_act", getattr(c, "hidden_act", "silu") == "silu"),
            ("rope_scaling", rope.get("rope_type", "default") == "default"),
            ("attention_bias", not getattr(c, "attention_bias", False)),
            ("mlp_bias", not getattr(c, "mlp_bias", False))) if not ok]
        if unsupported:
            raise ValueError(f"GPT.{who}: this model uses what GPTConfig does not: {', '.join(unsupported)}")
        cfg = GPTConfig.llama(vocab_size=c.vocab_size, context_length=c.max_position_embeddings,
                              n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads,
                              n_kv_heads=c.num_key_value_heads, d_model=c.hidden_size, d_ff=c.intermediate_size,
                              head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                              eps=c.rms_norm_eps, rope_base=rope["rope_theta"], qk_norm=qk_norm,
                              tie_embeddings=bool(getattr(c, "tie_word_embeddings", False)))
        sd = model.state_dict()
        ours = {"tok_embed.weight": sd["model.embed_tokens.weight"], "final_norm.weight": sd["model.norm.weight"],
                "head.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"])}
        for i in range(cfg.n_layers):
            hf, me = f"model.layers.{i}.", f"blocks.{i}."
            ours[me + "attn.qkv.weight"] = torch.cat([sd[hf + f"self_attn.{x}_proj.weight"] for x in "qkv"])
            names = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2", "self_attn.o_proj": "attn.out",
                     "mlp.gate_proj": "ffn.fc1", "mlp.up_proj": "ffn.gate", "mlp.down_proj": "ffn.fc2"}
            if qk_norm:
                names.update({"self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm"})
            for theirs, mine in names.items():
                ours[me + mine + ".weight"] = sd[hf + theirs + ".weight"]
        gpt = cls(cfg)
        missing, unexpected = gpt.load_state_dict(ours, strict=False)
        if missing or unexpected:
            raise ValueError(f"GPT.{who}: missing {missing}, unexpected {unexpected}")
        return gpt
