"""The Vision Transformer (Dosovitskiy et al., 2020): an image is a sequence of patches (chapter 12).

    images (B, C, H, W) -> p x p patches, each flattened and projected: (B, N, d), N = (H/p)(W/p)
      -> prepend a learned [class] token, add learned positions: (B, N+1, d)
      -> N x pre-LN TransformerBlock (bidirectional) -> LayerNorm -> head on the class token: (B, n_classes)

"An image is worth 16x16 words": the paper's ViT-B/16 cuts a 224x224 image into 14 x 14 = 196 patches
of 16 x 16 pixels. The projection of flattened patches is a Conv2d with kernel = stride = p (the same
matrix, one matmul per patch); `patchify` shows the flattening explicitly.

`ViT.from_hf_vit` loads weights named as in Hugging Face's `ViTModel` / `ViTForImageClassification`
(both the classic `encoder.layer.N.attention.attention.query` names and the newer `layers.N.attention.q_proj`).
The same class, with `embed_norm=True`, `patch_bias=False`, quick-GELU and eps 1e-5, is CLIP's image tower.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..dropout import Dropout
from ..utils.checks import check_float, check_rank
from ..attention import capture_attention
from ..blocks import BlockConfig, TransformerBlock


@dataclass
class ViTConfig:
    image_size: int = 224              # square images, image_size x image_size pixels
    patch_size: int = 16               # p: each p x p patch becomes one token (16 in the paper)
    in_channels: int = 3               # RGB
    d_model: int = 768                 # ViT-Base width
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072                   # FFN width (4 * d_model)
    n_classes: int | None = 1000       # classification head size; None = no head (features only)
    dropout: float = 0.0               # residual / attention / embedding dropout
    activation: str = "gelu"           # "quick_gelu" for CLIP
    eps: float = 1e-12                 # LayerNorm epsilon (Hugging Face ViT: 1e-12, CLIP: 1e-5)
    pool: str = "cls"                  # "cls": head reads the class token (ViT); "mean": average of all tokens
    embed_norm: bool = False           # a LayerNorm on the embeddings, before the blocks (CLIP's `pre_layrnorm`)
    patch_bias: bool = True            # bias in the patch projection (CLIP: False)

    def block(self) -> BlockConfig:
        """Every layer's config: pre-LN, this model's sizes."""
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, dropout=self.dropout,
                           norm_first=True, activation=self.activation, eps=self.eps)

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.grid ** 2


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut images into non-overlapping patches: (B, C, H, W) -> (B, N, C * p * p).

    Patches are listed row by row (left to right, top to bottom), N = (H/p)(W/p); each patch is
    flattened channel first, then rows, then columns, the order of a Conv2d weight (d, C, p, p), so
    `patchify(x, p) @ conv.weight.flatten(1).T + conv.bias` equals the patch embedding.
    """
    check_rank(images, 4, "patchify(images)", "(B, C, H, W)")
    b, c, h, w = images.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"patchify: image size {h}x{w} is not a multiple of patch_size={p}")
    x = images.reshape(b, c, h // p, p, w // p, p)               # (B, C, gh, p, gw, p)
    x = x.permute(0, 2, 4, 1, 3, 5)                               # (B, gh, gw, C, p, p)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


class PatchEmbedding(nn.Module):
    """(B, C, H, W) -> (B, N, d): a linear map of each flattened p x p patch (a strided Conv2d)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        if cfg.image_size % cfg.patch_size:
            raise ValueError(f"ViTConfig: image_size={cfg.image_size} must be a multiple of patch_size={cfg.patch_size}")
        self.proj = nn.Conv2d(cfg.in_channels, cfg.d_model, cfg.patch_size, stride=cfg.patch_size, bias=cfg.patch_bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)        # (B, d, gh, gw) -> (B, N, d)


class ViT(nn.Module):
    """Vision Transformer. `model(images)`: (B, C, H, W) -> logits (B, n_classes), or pooled features
    (B, d_model) when `n_classes` is None. `model.encode(images)` gives every token, (B, N+1, d_model)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        if cfg.pool not in ("cls", "mean"):
            raise ValueError(f"ViTConfig.pool must be 'cls' or 'mean', got {cfg.pool!r}")
        self.cfg = cfg
        self.patch_embed = PatchEmbedding(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.n_patches + 1, cfg.d_model))   # learned positions
        self.drop = Dropout(cfg.dropout)
        self.embed_norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps) if cfg.embed_norm else nn.Identity()
        self.blocks = nn.ModuleList(TransformerBlock(cfg.block()) for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes) if cfg.n_classes else None
        self.apply(self._init)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def _check(self, images: torch.Tensor) -> None:
        c, s = self.cfg.in_channels, self.cfg.image_size
        check_rank(images, 4, "ViT(images)", f"(B, C={c}, H={s}, W={s})")
        check_float(images, "ViT(images)")
        if tuple(images.shape[1:]) != (c, s, s):
            raise ValueError(f"ViT: expected images (B, {c}, {s}, {s}), got {tuple(images.shape)}")

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> tokens (B, N+1, d): [class] token + patch embeddings, plus positions."""
        self._check(images)
        x = self.patch_embed(images)                                # (B, N, d)
        cls = self.cls_token.expand(x.shape[0], -1, -1)             # (B, 1, d)
        x = torch.cat([cls, x], dim=1) + self.pos_embed             # (B, N+1, d)
        return self.embed_norm(self.drop(x))

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, N+1, d) after the final LayerNorm (Hugging Face's `last_hidden_state`)."""
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N+1, d) -> (B, d): the class token, or the mean over all tokens."""
        return tokens[:, 0] if self.cfg.pool == "cls" else tokens.mean(dim=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        z = self.pool(self.encode(images))                          # (B, d)
        return self.head(z) if self.head is not None else z

    @torch.no_grad()
    def attention_maps(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Attention weights of every layer: a list of n_layers tensors (B, n_heads, N+1, N+1)."""
        was_training = self.training
        self.eval()
        try:
            with capture_attention(self) as weights:
                self.encode(images)
            return weights
        finally:
            self.train(was_training)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_hf_vit(cls, model: nn.Module) -> "ViT":
        """Build a ViT from a Hugging Face `ViTModel` or `ViTForImageClassification` (same outputs:
        `encode` = last_hidden_state, `forward` = logits for the classifier; ViTModel's tanh pooler is
        not part of this model and is ignored)."""
        hf = model.config
        act = {"gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu", "quick_gelu": "quick_gelu"}.get(hf.hidden_act)
        if act is None:
            raise ValueError(f"ViT.from_hf_vit: unsupported activation {hf.hidden_act!r}")
        sd = model.state_dict()
        head = "classifier.weight" in sd
        sd = {k.removeprefix("vit."): v for k, v in sd.items()}
        cfg = ViTConfig(image_size=hf.image_size, patch_size=hf.patch_size, in_channels=hf.num_channels,
                        d_model=hf.hidden_size, n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads,
                        d_ff=hf.intermediate_size, n_classes=sd["classifier.weight"].shape[0] if head else None,
                        activation=act, eps=hf.layer_norm_eps)
        ours = {"cls_token": sd["embeddings.cls_token"], "pos_embed": sd["embeddings.position_embeddings"],
                "patch_embed.proj.weight": sd["embeddings.patch_embeddings.projection.weight"],
                "patch_embed.proj.bias": sd["embeddings.patch_embeddings.projection.bias"],
                "final_norm.weight": sd["layernorm.weight"], "final_norm.bias": sd["layernorm.bias"]}
        if head:
            ours["head.weight"], ours["head.bias"] = sd["classifier.weight"], sd["classifier.bias"]
        new_names = any(k.startswith("layers.") for k in sd)
        for i in range(cfg.n_layers):
            if new_names:                                            # transformers >= 5 layout
                p = f"layers.{i}."
                q, k, v, o = (p + f"attention.{n}_proj" for n in "qkvo")
                fc1, fc2 = p + "mlp.fc1", p + "mlp.fc2"
            else:                                                    # classic layout (hub checkpoints)
                p = f"encoder.layer.{i}."
                q, k, v = (p + f"attention.attention.{n}" for n in ("query", "key", "value"))
                o, fc1, fc2 = p + "attention.output.dense", p + "intermediate.dense", p + "output.dense"
            me = f"blocks.{i}."
            for t in ("weight", "bias"):
                ours[me + f"attn.qkv.{t}"] = torch.cat([sd[f"{q}.{t}"], sd[f"{k}.{t}"], sd[f"{v}.{t}"]], dim=0)
                ours[me + f"attn.out.{t}"] = sd[f"{o}.{t}"]
                ours[me + f"ffn.fc1.{t}"] = sd[f"{fc1}.{t}"]
                ours[me + f"ffn.fc2.{t}"] = sd[f"{fc2}.{t}"]
                ours[me + f"norm1.{t}"] = sd[p + f"layernorm_before.{t}"]
                ours[me + f"norm2.{t}"] = sd[p + f"layernorm_after.{t}"]
        vit = cls(cfg)
        vit.load_state_dict(ours, strict=True)
        return vit

