"""Mixture of experts (chapter 13): a router picks k of E expert FFNs for every token.

    logits = x W_r                      (N, E)   one score per expert
    p      = softmax(logits)            (N, E)
    top-k  -> experts e_1..e_k, gates g_j = p_{e_j}  (renormalised over the k: g_j / sum g, optional)
    y      = sum_j g_j * FFN_{e_j}(x)   (N, d)

Every token still passes through one FFN's worth of compute per chosen expert, but the layer holds E
FFNs: total parameters grow with E, active parameters per token with k.

Auxiliary losses (added to the LM loss by the model):
    balance (Switch Transformer):  E * sum_i f_i * P_i
        f_i = share of the N*k routing assignments that went to expert i (not differentiable),
        P_i = mean router probability of expert i (differentiable). Uniform routing gives 1;
        collapse onto one expert gives E.
    z-loss (ST-MoE):  mean_t logsumexp(logits_t)^2   keeps router logits small.

Capacity: with a capacity factor c, each expert takes at most C = ceil(c * N * k / E) assignments;
the rest are dropped (the token's residual connection carries it past the layer). Priority is
first choices before second choices, then token order (GShard). `capacity_factor=None` drops nothing.

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

from .utils import gpu
from .utils.checks import check_dim, check_float, check_rank
from .activations import ACTIVATIONS
from .dropout import Dropout

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
DISPATCH = ("auto", "naive", "padded", "grouped")
GROUP_ALIGN = 16   # "grouped" on CUDA: rows per expert block rounded up to a multiple of this (aligned TMA loads)


@dataclass
class MoEConfig:
    """What is MoE's own. The token width, activation, bias and dropout belong to the model (or block) that
    builds the layer: `MoE(d_model, cfg, d_ff=..., activation=..., bias=..., dropout=...)`."""
    n_experts: int = 8                  # E
    top_k: int = 2                      # k experts per token (Switch: 1, Mixtral: 2, Qwen3: 8)
    d_ff: int | None = None             # an expert's hidden width; None = the model's d_ff (Qwen3-235B: 1536 at d=4096)
    capacity_factor: float | None = None  # training: None = no-drop; e.g. 1.25 drops over-capacity tokens
    eval_capacity_factor: float | None = None  # the same at evaluation (default: drop nothing)
    balance_weight: float = 0.01        # alpha of the Switch load-balancing loss
    z_weight: float = 0.001             # router z-loss weight (ST-MoE)
    normalize_top_k: bool = True        # renormalise the k gates to sum to 1 (Mixtral, Qwen3); Switch: False
    dispatch: str = "auto"              # "auto", "padded", "grouped" or "naive" (see the module docstring)
    layers: tuple[int, ...] | None = None  # in a model: the blocks whose FFN is an MoE; None = all of them


# --------------------------------------------------------------------------------------------------
# Router and auxiliary losses (pure functions: the chapter's exercises are graded against these)
# --------------------------------------------------------------------------------------------------

def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def top_k_route(logits: torch.Tensor, k: int, normalize: bool = True, *, return_probs: bool = False):
    """Top-k gating. logits (N, E) -> (gates (N, k), experts (N, k) long), best expert first; with
    `return_probs`, also the router probabilities (N, E) (for the load-balancing loss).

    gates are the softmax probabilities (over all E experts) of the k chosen experts, renormalised to
    sum to 1 over the k if `normalize`. The softmax is taken in float32 (at least) for stability.
    """
    check_rank(logits, 2, "top_k_route(logits)", "(N, E)")
    check_float(logits, "top_k_route(logits)")
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"top_k_route: expected 1 <= k <= E={logits.shape[-1]}, got k={k}")
    probs = torch.softmax(_at_least_fp32(logits), dim=-1)
    gates, experts = probs.topk(k, dim=-1)                                      # (N, k), (N, k)
    if normalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return (gates, experts, probs) if return_probs else (gates, experts)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, n_experts: int | None = None) -> torch.Tensor:
    """Switch Transformer load-balancing loss, E * sum_i f_i * P_i (without the weight alpha).

    probs (N, E) router softmax; experts (N, k) chosen expert ids. f_i = (assignments to expert i) / (N k),
    P_i = mean_n probs[n, i]. Equals 1 for perfectly uniform routing and E when every token picks the
    same expert with probability 1. (Hugging Face's Mixtral/Qwen loss divides by N only: k times this.)
    """
    check_rank(probs, 2, "load_balancing_loss(probs)", "(N, E)")
    check_rank(experts, 2, "load_balancing_loss(experts)", "(N, k)")
    n_experts = probs.shape[-1] if n_experts is None else n_experts
    check_dim(probs, -1, n_experts, "load_balancing_loss(probs)", "n_experts")
    if experts.shape[0] != probs.shape[0]:
        raise ValueError(f"load_balancing_loss: probs has {probs.shape[0]} tokens, experts has {experts.shape[0]}")
    counts = torch.zeros(n_experts, dtype=probs.dtype, device=probs.device)
    counts = counts.scatter_add(0, experts.reshape(-1), torch.ones_like(experts.reshape(-1), dtype=probs.dtype))
    f = counts / experts.numel()                                               # (E,) sums to 1
    p = probs.mean(dim=0)                                                      # (E,) sums to 1
    return n_experts * (f * p).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of logsumexp(logits)^2. logits (N, E) -> scalar."""
    check_rank(logits, 2, "router_z_loss(logits)", "(N, E)")
    return torch.logsumexp(_at_least_fp32(logits), dim=-1).pow(2).mean()


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


class _RowGather(torch.autograd.Function):
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

class MoE(nn.Module):
    """Top-k mixture-of-experts FFN. x (B, T, d) or (N, d) -> same shape.

    After each forward: `aux_loss` (balance_weight * balance + z_weight * z, differentiable, to add to
    the training loss), and for inspection (detached) `last_balance_loss`, `last_z_loss`,
    `last_counts` (E,) assignments per expert, `last_gates` and `last_experts` (N, k) (the routing,
    before capacity), `last_dropped` (share of assignments dropped for capacity).
    """

    def __init__(self, d_model: int, cfg: MoEConfig, *, d_ff: int | None = None, activation: str = "gelu",
                 bias: bool = False, dropout: float = 0.0):
        """d_model, activation, bias, dropout (on the expert hidden layer) and `d_ff` (the expert width when
        `cfg.d_ff` is None) are the model's; a block passes its own. Everything else comes from `cfg`."""
        super().__init__()
        if not 1 <= cfg.top_k <= cfg.n_experts:
            raise ValueError(f"MoEConfig: expected 1 <= top_k <= n_experts={cfg.n_experts}, got top_k={cfg.top_k}")
        if cfg.dispatch not in DISPATCH:
            raise ValueError(f"MoEConfig.dispatch must be one of {DISPATCH}, got {cfg.dispatch!r}")
        width = cfg.d_ff or d_ff
        if width is None:
            raise ValueError("MoE: an expert's width is MoEConfig.d_ff, or the model's d_ff=; got neither")
        self.cfg = cfg
        self.d_model, self.d_ff, self.activation = d_model, width, activation
        self.router = nn.Linear(d_model, cfg.n_experts, bias=False)          # W_r
        self.experts = Experts(cfg.n_experts, d_model, width, activation, bias, dropout)
        self.aux_loss: torch.Tensor | float = 0.0
        self.last_balance_loss = self.last_z_loss = self.last_dropped = None
        self.last_counts: torch.Tensor | None = None
        self.last_gates: torch.Tensor | None = None
        self.last_experts: torch.Tensor | None = None

    def extra_repr(self) -> str:
        c = self.cfg
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, n_experts={c.n_experts}, top_k={c.top_k}, "
                f"activation={self.activation!r}, capacity_factor={c.capacity_factor}, dispatch={c.dispatch!r}")

    def params_total_active(self) -> tuple[int, int]:
        """(total, active per token): a token uses the router and k of the E experts."""
        total = sum(p.numel() for p in self.parameters())
        per_expert = self.experts.params_per_expert()
        return total, total - (self.cfg.n_experts - self.cfg.top_k) * per_expert

    def choose_dispatch(self, x: torch.Tensor) -> str:
        c = self.cfg
        if c.dispatch != "auto":
            return c.dispatch
        # grouped: no padding and no host sync where grouped_mm is one kernel (sm90/sm100) and on a CPU
        # (measured faster than padded there: benchmarks/bench_moe.py); on other GPUs it loops with a sync
        if grouped_mm_available(x, self.d_model, self.d_ff) and gpu.grouped_mm_fast(x.device):   # autocast included
            return "grouped"
        return "padded"

    def forward(self, x: torch.Tensor, dispatch: str | None = None) -> torch.Tensor:
        check_rank(x, (2, 3), "MoE(x)", "(B, T, d_model) or (N, d_model)")
        check_dim(x, -1, self.d_model, "MoE(x)", "d_model")
        c = self.cfg
        shape = x.shape
        xf = x.reshape(-1, self.d_model)                                       # (N, d)
        logits = self.router(xf)                                               # (N, E)
        gates, experts, probs = top_k_route(logits, c.top_k, c.normalize_top_k, return_probs=True)  # fp32 probs
        factor = c.capacity_factor if self.training else c.eval_capacity_factor
        capacity = expert_capacity(xf.shape[0], c.n_experts, c.top_k, factor)

        balance = load_balancing_loss(probs, experts, c.n_experts)
        z = router_z_loss(logits)
        self.aux_loss = c.balance_weight * balance + c.z_weight * z
        self.last_balance_loss, self.last_z_loss = balance.detach(), z.detach()
        self.last_gates, self.last_experts = gates.detach(), experts.detach()

        path = dispatch or self.choose_dispatch(xf)
        if path == "naive":
            y, keep = self._naive(xf, gates, experts, capacity)
            counts = torch.bincount(experts.reshape(-1), minlength=c.n_experts)
        else:
            y, keep, counts = self._dispatch(xf, gates, experts, capacity, path)
        self.last_counts = counts.detach()
        self.last_dropped = 1.0 - keep.float().mean().detach()
        return y.reshape(shape)

    def _dispatch(self, xf: torch.Tensor, gates: torch.Tensor, experts: torch.Tensor, capacity: int | None,
                  path: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fast paths: xf (N, d) -> (y (N, d), keep (N, k), counts (E,)). See the module docstring."""
        c, d = self.cfg, self.d_model
        n, k = experts.shape
        if path == "grouped" and not grouped_mm_available(xf, d, self.d_ff):
            raise RuntimeError(
                f"MoE dispatch='grouped' needs torch.nn.functional.grouped_mm (PyTorch >= 2.8), bf16 on an sm80+ "
                f"GPU (or fp32/bf16 on a CPU), and d_model, d_ff whose rows are 16-byte aligned; got "
                f"{compute_dtype(xf)} on {xf.device}, d_model={d}, d_ff={self.d_ff}. Use dispatch='padded'.")
        if path not in ("padded", "grouped"):
            raise ValueError(f"MoE: unknown dispatch {path!r}; expected one of {DISPATCH}")
        rows = route_rows(experts, c.n_experts, capacity, path, GROUP_ALIGN if xf.device.type == "cuda" else 1)
        # dispatch: buffer row r holds token src[r] % N; its gradient comes back by gathering at dest
        buf = _RowGather.apply(xf, rows.src % n, rows.dest, rows.keep_flat, k)               # (R, d)
        if path == "padded":
            ys = self.experts.padded(buf.view(c.n_experts, -1, d)).view(-1, d)
        else:
            buf = buf.to(compute_dtype(xf))
            ys = self.experts.grouped(buf, rows.expert_of_row, rows.ends)
        # combine: pair a reads row dest[a]; the gradient of row r is gathered from pair src[r]
        y_pairs = _RowGather.apply(ys, rows.dest, rows.src, rows.used, 1).view(k, n, d)   # (k, N, d)
        g = gates.t() if rows.keep_flat is None else gates.t() * rows.keep_flat.view(k, n)      # dropped: 0
        y = (y_pairs.to(xf.dtype) * g.to(xf.dtype)[:, :, None]).sum(0)    # (N, d), summed in the residual's dtype
        keep = torch.ones_like(experts, dtype=torch.bool) if rows.keep_flat is None else rows.keep_flat.view(k, n).t().bool()
        return y, keep, rows.counts

    def _naive(self, xf: torch.Tensor, gates: torch.Tensor, experts: torch.Tensor, capacity: int | None):
        """Reference: every token through each of its k experts one by one (Python loops; tests only).
        Capacity is counted the plain way: first choices of all tokens in order, then second choices."""
        n, k = experts.shape
        keep = torch.ones(n, k, dtype=torch.bool)
        used: dict[int, int] = {}
        for j in range(k):
            for t in range(n):
                e = int(experts[t, j])
                used[e] = used.get(e, 0) + 1
                keep[t, j] = capacity is None or used[e] <= capacity
        rows = []
        for t in range(n):
            acc = torch.zeros_like(xf[t])
            for j in range(k):
                if keep[t, j]:
                    acc = acc + gates[t, j].to(xf.dtype) * self.experts.expert(int(experts[t, j]), xf[t])
            rows.append(acc)
        return torch.stack(rows), keep.to(xf.device)


def collect_aux_loss(model: nn.Module) -> torch.Tensor | float:
    """Sum of `aux_loss` over every MoE layer in `model` (from the last forward); 0.0 if there are none.
    The one place the auxiliary losses are collected (`GPT.aux_loss` is this, for its own layers)."""
    total: torch.Tensor | float = 0.0
    for m in model.modules():
        if isinstance(m, MoE):
            total = total + m.aux_loss
    return total


# --------------------------------------------------------------------------------------------------
# Counting parameters of a published MoE LM from its configuration
# --------------------------------------------------------------------------------------------------

def moe_lm_param_counts(vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                        head_dim: int, num_experts: int, experts_per_token: int, expert_ffn: int,
                        tie_embeddings: bool = False, qk_norm: bool = True, attention_bias: bool = False,
                        gated: bool = True) -> dict[str, int]:
    """Total and active (per token) parameters of a decoder-only MoE LM of the Qwen3-MoE / Mixtral layout.

    Per layer: q/k/v/o projections (GQA), RMSNorms (2 per layer, + q/k norms if `qk_norm`), a router
    (hidden x E) and E SwiGLU experts (3 matrices hidden x expert_ffn; 2 if not `gated`); plus token
    embeddings, a final norm and the LM head (untied unless `tie_embeddings`).
    """
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    attn = hidden_size * q + 2 * hidden_size * kv + q * hidden_size
    if attention_bias:
        attn += q + 2 * kv
    norms = 2 * hidden_size + (2 * head_dim if qk_norm else 0)
    expert = (3 if gated else 2) * hidden_size * expert_ffn
    router = hidden_size * num_experts
    embed = vocab_size * hidden_size
    head = 0 if tie_embeddings else vocab_size * hidden_size
    shared = embed + head + hidden_size + num_layers * (attn + norms + router)   # used by every token
    total = shared + num_layers * num_experts * expert
    active = shared + num_layers * experts_per_token * expert
    return {"total": total, "active": active, "experts": num_layers * num_experts * expert,
            "attention": num_layers * attn, "embeddings": embed + head}


# Qwen3-235B-A22B, from its published config.json (huggingface.co/Qwen/Qwen3-235B-A22B).
QWEN3_235B_A22B = dict(vocab_size=151936, hidden_size=4096, num_layers=94, num_heads=64, num_kv_heads=4,
                       head_dim=128, num_experts=128, experts_per_token=8, expert_ffn=1536,
                       tie_embeddings=False, qk_norm=True)

# Mixtral-8x7B, from its published config.json (huggingface.co/mistralai/Mixtral-8x7B-v0.1): "46.7B total,
# 12.9B active".
MIXTRAL_8X7B = dict(vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                    head_dim=128, num_experts=8, experts_per_token=2, expert_ffn=14336,
                    tie_embeddings=False, qk_norm=False)


# DeepSeek-V3, from its published config.json (huggingface.co/deepseek-ai/DeepSeek-V3) and the technical
# report (arXiv:2412.19437): "671B total, 37B activated"; the 685B checkpoint adds a 14B MTP module.
DEEPSEEK_V3 = dict(vocab_size=129280, hidden_size=7168, num_hidden_layers=61, first_k_dense_replace=3,
                   intermediate_size=18432, num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256,
                   n_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=2048)


def mla_params(c: dict) -> int:
    """One multi-head latent attention block (DeepSeek-V2/V3), with keys as in their config.json: query
    down-projection, norm and up-projection; joint key-value down-projection (+ the shared RoPE key), norm
    and up-projection; output projection."""
    d, h, r_q, r_kv = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    qk_dim = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    query = d * r_q + r_q + r_q * h * qk_dim
    key_value = d * (r_kv + c["qk_rope_head_dim"]) + r_kv + r_kv * h * (c["qk_nope_head_dim"] + c["v_head_dim"])
    return query + key_value + h * c["v_head_dim"] * d


def deepseek_v3_param_counts(c: dict) -> dict[str, int]:
    """Total and active parameters of a DeepSeek-V3-layout LM from its config.json keys (e.g. `DEEPSEEK_V3`).

    Every layer: MLA and two RMSNorms; the first `first_k_dense_replace` a dense SwiGLU FFN, the others a
    router, `n_shared_experts` shared experts (every token) and `n_routed_experts` routed SwiGLU experts
    (`num_experts_per_tok` per token); untied input and output embeddings and a final norm. `mtp`: the
    multi-token-prediction module (one more MoE layer, a 2d -> d projection, two norms and its own copy of
    the embedding and head), which is in the checkpoint but not in the reported total. The routers' bias
    terms (buffers, not trained by gradient) are not counted.
    """
    d, n_layers, n_dense = c["hidden_size"], c["num_hidden_layers"], c["first_k_dense_replace"]
    expert = 3 * d * c["moe_intermediate_size"]                           # one SwiGLU expert
    n_moe = n_layers - n_dense
    embeddings = 2 * c["vocab_size"] * d
    every_token = (embeddings + d                                          # embeddings, head, final norm
                   + n_layers * (mla_params(c) + 2 * d)                    # attention and its norms
                   + n_dense * 3 * d * c["intermediate_size"]              # dense FFNs
                   + n_moe * (c["n_routed_experts"] * d + c["n_shared_experts"] * expert))   # routers, shared
    moe_layer = (mla_params(c) + 2 * d + c["n_routed_experts"] * d
                 + (c["n_routed_experts"] + c["n_shared_experts"]) * expert)
    return {"total": every_token + n_moe * c["n_routed_experts"] * expert,
            "active": every_token + n_moe * c["num_experts_per_tok"] * expert,
            "embeddings": embeddings, "attention": n_layers * mla_params(c),
            "mtp": moe_layer + 2 * d * d + 2 * d + embeddings}
