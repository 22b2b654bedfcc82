"""CLIP (chapter 12) against Hugging Face transformers' CLIPModel built from a small random config; the
symmetric contrastive loss; a few-step training smoke test on digit images and captions."""
import math

import pytest
import torch
import torch.nn.functional as F

from tformer.models import CLIP, CLIPConfig, ViT, ViTConfig
from tformer.models.clip import clip_loss, contrastive_logits_loss
from tformer.data.captions import caption_ids, digit_captions
from tformer.data.images import load_digits

transformers = pytest.importorskip("transformers")


def hf_clip(eos_token_id=49, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=16, eos_token_id=eos_token_id,
                         bos_token_id=1, pad_token_id=0),
        vision_config=dict(image_size=8, patch_size=2, num_channels=3, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64),
        projection_dim=16)
    return transformers.CLIPModel(cfg).eval()


def text_inputs(eos=49, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(3, 45, (4, 10), generator=g)
    lengths = [10, 7, 4, 9]
    mask = torch.zeros(4, 10, dtype=torch.long)
    for i, n in enumerate(lengths):
        idx[i, n - 1] = eos                                   # end-of-text, then padding
        idx[i, n:] = 0
        mask[i, :n] = 1
    return idx, mask


@pytest.mark.parametrize("eos", [49, 2])                      # 2: the legacy "argmax" pooling
def test_matches_hf_clip_model(eos):
    hf = hf_clip(eos)
    ours = CLIP.from_hf_clip(hf).eval()
    idx, mask = text_inputs(eos if eos != 2 else 49)          # legacy: the eos is the largest id
    images = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=idx, pixel_values=images, attention_mask=mask, return_loss=False)
        torch.testing.assert_close(ours.encode_image(images), ref.image_embeds, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours.encode_text(idx, mask), ref.text_embeds, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours(images, idx, mask), ref.logits_per_image, atol=1e-4, rtol=1e-4)


def test_loss_matches_hf_contrastive_loss():
    hf = hf_clip(seed=3)
    ours = CLIP.from_hf_clip(hf).eval()
    idx, mask = text_inputs()
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(input_ids=idx, pixel_values=images, attention_mask=mask, return_loss=True).loss
        torch.testing.assert_close(ours.loss(images, idx, mask), ref, atol=1e-5, rtol=1e-4)


def test_clip_loss_float64_reference():
    g = torch.Generator().manual_seed(0)
    img, txt = torch.randn(5, 8, generator=g, dtype=torch.float64), torch.randn(5, 8, generator=g, dtype=torch.float64)
    a, b = img / img.norm(dim=1, keepdim=True), txt / txt.norm(dim=1, keepdim=True)
    logits = 10.0 * a @ b.T
    i2t = -torch.log_softmax(logits, dim=1).diagonal().mean()
    t2i = -torch.log_softmax(logits, dim=0).diagonal().mean()
    torch.testing.assert_close(clip_loss(img, txt, 10.0), (i2t + t2i) / 2)
    assert clip_loss(img, img, 50.0) < clip_loss(img, txt, 50.0)  # matching pairs give a small loss


def test_bad_input_errors():
    with pytest.raises(ValueError, match="square"):
        contrastive_logits_loss(torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"\(N, E\)"):
        clip_loss(torch.randn(3, 4), torch.randn(2, 4), 1.0)
    m = CLIP(CLIPConfig(image_size=8, patch_size=4, in_channels=1, vision_d_model=16, vision_n_layers=1, vision_n_heads=2,
                        vision_d_ff=32, vocab_size=20, context_length=6, text_d_model=16, text_n_layers=1, text_n_heads=2,
                        text_d_ff=32, eos_id=2, embed_dim=8))
    with pytest.raises(ValueError, match="end-of-text"):
        m.encode_text(torch.full((1, 4), 5))
    with pytest.raises(ValueError, match="context_length"):
        m.encode_text(torch.full((1, 7), 2))


def test_temperature_is_learned_and_clamped():
    m = CLIP(CLIPConfig(image_size=8, patch_size=4, in_channels=1, vision_d_model=16, vision_n_layers=1, vision_n_heads=2,
                        vision_d_ff=32, vocab_size=20, context_length=6, text_d_model=16, text_n_layers=1, text_n_heads=2,
                        text_d_ff=32, eos_id=2, embed_dim=8))
    assert math.isclose(m.scale().item(), 1 / 0.07, rel_tol=1e-5)
    assert m.logit_scale.requires_grad
    with torch.no_grad():
        m.logit_scale.fill_(10.0)
    assert m.train().scale().item() == pytest.approx(100.0)


def test_digit_caption_training_smoke():
    torch.manual_seed(0)
    data = load_digits()
    x, y = data.x_train[:64], data.y_train[:64]
    g = torch.Generator().manual_seed(0)
    cfg = CLIPConfig(image_size=8, patch_size=2, in_channels=1, vision_d_model=32, vision_n_layers=1, vision_n_heads=4,
                     vision_d_ff=64, vocab_size=259, context_length=48, text_d_model=32, text_n_layers=1, text_n_heads=4,
                     text_d_ff=64, eos_id=2, embed_dim=16)
    model = CLIP(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for step in range(12):
        txt = caption_ids(digit_captions(y, generator=g), cfg.context_length)
        loss = model.loss(x, txt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3


def test_caption_word_dropout_keeps_the_class_and_is_reproducible():
    from tformer.data.captions import TRAIN_TEMPLATES
    from tformer.data.images import DIGIT_NAMES
    y = torch.arange(10).repeat(20)
    plain = digit_captions(y, generator=torch.Generator().manual_seed(3))
    assert digit_captions(y, generator=torch.Generator().manual_seed(3), word_dropout=0.0) == plain
    drop = digit_captions(y, generator=torch.Generator().manual_seed(3), word_dropout=0.5)
    assert drop == digit_captions(y, generator=torch.Generator().manual_seed(3), word_dropout=0.5)
    full = {t.format(name=DIGIT_NAMES[c], digit=c) for t in TRAIN_TEMPLATES for c in range(10)}
    assert sum(c not in full for c in drop) > 50                   # wordings the templates never had
    for cap, c in zip(drop, y.tolist()):                           # the class always survives, nothing else added
        assert DIGIT_NAMES[c] in cap or str(c) in cap
        assert len(cap.split(" ")) <= max(len(p.split(" ")) for p in plain)
    assert all(len(c.split(" ")) == 1 for c in digit_captions(y[:30], generator=torch.Generator().manual_seed(0),
                                                               word_dropout=1.0) if c.isalpha())


def test_given_image_tower_is_used_and_head_dropped():
    vit = ViT(ViTConfig(image_size=8, patch_size=2, in_channels=1, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                        n_classes=10))
    cfg = CLIPConfig(image_size=8, patch_size=2, in_channels=1, vision_d_model=16, vocab_size=20, context_length=6,
                     text_d_model=16, text_n_layers=1, text_n_heads=2, text_d_ff=32, eos_id=2, embed_dim=8)
    m = CLIP(cfg, visual=vit)
    assert m.visual is vit and vit.head is None
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(m.encode_image(x), F.normalize(m.visual_proj(vit.encode(x)[:, 0]), dim=-1))
    with pytest.raises(ValueError, match="vision_d_model"):
        CLIP(CLIPConfig(vision_d_model=32, vocab_size=20, context_length=6, text_d_model=16, text_n_layers=1, text_n_heads=2,
                        text_d_ff=32, embed_dim=8), visual=vit)


# -- real image-caption pairs through `datasets` (a local imagefolder stands in for Flickr8k) ------------
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}


def write_caption_folder(folder, per_colour=6):
    """An "imagefolder" dataset: PNGs of different sizes plus metadata.jsonl with two caption columns,
    the layout `datasets` reads locally and the parquet sets on the hub (Flickr8k) carry."""
    import json

    from PIL import Image
    g = torch.Generator().manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, rgb in COLOURS.items():
        for i in range(per_colour):
            w, h = 20 + 4 * i, 16 + 2 * i                                        # not square, not the target size
            noise = torch.randint(-20, 21, (h, w, 3), generator=g)
            px = (torch.tensor(rgb) + noise).clamp(0, 255).to(torch.uint8).numpy()
            Image.fromarray(px).save(folder / f"{name}_{i}.png")
            rows.append({"file_name": f"{name}_{i}.png", "caption_0": f"a {name} square",
                         "caption_1": f"something {name}"})
    (folder / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_image_captions_load_through_datasets_and_a_clip_learns_them(tmp_path):
    from tformer.capstones.vision_training import train_clip
    from tformer.data.images import load_image_captions
    from tformer.training.metrics import retrieval_recall
    write_caption_folder(tmp_path / "caps" / "train")
    data = load_image_captions(str(tmp_path / "caps"), split="train", image_size=8)
    assert data.images.shape == (24, 3, 8, 8) and data.images.dtype == torch.float32
    assert sorted(data.captions[0]) == sorted({c for c in data.captions[0]}) and len(data.captions[0]) == 2
    assert {c for caps in data.captions for c in caps} >= {"a red square", "something blue"}
    red = [i for i, caps in enumerate(data.captions) if "a red square" in caps]
    assert data.images[red, 0].mean() > data.images[red, 2].mean()              # the red channel dominates
    torch.manual_seed(0)
    cfg = CLIPConfig(image_size=8, patch_size=4, in_channels=3, vision_d_model=32, vision_n_layers=1, vision_n_heads=2,
                     vision_d_ff=64, vocab_size=259, context_length=24, text_d_model=32, text_n_layers=1,
                     text_n_heads=2, text_d_ff=64, eos_id=2, embed_dim=16)
    model = CLIP(cfg)
    before = retrieval_recall(model, data, ks=(1, 5))
    hist = train_clip(model, data, epochs=40, batch_size=8, lr=3e-3, progress=False)
    after = retrieval_recall(model, data, ks=(1, 5))
    first, last = sum(hist.loss[:6]) / 6, sum(hist.loss[-6:]) / 6
    assert last < 0.7 * first, f"CLIP loss should fall on colour/caption pairs: {first:.3f} -> {last:.3f}"
    # six images share each caption, so once colours align a caption's own image is among 6 near-ties:
    # text->image R@5 tops out near 5/6 (chance: 5/24)
    assert after["t2i@5"] >= 0.75 and after["t2i@5"] > before["t2i@5"] + 0.4, (before, after)


def test_image_captions_say_what_to_do_offline(tmp_path, monkeypatch):
    from tformer.data import DataUnavailableError
    from tformer.data.images import load_image_captions
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataUnavailableError, match="digit_captions"):
        load_image_captions("tformer-tests/no-such-caption-set")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("no images here")
    with pytest.raises((DataUnavailableError, ValueError)):
        load_image_captions(str(tmp_path / "empty"))
