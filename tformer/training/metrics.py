"""Scores for chapters 10-15: BLEU two ways, accuracy, perplexity, distinct-n (repetition in generated text),
recall@k and image-caption retrieval recall, and a scaling-law fit (chapter 15).

sacreBLEU (Post 2018) scores *detokenized* output with its own fixed tokenizer and prints a signature
(`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.x`), so numbers from different papers can be
compared. The 2017 paper reported *tokenized* BLEU, tensor2tensor's `get_ende_bleu.sh`: the Moses
tokenizer (`tokenizer.perl -l de`, here `sacremoses`, the same rules in Python), German compounds split at
hyphens ("Rechts-Staat" -> "Rechts ##AT##-##AT## Staat", which counts the pieces as extra matching
n-grams), scored by multi-bleu.perl. The same output reads higher that way, by about 0.5-1.5 points on
newstest2014 EN-DE; the course reports both so a learner can see why.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from ..data.captions import caption_ids
from ..utils.checks import check_rank
from ..utils.errors import MissingExtra


@dataclass
class BleuResult:
    score: float          # corpus BLEU, 0-100
    signature: str        # how it was computed (sacreBLEU's signature, or a description)
    detail: str           # the full sacreBLEU line: n-gram precisions, brevity penalty, lengths

    def __str__(self) -> str:
        return f"BLEU = {self.score:.2f}  ({self.signature})"


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if isinstance(hyps, str) or isinstance(refs, str):
        raise TypeError("BLEU: expected lists of sentences (one string per segment), got a single string")
    if len(hyps) != len(refs):
        raise ValueError(f"BLEU: {len(hyps)} hypotheses but {len(refs)} references; they must be aligned")


def sacrebleu_score(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a", lowercase: bool = False) -> BleuResult:
    """Corpus sacreBLEU of detokenized hypotheses against one reference each, with its signature."""
    from sacrebleu.metrics import BLEU

    _check(hyps, refs)
    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    res = metric.corpus_score(list(hyps), [list(refs)])
    return BleuResult(res.score, str(metric.get_signature()), str(res))


@functools.lru_cache(maxsize=None)
def _moses(lang: str):
    try:
        from sacremoses import MosesTokenizer
    except ModuleNotFoundError as e:
        raise MissingExtra(e.name or "sacremoses", "the paper's tokenized BLEU") from None
    return MosesTokenizer(lang=lang)


def moses_tokenize(line: str, lang: str = "de") -> str:
    """The Moses tokenizer as tensor2tensor ran it for the paper (`tokenizer.perl -l de`: no aggressive hyphen
    splitting, special characters escaped), through `sacremoses`: punctuation split off ("Nein!" -> "Nein !"),
    numbers kept whole ("1.000,50", "5,000"), quotes and apostrophes escaped ('"' -> "&quot;", "'" ->
    "&apos;"; German splits "ist's" -> "ist &apos; s", English keeps "don &apos;t")."""
    return _moses(lang).tokenize(line, return_str=True, escape=True)


_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(line: str) -> str:
    """The paper's compound splitting, `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'` of tensor2tensor's
    get_ende_bleu.sh: "a-b" -> "a ##AT##-##AT## b". Its matches do not overlap, so a one-character middle
    piece stays joined to what follows: "Vitamin-B-Mangel" -> "Vitamin ##AT##-##AT## B-Mangel"."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], compound_split: bool = True,
                   lang: str = "de") -> BleuResult:
    """BLEU as the 2017 paper computed it (tensor2tensor's get_ende_bleu.sh): Moses-tokenized text
    (`moses_tokenize`, `lang` the target language: de in the script), compounds split, then multi-bleu.perl:
    no further tokenization and no smoothing (an n-gram order without a match scores 0)."""
    from sacrebleu.metrics import BLEU

    _check(hyps, refs)

    def prep(s: str) -> str:
        s = moses_tokenize(s, lang)
        return split_compounds(s) if compound_split else s
    res = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score([prep(h) for h in hyps],
                                                                               [[prep(r) for r in refs]])
    sig = (f"tokenized BLEU (Moses tokens, -l {lang}" + (", compound splitting" if compound_split else "")
           + ", multi-bleu)")
    return BleuResult(res.score, sig, str(res))


def accuracy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int | None = None) -> float:
    """Share of positions where argmax(logits) == target. logits (..., C), target (...)."""
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    return float(((logits.argmax(-1) == target) & keep).sum() / keep.sum().clamp(min=1))


def perplexity(mean_nll: float) -> float:
    """exp(mean negative log-likelihood per token)."""
    return math.exp(mean_nll)


def fit_power_law(n: torch.Tensor, loss: torch.Tensor, c: float = 0.0) -> torch.Tensor:
    """Fit loss = a * n^-alpha + c with the offset c fixed (chapter 15's scaling law; the one power-law fit).

    With c fixed the law is a straight line in log-log space, log(loss - c) = log a - alpha * log n,
    fitted by ordinary least squares. n (K,) sizes > 0, loss (K,) > c, K >= 2 distinct sizes (tensors or
    lists). Returns a float64 tensor [a, alpha]. (c = 0 is the form of Kaplan et al. 2020,
    L(N) = (N_c / N)^alpha_N.) A cost that grows, y ~ n^p (chapters 8 and 9: time and memory against
    length), is the same fit with c = 0 and p = -alpha.
    """
    n, loss = torch.as_tensor(n, dtype=torch.float64), torch.as_tensor(loss, dtype=torch.float64)
    if n.dim() != 1 or n.shape != loss.shape or len(n) < 2:
        raise ValueError(f"fit_power_law: expected n and loss of the same shape (K,) with K >= 2, "
                         f"got {tuple(n.shape)} and {tuple(loss.shape)}")
    if (n <= 0).any() or (loss <= c).any():
        raise ValueError(f"fit_power_law: expected every n > 0 and every loss > c = {c}")
    x, y = n.log(), (loss - c).log()
    dx = x - x.mean()
    if float((dx ** 2).sum()) == 0.0:
        raise ValueError("fit_power_law: needs at least two different sizes n")
    slope = (dx * (y - y.mean())).sum() / (dx ** 2).sum()
    return torch.stack([(y.mean() - slope * x.mean()).exp(), -slope])


def compute_optimal(flops: float, tokens_per_param: float = 20.0) -> tuple[float, float]:
    """Compute-optimal model size and data for a training budget (chapter 15): (n_params, n_tokens).

    Training costs C = 6 N D FLOPs (forward 2, backward 4 per parameter per token); Hoffmann et al.
    (2022, "Chinchilla") found the loss lowest at about D = 20 N. Both together: N = sqrt(C / (6 r)),
    D = r N, with r = tokens_per_param.
    """
    if not flops > 0 or not tokens_per_param > 0:
        raise ValueError(f"compute_optimal: expected flops > 0 and tokens_per_param > 0, got {flops} and "
                         f"{tokens_per_param}")
    n_params = math.sqrt(flops / (6.0 * tokens_per_param))
    return n_params, tokens_per_param * n_params


__all__ = ["fit_power_law", "compute_optimal", "BleuResult", "sacrebleu_score", "tokenized_bleu", "moses_tokenize", "split_compounds",
           "accuracy", "perplexity", "distinct_n", "recall_at_k", "retrieval_recall"]


def distinct_n(seqs: Sequence[Sequence[int]], n: int = 2) -> float:
    """Distinct-n (Li et al. 2016): distinct n-grams / all n-grams over the sequences; 1 = no n-gram
    repeats, near 0 = the text loops."""
    if n < 1:
        raise ValueError(f"distinct_n: n must be >= 1, got {n}")
    grams = [tuple(s[i:i + n]) for s in seqs for i in range(len(s) - n + 1)]
    if not grams:
        raise ValueError(f"distinct_n: no sequence is at least n={n} tokens long")
    return len(set(grams)) / len(grams)


def recall_at_k(sim: torch.Tensor, k: int, query_labels: torch.Tensor | None = None,
                item_labels: torch.Tensor | None = None) -> float:
    """sim (N_q, N_items) similarities. Without labels, query i's match is item i (paired data); with
    labels, any item with the query's label is a match. Returns the fraction of queries with a match in
    their top k."""
    check_rank(sim, 2, "recall_at_k(sim)", "(N queries, N items)")
    topk = sim.topk(min(k, sim.shape[1]), dim=1).indices                  # (N_q, k)
    if query_labels is None:
        hit = topk == torch.arange(sim.shape[0], device=sim.device).unsqueeze(1)
    else:
        hit = item_labels.to(sim.device)[topk] == query_labels.to(sim.device).unsqueeze(1)
    return hit.any(dim=1).float().mean().item()


@torch.no_grad()
def retrieval_recall(model: nn.Module, data, ks: tuple[int, ...] = (1, 5, 10),
                     batch_size: int = 256) -> dict[str, float]:
    """The standard image-caption retrieval protocol on `data` (a `tformer.data.images.ImageCaptions`): every
    image against every caption of the set. image->text R@k: one of the image's own captions is in its
    top k; text->image R@k: the caption's image is in its top k. Returns {"i2t@k": ..., "t2i@k": ...}."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    ctx = model.cfg.context_length
    texts = [t for caps in data.captions for t in caps]
    owner = torch.tensor([i for i, caps in enumerate(data.captions) for _ in caps])          # (N_txt,)
    img = torch.cat([model.encode_image(data.images[i:i + batch_size].to(dev)).float().cpu()
                     for i in range(0, len(data), batch_size)])                               # (N_img, E)
    txt = torch.cat([model.encode_text(caption_ids(texts[i:i + batch_size], ctx).to(dev)).float().cpu()
                     for i in range(0, len(texts), batch_size)])                              # (N_txt, E)
    sim = img @ txt.T                                                                         # (N_img, N_txt)
    model.train(was)
    out = {}
    for k in ks:
        top_t = sim.topk(min(k, sim.shape[1]), dim=1).indices                                 # (N_img, k)
        out[f"i2t@{k}"] = (owner[top_t] == torch.arange(len(data)).unsqueeze(1)).any(1).float().mean().item()
        out[f"t2i@{k}"] = recall_at_k(sim.T, k, owner, torch.arange(len(data)))
    return out
