"""ViT (chapter 12) against Hugging Face transformers' ViTModel / ViTForImageClassification built from small
random configs; patchify vs the Conv2d patch embedding; attention maps; a few-step training smoke test."""
import pytest
import torch

from tformer.models import ViT, ViTConfig
from tformer.models.vit import patchify
from tformer.data.augment import random_affine
from tformer.capstones.vision_training import train_classifier
from tformer.data.images import load_digits
from tformer.training.metrics import recall_at_k

transformers = pytest.importorskip("transformers")


def hf_config(**kw):
    base = dict(image_size=8, patch_size=2, num_channels=3, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=64, num_labels=5)
    base.update(kw)
    return transformers.ViTConfig(**base)


def images(b=3, c=3, s=8, seed=0):
    return torch.randn(b, c, s, s, generator=torch.Generator().manual_seed(seed))


def test_matches_hf_vit_model():
    torch.manual_seed(0)
    hf = transformers.ViTModel(hf_config()).eval()
    ours = ViT.from_hf_vit(hf).eval()
    assert ours.head is None
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(x), hf(pixel_values=x).last_hidden_state, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("patch,channels,act", [(2, 3, "gelu"), (4, 1, "gelu_new")])
def test_matches_hf_vit_for_image_classification(patch, channels, act):
    torch.manual_seed(1)
    hf = transformers.ViTForImageClassification(hf_config(patch_size=patch, num_channels=channels, hidden_act=act)).eval()
    ours = ViT.from_hf_vit(hf).eval()
    x = images(c=channels, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(pixel_values=x).logits, atol=1e-5, rtol=1e-4)


def test_loads_classic_hf_checkpoint_names():
    """Hub checkpoints use encoder.layer.N.attention.attention.query...; a renamed state_dict must load too."""
    torch.manual_seed(2)
    hf = transformers.ViTForImageClassification(hf_config()).eval()
    sd = hf.state_dict()
    if not any(".layers." in k for k in sd):
        pytest.skip("this transformers version already uses the classic names")
    classic = {}
    for k, v in sd.items():
        k = (k.replace("vit.layers.", "vit.encoder.layer.").replace("attention.q_proj", "attention.attention.query")
             .replace("attention.k_proj", "attention.attention.key").replace("attention.v_proj", "attention.attention.value")
             .replace("attention.o_proj", "attention.output.dense").replace("mlp.fc1", "intermediate.dense")
             .replace("mlp.fc2", "output.dense"))
        classic[k] = v

    class Wrapper(torch.nn.Module):
        config = hf.config

        def state_dict(self):
            return classic
    ours = ViT.from_hf_vit(Wrapper()).eval()
    x = images(seed=2)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(pixel_values=x).logits, atol=1e-5, rtol=1e-4)


def test_patchify_is_the_conv_patch_embedding():
    m = ViT(ViTConfig(image_size=12, patch_size=4, in_channels=3, d_model=16, n_layers=1, n_heads=2, d_ff=32))
    x = images(2, 3, 12, seed=3)
    p = patchify(x, 4)
    assert p.shape == (2, 9, 48)
    torch.testing.assert_close(p[0, 1], x[0, :, 0:4, 4:8].reshape(-1))   # patch 1: first row, second column
    conv = m.patch_embed.proj
    torch.testing.assert_close(p @ conv.weight.flatten(1).T + conv.bias, m.patch_embed(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        patchify(torch.randn(1, 3, 10, 10), 4)


def test_bad_input_errors():
    m = ViT(ViTConfig(image_size=8, patch_size=2, in_channels=1, d_model=16, n_layers=1, n_heads=2, d_ff=32, n_classes=3))
    with pytest.raises(ValueError, match=r"\(B, 1, 8, 8\)"):
        m(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="4 dims"):
        m(torch.randn(8, 8))
    with pytest.raises(ValueError, match="multiple of patch_size"):
        ViT(ViTConfig(image_size=9, patch_size=2))


def test_attention_maps_rows_sum_to_one_and_match_forward():
    torch.manual_seed(0)
    m = ViT(ViTConfig(image_size=8, patch_size=2, in_channels=1, d_model=16, n_layers=2, n_heads=2, d_ff=32, n_classes=3))
    x = images(2, 1, 8, seed=4)
    before = m.eval()(x)
    maps = m.attention_maps(x)
    assert len(maps) == 2 and maps[0].shape == (2, 2, 17, 17)
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(2, 2, 17))
    torch.testing.assert_close(m(x), before)                              # recording leaves the model unchanged


def test_random_affine_and_recall():
    x = images(4, 1, 8, seed=5)
    same = random_affine(x, shift=0.0, degrees=0.0, scale=0.0)
    torch.testing.assert_close(same, x, atol=1e-5, rtol=1e-5)             # identity transform
    moved = random_affine(x, generator=torch.Generator().manual_seed(0))
    assert moved.shape == x.shape and not torch.allclose(moved, x)
    sim = torch.tensor([[0.9, 0.1, 0.0], [0.5, 0.4, 0.3], [0.3, 0.2, 0.1]])
    assert recall_at_k(sim, 1) == pytest.approx(1 / 3) and recall_at_k(sim, 2) == pytest.approx(2 / 3)
    labels = torch.tensor([0, 1, 1])                                      # with labels: any same-label item
    assert recall_at_k(sim, 1, labels, labels) == pytest.approx(1 / 3)
    assert recall_at_k(sim, 1, labels, torch.tensor([1, 0, 0])) == pytest.approx(2 / 3)


def test_digits_training_smoke():
    torch.manual_seed(0)
    data = load_digits()
    assert data.x_train.shape == (1347, 1, 8, 8) and data.x_test.shape == (450, 1, 8, 8)
    m = ViT(ViTConfig(image_size=8, patch_size=2, in_channels=1, d_model=64, n_layers=2, n_heads=4, d_ff=128,
                      n_classes=10))
    hist = train_classifier(m, data, epochs=2, batch_size=32, lr=3e-3, progress=False)
    assert len(hist.loss) == 86 and len(hist.test_acc) == 2
    assert sum(hist.loss[-5:]) / 5 < sum(hist.loss[:5]) / 5
    assert hist.test_acc[-1] > 0.15                                         # chance is 0.1


def test_batches_augment_on_the_training_device_with_the_same_draws():
    """A batch moves to the training device before `random_affine` (a GPU augments on the GPU); the draws come
    from the same CPU generator, so the batches are those of a CPU run. Autocast only on CUDA."""
    from tformer.capstones import vision_training as vt
    x, y = images(10, 1, 8, seed=3), torch.arange(10)
    aug = lambda b, generator: random_affine(b, shift=2.0, degrees=5.0, scale=0.1, flip=True, generator=generator)
    plain = list(vt.ImageBatches(x, y, 4, torch.Generator().manual_seed(0), aug))
    moved = list(vt.ImageBatches(x, y, 4, torch.Generator().manual_seed(0), aug, device=torch.device("cpu")))
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(plain, moved))
    assert vt._batch_device("cpu") is None and vt._batch_device(None) is None
    assert vt._batch_device("cuda:0") == torch.device("cuda", 0)
    assert vt._on_cuda("cuda") and not vt._on_cuda("cpu") and not vt._on_cuda("mps")
