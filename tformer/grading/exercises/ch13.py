"""Chapter 13: mixture of experts. A top-k router, and the Switch load-balancing loss."""
import torch

from ... import moe
from ...moe import load_balancing_loss, top_k_route
from ..core import Case, Exercise, register
from ..questions import Question

# ---------------------------------------------------------------------------------------------------
# ch13.top_k_router: logits (N, E), k, normalize -> (gates (N, k), experts (N, k)), best expert first
# ---------------------------------------------------------------------------------------------------


def _route(logits, k, normalize):
    """The mistakes' own top-k (the reference is disabled while a learner's function runs)."""
    gates, experts = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    return (gates / gates.sum(-1, keepdim=True) if normalize else gates), experts


def _softmax_over_chosen(logits, k, normalize=True):
    top, idx = logits.topk(k, dim=-1)
    return torch.softmax(top, dim=-1), idx          # = renormalised gates: wrong when normalize=False


def _always_normalized(logits, k, normalize=True):
    return _route(logits, k, True)


def _never_normalized(logits, k, normalize=True):
    return _route(logits, k, False)


def _softmax_wrong_axis(logits, k, normalize=True):
    p = torch.softmax(logits, dim=0)
    g, i = p.topk(k, dim=-1)
    return (g / g.sum(-1, keepdim=True) if normalize else g), i


def _ascending(logits, k, normalize=True):
    g, i = _route(logits, k, normalize)
    return g.flip(-1), i.flip(-1)


def _logits(seed: int, n: int, e: int, dtype=torch.float32, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, e, generator=g) * scale).to(dtype)


def _router_edge_cases() -> list[Case]:
    return [
        Case("one token, two experts, k=1", (_logits(1, 1, 2), 1)),
        Case("k=1 with normalize=True: the gate is exactly 1", (_logits(2, 4, 4), 1, True)),
        Case("k=1 with normalize=False: the gate is the softmax probability", (_logits(3, 4, 4), 1, False)),
        Case("k=2 of 8, normalize=False", (_logits(4, 6, 8), 2, False)),
        Case("k=E: every expert, best first", (_logits(5, 3, 4), 4, True)),
        Case("large logits (scale 30: softmax must not overflow)", (_logits(6, 5, 6, scale=30.0), 1, False)),
        Case("float64 logits", (_logits(7, 5, 6, torch.float64), 3, True)),
    ]


def _router_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(13000 + seed)
    n, e = int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(2, 17, (1,), generator=g))
    k = int(torch.randint(1, e + 1, (1,), generator=g))
    normalize = bool(seed % 2)
    return Case(f"random #{seed}: N={n} E={e} k={k} normalize={normalize}", (_logits(13000 + seed, n, e), k, normalize),
                seed=13000 + seed)


register(Exercise(
    name="ch13.top_k_router",
    title="top-k router: logits (N, E), k, normalize -> (gates (N, k), experts (N, k)), best first",
    reference=top_k_route,
    edge_cases=_router_edge_cases,
    random_case=_router_random_case,
    points=2,
    hint="probs = softmax(logits) over the experts (last axis); gates, experts = probs.topk(k) (sorted, best first); "
         "if normalize, divide the k gates by their sum.",
    mistakes={"softmax over the k chosen logits only (that is the renormalised gate; wrong when normalize=False)":
              _softmax_over_chosen,
              "gates renormalised although normalize=False": _always_normalized,
              "gates not renormalised although normalize=True": _never_normalized,
              "softmax over the tokens axis instead of the experts axis": _softmax_wrong_axis,
              "experts in ascending order (best last)": _ascending},
    forbidden=[(moe, "top_k_route")],
))

# ---------------------------------------------------------------------------------------------------
# ch13.balance_loss: Switch load balancing, E * sum_i f_i P_i
# ---------------------------------------------------------------------------------------------------


def _f(experts, n_experts, dtype, per):
    return torch.bincount(experts.flatten(), minlength=n_experts).to(dtype) / per


def _divide_by_n_only(probs, experts):
    return probs.shape[1] * (_f(experts, probs.shape[1], probs.dtype, experts.shape[0]) * probs.mean(0)).sum()


def _f_from_probs(probs, experts):
    p = probs.mean(0)
    return probs.shape[1] * (p * p).sum()


def _no_factor_e(probs, experts):
    return (_f(experts, probs.shape[1], probs.dtype, experts.numel()) * probs.mean(0)).sum()


def _first_choice_only(probs, experts):
    first = experts[:, :1]
    return probs.shape[1] * (_f(first, probs.shape[1], probs.dtype, first.numel()) * probs.mean(0)).sum()


def _balance_case(name: str, seed: int, n: int, e: int, k: int, dtype=torch.float32, skew: float = 1.0,
                  random: bool = False) -> Case:
    logits = _logits(seed, n, e, dtype, scale=skew)
    probs = torch.softmax(logits, -1)
    return Case(name, (probs, probs.topk(k, -1).indices), seed=seed if random else None)


def _balance_edge_cases() -> list[Case]:
    uniform = torch.full((4, 4), 0.25)
    collapsed = torch.zeros(5, 3)
    collapsed[:, 1] = 1.0
    return [
        Case("uniform probabilities, each expert chosen once (loss 1)", (uniform, torch.tensor([[0], [1], [2], [3]]))),
        Case("collapse: every token on expert 1 with probability 1 (loss E)",
             (collapsed, torch.ones(5, 1, dtype=torch.long))),
        _balance_case("one token, k=1", 1, 1, 4, 1),
        _balance_case("k=2 of 4 experts", 2, 6, 4, 2),
        _balance_case("a peaked router, k=2 of 8", 3, 10, 8, 2, skew=5.0),
        _balance_case("float64", 4, 7, 5, 3, torch.float64),
    ]


def _balance_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(13500 + seed)
    n, e = int(torch.randint(1, 60, (1,), generator=g)), int(torch.randint(2, 17, (1,), generator=g))
    k = int(torch.randint(1, min(e, 4) + 1, (1,), generator=g))
    return _balance_case(f"random #{seed}: N={n} E={e} k={k}", 13500 + seed, n, e, k, skew=float(1 + seed % 4),
                         random=True)


register(Exercise(
    name="ch13.balance_loss",
    title="Switch load-balancing loss: probs (N, E), experts (N, k) -> scalar E * sum_i f_i P_i",
    reference=load_balancing_loss,
    edge_cases=_balance_edge_cases,
    random_case=_balance_random_case,
    points=2,
    hint="f_i = (number of the N*k choices equal to i) / (N*k), e.g. with torch.bincount(experts.flatten(), "
         "minlength=E); P_i = probs.mean(0)[i]; return E * (f * P).sum() in probs' dtype.",
    mistakes={"f_i divided by N instead of N*k (k times too large)": _divide_by_n_only,
              "f_i taken from the probabilities instead of the choices (E * sum P_i^2)": _f_from_probs,
              "missing the factor E (uniform routing should give 1)": _no_factor_e,
              "only the first choice counted in f_i": _first_choice_only},
    forbidden=[(moe, "load_balancing_loss")],
))


# --- questions of understanding ------------------------------------------------------------------------
# The answers are moe_lm_param_counts(**QWEN3_235B_A22B) of tformer/moe/params.py, written out:
# tests/test_questions_late.py recomputes them from the configuration.

register(Question(
    name="ch13.q_active_share",
    title="the share of Qwen3-235B-A22B's parameters one token uses, in percent",
    kind="number", answer=9.439, rel_tol=1e-2, points=1,
    mistakes={
        "8 / 128 = 6.25% is the share of the experts a token visits; the attention, embeddings, norms and routers "
        "are used by every token, so the share of all parameters is larger": 6.25,
        "a dense model uses 100% of its parameters; a token of this MoE skips 120 of the 128 experts of every "
        "layer": 100,
    },
    hint="active / total, both printed under Qwen3-235B-A22B from its published configuration, times 100.",
))

register(Question(
    name="ch13.q_active_16",
    title="Qwen3-235B-A22B with 16 experts per token instead of 8: active parameters, in billions",
    kind="number", answer=36.384, rel_tol=1e-2, points=1,
    mistakes={
        "only the experts' part doubles: the attention, embeddings, norms and routers stay the same": 44.382,
        "the active count grows with k, the experts each token visits: 8 more experts of 3 x 4096 x 1536 per "
        "layer": 22.191,
        "16/128 of the total scales everything by k/E, but the attention and embeddings are used by every token "
        "whatever k is": 29.387,
    },
    hint="add 94 layers x 8 more experts x 3 x 4096 x 1536 to the active count, or run moe_lm_param_counts with "
         "experts_per_token=16.",
))

register(Question(
    name="ch13.q_compute_follows_k",
    title="from 2 to 32 experts at k = 2: what the parameters and the forward FLOPs do",
    kind="choice", answer="A", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "each token still visits k experts whatever E is: the experts' FLOPs are the same at every E (asserted)":
            "B",
        "every expert has its own weights, so the total grows about linearly with E (asserted); each expert gets "
        "fewer tokens, but there are more experts, and the FLOPs stay": "C",
        "the total counts every expert, visited or not, and memory must hold them all; only the active count and "
        "the FLOPs follow k": "D",
    },
))
