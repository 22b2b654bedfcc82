"""The answers of chapters 9-15's questions, recomputed by the code the chapters run: a question's answer key is
written out in its chapter module, and a change in tformer (or a typo in the key) fails here. The generic checks
(right answer passes, each named mistake fails by name, the notebooks' cells) are tests/test_questions_content.py's."""
from __future__ import annotations

import math

import pytest
import torch

from tformer.grading import core
from tformer.grading.questions import judge_question, plain


@pytest.fixture(scope="module")
def q():
    core.load_exercises()
    return core.REGISTRY


def _close(value, expected, rel=1e-9):
    return math.isclose(float(value), float(expected), rel_tol=rel)


def _right(question, value) -> bool:
    return judge_question(question, plain(value)).passed


def test_ch09_strided_exponent_is_the_fitted_one(q):
    from tformer.sparse import count_pairs, strided_pattern
    from tformer.training.metrics import fit_power_law
    ns = [512, 1024, 2048, 4096]                                      # the chapter's sizes
    fitted = -float(fit_power_law(ns, [count_pairs(strided_pattern(n, math.isqrt(n))) for n in ns])[1])
    assert _right(q["ch09.q_strided_exponent"], fitted)


def test_ch09_tiled_scores_are_queries_times_block(q, monkeypatch):
    import tformer.efficient as efficient
    n, b, d = 6, 4, 3
    sizes, real = [], efficient.online_softmax_step

    def spy(m, l, acc, scores, v):
        sizes.append(scores[0, 0].numel())                            # one head's scores of one block
        return real(m, l, acc, scores, v)
    monkeypatch.setattr(efficient, "online_softmax_step", spy)
    efficient.tiled_attention(*(torch.randn(1, 1, n, d) for _ in range(3)), block=b)
    assert max(sizes) == eval(q["ch09.q_tiled_memory"].answer, {}, {"n": n, "b": b})   # our own key, not learner text


def test_ch10_peak_lr_is_the_schedules_peak(q):
    from tformer.training.schedules import noam_lr
    for d, w in [(512, 4000), (1024, 8000), (64, 30)]:
        peak = max(noam_lr(s, d, w) for s in range(1, 3 * w))
        assert _close(peak, eval(q["ch10.q_peak_lr"].answer, {}, {"d": d, "w": w}), 1e-12)


def test_ch10_smoothed_target_minimises_the_loss(q):
    from tformer.training.losses import label_smoothed_cross_entropy
    margins = torch.linspace(0, 10, 20001, dtype=torch.float64)
    logits = torch.zeros(len(margins), 4, dtype=torch.float64)
    logits[:, 0] = margins
    loss = torch.stack([label_smoothed_cross_entropy(row[None], torch.tensor([0]), 0.1) for row in logits])
    best = torch.softmax(logits[loss.argmin()], -1)[0]
    assert abs(best.item() - q["ch10.q_smoothed_target"].answer) < 1e-3


def test_ch12_vit_tokens_and_clip_chance(q):
    from tformer.models.clip import clip_loss
    from tformer.models.vit import ViT, ViTConfig
    cfg = ViTConfig(image_size=224, patch_size=16, in_channels=3, d_model=8, n_layers=1, n_heads=2, d_ff=16,
                    n_classes=10)
    with torch.no_grad():
        tokens = ViT(cfg).embed(torch.zeros(1, 3, 224, 224)).shape[1]
    assert tokens == q["ch12.q_vit_tokens"].answer
    same = torch.ones(16, 8)                                          # every logit equal
    assert _close(clip_loss(same, same, 1 / 0.07), q["ch12.q_clip_chance"].answer, 1e-6)


def test_ch13_answers_from_the_qwen3_config(q):
    from tformer.moe.params import QWEN3_235B_A22B, moe_lm_param_counts
    counts = moe_lm_param_counts(**QWEN3_235B_A22B)
    wider = moe_lm_param_counts(**dict(QWEN3_235B_A22B, experts_per_token=16))
    assert _close(100 * counts["active"] / counts["total"], q["ch13.q_active_share"].answer, 1e-4)
    sixteen = q["ch13.q_active_16"]
    assert _close(wider["active"] / 1e9, sixteen.answer, 1e-4)
    assert sorted(sixteen.mistakes.values()) == sorted(
        round(x / 1e9, 3) for x in (2 * counts["active"], counts["active"], counts["total"] * 16 / 128))


def test_ch15_chinchilla_compute_splits_back(q):
    from tformer.training.metrics import compute_optimal
    n, d = compute_optimal(q["ch15.q_chinchilla_flops"].answer, 20.0)
    assert _close(n, 70e9, 1e-9) and _close(d, 1.4e12, 1e-9)


def test_ch11_uniform_loss_is_the_loss_of_equal_logits(q):
    from tformer.training.losses import causal_lm_loss
    for v in (7, 1024):
        loss = causal_lm_loss(torch.zeros(2, 5, v), torch.randint(0, v, (2, 5)))
        assert _close(loss, eval(q["ch11.q_uniform_loss"].answer, {"log": math.log}, {"V": v}), 1e-6)


def test_ch11_lora_fc1_share_is_what_add_lora_trains(q):
    from tformer.training.lora import LoRALinear
    for d, r in ((64, 16), (384, 8), (10, 3)):
        lin = LoRALinear(torch.nn.Linear(d, 4 * d), r=r)                # fc1: weight (4d, d)
        share = (lin.A.numel() + lin.B.numel()) / lin.base.weight.numel()
        assert _close(share, eval(q["ch11.q_lora_fc1_share"].answer, {}, {"r": r, "d": d}), 1e-12)


def test_ch11_lone_success_advantage_is_what_group_advantages_gives(q):
    from tformer.training.grpo import group_advantages
    for g in (2, 5, 8, 16):
        adv = group_advantages(torch.tensor([[1.0] + [0.0] * (g - 1)], dtype=torch.float64))[0, 0]
        expected = eval(q["ch11.q_grpo_lone_success"].answer, {"sqrt": math.sqrt}, {"G": g})   # our own key
        assert _close(adv * (1 + 1e-4 * math.sqrt(g)), expected, 1e-12)          # the std's + 1e-4 put back


def test_ch14_kv_bytes_is_what_the_cache_holds(q):
    from tformer.cache import make_caches
    layers, kv_heads, head, t = 32, 8, 128, 3                         # Llama 3 8B's shape, bf16
    caches = make_caches(layers)
    for c in caches:
        c.append(*(torch.zeros(1, kv_heads, t, head, dtype=torch.bfloat16) for _ in range(2)))
    assert sum(c.nbytes() for c in caches) / t == q["ch14.q_kv_bytes"].answer


def test_ch14_passes_count_the_chapters_way(q):
    answer = q["ch14.q_no_cache_passes"].answer
    for n, p in [(32, 8), (96, 8), (5, 1)]:
        assert eval(answer, {}, {"n": n, "P": p}) == sum(p + i for i in range(n))   # the chapter's own count
