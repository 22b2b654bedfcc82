"""One naming scheme across the configs (the old names are gone, not aliased), capture_attention, one LM loss."""
import dataclasses

import pytest
import torch

import tformer
from tformer import MultiHeadAttention, TransformerBlock, capture_attention
from tformer.models import CLIPConfig, GPT, GPTConfig, LSTMConfig, LSTMEncoder, ViT, ViTConfig


@pytest.mark.parametrize("cls", [GPTConfig, LSTMConfig, ViTConfig, tformer.models.BertConfig,
                                 tformer.models.TransformerConfig, tformer.BlockConfig])
def test_every_config_uses_the_papers_names(cls):
    names = {f.name for f in dataclasses.fields(cls)}
    assert "d_model" in names
    assert not names & {"n_embd", "n_layer", "n_head", "n_kv_head", "width", "heads"}


def test_moe_config_holds_only_what_is_moes_own():
    names = {f.name for f in dataclasses.fields(tformer.MoEConfig)}
    assert not names & {"d_model", "activation", "bias", "dropout"}          # the model's, passed by its block
    assert not {f.name for f in dataclasses.fields(GPTConfig)} & {"n_experts", "moe_top_k", "moe_d_ff"}
    with pytest.raises(TypeError, match="n_experts"):
        GPTConfig(n_experts=4)


def test_the_old_names_are_gone():
    with pytest.raises(TypeError, match="n_layer"):
        GPTConfig(n_layer=1)
    with pytest.raises(TypeError, match="n_layer"):
        LSTMEncoder(4, 5, n_layer=2)
    with pytest.raises(TypeError, match="text_width"):
        CLIPConfig(text_width=16)
    assert not hasattr(tformer, "EncoderLayer")
    import importlib
    for old in ("vision", "train", "lm", "lm_data", "gpu", "runtime", "_compat", "images", "decode"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"tformer.{old}")
    for old in ("utils.timing", "utils.flash", "utils.doctor", "inference.cache"):   # moved, not aliased
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"tformer.{old}")


def test_capture_attention_collects_weights_in_call_order_and_restores_the_fast_path():
    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=8, patch_size=4, in_channels=1, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                        n_classes=3)).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad(), capture_attention(vit) as weights:
        out = vit(x)
    assert len(weights) == 2 and weights[0].shape == (2, 2, 5, 5)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(2, 2, 5))
    torch.testing.assert_close(out, vit(x))                                # same outputs either path
    assert all(m._captured is None for m in vit.modules() if isinstance(m, MultiHeadAttention))
    maps = vit.attention_maps(x)
    assert [w.shape for w in maps] == [w.shape for w in weights]
    for a, b in zip(maps, weights):
        torch.testing.assert_close(a, b)
    mha = MultiHeadAttention(16, 4)
    h = torch.randn(1, 3, 16)
    with capture_attention(mha) as w:
        _, ref = mha(h, need_weights=True)
    torch.testing.assert_close(w[0], ref.detach())
    with pytest.raises(ValueError, match="no MultiHeadAttention"):
        with capture_attention(torch.nn.Linear(2, 2)):
            pass


# -- one loss, one loop, one schedule family, one timer -------------------------------------------------
def test_causal_lm_loss_is_the_one_next_token_loss():
    import torch.nn.functional as F
    from tformer.training.losses import causal_lm_loss, lm_loss
    g = torch.Generator().manual_seed(0)
    logits, idx = torch.randn(2, 5, 7, generator=g, dtype=torch.float64), torch.randint(0, 7, (2, 5), generator=g)
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, 7), idx[:, 1:].reshape(-1))
    torch.testing.assert_close(causal_lm_loss(logits, idx), ref)
    torch.testing.assert_close(causal_lm_loss(logits[:, :-1], targets=idx[:, 1:]), ref)
    torch.testing.assert_close(causal_lm_loss(logits[:, :-1], targets=idx[:, 1:], reduction="sum"), ref * 8)
    with pytest.raises(ValueError, match="exactly one of idx"):
        causal_lm_loss(logits, idx, targets=idx)
    with pytest.raises(ValueError, match="same \\(B, T\\)"):
        causal_lm_loss(logits, targets=idx[:, 1:])
    model = GPT(GPTConfig(vocab_size=7, context_length=8, n_layers=1, n_heads=2, d_model=8)).eval()
    total, n = lm_loss(model, (idx[:, :-1], idx[:, 1:]))
    torch.testing.assert_close(total / n, causal_lm_loss(model(idx), idx), rtol=1e-5, atol=1e-6)


def test_cosine_schedule_warms_up_then_follows_a_half_cosine_to_zero():
    import math
    from tformer.training import CosineSchedule
    s = CosineSchedule(warmup=4, total=20)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(12) == pytest.approx(0.5 * (1 + math.cos(math.pi * 8 / 16)))
    assert s(20) == pytest.approx(0.0) and s(25) == pytest.approx(0.0)


def test_image_training_runs_on_the_trainer_and_leaves_the_global_rng_alone():
    from tformer.capstones.vision_training import train_classifier
    from tformer.data.images import ImageSplit
    g = torch.Generator().manual_seed(0)
    data = ImageSplit(torch.randn(20, 1, 8, 8, generator=g), torch.randint(0, 3, (20,), generator=g),
                      torch.randn(6, 1, 8, 8, generator=g), torch.randint(0, 3, (6,), generator=g))
    vit = ViT(ViTConfig(image_size=8, patch_size=4, in_channels=1, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                        n_classes=3))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    hist = train_classifier(vit, data, epochs=2, batch_size=8, progress=False)
    assert len(hist.loss) == 6 and len(hist.test_acc) == 2                  # 3 steps an epoch, 2 epochs
    assert torch.equal(torch.rand(3), expected)                             # the Trainer did not reseed


def test_every_model_builds_its_blocks_from_a_block_config_and_uses_one_set_of_names():
    from tformer.blocks import BlockConfig
    from tformer.models import BERT, CLIP, LSTMLM, BertConfig, Transformer, TransformerConfig
    from tformer.moe import MoEConfig
    gpt = GPT(GPTConfig(vocab_size=16, context_length=8, n_layers=2, n_heads=2, d_model=8,
                        moe=MoEConfig(n_experts=2, top_k=1, layers=(1,))))
    assert [b.cfg for b in gpt.blocks] == [gpt.cfg.block(0), gpt.cfg.block(1)]
    assert gpt.blocks[0].cfg.moe is None and gpt.blocks[1].cfg.moe is gpt.cfg.moe
    bert = BERT(BertConfig(vocab_size=16, context_length=8, d_model=8, n_layers=1, n_heads=2, d_ff=16))
    vit = ViT(ViTConfig(image_size=8, patch_size=4, in_channels=1, d_model=8, n_layers=1, n_heads=2, d_ff=16))
    clip = CLIP(CLIPConfig(image_size=8, patch_size=4, vision_d_model=8, vision_n_layers=1, vision_n_heads=2,
                           vision_d_ff=16, vocab_size=16, context_length=8, text_d_model=8, text_n_layers=1,
                           text_n_heads=2, text_d_ff=16, eos_id=15, embed_dim=4))
    tr = Transformer(TransformerConfig(src_vocab_size=16, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                                       n_decoder_layers=1, norm_first=True))
    for blocks in (gpt.blocks, bert.blocks, vit.blocks, clip.text.blocks, tr.encoder.layers, tr.decoder.layers):
        assert all(isinstance(b.cfg, BlockConfig) for b in blocks)
    lstm = LSTMLM(LSTMConfig(vocab_size=16, d_model=8, n_layers=1))
    for model, names in ((gpt, "tok_embed pos_embed final_norm head"), (lstm, "tok_embed final_norm head"),
                         (tr, "pos_embed head"), (tr.encoder, "final_norm"), (bert, "tok_embed pos_embed embed_norm"),
                         (vit, "pos_embed embed_norm final_norm head"), (clip.text, "tok_embed pos_embed final_norm")):
        for name in names.split():
            assert hasattr(model, name), (type(model).__name__, name)
    with pytest.raises(TypeError, match="BlockConfig"):
        TransformerBlock(8)                                                # the config, not its sizes
