"""Chapter 12: ViT patches and the CLIP loss."""
import torch
import torch.nn.functional as F


def patchify(images, p):
    return F.unfold(images, kernel_size=p, stride=p).transpose(1, 2)  # the Conv2d order, via unfold


def clip_loss(img, txt, scale):
    a, b = img.double(), txt.double()
    a, b = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)
    lg = float(scale) * a @ b.T
    n = len(a)
    loss = -(torch.log_softmax(lg, 1).diagonal().sum() + torch.log_softmax(lg, 0).diagonal().sum()) / (2 * n)
    return loss.to(img.dtype)


SOLUTIONS = {"ch12.patchify": patchify, "ch12.clip_loss": clip_loss}
