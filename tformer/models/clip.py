"""A CLIP-style image-text aligner (Radford et al., 2021) (chapter 12).

    images (B, C, H, W) -> ViT (pre-norm, class token)     -> (B, d_v) -> W_img -> unit vector (B, E)
    text   (B, T) ids   -> causal pre-LN Transformer, pool at the end-of-text token -> W_txt -> (B, E)
    logits_per_image = exp(t) * img @ txt^T     (B_img, B_txt), t a learned log-temperature

Training pulls the N matching pairs of a batch together and pushes the N^2 - N others apart with a
symmetric cross-entropy (InfoNCE) over rows (image -> text) and columns (text -> image). After training,
zero-shot classification is retrieval among captions: "a photo of a {class}" for every class, pick the
most similar. `CLIP.from_hf_clip` loads weights named as in Hugging Face's `CLIPModel`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..dropout import Dropout
from ..utils.checks import check_rank, check_tokens
from ..blocks import BlockConfig, TransformerBlock
from ..positional import LearnedPositionalEmbedding
from .vit import ViT, ViTConfig


@dataclass
class CLIPConfig:
    # image tower (ViT-B/32)
    image_size: int = 224
    patch_size: int = 32
    in_channels: int = 3
    vision_d_model: int = 768
    vision_n_layers: int = 12
    vision_n_heads: int = 12
    vision_d_ff: int = 3072
    # text tower
    vocab_size: int = 49408            # CLIP's BPE vocabulary
    context_length: int = 77           # learned positions
    text_d_model: int = 512
    text_n_layers: int = 12
    text_n_heads: int = 8
    text_d_ff: int = 2048
    eos_id: int | None = 49407         # pool at the first eos_id; None = at the largest id (original CLIP)
    # shared
    embed_dim: int = 512               # joint embedding size E
    activation: str = "quick_gelu"     # x * sigmoid(1.702 x)
    eps: float = 1e-5                  # LayerNorm epsilon
    dropout: float = 0.0
    logit_scale_init: float = math.log(1 / 0.07)   # t: logits are multiplied by exp(t) = 1/temperature
    max_logit_scale: float = 100.0     # exp(t) is clamped here during training (as in CLIP)

    def vision_config(self) -> ViTConfig:
        return ViTConfig(image_size=self.image_size, patch_size=self.patch_size, in_channels=self.in_channels,
                         d_model=self.vision_d_model, n_layers=self.vision_n_layers, n_heads=self.vision_n_heads,
                         d_ff=self.vision_d_ff, n_classes=None, dropout=self.dropout, activation=self.activation,
                         eps=self.eps, pool="cls", embed_norm=True, patch_bias=False)

    def text_block(self) -> BlockConfig:
        """Every text layer's config: pre-LN (causal at run time), the text tower's sizes."""
        return BlockConfig(d_model=self.text_d_model, n_heads=self.text_n_heads, d_ff=self.text_d_ff,
                           dropout=self.dropout, norm_first=True, activation=self.activation, eps=self.eps)


class TextTransformer(nn.Module):
    """CLIP's text tower: token + learned positions, causal pre-LN layers, final LayerNorm.
    (B, T) ids -> (B, T, text_d_model); `pool` picks the end-of-text token of each row."""

    def __init__(self, cfg: CLIPConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.text_d_model)
        self.pos_embed = LearnedPositionalEmbedding(cfg.context_length, cfg.text_d_model)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(cfg.text_block()) for _ in range(cfg.text_n_layers))
        self.final_norm = nn.LayerNorm(cfg.text_d_model, eps=cfg.eps)

    def forward(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_tokens(idx, "text ids")
        t = idx.shape[1]
        if t > self.cfg.context_length:
            raise ValueError(f"CLIP text: {t} tokens exceed context_length={self.cfg.context_length}")
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != idx.shape:
                raise ValueError(f"CLIP text: attention_mask must be (B, T) = {tuple(idx.shape)}, "
                                 f"got {tuple(attention_mask.shape)}")
            if not bool(attention_mask.bool().all()):
                mask = attention_mask.bool()[:, None, None, :]      # (B, 1, 1, T), combined with causal
        x = self.drop(self.pos_embed(self.tok_embed(idx)))
        for block in self.blocks:
            x = block(x, mask, is_causal=True)
        return self.final_norm(x)

    def pool(self, hidden: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (B, d): the hidden state at the end-of-text token (causal: it has read the whole text)."""
        if self.cfg.eos_id is None:
            pos = idx.argmax(dim=-1)
        else:
            is_eos = idx == self.cfg.eos_id
            if not bool(is_eos.any(dim=-1).all()):
                raise ValueError(f"CLIP text: every row needs an end-of-text token (id {self.cfg.eos_id})")
            pos = is_eos.int().argmax(dim=-1)                         # first occurrence
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), pos]


class CLIP(nn.Module):
    """Image tower + text tower + projections + learned temperature.

    `model(images, text)` -> logits_per_image (B_img, B_txt); `encode_image` / `encode_text` give unit
    vectors (B, E); `model.loss(images, text)` is the symmetric contrastive loss of a batch of pairs.
    """

    def __init__(self, cfg: CLIPConfig, visual: ViT | None = None):
        """`visual`: an existing image tower (e.g. a trained ViT, as in LiT) instead of a new one; its
        classification head is dropped and its width must be cfg.vision_d_model."""
        super().__init__()
        self.cfg = cfg
        if visual is not None:
            if visual.cfg.d_model != cfg.vision_d_model:
                raise ValueError(f"CLIP: visual tower width {visual.cfg.d_model} != vision_d_model {cfg.vision_d_model}")
            visual.head = None
        self.visual = visual if visual is not None else ViT(cfg.vision_config())
        self.text = TextTransformer(cfg)
        self.visual_proj = nn.Linear(cfg.vision_d_model, cfg.embed_dim, bias=False)
        self.text_proj = nn.Linear(cfg.text_d_model, cfg.embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(float(cfg.logit_scale_init)))
        for m in (self.text, self.visual_proj, self.text_proj):
            m.apply(ViT._init)
        nn.init.normal_(self.text.tok_embed.weight, std=0.02)
        nn.init.normal_(self.text.pos_embed.weight, std=0.01)

    def encode_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """(B, C, H, W) -> (B, E)."""
        z = self.visual_proj(self.visual(images))
        return F.normalize(z, dim=-1) if normalize else z

    def encode_text(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    normalize: bool = True) -> torch.Tensor:
        """(B, T) ids -> (B, E)."""
        z = self.text_proj(self.text.pool(self.text(idx, attention_mask), idx))
        return F.normalize(z, dim=-1) if normalize else z

    def scale(self) -> torch.Tensor:
        """exp(t): 1 / temperature, clamped at max_logit_scale while training."""
        s = self.logit_scale.exp()
        return s.clamp(max=self.cfg.max_logit_scale) if self.training else s

    def forward(self, images: torch.Tensor, idx: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """logits_per_image (B_img, B_txt) = exp(t) * cosine similarities; its transpose is per text."""
        img, txt = self.encode_image(images), self.encode_text(idx, attention_mask)
        return self.scale() * img @ txt.T

    def loss(self, images: torch.Tensor, idx: torch.Tensor, attention_mask: torch.Tensor | None = None
             ) -> torch.Tensor:
        """Symmetric contrastive loss of B matching (image i, text i) pairs: `clip_loss` of the two towers'
        embeddings at the model's temperature (the logits are `forward`'s, op for op)."""
        return clip_loss(self.encode_image(images, normalize=False),
                         self.encode_text(idx, attention_mask, normalize=False), self.scale())

    @torch.no_grad()
    def class_embeddings(self, prompts: list[torch.Tensor]) -> torch.Tensor:
        """Zero-shot classifier weights: for each class a (n_templates, T) tensor of prompt ids;
        the mean of its prompts' unit text embeddings, renormalised. Returns (n_classes, E)."""
        return F.normalize(torch.stack([self.encode_text(p).mean(dim=0) for p in prompts]), dim=-1)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_hf_clip(cls, model: nn.Module) -> "CLIP":
        """Build a CLIP from a Hugging Face `CLIPModel` (same logits_per_image, text_embeds, image_embeds)."""
        hc = model.config
        tc, vc = hc.text_config, hc.vision_config
        acts = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu"}
        if tc.hidden_act != vc.hidden_act or tc.hidden_act not in acts or tc.layer_norm_eps != vc.layer_norm_eps:
            raise ValueError("CLIP.from_hf_clip: both towers must share a supported activation and LayerNorm eps; "
                             f"got {tc.hidden_act!r}/{vc.hidden_act!r}, eps {tc.layer_norm_eps}/{vc.layer_norm_eps}")
        eos = tc.eos_token_id
        cfg = CLIPConfig(image_size=vc.image_size, patch_size=vc.patch_size, in_channels=vc.num_channels,
                         vision_d_model=vc.hidden_size, vision_n_layers=vc.num_hidden_layers,
                         vision_n_heads=vc.num_attention_heads, vision_d_ff=vc.intermediate_size,
                         vocab_size=tc.vocab_size, context_length=tc.max_position_embeddings,
                         text_d_model=tc.hidden_size, text_n_layers=tc.num_hidden_layers, text_n_heads=tc.num_attention_heads,
                         text_d_ff=tc.intermediate_size, eos_id=None if eos == 2 else eos,  # 2: legacy configs use argmax
                         embed_dim=hc.projection_dim, activation=acts[tc.hidden_act], eps=tc.layer_norm_eps)
        sd = model.state_dict()
        ours = {"logit_scale": sd["logit_scale"],
                "visual_proj.weight": sd["visual_projection.weight"], "text_proj.weight": sd["text_projection.weight"],
                "text.tok_embed.weight": sd["text_model.embeddings.token_embedding.weight"],
                "text.pos_embed.weight": sd["text_model.embeddings.position_embedding.weight"],
                "text.final_norm.weight": sd["text_model.final_layer_norm.weight"],
                "text.final_norm.bias": sd["text_model.final_layer_norm.bias"],
                "visual.cls_token": sd["vision_model.embeddings.class_embedding"].view(1, 1, -1),
                "visual.pos_embed": sd["vision_model.embeddings.position_embedding.weight"].unsqueeze(0),
                "visual.patch_embed.proj.weight": sd["vision_model.embeddings.patch_embedding.weight"]}
        for t in ("weight", "bias"):
            ours[f"visual.embed_norm.{t}"] = sd[f"vision_model.pre_layrnorm.{t}"]
            ours[f"visual.final_norm.{t}"] = sd[f"vision_model.post_layernorm.{t}"]
        for tower, me, n in (("text_model", "text", cfg.text_n_layers), ("vision_model", "visual", cfg.vision_n_layers)):
            for i in range(n):
                p, m = f"{tower}.encoder.layers.{i}.", f"{me}.blocks.{i}."
                for t in ("weight", "bias"):
                    ours[m + f"attn.qkv.{t}"] = torch.cat([sd[p + f"self_attn.{x}_proj.{t}"] for x in "qkv"])
                    ours[m + f"attn.out.{t}"] = sd[p + f"self_attn.out_proj.{t}"]
                    ours[m + f"norm1.{t}"] = sd[p + f"layer_norm1.{t}"]
                    ours[m + f"norm2.{t}"] = sd[p + f"layer_norm2.{t}"]
                    ours[m + f"ffn.fc1.{t}"] = sd[p + f"mlp.fc1.{t}"]
                    ours[m + f"ffn.fc2.{t}"] = sd[p + f"mlp.fc2.{t}"]
        clip = cls(cfg)
        clip.load_state_dict(ours, strict=True)
        return clip


def contrastive_logits_loss(logits_per_image: torch.Tensor) -> torch.Tensor:
    """Symmetric cross-entropy of an (N, N) similarity matrix whose diagonal holds the matching pairs:
    (CE over rows, image -> text, + CE over columns, text -> image) / 2."""
    check_rank(logits_per_image, 2, "contrastive_logits_loss(logits)", "(N images, N texts)")
    n = logits_per_image.shape[0]
    if logits_per_image.shape[1] != n:
        raise ValueError(f"contrastive loss: needs N matching pairs, a square (N, N) matrix; got {tuple(logits_per_image.shape)}")
    target = torch.arange(n, device=logits_per_image.device)
    return (F.cross_entropy(logits_per_image, target) + F.cross_entropy(logits_per_image.T, target)) / 2


def clip_loss(image_emb: torch.Tensor, text_emb: torch.Tensor, logit_scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE. image_emb (N, E), text_emb (N, E) (row i of each is a matching pair), logit_scale
    = 1/temperature. Both are L2-normalised, logits = logit_scale * img @ txt^T, loss = mean of the two
    cross-entropies (rows: image -> text; columns: text -> image)."""
    check_rank(image_emb, 2, "clip_loss(image_emb)", "(N, E)")
    check_rank(text_emb, 2, "clip_loss(text_emb)", "(N, E)")
    if image_emb.shape != text_emb.shape:
        raise ValueError(f"clip_loss: image_emb {tuple(image_emb.shape)} and text_emb {tuple(text_emb.shape)} "
                         "must both be (N, E)")
    logits = logit_scale * F.normalize(image_emb, dim=-1) @ F.normalize(text_emb, dim=-1).T
    return contrastive_logits_loss(logits)
