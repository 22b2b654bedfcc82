"""Chapter 4: positional encoding: the sinusoidal table, and the linear map that shifts it by k."""
import math

import torch

from ... import positional
from ...positional import sinusoidal_shift_matrix, sinusoidal_table
from ..core import Case, Exercise, register
from ..questions import Question

FORBIDDEN = [(positional, "sinusoidal_table"), (positional, "sinusoidal_shift_matrix"),
              (positional.SinusoidalPositionalEncoding, "__init__")]


def _table_edge_cases() -> list[Case]:
    return [Case("max_len=1, d_model=2", (1, 2)), Case("max_len=3, d_model=2", (3, 2)),
            Case("max_len=4, d_model=8", (4, 8)), Case("max_len=1, d_model=16", (1, 16))]


def _table_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(7000 + seed)
    max_len = int(torch.randint(1, 200, (1,), generator=g))
    d_model = 2 * int(torch.randint(1, 33, (1,), generator=g))
    return Case(f"random #{seed}: max_len={max_len}, d_model={d_model}", (max_len, d_model), seed=7000 + seed)


def _freqs(d_model, step=2):
    return torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) * (step / 2) / d_model)


def _table(max_len, d_model, first, second, w):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = first(pos * w), second(pos * w)
    return pe.float()


def _table_swapped(max_len, d_model):
    return _table(max_len, d_model, torch.cos, torch.sin, _freqs(d_model))


def _table_exponent_i(max_len, d_model):           # w_i = 10000^(-i/d) with i = 0, 1, 2, ... (no factor 2)
    return _table(max_len, d_model, torch.sin, torch.cos, _freqs(d_model, step=1))


def _table_halves(max_len, d_model):               # sin block then cos block, not interleaved
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    a = pos * _freqs(d_model)
    return torch.cat([torch.sin(a), torch.cos(a)], dim=-1).float()


def _table_no_exp(max_len, d_model):                # pos * 10000^(+2i/d): frequencies grow instead of shrink
    return _table(max_len, d_model, torch.sin, torch.cos, 1 / _freqs(d_model))


register(Exercise(
    name="ch04.sinusoidal_table",
    title="sinusoidal positional table (max_len, d_model), float32",
    reference=sinusoidal_table,
    edge_cases=_table_edge_cases,
    random_case=_table_random_case,
    points=2,
    atol=1e-4,   # float32 angles pos * w up to ~200 rad: sin/cos of them differ in the 5th decimal
    hint="PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)): even columns sin, "
         "odd columns cos, the same frequency in each pair. Return float32.",
    mistakes={"sin and cos swapped (cos in the even columns)": _table_swapped,
              "exponent i/d instead of 2i/d": _table_exponent_i,
              "sin in the first half and cos in the second (not interleaved)": _table_halves,
              "frequencies 10000^(+2i/d) (divide instead of multiply, or the sign of the exponent)": _table_no_exp},
    forbidden=FORBIDDEN,
))


# --- PE(pos + k) = M_k PE(pos) -----------------------------------------------------------------------

def _shift_edge_cases() -> list[Case]:
    return [Case("k=0 (identity), d_model=2", (0, 2)), Case("k=1, d_model=2", (1, 2)),
            Case("k=3, d_model=4", (3, 4)), Case("k=-2 (shift back), d_model=6", (-2, 6))]


def _shift_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(7500 + seed)
    k = int(torch.randint(-20, 50, (1,), generator=g))
    d_model = 2 * int(torch.randint(1, 17, (1,), generator=g))
    return Case(f"random #{seed}: k={k}, d_model={d_model}", (k, d_model), seed=7500 + seed)


def _shift_transposed(k, d_model):
    a = k * _freqs(d_model)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    i = torch.arange(0, d_model, 2)
    m[i, i], m[i, i + 1], m[i + 1, i], m[i + 1, i + 1] = a.cos(), -a.sin(), a.sin(), a.cos()
    return m.float()


register(Exercise(
    name="ch04.shift_matrix",
    title="the matrix M_k with PE[pos + k] = M_k @ PE[pos]",
    reference=sinusoidal_shift_matrix,
    edge_cases=_shift_edge_cases,
    random_case=_shift_random_case,
    points=1,
    atol=1e-4,
    hint="each (sin, cos) pair rotates by the angle k * w_i: sin(a + b) = sin a cos b + cos a sin b and "
         "cos(a + b) = cos a cos b - sin a sin b. M_k is block diagonal with 2x2 blocks [[c, s], [-s, c]].",
    mistakes={"rotation the wrong way ([[c, -s], [s, c]]: that is M_{-k})": _shift_transposed},
    forbidden=FORBIDDEN,
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch04.q_permutation",
    title="a layer without positions, on shuffled tokens",
    kind="choice", answer="C", choices=("A", "B", "C"), points=1,
    mistakes={
        "each output row follows its own token, so the rows come out shuffled: equal as a set, not in order": "A",
        "without positions nothing in the layer depends on order: its output is the original one, shuffled the "
        "same way": "B",
    },
))

register(Question(
    name="ch04.q_shift_matrix",
    title="the map M_k from PE(pos) to PE(pos + k)",
    kind="choice", answer="D", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "one M_k serves every position: the least-squares fit over all positions is exact, and it holds far "
        "outside the fit": "B",
        "a shift of position is not a scaling of the encoding: every row of the table has the same length": "C",
        "shifting by k changes the values, not their order: each (sin, cos) pair turns by the angle k w_i": "A",
    },
))

register(Question(
    name="ch04.q_extrapolation",
    title="which position encoding is at chance past the training length",
    kind="choice", answer="A", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "the sinusoidal table is defined at every position: past the training length it keeps part of its "
        "accuracy": "B",
        "RoPE is relative by construction and keeps the most accuracy past the training length": "C",
        "a learned table's rows past the training length were never trained: they stay at their random start": "D",
    },
))
