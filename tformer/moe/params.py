"""The parameters of published mixture-of-experts LMs, counted from their configurations (chapter 13):
Qwen3-MoE, Mixtral and DeepSeek-V3 (with MLA and its shared experts); `tests/test_moe.py` checks the
counts against `transformers`' own models."""
from __future__ import annotations


def moe_lm_param_counts(vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                        head_dim: int, num_experts: int, experts_per_token: int, expert_ffn: int,
                        tie_embeddings: bool = False, qk_norm: bool = True, attention_bias: bool = False,
                        gated: bool = True) -> dict[str, int]:
    """Total and active (per token) parameters of a decoder-only MoE LM of the Qwen3-MoE / Mixtral layout.

    Per layer: q/k/v/o projections (GQA), RMSNorms (2 per layer, + q/k norms if `qk_norm`), a router
    (hidden x E) and E SwiGLU experts (3 matrices hidden x expert_ffn; 2 if not `gated`); plus token
    embeddings, a final norm and the LM head (untied unless `tie_embeddings`).
    """
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    attn = hidden_size * q + 2 * hidden_size * kv + q * hidden_size
    if attention_bias:
        attn += q + 2 * kv
    norms = 2 * hidden_size + (2 * head_dim if qk_norm else 0)
    expert = (3 if gated else 2) * hidden_size * expert_ffn
    router = hidden_size * num_experts
    embed = vocab_size * hidden_size
    head = 0 if tie_embeddings else vocab_size * hidden_size
    shared = embed + head + hidden_size + num_layers * (attn + norms + router)   # used by every token
    total = shared + num_layers * num_experts * expert
    active = shared + num_layers * experts_per_token * expert
    return {"total": total, "active": active, "experts": num_layers * num_experts * expert,
            "attention": num_layers * attn, "embeddings": embed + head}


# Qwen3-235B-A22B, from its published config.json (huggingface.co/Qwen/Qwen3-235B-A22B).
QWEN3_235B_A22B = dict(vocab_size=151936, hidden_size=4096, num_layers=94, num_heads=64, num_kv_heads=4,
                       head_dim=128, num_experts=128, experts_per_token=8, expert_ffn=1536,
                       tie_embeddings=False, qk_norm=True)

# Mixtral-8x7B, from its published config.json (huggingface.co/mistralai/Mixtral-8x7B-v0.1): "46.7B total,
# 12.9B active".
MIXTRAL_8X7B = dict(vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                    head_dim=128, num_experts=8, experts_per_token=2, expert_ffn=14336,
                    tie_embeddings=False, qk_norm=False)


# DeepSeek-V3, from its published config.json (huggingface.co/deepseek-ai/DeepSeek-V3) and the technical
# report (arXiv:2412.19437): "671B total, 37B activated"; the 685B checkpoint adds a 14B MTP module.
DEEPSEEK_V3 = dict(vocab_size=129280, hidden_size=7168, num_hidden_layers=61, first_k_dense_replace=3,
                   intermediate_size=18432, num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256,
                   n_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=2048)


def mla_params(c: dict) -> int:
    """One multi-head latent attention block (DeepSeek-V2/V3), with keys as in their config.json: query
    down-projection, norm and up-projection; joint key-value down-projection (+ the shared RoPE key), norm
    and up-projection; output projection."""
    d, h, r_q, r_kv = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    qk_dim = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    query = d * r_q + r_q + r_q * h * qk_dim
    key_value = d * (r_kv + c["qk_rope_head_dim"]) + r_kv + r_kv * h * (c["qk_nope_head_dim"] + c["v_head_dim"])
    return query + key_value + h * c["v_head_dim"] * d


def deepseek_v3_param_counts(c: dict) -> dict[str, int]:
    """Total and active parameters of a DeepSeek-V3-layout LM from its config.json keys (e.g. `DEEPSEEK_V3`).

    Every layer: MLA and two RMSNorms; the first `first_k_dense_replace` a dense SwiGLU FFN, the others a
    router, `n_shared_experts` shared experts (every token) and `n_routed_experts` routed SwiGLU experts
    (`num_experts_per_tok` per token); untied input and output embeddings and a final norm. `mtp`: the
    multi-token-prediction module (one more MoE layer, a 2d -> d projection, two norms and its own copy of
    the embedding and head), which is in the checkpoint but not in the reported total. The routers' bias
    terms (buffers, not trained by gradient) are not counted.
    """
    d, n_layers, n_dense = c["hidden_size"], c["num_hidden_layers"], c["first_k_dense_replace"]
    expert = 3 * d * c["moe_intermediate_size"]                           # one SwiGLU expert
    n_moe = n_layers - n_dense
    embeddings = 2 * c["vocab_size"] * d
    every_token = (embeddings + d                                          # embeddings, head, final norm
                   + n_layers * (mla_params(c) + 2 * d)                    # attention and its norms
                   + n_dense * 3 * d * c["intermediate_size"]              # dense FFNs
                   + n_moe * (c["n_routed_experts"] * d + c["n_shared_experts"] * expert))   # routers, shared
    moe_layer = (mla_params(c) + 2 * d + c["n_routed_experts"] * d
                 + (c["n_routed_experts"] + c["n_shared_experts"]) * expert)
    return {"total": every_token + n_moe * c["n_routed_experts"] * expert,
            "active": every_token + n_moe * c["num_experts_per_tok"] * expert,
            "embeddings": embeddings, "attention": n_layers * mla_params(c),
            "mtp": moe_layer + 2 * d * d + 2 * d + embeddings}
