"""Chapters 11-12 exercises: independent solutions pass (stubs, named mistakes and the reference guard are
checked for every chapter in tests/test_grading.py)."""
import pytest
import torch
import torch.nn.functional as F

from tformer.grading import check, set_mode

import tformer.grading.exercises  # noqa: F401  (registers them)


@pytest.fixture(autouse=True)
def learner_mode():
    set_mode("learner")
    yield
    set_mode(None)


def causal_lm_loss(logits, idx):
    v = logits.shape[-1]
    lp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return -lp.gather(-1, idx[:, 1:, None]).mean().to(logits.dtype)


def mlm_masking(ids, u_select, u_action, random_ids, mask_id, p=0.15, special=None):
    chosen = u_select < p
    if special is not None:
        chosen &= ~special
    labels = ids.clone()
    labels[~chosen] = -100
    inputs = ids.clone()
    inputs[chosen & (u_action < 0.8)] = mask_id
    rnd = chosen & (u_action >= 0.8) & (u_action < 0.9)
    inputs[rnd] = random_ids[rnd]
    return inputs, labels


def patchify(images, p):
    return F.unfold(images, kernel_size=p, stride=p).transpose(1, 2)  # the Conv2d order, via unfold


def clip_loss(img, txt, scale):
    a, b = img.double(), txt.double()
    a, b = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)
    lg = float(scale) * a @ b.T
    n = len(a)
    loss = -(torch.log_softmax(lg, 1).diagonal().sum() + torch.log_softmax(lg, 0).diagonal().sum()) / (2 * n)
    return loss.to(img.dtype)


SOLUTIONS = {"ch11.causal_lm_loss": causal_lm_loss, "ch11.mlm_masking": mlm_masking, "ch12.patchify": patchify,
             "ch12.clip_loss": clip_loss}


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_independent_solution_passes(name):
    result = check(name, SOLUTIONS[name])
    assert result.passed, result.message
