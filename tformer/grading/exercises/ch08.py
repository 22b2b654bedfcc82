"""Chapter 8: a sliding-window mask, and NTK-aware RoPE frequencies."""
import torch

from ... import masks, positional
from ..core import Case, Exercise, register
from ..questions import Question


def _window_reference(t, window, causal=True):
    return masks.sliding_window_mask(t, window, causal=causal)


def _window_edges() -> list[Case]:
    return [Case("T=1, window=1", (1, 1)), Case("window=1: only itself", (5, 1)),
            Case("window larger than T", (4, 9)), Case("T=6, window=3, causal", (6, 3)),
            Case("T=6, window=2, both sides (causal=False)", (6, 2), {"causal": False})]


def _window_random(seed: int) -> Case:
    g = torch.Generator().manual_seed(800 + seed)
    t, w = int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
    causal = bool(seed % 2 == 0)
    return Case(f"random #{seed}: T={t} window={w} causal={causal}", (t, w), {"causal": causal}, seed=800 + seed)


def _ij(t):
    return torch.arange(t).unsqueeze(1), torch.arange(t).unsqueeze(0)


def _off_by_one(t, window, causal=True):
    i, j = _ij(t)
    m = (i - j).abs() <= window
    return m & (j <= i) if causal else m


def _no_causal(t, window, causal=True):
    i, j = _ij(t)
    return (i - j).abs() < window


def _future_only(t, window, causal=True):
    i, j = _ij(t)
    m = (i - j).abs() < window
    return m & (j >= i) if causal else m


register(Exercise(
    name="ch08.sliding_window_mask",
    title="sliding-window mask (T, T), True = may attend",
    reference=_window_reference,
    edge_cases=_window_edges,
    random_case=_window_random,
    points=2,
    hint="query i sees key j when |i - j| < window; with causal=True also j <= i. Build it from "
         "torch.arange(T) as a column minus a row, no loops.",
    mistakes={"window off by one (|i - j| <= window: one key too many)": _off_by_one,
              "causal=True ignored (the window looks into the future)": _no_causal,
              "the window points the wrong way (j >= i: the future instead of the past)": _future_only},
    forbidden=[(masks, "sliding_window_mask")],
))


def _ntk_reference(head_dim, base, factor):
    return positional.rope_frequencies(head_dim, base, "ntk", factor)[0]


def _ntk_edges() -> list[Case]:
    return [Case("factor 1: plain RoPE", (8, 10000.0, 1.0)), Case("head_dim 4", (4, 10000.0, 2.0)),
            Case("head_dim 64, factor 4", (64, 10000.0, 4.0)), Case("Llama-3 base 500000, factor 8", (128, 500000.0, 8.0))]


def _ntk_random(seed: int) -> Case:
    g = torch.Generator().manual_seed(810 + seed)
    hd = 2 * int(torch.randint(2, 65, (1,), generator=g))
    factor = float(torch.randint(2, 17, (1,), generator=g))
    base = [10000.0, 500000.0, 1000000.0][seed % 3]
    return Case(f"random #{seed}: head_dim={hd} base={base:g} factor={factor:g}", (hd, base, factor), seed=810 + seed)


def _plain_base_scaled(head_dim, base, factor):
    i = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return ((base * factor) ** (-i)).float()


def _position_interpolation(head_dim, base, factor):
    i = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (base ** (-i) / factor).float()


register(Exercise(
    name="ch08.ntk_rope",
    title="NTK-aware RoPE frequencies (head_dim/2,) float32",
    reference=_ntk_reference,
    edge_cases=_ntk_edges,
    random_case=_ntk_random,
    points=2,
    atol=0.0,
    rtol=1e-5,
    hint="theta_i = base'^(-2i/d) for i = 0 .. d/2 - 1, with base' = base * factor^(d / (d - 2)); compute in "
         "float64 and return float32.",
    mistakes={"base multiplied by factor without the d/(d-2) exponent": _plain_base_scaled,
              "that is position interpolation (every frequency / factor), not NTK": _position_interpolation},
    forbidden=[(positional, "rope_frequencies")],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch08.q_memory_doubling",
    title="explicit attention's peak memory when n doubles",
    kind="number", answer=4, rel_tol=0.125, points=1,    # 3.5-4.5: the table's ratios, 3.59-3.88, and the ideal 4
    mistakes={
        "2 is the sliding window's and linear attention's growth: explicit attention stores the n x n "
        "weights, which grow as n^2": 2,
        "the weights matrix is n x n, not n x n x n: doubling n quadruples it": 8,
    },
    hint="the n x n weights dominate the peak: (2n)^2 / n^2. The table's ratios fall a little short of that, "
         "since the inputs and outputs grow only linearly.",
))

register(Question(
    name="ch08.q_rope_scaling",
    title="which RoPE frequencies position interpolation and NTK-aware scaling change",
    kind="choice", answer="C", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "NTK-aware scaling raises the base: the fastest pair keeps its frequency, only the slow ones slow "
        "down": "B",
        "the other way around: NTK keeps the fast pairs (local order) and interpolates the slowest by s": "A",
        "only YaRN rescales the logits, and it changes the frequencies too; position interpolation and NTK "
        "change the frequencies": "D",
    },
))

register(Question(
    name="ch08.q_yarn_logits",
    title="the factor YaRN puts on the logits q.k, at scaling factor s",
    kind="expr", answer="(0.1*log(s) + 1)**2", symbols=("s",), points=1,
    mistakes={
        "0.1 ln s + 1 multiplies the rotated query and the rotated key both, so their dot product gets its "
        "square": "0.1*log(s) + 1",
        "1/s is position interpolation's factor on the slow frequencies, not a factor on the logits": "1/s",
    },
))
