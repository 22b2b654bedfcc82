"""Chapter 7: the paper's training cost in FLOPs (time x GPUs x FLOP/s), compared by relative error; and one
LSTM layer written as the loop it is (the T dependent steps that keep an RNN from running in parallel)."""
import torch
import torch.nn as nn

from ...models import rnn
from ...measure import timing
from ..core import Case, Exercise, register
from ..questions import Question

P100, V100, A100, H100 = 9.5e12, 15.7e12, 312e12, 989e12        # sustained FP32 (P100, V100) / dense bf16 FLOP/s


def _reference(days, n_gpus, flops_per_gpu):
    return timing.training_flops(days, n_gpus, flops_per_gpu)


def _edges() -> list[Case]:
    return [Case("the paper's big model: 3.5 days on 8 P100", (3.5, 8, P100)),
            Case("the paper's base model: 12 hours on 8 P100", (0.5, 8, P100)),
            Case("one GPU for one day", (1.0, 1, V100)),
            Case("one H100 for one hour", (1 / 24, 1, H100))]


def _random(seed: int) -> Case:
    g = torch.Generator().manual_seed(700 + seed)
    days = round(float(torch.empty(1).uniform_(0.05, 90.0, generator=g)), 3)
    gpus = int(torch.randint(1, 4097, (1,), generator=g))
    flops = [P100, V100, A100, H100][seed % 4]
    return Case(f"random #{seed}: {days} days on {gpus} GPUs at {flops:.3g} FLOP/s", (days, gpus, flops),
                seed=700 + seed)


register(Exercise(
    name="ch07.training_flops",
    title="a training run's cost in FLOPs: days x GPUs x FLOP/s per GPU",
    reference=_reference,
    edge_cases=_edges,
    random_case=_random,
    points=1,
    atol=0.0,
    rtol=1e-3,                                   # compared by relative error
    hint="convert days to seconds (24 x 3600 seconds a day), then multiply by the number of GPUs and by "
         "each GPU's FLOP/s. The paper's big model: 3.5 days x 8 P100 at 9.5e12 FLOP/s = 2.3e19 FLOPs.",
    mistakes={"days used as hours (x 3600 instead of x 86400)": lambda d, n, f: d * 3600 * n * f,
              "days not converted to seconds": lambda d, n, f: d * n * f,
              "the number of GPUs left out": lambda d, n, f: d * 86400 * f},
    forbidden=[(timing, "training_flops")],
))


# ---- one LSTM layer, step by step --------------------------------------------------------------------------

def lstm_layer_reference(x, w_ih, w_hh, b_ih, b_hh):
    """x (B, T, d_in) -> h_1..h_T (B, T, H) of one nn.LSTM layer with these weights, zero initial state."""
    lstm = nn.LSTM(w_ih.shape[1], w_hh.shape[1], batch_first=True, dtype=x.dtype)
    with torch.no_grad():
        for name, w in (("weight_ih_l0", w_ih), ("weight_hh_l0", w_hh), ("bias_ih_l0", b_ih), ("bias_hh_l0", b_hh)):
            getattr(lstm, name).copy_(w)
        return rnn.lstm_reference(lstm, x)


def _loop(x, w_ih, w_hh, b_ih, b_hh, order="ifgo", use_b_hh=True, tanh_c=True, carry_h=True, carry_c=True):
    """Shared by the named mistakes: the LSTM loop with one thing changed."""
    hidden = w_hh.shape[1]
    h = x.new_zeros(x.shape[0], hidden)
    c = torch.zeros_like(h)
    xw = x @ w_ih.T + b_ih + (b_hh if use_b_hh else 0.0)
    outs = []
    for t in range(x.shape[1]):
        gates = dict(zip(order, (xw[:, t] + (h if carry_h else 0.0 * h) @ w_hh.T).chunk(4, dim=-1)))
        i, f, g, o = gates["i"], gates["f"], gates["g"], gates["o"]
        c = (torch.sigmoid(f) * c if carry_c else 0.0) + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * (torch.tanh(c) if tanh_c else c)
        outs.append(h)
    return torch.stack(outs, dim=1)


def _lstm_case(name, b, t, d_in, hidden, seed, scale=1.0, zero_x=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    bound = scale / hidden ** 0.5                                      # nn.LSTM's init range, times scale

    def u(*shape):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * bound
    x = torch.zeros(b, t, d_in, dtype=torch.float64) if zero_x else torch.randn(b, t, d_in, generator=g,
                                                                                   dtype=torch.float64)
    return Case(name, (x, u(4 * hidden, d_in), u(4 * hidden, hidden), u(4 * hidden), u(4 * hidden)), seed=seed)


def _lstm_edges() -> list[Case]:
    return [_lstm_case("one step, one unit (T = 1: no recurrence yet)", 1, 1, 1, 1, 7100),
            _lstm_case("two steps: step 2 reads h_1 and c_1", 1, 2, 2, 2, 7101),
            _lstm_case("zero inputs: the biases and the recurrence alone move the state", 2, 6, 3, 2, 7102,
                       zero_x=True),
            _lstm_case("a batch of 3 sequences, d_in = 4 != hidden = 3", 3, 5, 4, 3, 7103),
            _lstm_case("large weights: the gates saturate", 2, 8, 3, 4, 7104, scale=6.0)]


def _lstm_random(seed: int) -> Case:
    g = torch.Generator().manual_seed(7200 + seed)
    b, t, d_in, hidden = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 5), (1, 17), (1, 9), (1, 9)))
    return _lstm_case(f"random #{seed}: B={b}, T={t}, d_in={d_in}, hidden={hidden}", b, t, d_in, hidden, 7200 + seed)


register(Exercise(
    name="ch07.lstm_layer",
    title="one LSTM layer as a loop over time: x (B, T, d_in) -> h_1..h_T (B, T, H), zero initial state",
    reference=lstm_layer_reference,
    edge_cases=_lstm_edges,
    random_case=_lstm_random,
    points=2,
    atol=1e-9,
    rtol=1e-7,
    hint="h = c = zeros (B, H). The input products for all steps at once: xw = x @ w_ih.T + b_ih + b_hh "
         "(B, T, 4H). Then for t in range(T): i, f, g, o = (xw[:, t] + h @ w_hh.T).chunk(4, -1) (PyTorch's "
         "gate order); c = sigmoid(f) * c + sigmoid(i) * tanh(g); h = sigmoid(o) * tanh(c); keep h. "
         "Stack the T states on dim 1.",
    mistakes={"gates split as i, f, o, g (PyTorch's order is i, f, g, o)": lambda *a: _loop(*a, order="ifog"),
              "b_hh left out (nn.LSTM adds both biases)": lambda *a: _loop(*a, use_b_hh=False),
              "tanh of the cell state left out: h_t = sigmoid(o) * c_t": lambda *a: _loop(*a, tanh_c=False),
              "the recurrence dropped: every step computed from h = 0, as if the steps were independent":
                  lambda *a: _loop(*a, carry_h=False, carry_c=False),
              "the cell state not carried: c_t = sigmoid(i) * tanh(g), the forget gate unused":
                  lambda *a: _loop(*a, carry_c=False)},
    forbidden=[(rnn, "lstm_reference"), (torch, "lstm"), (torch, "lstm_cell")],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch07.q_lstm_matmuls",
    title="the matrix products of the 2-layer lstm_reference at length T",
    kind="expr", answer="2*T + 2", symbols=("T",), points=1,
    mistakes={
        "each layer also runs one input product x W_ih, batched over all time steps": "2*T",
        "the input products x W_ih are batched over time, one per layer: only h_(t-1) W_hh must wait for the "
        "step before": "4*T",
        "5 is the Transformer layer's count, the same for every T; the LSTM's grows with T": "5",
    },
    hint="per layer: one input product for all steps at once, and one recurrent product h_(t-1) W_hh per step.",
))

register(Question(
    name="ch07.q_causal_parallel",
    title="what a causal Transformer layer's output at position t needs",
    kind="choice", answer="C", choices=("A", "B", "C"), points=1,
    mistakes={
        "that is an RNN's h_(t-1): a Transformer layer reads only the layer below, so each position can be "
        "computed on its own from the prefix, with the same numbers": "B",
        "the causal mask hides the positions after t: changing them cannot change the output at t": "A",
    },
))

register(Question(
    name="ch07.q_hunyuan",
    title="Hunyuan-Large's pre-training compute, in units of the big Transformer's",
    kind="number", answer=6 * 52e9 * 7e12 / (3.5 * 86400 * 8 * 9.5e12), rel_tol=0.01, points=1,
    mistakes={
        "a token's arithmetic uses only the 52 B active parameters, not all 389 B":
            6 * 389e9 * 7e12 / (3.5 * 86400 * 8 * 9.5e12),
        "2 N D is the forward pass only: training costs about 6 N per token (forward and backward)":
            2 * 52e9 * 7e12 / (3.5 * 86400 * 8 * 9.5e12),
    },
    hint="6 x active parameters x tokens, divided by 3.5 days x 8 GPUs x 9.5e12 FLOP/s.",
))
