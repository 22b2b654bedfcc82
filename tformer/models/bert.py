"""A BERT-style bidirectional encoder (Devlin et al., 2018) with its pretraining and adaptation heads (chapter 11).

    idx (B, T) -> token + position + segment embeddings -> LayerNorm -> N x post-LN TransformerBlock
      -> hidden (B, T, d)
         -> MLM head: dense + GELU + LayerNorm + (tied) output embedding -> logits (B, T, V)
         -> pooler: tanh(dense(hidden[:, 0]))  ([CLS])    -> classifier -> (B, n_classes)

Every token sees every other token (no causal mask), so BERT cannot be trained to predict the next token;
it is pretrained with masked-language modelling instead (`tformer.data.text.mask_tokens`: 15% of the tokens
are chosen, 80% of those become [MASK], 10% a random token, 10% stay) and then adapted with a small head
(`BertClassifier`). `BERT.from_hf_bert` loads weights named as in Hugging Face's `BertModel` /
`BertForMaskedLM` / `BertForSequenceClassification`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..dropout import Dropout
from ..utils.checks import check_tokens
from ..activations import ACTIVATIONS
from ..blocks import BlockConfig, TransformerBlock
from ..masks import padding_mask
from ..positional import LearnedPositionalEmbedding


@dataclass
class BertConfig:
    vocab_size: int = 30522            # BERT's WordPiece vocabulary
    context_length: int = 512          # learned positions
    type_vocab_size: int = 2           # segments A / B (sentence pairs)
    d_model: int = 768                 # BERT-Base width
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    dropout: float = 0.1               # embeddings, attention, residual
    activation: str = "gelu"           # exact (erf) GELU
    eps: float = 1e-12                 # LayerNorm epsilon
    pad_id: int = 0                    # [PAD]: masked out of attention when no attention_mask is given

    def block(self) -> BlockConfig:
        """Every layer's config: post-LN, biases, this model's sizes."""
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, dropout=self.dropout,
                           norm_first=False, activation=self.activation, eps=self.eps)


class BERT(nn.Module):
    """Bidirectional encoder. `model(idx)`: (B, T) ids -> hidden states (B, T, d_model).

    `mlm_logits(hidden)` -> (B, T, V) and `pool(hidden)` -> (B, d_model) are the two heads.
    """

    def __init__(self, cfg: BertConfig):
        super().__init__()
        if cfg.activation not in ACTIVATIONS:
            raise ValueError(f"BertConfig.activation must be one of {sorted(ACTIVATIONS)}, got {cfg.activation!r}")
        self.cfg = cfg
        d = cfg.d_model
        self.tok_embed = nn.Embedding(cfg.vocab_size, d)
        self.pos_embed = LearnedPositionalEmbedding(cfg.context_length, d)
        self.type_embed = nn.Embedding(cfg.type_vocab_size, d)
        self.embed_norm = nn.LayerNorm(d, eps=cfg.eps)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(cfg.block()) for _ in range(cfg.n_layers))
        self.pooler = nn.Linear(d, d)                               # [CLS] -> tanh(W h + b)
        self.mlm_dense = nn.Linear(d, d)                            # MLM head: transform ...
        self.mlm_norm = nn.LayerNorm(d, eps=cfg.eps)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))   # ... then the tied embedding + bias
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding, LearnedPositionalEmbedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) ids; token_type_ids (B, T) segment ids (default 0); attention_mask (B, T), 1/True for
        real tokens (default: idx != pad_id). Returns hidden states (B, T, d_model)."""
        check_tokens(idx, "idx")
        b, t = idx.shape
        if t > self.cfg.context_length:
            raise ValueError(f"BERT: sequence of {t} tokens exceeds context_length={self.cfg.context_length}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(idx)
        if attention_mask is None:
            mask = padding_mask(idx, self.cfg.pad_id)                # (B, 1, 1, T)
        else:
            if attention_mask.shape != idx.shape:
                raise ValueError(f"BERT: attention_mask must be (B, T) = {tuple(idx.shape)}, got {tuple(attention_mask.shape)}")
            mask = attention_mask.bool()[:, None, None, :]
        if bool(mask.all()):
            mask = None                                              # no padding: the fused kernel without a mask
        x = self.pos_embed(self.tok_embed(idx)) + self.type_embed(token_type_ids)   # (B, T, d): tokens + positions + segments
        x = self.drop(self.embed_norm(x))
        for block in self.blocks:
            x = block(x, mask)
        return x

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, d) -> vocabulary logits (B, T, V); the output matrix is the token embedding."""
        h = self.mlm_norm(ACTIVATIONS[self.cfg.activation](self.mlm_dense(hidden)))
        return F.linear(h, self.tok_embed.weight, self.mlm_bias)

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, d) -> (B, d): tanh(dense(hidden of the first token, [CLS]))."""
        return torch.tanh(self.pooler(hidden[:, 0]))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_hf_bert(cls, model: nn.Module) -> "BERT":
        """Build a BERT from a Hugging Face `BertModel`, `BertForMaskedLM`, `BertForPreTraining` or
        `BertForSequenceClassification` (the encoder, plus the pooler and MLM head where present).
        For a classifier, wrap the result: `BertClassifier.from_hf_bert(model)`."""
        hf = model.config
        act = {"gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu", "quick_gelu": "quick_gelu"}.get(hf.hidden_act)
        if act is None:
            raise ValueError(f"BERT.from_hf_bert: unsupported activation {hf.hidden_act!r}")
        sd = {k.removeprefix("bert."): v for k, v in model.state_dict().items()}
        cfg = BertConfig(vocab_size=hf.vocab_size, context_length=hf.max_position_embeddings, type_vocab_size=hf.type_vocab_size,
                         d_model=hf.hidden_size, n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads,
                         d_ff=hf.intermediate_size, dropout=hf.hidden_dropout_prob, activation=act,
                         eps=hf.layer_norm_eps, pad_id=hf.pad_token_id if hf.pad_token_id is not None else 0)
        bert = cls(cfg)
        ours = {"tok_embed.weight": sd["embeddings.word_embeddings.weight"],
                "pos_embed.weight": sd["embeddings.position_embeddings.weight"],
                "type_embed.weight": sd["embeddings.token_type_embeddings.weight"],
                "embed_norm.weight": sd["embeddings.LayerNorm.weight"], "embed_norm.bias": sd["embeddings.LayerNorm.bias"]}
        for i in range(cfg.n_layers):
            p, me = f"encoder.layer.{i}.", f"blocks.{i}."
            for t in ("weight", "bias"):
                ours[me + f"attn.qkv.{t}"] = torch.cat([sd[p + f"attention.self.{n}.{t}"] for n in ("query", "key", "value")])
                ours[me + f"attn.out.{t}"] = sd[p + f"attention.output.dense.{t}"]
                ours[me + f"norm1.{t}"] = sd[p + f"attention.output.LayerNorm.{t}"]
                ours[me + f"ffn.fc1.{t}"] = sd[p + f"intermediate.dense.{t}"]
                ours[me + f"ffn.fc2.{t}"] = sd[p + f"output.dense.{t}"]
                ours[me + f"norm2.{t}"] = sd[p + f"output.LayerNorm.{t}"]
        optional = {"pooler.dense": "pooler", "cls.predictions.transform.dense": "mlm_dense",
                    "cls.predictions.transform.LayerNorm": "mlm_norm"}
        for hf_name, me in optional.items():
            if f"{hf_name}.weight" in sd:
                ours[f"{me}.weight"], ours[f"{me}.bias"] = sd[f"{hf_name}.weight"], sd[f"{hf_name}.bias"]
        if "cls.predictions.bias" in sd:
            ours["mlm_bias"] = sd["cls.predictions.bias"]
        missing, unexpected = bert.load_state_dict(ours, strict=False)
        core_missing = [k for k in missing if not k.startswith(("pooler", "mlm_"))]
        if core_missing or unexpected:
            raise ValueError(f"BERT.from_hf_bert: missing {core_missing}, unexpected {unexpected}")
        return bert


class BertClassifier(nn.Module):
    """Adaptation head: logits (B, n_classes) = W dropout(pool(BERT(idx))) + b (BertForSequenceClassification)."""

    def __init__(self, bert: BERT, n_classes: int, dropout: float | None = None):
        super().__init__()
        self.bert = bert
        self.drop = Dropout(bert.cfg.dropout if dropout is None else dropout)
        self.head = nn.Linear(bert.cfg.d_model, n_classes)
        nn.init.normal_(self.head.weight, 0.0, 0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, idx: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> logits (B, n_classes)."""
        return self.head(self.drop(self.bert.pool(self.bert(idx, token_type_ids, attention_mask))))

    @classmethod
    def from_hf_bert(cls, model: nn.Module) -> "BertClassifier":
        """From a Hugging Face `BertForSequenceClassification`."""
        sd = model.state_dict()
        clf = cls(BERT.from_hf_bert(model), sd["classifier.weight"].shape[0])
        clf.head.load_state_dict({"weight": sd["classifier.weight"], "bias": sd["classifier.bias"]})
        return clf
