"""Weight-only quantization (chapter 14): int8 per output channel, int4 group-wise packed two per byte.

Symmetric quantization maps a float weight w to an integer q with one scale s per group of weights:

    s = max|w| / q_max          q = clamp(round(w / s), -q_max - 1, q_max)          w ~ s * q

int8 (q_max = 127) uses one scale per output channel (a row of the (out, in) weight matrix): 4x
smaller than float32. int4 (q_max = 7, values -8..7) is too coarse for a whole row, so each row is cut
into groups of `group_size` inputs with a scale each (GPTQ/AWQ-style layouts); two 4-bit values are
packed into one byte: about 8x smaller than float32 (plus the scales).

`QuantLinear` keeps only the integer weights and scales, and its matmul consumes them: int8 computes
x @ q^T and scales the result per output channel (the scale factors out of the sum); int4 unpacks the
nibbles and applies each group's scale on the fly, into a transient weight used by one matmul (a fused
GPU kernel does this tile by tile in registers). Activations stay in floating point (weight-only
quantization, the common form for LLM inference, where reading the weights from memory is the
bottleneck).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..utils.checks import check_float, check_rank


@dataclass
class QuantConfig:
    bits: int = 8                      # 8: int8 per output channel; 4: int4 group-wise, packed two per byte
    group_size: int = 64               # int4 only: input features sharing one scale
    skip: tuple[str, ...] = ("head", "cross_attn.qkv")  # left in float (see quantize_model)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in) float -> (q (out, in) int8, scale (out,) float). w ~ q * scale[:, None].

    Symmetric, one scale per output channel (row): scale = max|row| / 127. An all-zero row gets scale 1.
    """
    check_rank(w, 2, "quantize_int8(w)", "(out_features, in_features)")
    check_float(w, "quantize_int8(w)")
    amax = w.abs().amax(dim=1)                                       # (out,)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -128, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(q (out, in) int8, scale (out,)) -> w (out, in) in scale's dtype."""
    return q.to(scale.dtype) * scale[:, None]


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q (..., n) integers in [-8, 7], n even -> (..., n/2) uint8: q[2i] in the low nibble, q[2i+1] high."""
    if q.shape[-1] % 2:
        raise ValueError(f"pack_int4: expected an even last dimension, got shape {tuple(q.shape)}")
    if q.numel() and (q.min() < -8 or q.max() > 7):
        raise ValueError(f"pack_int4: values must lie in [-8, 7], got [{int(q.min())}, {int(q.max())}]")
    u = (q.to(torch.int16) & 0xF).to(torch.uint8)                    # two's complement nibble
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(..., n/2) uint8 -> (..., n) int8 in [-8, 7] (the inverse of `pack_int4`)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_int4: expected uint8 packed values, got {packed.dtype}")
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).to(torch.int8)  # (..., n) in 0..15
    return torch.where(nib >= 8, nib - 16, nib)                       # 8..15 -> -8..-1


def quantize_int4(w: torch.Tensor, group_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in) float -> (packed (out, in/2) uint8, scale (out, in/group_size) float).

    Symmetric per group of `group_size` consecutive inputs: scale = max|group| / 7, q in [-8, 7].
    `in` must be a multiple of group_size, and group_size even.
    """
    check_rank(w, 2, "quantize_int4(w)", "(out_features, in_features)")
    check_float(w, "quantize_int4(w)")
    out_f, in_f = w.shape
    if group_size < 2 or group_size % 2 or in_f % group_size:
        raise ValueError(f"quantize_int4: group_size must be even and divide in_features={in_f}, got {group_size}")
    g = w.reshape(out_f, in_f // group_size, group_size)             # (out, G, gs)
    amax = g.abs().amax(dim=-1)                                      # (out, G)
    scale = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(g / scale[..., None]), -8, 7).reshape(out_f, in_f)
    return pack_int4(q), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(packed (out, in/2) uint8, scale (out, G)) -> w (out, in) in scale's dtype."""
    q = unpack_int4(packed)                                          # (out, in)
    out_f, in_f = q.shape
    g = scale.shape[1]
    return (q.view(out_f, g, in_f // g).to(scale.dtype) * scale[..., None]).view(out_f, in_f)


class QuantLinear(nn.Module):
    """A Linear layer whose weight is stored as int8 or packed int4; y = x W^T + b.

    x (..., in_features) -> (..., out_features). Build it with `QuantLinear.from_linear(linear, bits)`.
    """

    def __init__(self, in_features: int, out_features: int, bits: int = 8, group_size: int = 64,
                 bias: bool = True, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"QuantLinear: bits must be 4 or 8, got {bits}")
        self.in_features, self.out_features, self.bits, self.group_size = in_features, out_features, bits, group_size
        if bits == 8:
            self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
            self.register_buffer("scale", torch.ones(out_features, dtype=dtype, device=device))
        else:
            if group_size % 2 or in_features % group_size:
                raise ValueError(f"QuantLinear: group_size={group_size} must be even and divide in_features={in_features}")
            self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
            self.register_buffer("scale", torch.ones(out_features, in_features // group_size, dtype=dtype, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 8, group_size: int = 64) -> "QuantLinear":
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, bits, group_size, linear.bias is not None, w.dtype, w.device)
        q, s = quantize_int8(w) if bits == 8 else quantize_int4(w, group_size)
        m.qweight.copy_(q)
        m.scale.copy_(s)
        if linear.bias is not None:
            m.bias.copy_(linear.bias.detach())
        return m

    def dequantized_weight(self) -> torch.Tensor:
        """The float (out, in) weight this layer represents (for comparisons, not used by forward)."""
        return dequantize_int8(self.qweight, self.scale) if self.bits == 8 else dequantize_int4(self.qweight, self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"QuantLinear: expected x (..., {self.in_features}), got {tuple(x.shape)}")
        if self.bits == 8:
            # (x @ q^T) * s: the per-output-channel scale factors out of the sum over inputs
            y = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        else:
            # unpack the nibbles and scale them group by group into a transient weight, then one matmul:
            # what fused int4 kernels do tile by tile in registers (the float weight is never stored)
            y = F.linear(x, dequantize_int4(self.qweight, self.scale.to(x.dtype)))
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        gs = f", group_size={self.group_size}" if self.bits == 4 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}{gs}"


def quantize_model(model: nn.Module, bits: int = 8, group_size: int = 64,
                   skip: tuple[str, ...] = QuantConfig.skip) -> nn.Module:
    """Replace every nn.Linear of `model` (in place) by a QuantLinear; returns the model.

    Linear layers whose name ends with one of `skip` stay in float: the output `head` of GPT and of the
    Transformer shares its weight with the token embedding, and cross-attention slices its `qkv.weight`. With bits=4, a layer whose in_features is not a multiple of group_size
    stays in float too.
    """
    targets = []
    for name, mod in model.named_modules():
        for child_name, child in mod.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and not full.endswith(skip):
                if bits == 4 and child.in_features % group_size:
                    continue
                targets.append((mod, child_name, child))
    for parent, child_name, child in targets:
        setattr(parent, child_name, QuantLinear.from_linear(child, bits, group_size))
    return model


def model_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers (tied tensors counted once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
