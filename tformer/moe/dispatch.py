"""How an MoE layer moves tokens to its experts and back, fast (chapter 13): the plan, the buffers,
the experts' batched and grouped matmuls. `tformer.moe` is the idea; this is its machinery.

Dispatch paths, all computing the same function (tests prove it, forward and gradients):
    "naive"    loops over tokens and their k experts one by one: the readable reference, slow.
    "padded"   sorts assignments by expert, gathers them into a (E, C, d) buffer and runs all experts
               with one batched matmul (`torch.bmm`); no Python loop over tokens or experts.
    "grouped"  sorts assignments by expert and runs each expert on its contiguous block with one
               grouped matmul (`torch.nn.functional.grouped_mm`: bf16 on an sm80+ GPU, fp32/bf16 on a
               CPU; PyTorch >= 2.8); no padding beyond rounding each block up to GROUP_ALIGN rows on a GPU.
    "auto"     "grouped" where it is one kernel with no host sync (an sm90/sm100 GPU, `gpu.grouped_mm_fast`)
               and on a CPU (where it measured faster), else "padded" (an A100's or T4's grouped_mm loops
               over the experts after copying their offsets to the host).

How the fast paths move rows (MegaBlocks / ScatterMoE / torchtitan do the same in spirit): the (token,
choice) pairs are sorted by expert once, and every buffer row knows which pair it holds (`src`) and every
pair which row holds it (`dest`). Dispatch and combine are then *gathers* (`index_select`) both ways,
written as one small autograd Function whose backward is the gather by the other index: no advanced-
indexing backward (`index_put_` with accumulate, a sort on CUDA) and no `index_add`. All shapes are static
(the grouped buffer has N k + E (GROUP_ALIGN - 1) rows), so nothing is read back to the host, except by
"padded" without a capacity factor, which reads the fullest expert's count once per layer to size its buffer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..activations import ACTIVATIONS
from ..dropout import Dropout

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
DISPATCH = ("auto", "naive", "padded", "grouped")
GROUP_ALIGN = 16   # "grouped" on CUDA: rows per expert block rounded up to a multiple of this (aligned TMA loads)


def expert_capacity(n_tokens: int, n_experts: int, k: int, capacity_factor: float | None) -> int | None:
    """Slots per expert: ceil(capacity_factor * n_tokens * k / n_experts); None means no limit."""
    if capacity_factor is None:
        return None
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be > 0 (or None for no-drop), got {capacity_factor}")
    return max(1, math.ceil(capacity_factor * n_tokens * k / n_experts))


@dataclass
class DispatchPlan:
    """Where each routing assignment goes. An assignment is one (token, choice) pair; there are N*k,
    flattened choice-major (all first choices, then all second choices, ...), which is also the
    priority order when capacity runs out.

    The `*_sorted` tensors list the *kept* assignments sorted by expert (stable, so priority order
    is kept inside each expert's block).
    """
    token_sorted: torch.Tensor    # (M,) token index of each kept assignment, grouped by expert
    expert_sorted: torch.Tensor   # (M,) its expert (non-decreasing)
    slot_sorted: torch.Tensor     # (M,) its position inside the expert's block (0, 1, ...)
    gate_sorted: torch.Tensor     # (M,) its gate weight (differentiable)
    counts: torch.Tensor          # (E,) assignments each expert received, before dropping
    kept_counts: torch.Tensor     # (E,) assignments each expert processes (<= capacity)
    keep: torch.Tensor            # (N, k) bool: False where the assignment was dropped
    capacity: int | None


def sort_by_expert(experts: torch.Tensor, n_experts: int):
    """The sort both plans start from. experts (N, k) -> (order, e_sorted, counts, slot): the N k (token,
    choice) pairs, flattened choice-major (a = j N + t: the priority order), sorted stably by expert
    (`order[i]` is the pair in sorted position i, `e_sorted[i]` its expert), the pairs each expert received
    (E,), and each sorted pair's rank inside its expert's block. Integer work on the device, no host sync."""
    e_flat = experts.t().reshape(-1)                                           # (N k,) choice-major
    order = torch.argsort(e_flat, stable=True)                                 # group by expert, keep priority
    e_sorted = e_flat.index_select(0, order)
    counts = torch.zeros(n_experts, dtype=torch.long, device=experts.device).scatter_add_(
        0, e_flat, torch.ones_like(e_flat))                                    # (E,) = bincount, without a sync
    starts = torch.cumsum(counts, 0) - counts                                  # first sorted position of each block
    slot = torch.arange(e_flat.numel(), device=experts.device) - starts.index_select(0, e_sorted)
    return order, e_sorted, counts, slot


def make_plan(gates: torch.Tensor, experts: torch.Tensor, n_experts: int, capacity: int | None) -> DispatchPlan:
    """gates, experts (N, k) -> a `DispatchPlan` (sort by expert, rank within expert, drop over capacity)."""
    n, k = experts.shape
    order, e_sorted, counts, slot = sort_by_expert(experts, n_experts)
    token_flat = torch.arange(n, device=experts.device).repeat(k)             # (k*N,)
    gate_flat = gates.t().reshape(-1)
    keep_sorted = slot < capacity if capacity is not None else torch.ones_like(slot, dtype=torch.bool)
    keep_flat = torch.empty_like(keep_sorted).scatter(0, order, keep_sorted)  # back to (k*N,) order
    kept = order[keep_sorted] if capacity is not None else order
    return DispatchPlan(
        token_sorted=token_flat[kept], expert_sorted=e_sorted[keep_sorted] if capacity is not None else e_sorted,
        slot_sorted=slot[keep_sorted] if capacity is not None else slot, gate_sorted=gate_flat[kept],
        counts=counts, kept_counts=counts.clamp(max=capacity) if capacity is not None else counts,
        keep=keep_flat.view(k, n).t(), capacity=capacity)


@dataclass
class Rows:
    """Where each (token, choice) pair sits in the experts' buffer, for the fast paths; static shapes.

    Pairs are flattened choice-major (a = j N + t, as in `DispatchPlan`). R buffer rows: E * C for "padded",
    N k + E (align - 1) for "grouped" (each expert's block rounded up to `align` rows; unused rows are
    never read back).
    """
    dest: torch.Tensor                   # (N k,) buffer row of each pair (0 for a dropped pair: read, weighted 0)
    src: torch.Tensor                    # (R,) pair held by each buffer row (0 for an unused row)
    used: torch.Tensor | None            # (R,) 1.0 where a row holds a kept pair (None: every row does)
    keep_flat: torch.Tensor | None       # (N k,) 1.0 for kept pairs, 0.0 for dropped (None: nothing dropped)
    counts: torch.Tensor                 # (E,) pairs routed to each expert, before dropping
    ends: torch.Tensor                   # (E,) int32: "grouped": end row of each expert's block
    expert_of_row: torch.Tensor | None   # (R,) "grouped": the expert of each row (E past the last block)


def route_rows(experts: torch.Tensor, n_experts: int, capacity: int | None, layout: str, align: int = 1) -> Rows:
    """experts (N, k) chosen expert ids -> `Rows` for layout "padded" or "grouped". Integer work only, on the
    device, with no read back to the host (except "padded" without a capacity: its C is the largest count)."""
    n, k = experts.shape
    a = n * k
    dev = experts.device
    order, e_sorted, counts, slot = sort_by_expert(experts, n_experts)        # order: sorted position -> pair
    kept_counts = counts if capacity is None else counts.clamp(max=capacity)
    expert_of_row = None
    if layout == "padded":
        cap = capacity if capacity is not None else int(counts.max())         # the one host read (no capacity)
        row = e_sorted * cap + slot
        n_rows = n_experts * cap
        ends = torch.zeros(0, dtype=torch.int32, device=dev)
    else:
        sizes = (kept_counts + align - 1) // align * align                     # (E,) blocks rounded up
        ends64 = torch.cumsum(sizes, 0)
        row = (ends64 - sizes).index_select(0, e_sorted) + slot
        n_rows = a + n_experts * (align - 1)                                   # static bound: no sync
        ends = ends64.to(torch.int32)
        expert_of_row = torch.searchsorted(ends64, torch.arange(n_rows, device=dev), right=True)
    if capacity is None and row.numel() == n_rows and layout == "grouped":   # rows = sorted pairs exactly
        dest = torch.empty_like(order).scatter_(0, order, torch.arange(a, device=dev))
        return Rows(dest=dest, src=order, used=None, keep_flat=None, counts=counts, ends=ends,
                    expert_of_row=expert_of_row)
    keep_sorted = slot < capacity if capacity is not None else torch.ones_like(slot, dtype=torch.bool)
    dest = torch.empty_like(order).scatter_(0, order, torch.where(keep_sorted, row, 0))
    target = torch.where(keep_sorted, row, n_rows)                             # dropped pairs: a spare row, cut off
    src = torch.zeros(n_rows + 1, dtype=torch.long, device=dev).scatter_(0, target, order)[:n_rows]
    used = torch.zeros(n_rows + 1, device=dev).scatter_(0, target, torch.ones(a, device=dev))[:n_rows]
    keep_flat = None
    if capacity is not None:
        keep_flat = torch.empty(a, device=dev).scatter_(0, order, keep_sorted.float())
    return Rows(dest=dest, src=src, used=used, keep_flat=keep_flat, counts=counts, ends=ends,
                expert_of_row=expert_of_row)


class RowGather(torch.autograd.Function):
    """out = x.index_select(0, fwd), with the backward a gather too: grad_x = (grad_out[bwd] * mask), summed
    over `fold` copies (grad_x has fold * len(x) rows before the sum: x row i is read by out rows
    bwd[j len(x) + i], j < fold). Exact when those are the only out rows reading row i whose gradient is not
    zero (here: unused buffer rows and dropped pairs are never weighted into the output). Autograd's own
    backward of a gather is a scatter-add (`index_put_` with accumulate for x[idx]), slow on a GPU."""

    @staticmethod
    def forward(ctx, x, fwd, bwd, mask, fold):
        ctx.save_for_backward(bwd, mask)
        ctx.fold, ctx.n = fold, x.shape[0]
        return x.index_select(0, fwd)

    @staticmethod
    def backward(ctx, grad):
        bwd, mask = ctx.saved_tensors
        g = grad.index_select(0, bwd)
        if mask is not None:
            g = g * mask.to(g.dtype)[:, None]
        if ctx.fold > 1:
            g = g.view(ctx.fold, ctx.n, -1).sum(0)
        return g, None, None, None, None


# --------------------------------------------------------------------------------------------------
# Experts: E FFNs stored as stacked weights, (E, out, in) like nn.Linear (and Hugging Face's MoE blocks)
# --------------------------------------------------------------------------------------------------

class Experts(nn.Module):
    """E position-wise FFNs, FFN_e(x) = W2_e act(W1_e x + b1_e) + b2_e, or SwiGLU W2_e (silu(W1_e x) * W3_e x).

    Weights are stacked: fc1 (E, d_ff, d), gate (E, d_ff, d) for SwiGLU, fc2 (E, d, d_ff), so a batched or
    grouped matmul runs all experts at once.
    """

    def __init__(self, n_experts: int, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = False,
                 dropout: float = 0.0):
        super().__init__()
        if activation not in ACTIVATIONS and activation != "swiglu":
            raise ValueError(f"Experts: activation must be one of {sorted(ACTIVATIONS) + ['swiglu']}, "
                             f"got {activation!r}")
        self.n_experts, self.d_model, self.d_ff, self.activation = n_experts, d_model, d_ff, activation
        self.fc1 = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.gate = nn.Parameter(torch.empty(n_experts, d_ff, d_model)) if activation == "swiglu" else None
        self.fc2 = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        self.b1 = nn.Parameter(torch.zeros(n_experts, d_ff)) if bias else None
        self.b3 = nn.Parameter(torch.zeros(n_experts, d_ff)) if bias and activation == "swiglu" else None
        self.b2 = nn.Parameter(torch.zeros(n_experts, d_model)) if bias else None
        self.dropout = Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each expert initialised like nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        for w in (self.fc1, self.gate, self.fc2):
            if w is not None:
                nn.init.uniform_(w, -1 / math.sqrt(w.shape[-1]), 1 / math.sqrt(w.shape[-1]))
        for b in (self.b1, self.b3, self.b2):
            if b is not None:
                nn.init.zeros_(b)

    def params_per_expert(self) -> int:
        return sum(p[0].numel() for p in self.parameters())

    def _hidden(self, up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        h = F.silu(up) * gate if self.gate is not None else ACTIVATIONS[self.activation](up)
        return self.dropout(h)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e alone on x (..., d): the reference the fast paths are tested against."""
        up = F.linear(x, self.fc1[e], None if self.b1 is None else self.b1[e])
        gate = None if self.gate is None else F.linear(x, self.gate[e], None if self.b3 is None else self.b3[e])
        return F.linear(self._hidden(up, gate), self.fc2[e], None if self.b2 is None else self.b2[e])

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """All experts at once on a padded buffer x (E, C, d) -> (E, C, d), one bmm per matrix."""
        up = torch.bmm(x, self.fc1.transpose(1, 2))                           # (E, C, d_ff)
        if self.b1 is not None:
            up = up + self.b1[:, None, :]
        gate = None
        if self.gate is not None:
            gate = torch.bmm(x, self.gate.transpose(1, 2))
            if self.b3 is not None:
                gate = gate + self.b3[:, None, :]
        y = torch.bmm(self._hidden(up, gate), self.fc2.transpose(1, 2))       # (E, C, d)
        return y if self.b2 is None else y + self.b2[:, None, :]

    def grouped(self, x: torch.Tensor, expert_of_row: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Rows of x (M, d) grouped by expert (block e ends at offsets[e], int32) -> (M, d), one grouped
        matmul per matrix. expert_of_row (M,) names each row's expert; rows past offsets[-1] (marked with
        E) are left undefined by the kernel and must not be read."""
        def mm(a, w, b):
            out = _grouped_mm(a, w.to(a.dtype).transpose(1, 2), offs=offsets)   # (M, out), in a's dtype
            if out.requires_grad:   # the kernel's backward wants a dense gradient (not an expanded one)
                out.register_hook(lambda g: g.contiguous())
            if b is None:
                return out
            return out + F.pad(b.to(out.dtype), (0, 0, 0, 1)).index_select(0, expert_of_row)   # row E: tail rows
        up = mm(x, self.fc1, self.b1)
        gate = mm(x, self.gate, self.b3) if self.gate is not None else None
        return mm(self._hidden(up, gate).to(x.dtype).contiguous(), self.fc2, self.b2)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matmuls on x run in: the autocast dtype when autocast is on for x's device, else x's own."""
    if x.is_floating_point() and torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def grouped_mm_available(x: torch.Tensor, *dims: int) -> bool:
    """True when `F.grouped_mm` exists and can multiply x (in its compute dtype, autocast included) with
    rows of these widths: bf16 on an sm80+ CUDA GPU, or fp32/bf16 on a CPU (bf16 only under torch.compile);
    rows 16-byte aligned."""
    dt = compute_dtype(x)
    if _grouped_mm is None:
        return False
    if x.device.type == "cuda":
        if dt != torch.bfloat16 or torch.cuda.get_device_capability(x.device)[0] < 8:
            return False
    elif x.device.type != "cpu" or dt not in (torch.float32, torch.bfloat16):
        return False
    elif dt != torch.bfloat16 and torch.compiler.is_compiling():   # torch.compile knows grouped_mm in bf16 only
        return False
    return all((d * dt.itemsize) % 16 == 0 for d in dims)


# --------------------------------------------------------------------------------------------------
# The MoE layer: router + experts + dispatch; blocks.TransformerBlock builds it from BlockConfig.moe
# --------------------------------------------------------------------------------------------------
