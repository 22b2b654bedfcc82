"""The Llama- and Qwen3-style GPT against Hugging Face: `GPTConfig.llama` / `GPTConfig.qwen3` (RoPE, SwiGLU,
GQA, RMSNorm, no biases, an untied head; Qwen3's RMSNorm on queries and keys and an explicit head size)
loaded from `LlamaForCausalLM` / `Qwen3ForCausalLM` built from random-init configs: the same logits, and
greedy generation through the KV cache gives the same tokens as `generate`."""
import pytest
import torch

from tformer.models import GPT, GPTConfig

transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def hf_model(kind: str, **extra):
    """A tiny random-init Hugging Face model; weights drawn wider than HF's init so the logits differ."""
    if kind == "llama":
        cfg = transformers.LlamaConfig(**SIZES, rms_norm_eps=1e-6, rope_theta=10000.0, **extra)
        model = transformers.LlamaForCausalLM(cfg)
    else:   # Qwen3: a head size of its own (4 x 32 = 128 query features at width 64), q_norm / k_norm
        cfg = transformers.Qwen3Config(**SIZES, head_dim=32, rms_norm_eps=1e-6, rope_theta=1e6, **extra)
        model = transformers.Qwen3ForCausalLM(cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    return model.eval()


LOADERS = {"llama": GPT.from_hf_llama, "qwen3": GPT.from_hf_qwen3}


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_same_logits_as_hugging_face(kind):
    hf = hf_model(kind)
    ours = LOADERS[kind](hf).eval()
    assert ours.cfg.norm == "rmsnorm" and ours.cfg.activation == "swiglu" and not ours.cfg.bias
    assert ours.cfg.qk_norm == (kind == "qwen3") and ours.cfg.n_kv_heads == 2
    assert ours.head.weight.data_ptr() != ours.tok_embed.weight.data_ptr()      # untied, as HF's
    idx = torch.randint(0, 97, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_generation_with_the_cache_equals_hugging_face(kind):
    hf = hf_model(kind)
    ours = LOADERS[kind](hf)
    idx = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(2))
    hf.generation_config.eos_token_id = None                           # never stop early: 20 tokens each
    theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=20, do_sample=False,
                         pad_token_id=0)
    mine = ours.generate(idx, 20, temperature=0.0, use_cache=True)
    assert torch.equal(mine, theirs)
    assert len(set(mine[0, 6:].tolist())) > 3                          # a real continuation, not one token


def test_tied_embeddings_load_tied():
    hf = hf_model("llama", tie_word_embeddings=True)
    ours = GPT.from_hf_llama(hf).eval()
    assert ours.head.weight.data_ptr() == ours.tok_embed.weight.data_ptr()
    idx = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, atol=1e-5, rtol=1e-5)


def test_what_the_config_cannot_express_is_refused():
    with pytest.raises(ValueError, match="attention_bias"):
        GPT.from_hf_llama(hf_model("llama", attention_bias=True))
    with pytest.raises(ValueError, match="rope_scaling"):
        GPT.from_hf_llama(hf_model("llama", rope_scaling={"rope_type": "linear", "factor": 2.0}))


def test_the_presets_and_an_explicit_head_size():
    cfg = GPTConfig.qwen3(vocab_size=50, d_model=48, n_heads=4, n_kv_heads=1, head_dim=24, n_layers=1,
                          context_length=32)
    assert (cfg.positional, cfg.activation, cfg.norm, cfg.bias, cfg.tie_embeddings) == (
        "rope", "swiglu", "rmsnorm", False, False)
    assert cfg.qk_norm and cfg.rope_base == 1e6 and cfg.head_dim == 24
    attn = GPT(cfg).blocks[0].attn
    assert attn.qkv.weight.shape == (4 * 24 + 2 * 24, 48) and attn.out.weight.shape == (48, 4 * 24)
    assert GPTConfig(d_model=64, n_heads=4).head_dim == 16                 # GPT-2: d_model / n_heads
    with pytest.raises(ValueError, match="head_dim"):
        GPTConfig(d_model=50, n_heads=4)
