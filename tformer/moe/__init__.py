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

Beside this idea, the package holds its machinery and its arithmetic:

    dispatch   the fast paths: the plan, the buffers, the experts' batched and grouped matmuls
    params     a published MoE LM's parameters counted from its config (Qwen3, Mixtral, DeepSeek-V3)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..utils import gpu
from ..utils.checks import check_dim, check_float, check_rank
from .dispatch import (DISPATCH, GROUP_ALIGN, Experts, RowGather, compute_dtype, expert_capacity,
                       grouped_mm_available, route_rows)


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
        buf = RowGather.apply(xf, rows.src % n, rows.dest, rows.keep_flat, k)               # (R, d)
        if path == "padded":
            ys = self.experts.padded(buf.view(c.n_experts, -1, d)).view(-1, d)
        else:
            buf = buf.to(compute_dtype(xf))
            ys = self.experts.grouped(buf, rows.expert_of_row, rows.ends)
        # combine: pair a reads row dest[a]; the gradient of row r is gathered from pair src[r]
        y_pairs = RowGather.apply(ys, rows.dest, rows.src, rows.used, 1).view(k, n, d)   # (k, N, d)
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
