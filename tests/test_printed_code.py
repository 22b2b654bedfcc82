"""The printed code is the code that runs.

Every chapter prints the package's version of what the learner built, and its prose names who calls
it ("the `Trainer`'s noam schedule calls it", "which `CLIP.loss` calls", "what `tformer` runs"). Each
case below patches the printed function with a spy that records the call and then runs the real
function, runs the caller the prose names, and asserts that the spy was called. A caller that has its
own copy of the printed code fails here.
"""
from __future__ import annotations

import importlib

import torch

import tformer


class Spy:
    """Replace `module.name` (a function, or a method when `module` is a class) with a wrapper that
    counts its calls and runs the original."""

    def __init__(self, monkeypatch, module, name: str):
        module = importlib.import_module(module) if isinstance(module, str) else module
        original = getattr(module, name)
        self.calls = 0

        def spy(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)


def tiny_transformer():
    from tformer.models import Transformer, TransformerConfig
    torch.manual_seed(0)
    return Transformer(TransformerConfig(src_vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                         n_decoder_layers=1, dropout=0.0, context_length=16))


def tiny_gpt():
    from tformer.models import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, context_length=16, n_layers=1, n_heads=2, d_model=16))


def src_tgt():
    src = torch.tensor([[4, 5, 6, 2, 0], [7, 8, 9, 10, 2]])
    tgt = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    return src, tgt


# -- chapters 1-6: "what you wrote is what tformer runs" ----------------------------------------------
def test_ch01_reference_attention_runs_in_multi_head_attention(monkeypatch):
    spy = Spy(monkeypatch, "tformer.attention", "scaled_dot_product_attention")
    mha = tformer.MultiHeadAttention(16, 2, fast=False)           # the reference path (the fast one: fused SDPA)
    mha(torch.randn(2, 5, 16))
    assert spy.calls == 1


def test_ch03_split_and_merge_heads_run_in_multi_head_attention(monkeypatch):
    split = Spy(monkeypatch, "tformer.attention", "split_heads")
    merge = Spy(monkeypatch, "tformer.attention", "merge_heads")
    tformer.MultiHeadAttention(16, 2)(torch.randn(2, 5, 16))
    assert split.calls == 3 and merge.calls == 1                  # q, k, v split; the heads merged once


def test_ch04_sinusoidal_table_builds_the_transformers_positions(monkeypatch):
    spy = Spy(monkeypatch, "tformer.positional", "sinusoidal_table")
    tiny_transformer()
    assert spy.calls >= 1


def test_ch05_feed_forward_and_block_forward_run_in_the_encoder(monkeypatch):
    from tformer.blocks import FeedForward, TransformerBlock
    ffn = Spy(monkeypatch, FeedForward, "forward")
    block = Spy(monkeypatch, TransformerBlock, "forward")
    tiny_transformer()(*src_tgt())
    assert block.calls >= 1 and ffn.calls >= 1


def test_ch06_masks_run_in_the_transformer(monkeypatch):
    causal = Spy(monkeypatch, "tformer.attention", "causal_mask")
    padding = Spy(monkeypatch, "tformer.models.transformer", "padding_mask")
    model = tiny_transformer()
    for m in model.modules():                                      # the reference path builds the full mask
        if isinstance(m, tformer.MultiHeadAttention):
            m.fast = False
    model(*src_tgt())
    assert causal.calls >= 1 and padding.calls >= 1


# -- chapters 8, 9 --------------------------------------------------------------------------------------
def test_ch08_rope_frequencies_build_the_rotary_embedding(monkeypatch):
    spy = Spy(monkeypatch, "tformer.positional", "rope_frequencies")
    tformer.positional.RotaryEmbedding(8, max_len=16, scaling="yarn", factor=2.0)
    assert spy.calls == 1


def test_ch09_online_softmax_step_runs_in_tiled_attention(monkeypatch):
    spy = Spy(monkeypatch, "tformer.efficient", "online_softmax_step")
    q = torch.randn(1, 2, 8, 4)
    tformer.efficient.tiled_attention(q, q, q, is_causal=True, block=4)
    assert spy.calls >= 2                                          # one call per key block


# -- chapter 10 -----------------------------------------------------------------------------------------
def test_ch10_the_trainers_noam_schedule_calls_noam_lr(monkeypatch):
    from tformer.training import TrainConfig, Trainer
    spy = Spy(monkeypatch, "tformer.training.schedules", "noam_lr")
    model = torch.nn.Linear(3, 1)
    data = [(torch.randn(4, 3), torch.randn(4, 1))]
    trainer = Trainer(model, lambda m, b: (((m(b[0]) - b[1]) ** 2).sum(), 4), data,
                      TrainConfig(max_steps=3, schedule="noam", warmup=2, progress=False), device="cpu")
    before = spy.calls                                             # LambdaLR sets the first lr at construction
    trainer.fit()
    assert before >= 1 and spy.calls > before


def test_ch10_seq2seq_loss_trains_the_course_model_with_the_fused_head(monkeypatch):
    from tformer.data.batching import Seq2SeqBatch
    from tformer.translate.pipeline import Seq2SeqLoss
    spy = Spy(monkeypatch, "tformer.training.losses", "linear_cross_entropy")
    src, tgt = src_tgt()
    loss_sum, count = Seq2SeqLoss(0.1, 0)(tiny_transformer(), Seq2SeqBatch(src, tgt, torch.roll(tgt, -1, 1)))
    assert spy.calls == 1 and loss_sum.dim() == 0 and int(count) > 0


# -- chapter 11 -----------------------------------------------------------------------------------------
def test_ch11_train_bpe_merges_with_merge(monkeypatch):
    from tformer.data import bpe
    spy = Spy(monkeypatch, bpe, "merge")
    bpe.train_bpe(["low lower lowest newer wider " * 4], vocab_size=len(bpe.byte_alphabet()) + 6)
    assert spy.calls >= 1


def test_ch11_sample_next_chains_the_filters(monkeypatch):
    from tformer import sampling
    spies = [Spy(monkeypatch, sampling, n) for n in ("apply_repetition_penalty", "top_k_filter", "top_p_filter")]
    sampling.sample_next(torch.randn(2, 10), temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.3,
                       idx=torch.tensor([[1, 2], [3, 4]]), generator=torch.Generator().manual_seed(0))
    assert [s.calls for s in spies] == [1, 1, 1]


# -- chapter 12 -----------------------------------------------------------------------------------------
def test_ch12_clip_loss_is_what_clip_loss_method_calls(monkeypatch):
    from tformer.models.clip import CLIP, CLIPConfig
    spy = Spy(monkeypatch, "tformer.models.clip", "clip_loss")
    torch.manual_seed(0)
    cfg = CLIPConfig(image_size=8, patch_size=4, in_channels=1, vision_d_model=16, vision_n_layers=1, vision_n_heads=2,
                     vision_d_ff=32, vocab_size=20, context_length=6, text_d_model=16, text_n_layers=1,
                     text_n_heads=2, text_d_ff=32, eos_id=2, embed_dim=8)
    model = CLIP(cfg)
    images, ids = torch.randn(3, 1, 8, 8), torch.tensor([[5, 6, 2, 0, 0, 0], [7, 8, 9, 2, 0, 0], [4, 2, 0, 0, 0, 0]])
    loss = model.loss(images, ids)
    assert spy.calls == 1
    target = torch.arange(3)                                       # and it is the loss of forward's logits
    logits = model(images, ids)
    ref = (torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.T, target)) / 2
    torch.testing.assert_close(loss, ref)


# -- chapter 13 (MoE) -----------------------------------------------------------------------------------
# PLACE FOR THE MoE CASE: `top_k_route` via `MoE.forward` (and `load_balancing_loss` via the MoE layer's
# auxiliary loss), as chapter 13's "What `tformer.moe` runs" says. Added with the change that makes
# MoE.forward call top_k_route (until then MoE.forward keeps its own copy of the gating).


# -- chapter 14 -----------------------------------------------------------------------------------------
def test_ch14_the_kv_cache_append_runs_in_cached_generation(monkeypatch):
    from tformer.cache import KVCache
    spy = Spy(monkeypatch, KVCache, "append")
    tiny_gpt().generate(torch.tensor([[1, 2, 3]]), 3, temperature=0.0)
    assert spy.calls >= 3


def test_ch14_speculative_generate_uses_speculative_accept(monkeypatch):
    from tformer.inference import speculative
    spy = Spy(monkeypatch, speculative, "speculative_accept")
    target, draft = tiny_gpt(), tiny_gpt()
    speculative.speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), 4, k=2, temperature=1.0,
                                     generator=torch.Generator().manual_seed(0))
    assert spy.calls >= 1


def test_ch14_quantize_model_uses_quantize_int8(monkeypatch):
    from tformer.inference import quantize
    spy = Spy(monkeypatch, quantize, "quantize_int8")
    quantize.quantize_model(tiny_gpt(), bits=8)
    assert spy.calls >= 1


# -- one way to build learned positions -----------------------------------------------------------------
def test_learned_positions_are_one_module_in_every_text_model():
    """GPT, the encoder-decoder (learned option), BERT and CLIP's text tower add learned positions
    with `tformer.positional.LearnedPositionalEmbedding` (ViT keeps a (1, N+1, d) parameter, the layout
    of its pretrained checkpoints, added the same way)."""
    from tformer.models import BERT, BertConfig
    from tformer.models.clip import TextTransformer, CLIPConfig
    from tformer.positional import LearnedPositionalEmbedding
    models = [tiny_gpt(), BERT(BertConfig(vocab_size=20, context_length=8, n_layers=1, n_heads=2, d_model=16, d_ff=32)),
              TextTransformer(CLIPConfig(vocab_size=20, context_length=8, text_d_model=16, text_n_layers=1,
                                         text_n_heads=2, text_d_ff=32))]
    for m in models:
        kinds = [type(mod) for mod in m.modules() if isinstance(mod, (LearnedPositionalEmbedding, torch.nn.Embedding))]
        assert LearnedPositionalEmbedding in kinds, type(m).__name__
        assert sum(k is LearnedPositionalEmbedding for k in kinds) == 1
