"""Chapter 5: LayerNorm, the position-wise feed-forward network, and a post-LN encoder layer."""
import torch
import torch.nn.functional as F

from ... import blocks
from ...blocks import FeedForward
from ..core import Case, Exercise, register
from ..questions import Question

# --- LayerNorm ---------------------------------------------------------------------------------------

_LN_FORBIDDEN = [(torch.nn.functional, "layer_norm"), (torch, "layer_norm"), (torch, "native_layer_norm"),
                 (torch.nn.LayerNorm, "forward"), (torch.nn.functional, "group_norm"),
                 (torch.nn.functional, "instance_norm"), (torch.nn.functional, "rms_norm")]


def _ln_case(name, seed, shape, scale=1.0, shift=0.0, eps=1e-5, random=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = torch.randn(*shape, generator=g) * scale + shift
    return Case(name, (x, 1 + 0.1 * torch.randn(d, generator=g), 0.1 * torch.randn(d, generator=g), eps),
                seed=seed if random else None)


def _ln_edge_cases() -> list[Case]:
    g = torch.Generator().manual_seed(50)
    const = torch.full((1, 2, 4), 3.0)
    x, w, b, eps = _ln_case("", 51, (2, 3, 8)).args
    return [
        _ln_case("one token, 2 features", 52, (1, 1, 2)),
        Case("constant rows (variance 0: eps matters)", (const, torch.ones(4), torch.zeros(4), 1e-5)),
        _ln_case("tiny variance (features scaled by 1e-3)", 53, (2, 3, 8), scale=1e-3),
        _ln_case("large mean (features + 1000)", 54, (1, 2, 8), shift=1000.0),
        Case("non-contiguous input", (x.transpose(0, 1).contiguous().transpose(0, 1), w, b, eps)),
        _ln_case("eps = 0.1", 55, (1, 4, 6), eps=0.1),
    ]


def _ln_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(8000 + seed)
    b, t, d = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 4), (1, 9), (2, 33)))
    return _ln_case(f"random #{seed}: B={b} T={t} d={d}", 8000 + seed, (b, t, d), scale=float(1 + seed % 3),
                    random=True)


def layer_norm_reference(x, weight, bias, eps=1e-5):
    """x (..., d): normalize each token's d features to mean 0 and variance 1, then scale and shift."""
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _ln_math(x, weight, bias, eps, unbiased=False, dim=-1, eps_outside=False):
    mu = x.mean(dim, keepdim=True)
    var = x.var(dim, keepdim=True, unbiased=unbiased)
    std = var.sqrt() + eps if eps_outside else (var + eps).sqrt()
    return (x - mu) / std * weight + bias


def _ln_bessel(x, weight, bias, eps=1e-5):
    return _ln_math(x, weight, bias, eps, unbiased=True)


def _ln_over_tokens(x, weight, bias, eps=1e-5):
    return _ln_math(x, weight, bias, eps, dim=-2)


def _ln_eps_outside(x, weight, bias, eps=1e-5):
    return _ln_math(x, weight, bias, eps, eps_outside=True)


def _ln_no_affine(x, weight, bias, eps=1e-5):
    return _ln_math(x, torch.ones_like(weight), torch.zeros_like(bias), eps)


register(Exercise(
    name="ch05.layer_norm",
    title="LayerNorm over each token's features",
    reference=layer_norm_reference,
    edge_cases=_ln_edge_cases,
    random_case=_ln_random_case,
    points=2,
    atol=1e-4,
    hint="mean and variance over the last axis (features), keepdim=True; the *biased* variance (divide by d, "
         "not d-1: x.var(-1, unbiased=False)); y = (x - mean) / sqrt(var + eps) * weight + bias.",
    mistakes={"variance with Bessel's correction (divides by d-1; LayerNorm divides by d)": _ln_bessel,
              "normalized over the tokens (axis -2) instead of the features": _ln_over_tokens,
              "eps added outside the square root": _ln_eps_outside,
              "weight and bias (gain and shift) not applied": _ln_no_affine},
    forbidden=_LN_FORBIDDEN,
))


# --- position-wise feed-forward network ------------------------------------------------------------------

def _ffn_case(name, seed, b, t, d, d_ff, random=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    return Case(name, (torch.randn(b, t, d, generator=g), torch.randn(d_ff, d, generator=g) * d ** -0.5,
                       torch.randn(d_ff, generator=g) * 0.1, torch.randn(d, d_ff, generator=g) * d_ff ** -0.5,
                       torch.randn(d, generator=g) * 0.1), seed=seed if random else None)


def _ffn_edge_cases() -> list[Case]:
    x, *w = _ffn_case("", 61, 2, 4, 4, 16).args
    return [_ffn_case("one token", 60, 1, 1, 2, 8), _ffn_case("batch of 2, d_ff = 4 d", 61, 2, 4, 4, 16),
            Case("non-contiguous input", (x.transpose(0, 1).contiguous().transpose(0, 1), *w))]


def _ffn_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(8500 + seed)
    b, t, d = (int(torch.randint(1, n, (1,), generator=g)) for n in (4, 9, 17))
    return _ffn_case(f"random #{seed}: B={b} T={t} d={d} d_ff={4 * d}", 8500 + seed, b, t, d, 4 * d, random=True)


def ffn_reference(x, w1, b1, w2, b2):
    """tformer.FeedForward (ReLU, the paper's) with these weights: (B, T, d) -> (B, T, d)."""
    ffn = FeedForward(x.shape[-1], w1.shape[0], activation="relu")
    with torch.no_grad():
        ffn.fc1.weight.copy_(w1), ffn.fc1.bias.copy_(b1), ffn.fc2.weight.copy_(w2), ffn.fc2.bias.copy_(b2)
    return ffn(x)


def _ffn_no_activation(x, w1, b1, w2, b2):
    return F.linear(F.linear(x, w1, b1), w2, b2)


def _ffn_relu_after(x, w1, b1, w2, b2):
    return F.relu(F.linear(F.linear(x, w1, b1), w2, b2))


register(Exercise(
    name="ch05.ffn",
    title="position-wise FFN: W_2 relu(W_1 x + b_1) + b_2",
    reference=ffn_reference,
    edge_cases=_ffn_edge_cases,
    random_case=_ffn_random_case,
    points=1,
    hint="weights are in nn.Linear's layout (out, in): x @ w1.T + b1 expands d -> d_ff, ReLU, then "
         "@ w2.T + b2 contracts back to d. The same weights act on every position.",
    mistakes={"no ReLU between the two layers (the FFN collapses to one linear map)": _ffn_no_activation,
              "ReLU after the second layer instead of between": _ffn_relu_after},
    forbidden=[(FeedForward, "forward"), (blocks.TransformerBlock, "forward")],
))


# --- a post-LN encoder layer (the paper) --------------------------------------------------------------------

def _enc_case(name, seed, b, t, h, hd, random=False) -> Case:
    g = torch.Generator().manual_seed(seed)
    d = h * hd
    layer = blocks.TransformerBlock(blocks.BlockConfig(d_model=d, n_heads=h, d_ff=4 * d, dropout=0.0, norm_first=False))
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else p.shape[-1] ** -0.5))
    params = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    return Case(name, (torch.randn(b, t, d, generator=g), params, h), seed=seed if random else None)


def _enc_edge_cases() -> list[Case]:
    return [_enc_case("one token, one head", 70, 1, 1, 1, 4), _enc_case("batch of 2, 2 heads", 71, 2, 5, 2, 4)]


def _enc_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(9000 + seed)
    b, t, h, hd = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 3), (1, 7), (1, 4), (2, 5)))
    return _enc_case(f"random #{seed}: B={b} T={t} heads={h} d_head={hd}", 9000 + seed, b, t, h, hd, random=True)


def encoder_layer_reference(x, params, n_heads):
    """tformer.TransformerBlock(BlockConfig(norm_first=False)) loaded with `params` (its state_dict)."""
    d = x.shape[-1]
    cfg = blocks.BlockConfig(d_model=d, n_heads=n_heads, d_ff=params["ffn.fc1.weight"].shape[0], dropout=0.0,
                             norm_first=False)
    layer = blocks.TransformerBlock(cfg)
    layer.load_state_dict(params)
    return layer.eval()(x)


def _enc_math(x, p, n_heads, norm_first):
    d = x.shape[-1]
    b, t, _ = x.shape

    def attn(h):
        q, k, v = (z.view(b, t, n_heads, d // n_heads).transpose(1, 2)
                   for z in F.linear(h, p["attn.qkv.weight"], p["attn.qkv.bias"]).split(d, -1))
        y = torch.softmax(q @ k.transpose(-2, -1) / (d // n_heads) ** 0.5, -1) @ v
        return F.linear(y.transpose(1, 2).reshape(b, t, d), p["attn.out.weight"], p["attn.out.bias"])

    def ffn(h):
        return F.linear(F.relu(F.linear(h, p["ffn.fc1.weight"], p["ffn.fc1.bias"])), p["ffn.fc2.weight"], p["ffn.fc2.bias"])

    def ln(h, i):
        return _ln_math(h, p[f"norm{i}.weight"], p[f"norm{i}.bias"], 1e-5)
    if norm_first:
        x = x + attn(ln(x, 1))
        return x + ffn(ln(x, 2))
    x = ln(x + attn(x), 1)
    return ln(x + ffn(x), 2)


def _enc_pre_ln(x, params, n_heads):
    return _enc_math(x, params, n_heads, norm_first=True)


def _enc_no_residual(x, p, n_heads):           # x = LN1(MHA(x)); x = LN2(FFN(x)): no "+ x"
    b, t, d = x.shape
    q, k, v = (z.view(b, t, n_heads, d // n_heads).transpose(1, 2)
               for z in F.linear(x, p["attn.qkv.weight"], p["attn.qkv.bias"]).split(d, -1))
    y = torch.softmax(q @ k.transpose(-2, -1) / (d // n_heads) ** 0.5, -1) @ v
    h = _ln_math(F.linear(y.transpose(1, 2).reshape(b, t, d), p["attn.out.weight"], p["attn.out.bias"]),
                 p["norm1.weight"], p["norm1.bias"], 1e-5)
    f = F.linear(F.relu(F.linear(h, p["ffn.fc1.weight"], p["ffn.fc1.bias"])), p["ffn.fc2.weight"], p["ffn.fc2.bias"])
    return _ln_math(f, p["norm2.weight"], p["norm2.bias"], 1e-5)


register(Exercise(
    name="ch05.encoder_layer",
    title="post-LN encoder layer: x = LN(x + MHA(x)); x = LN(x + FFN(x))",
    reference=encoder_layer_reference,
    edge_cases=_enc_edge_cases,
    random_case=_enc_random_case,
    points=2,
    atol=1e-4,
    n_random=6,
    hint="the paper's order (post-LN): add the sublayer's output to its input, then LayerNorm: "
         "x = LN1(x + MHA(x)), then x = LN2(x + FFN(x)). params holds the weights by name (print params.keys()).",
    mistakes={"pre-LN order (x + MHA(LN(x))) instead of the paper's post-LN": _enc_pre_ln,
              "residual connections missing": _enc_no_residual},
    forbidden=[(blocks.TransformerBlock, "forward"), (torch.nn.TransformerEncoderLayer, "forward"),
               (torch.nn.MultiheadAttention, "forward")] + _LN_FORBIDDEN[:4],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch05.q_residual",
    title="the gradient at the first of 64 layers, with and without the residual",
    kind="choice", answer="C", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "the stack without residual has a LayerNorm after every layer too, and its gradient still decays: "
        "normalizing does not give the gradient a path": "B",
        "without the residual the gradient shrinks with depth, it does not grow": "A",
        "with the residual the gradient keeps its size at every depth: the identity path carries it past every "
        "layer": "D",
    },
))

register(Question(
    name="ch05.q_layernorm",
    title="the axis of LayerNorm's mean and variance",
    kind="choice", answer="A", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "that is BatchNorm: LayerNorm's output for a token does not change with the rest of the batch": "B",
        "a token is normalized over its own features; per feature, across tokens, the variance is not 1": "C",
        "the statistics are per token: each token comes out with mean 0 and variance 1, whatever its scale": "D",
    },
))

register(Question(
    name="ch05.q_ffn_params",
    title="the parameters of the paper's FFN (512 -> 2048 -> 512) on 7 tokens",
    kind="number", answer=2 * 512 * 2048 + 2048 + 512, points=1,
    mistakes={
        "the same weights serve every position: the count does not depend on the number of tokens":
            7 * (2 * 512 * 2048 + 2048 + 512),
        "the two biases count too, 2048 + 512": 2 * 512 * 2048,
        "that is W_1 only: the FFN expands with W_1 and contracts back with W_2": 512 * 2048 + 2048,
    },
))
