"""Chapter 14: efficient inference. A KV-cache decoding step, the speculative accept/reject rule,
int8 per-channel weight quantization, and the continuous-batching scheduler's admission rule."""
import math

import torch

from ... import attention
from ...inference import quantize, speculative
from ...attention import scaled_dot_product_attention
from ...cache import KVCache
from ...masks import causal_mask
from ...inference import engine
from ...inference.engine import plan_admission
from ...inference.quantize import quantize_int8
from ...inference.speculative import speculative_accept
from ..core import Case, Exercise, compare, register
from ..questions import Question

# ---------------------------------------------------------------------------------------------------
# ch14.kv_step: attend from T_new new queries over the cached keys/values plus the new ones
# ---------------------------------------------------------------------------------------------------


def kv_step_reference(q, k_new, v_new, k_cache, v_cache):
    """q, k_new, v_new (B, H, T_new, d); k_cache, v_cache (B, H, T_past, d) (T_past may be 0).

    Returns (out (B, H, T_new, d), k_all, v_all (B, H, T_past + T_new, d)); new query i sees every cached
    key and the new keys 0..i (causal mask aligned bottom-right).
    """
    cache = KVCache()
    if k_cache.shape[2]:
        cache.append(k_cache, v_cache)
    k_all, v_all = cache.append(k_new, v_new)
    out, _ = scaled_dot_product_attention(q, k_all, v_all, causal_mask(q.shape[2], k_all.shape[2]))
    return out, k_all.clone(), v_all.clone()


def _attend(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def _kv_forgot_cache(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    return _attend(q, k_new, v_new, causal_mask(q.shape[2])), k_all, v_all


def _kv_no_causal(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    return _attend(q, k_all, v_all), k_all, v_all


def _kv_top_left(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    t_q, t_k = q.shape[2], k_all.shape[2]
    return _attend(q, k_all, v_all, torch.ones(t_q, t_k, dtype=torch.bool).tril()), k_all, v_all


def _kv_new_first(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_new, k_cache], 2), torch.cat([v_new, v_cache], 2)
    return _attend(q, k_all, v_all, causal_mask(q.shape[2], k_all.shape[2])), k_all, v_all


def _kv_case(name: str, seed: int, b: int, h: int, t_past: int, t_new: int, d: int, random: bool = False,
             d_v: int | None = None) -> Case:
    g = torch.Generator().manual_seed(seed)
    d_v = d if d_v is None else d_v
    q, k_new, v_new = (torch.randn(b, h, t_new, dd, generator=g) for dd in (d, d, d_v))
    k_cache, v_cache = (torch.randn(b, h, t_past, dd, generator=g) for dd in (d, d_v))
    return Case(name, (q, k_new, v_new, k_cache, v_cache), seed=seed if random else None)


def _kv_edge_cases() -> list[Case]:
    return [
        _kv_case("one new token, one cached (B=1, H=1)", 1, 1, 1, 1, 1, 4),
        _kv_case("empty cache (the prompt): T_past=0, T_new=4", 2, 2, 2, 0, 4, 8),
        _kv_case("one new token over 6 cached", 3, 2, 3, 6, 1, 8),
        _kv_case("a chunk of 3 new tokens over 5 cached", 4, 2, 2, 5, 3, 8),
        _kv_case("values wider than keys: d_k=4, d_v=10", 5, 1, 2, 3, 2, 4, d_v=10),
    ]


def _kv_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(14000 + seed)
    b, h, t_past, t_new, d = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in
                              ((1, 4), (1, 4), (0, 10), (1, 5), (1, 17)))
    d_v = d if seed % 3 else int(torch.randint(1, 17, (1,), generator=g))      # every third: d_v != d_k
    return _kv_case(f"random #{seed}: B={b} H={h} T_past={t_past} T_new={t_new} d_k={d} d_v={d_v}", 14000 + seed,
                    b, h, t_past, t_new, d, random=True, d_v=d_v)


register(Exercise(
    name="ch14.kv_step",
    title="one decoding step with a KV cache -> (out, k_all, v_all)",
    reference=kv_step_reference,
    edge_cases=_kv_edge_cases,
    random_case=_kv_random_case,
    points=2,
    hint="append the new keys/values AFTER the cached ones along the time axis (dim 2); every new query sees "
         "all cached keys, and new query i sees new keys 0..i only: the causal mask is aligned bottom-right "
         "(key j is visible to query i iff j <= i + T_past).",
    mistakes={"attended only to the new keys (the cache was ignored)": _kv_forgot_cache,
              "no causal mask among the new tokens": _kv_no_causal,
              "causal mask aligned top-left instead of bottom-right": _kv_top_left,
              "new keys placed before the cached ones": _kv_new_first},
    forbidden=[(attention, "scaled_dot_product_attention"), (attention, "fast_attention"),
               (torch.nn.functional, "scaled_dot_product_attention"), (KVCache, "append")],
))

# ---------------------------------------------------------------------------------------------------
# ch14.accept: the speculative-sampling accept/reject rule
# ---------------------------------------------------------------------------------------------------


def _acc_inverted(p, q, draft, u):
    rows = torch.arange(draft.shape[0])
    n = (u * p[rows, draft] < q[rows, draft]).long().cumprod(0).sum()
    return n, _next_dist(p, q, int(n))


def _next_dist(p, q, n):
    k = q.shape[0]
    if n == k:
        return p[k]
    r = (p[n] - q[n]).clamp(min=0)
    return r / r.sum()


def _prefix(p, q, draft, u):
    rows = torch.arange(draft.shape[0])
    return (u * q[rows, draft] < p[rows, draft]).long().cumprod(0).sum()


def _acc_resample_p(p, q, draft, u):
    n = _prefix(p, q, draft, u)
    return n, p[int(n)]


def _acc_unnormalised(p, q, draft, u):
    n = _prefix(p, q, draft, u)
    return n, p[int(n)] if int(n) == draft.shape[0] else (p[int(n)] - q[int(n)]).clamp(min=0)


def _acc_count_all(p, q, draft, u):
    rows = torch.arange(draft.shape[0])
    accepted = u * q[rows, draft] < p[rows, draft]
    n = accepted.long().sum()
    first_bad = int(accepted.long().cumprod(0).sum())
    return n, _next_dist(p, q, first_bad)


def _acc_case(name: str, seed: int, k: int, v: int, random: bool = False, u: torch.Tensor | None = None) -> Case:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(k + 1, v, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(k, v, generator=g, dtype=torch.float64), -1)
    draft = torch.multinomial(q, 1, generator=g)[:, 0]
    if u is None:
        u = torch.rand(k, generator=g, dtype=torch.float64)
    return Case(name, (p, q, draft, u), seed=seed if random else None)


def _acc_edge_cases() -> list[Case]:
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]], dtype=torch.float64)
    q = torch.tensor([[0.25, 0.25, 0.5], [0.6, 0.2, 0.2]], dtype=torch.float64)
    f64 = dict(dtype=torch.float64)
    return [
        Case("k=1, accepted (p/q = 2 > u)", (p[:2], q[:1], torch.tensor([0]), torch.tensor([0.9], **f64))),
        Case("k=1, draft token the target never picks (p = 0)", (p[:2], q[:1], torch.tensor([2]), torch.tensor([0.0], **f64))),
        Case("k=2, second rejected (p/q = 1/3 < u = 0.5)", (p, q, torch.tensor([0, 0]), torch.tensor([0.9, 0.5], **f64))),
        Case("k=2, both accepted: bonus token from p[k]", (p, q, torch.tensor([0, 0]), torch.tensor([0.9, 0.2], **f64))),
        Case("k=2, first rejected, second would pass", (p, q, torch.tensor([2, 1]), torch.tensor([0.3, 0.0], **f64))),
    ]


def _acc_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(14500 + seed)
    k, v = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(2, 11, (1,), generator=g))
    return _acc_case(f"random #{seed}: k={k} V={v}", 14500 + seed, k, v, random=True)


register(Exercise(
    name="ch14.accept",
    title="speculative accept/reject rule -> (n_accepted, next-token distribution)",
    reference=speculative_accept,
    edge_cases=_acc_edge_cases,
    random_case=_acc_random_case,
    points=3,
    n_random=20,
    hint="draft token x_i is accepted iff u[i] < p[i, x_i] / q[i, x_i] and every earlier one was accepted; "
         "n is the length of that accepted prefix. After a rejection at n the next token comes from "
         "max(0, p[n] - q[n]) normalised to sum 1; if all k were accepted it comes from p[k].",
    mistakes={"ratio inverted: accepted when u < q/p": _acc_inverted,
              "after a rejection, resampled from p instead of norm(max(0, p - q))": _acc_resample_p,
              "residual max(0, p - q) not normalised to sum 1": _acc_unnormalised,
              "counted every accepted token, not the accepted prefix": _acc_count_all},
    forbidden=[(speculative, "speculative_accept")],
))

# ---------------------------------------------------------------------------------------------------
# ch14.int8: symmetric per-output-channel int8 quantization
# ---------------------------------------------------------------------------------------------------


def _q8_per_tensor(w):
    s = w.abs().max() / 127
    return torch.round(w / s).clamp(-128, 127).to(torch.int8), s.expand(w.shape[0]).clone()


def _q8_per_column(w):
    s = w.abs().amax(0) / 127
    q = torch.round(w / s).clamp(-128, 127).to(torch.int8)
    return q, s[: w.shape[0]] if s.shape[0] >= w.shape[0] else s


def _q8_div128(w):
    s = w.abs().amax(1) / 128
    return torch.round(w / s[:, None]).clamp(-128, 127).to(torch.int8), s


def _q8_truncate(w):
    s = w.abs().amax(1) / 127
    return (w / s[:, None]).to(torch.int8), s


def _q8_case(name: str, seed: int, out_f: int, in_f: int, random: bool = False, zero_row: bool = False) -> Case:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) * torch.rand(out_f, 1, generator=g) * 2
    if zero_row:
        w[0] = 0.0
    return Case(name, (w,), seed=seed if random else None)


def _q8_compare(got, expected, case: Case, atol: float, rtol: float) -> str | None:
    """The generic comparison, except that a value of w / scale within float32 rounding of a tie (x.5) may
    round either way: a float64 or multiply-by-reciprocal answer is as right as the float32 reference."""
    problem = compare(got, expected, atol, rtol)
    if problem is None or not (isinstance(got, (tuple, list)) and len(got) == 2
                               and all(isinstance(t, torch.Tensor) for t in got)):
        return problem
    (q, s), (q_ref, s_ref) = got, expected
    if q.dtype != torch.int8 or q.shape != q_ref.shape or compare(s, s_ref, atol, rtol) is not None:
        return problem
    exact = case.args[0].double() / s_ref.double()[:, None]
    near_tie = ((exact - exact.floor()) - 0.5).abs() < 1e-4 * exact.abs().clamp(min=1)
    off_by_one = (q.int() - q_ref.int()).abs() == 1
    return None if bool(((q == q_ref) | (near_tie & off_by_one)).all()) else problem


def _q8_edge_cases() -> list[Case]:
    return [
        Case("one weight", (torch.tensor([[0.5]]),)),
        Case("rows of very different size (0.01 / scale is a tie, 63.5: either rounding is right)",
             (torch.tensor([[0.01, -0.02, 0.005], [3.0, -1.5, 0.7]]),)),
        _q8_case("an all-zero row (its scale must be 1, not 0)", 1, 3, 5, zero_row=True),
        _q8_case("8 x 16", 2, 8, 16),
    ]


def _q8_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(14800 + seed)
    o, i = int(torch.randint(1, 33, (1,), generator=g)), int(torch.randint(1, 65, (1,), generator=g))
    return _q8_case(f"random #{seed}: {o} x {i}", 14800 + seed, o, i, random=True)


register(Exercise(
    name="ch14.int8",
    title="int8 per-output-channel quantization -> (q int8 (out, in), scale (out,))",
    reference=quantize_int8,
    edge_cases=_q8_edge_cases,
    random_case=_q8_random_case,
    points=2,
    atol=1e-7,
    rtol=1e-6,
    hint="one scale per ROW (output channel): scale = max|row| / 127 (1 for an all-zero row); "
         "q = round(w / scale) clamped to [-128, 127], as torch.int8.",
    mistakes={"one scale for the whole matrix (per tensor)": _q8_per_tensor,
              "one scale per input column instead of per output row": _q8_per_column,
              "divided by 128 instead of 127": _q8_div128,
              "truncated toward zero instead of rounding": _q8_truncate},
    forbidden=[(quantize, "quantize_int8"), (torch, "quantize_per_channel")],
    compare=_q8_compare,
))


# ---------------------------------------------------------------------------------------------------
# ch14.admit: how many waiting requests the scheduler admits (block accounting, first come first served)
# ---------------------------------------------------------------------------------------------------


def _ceil(a, b):
    return -(-a // b)


def _adm_no_headroom(lengths, shared, n_free, bs, watermark):
    n = 0
    for length, sh in zip(lengths, shared):
        need = _ceil(length, bs) - sh
        if n_free - need < watermark:
            break
        n_free, n = n_free - need, n + 1
    return n


def _adm_plain(lengths, shared, n_free, bs, watermark):
    n = 0
    for length, sh in zip(lengths, shared):
        if n_free - (_ceil(length + 1, bs) - sh) < watermark:
            break
        n_free, n = n_free - (_ceil(length, bs) - sh), n + 1
    return n


def _adm_ignores_shared(lengths, shared, n_free, bs, watermark):
    return _adm_plain(lengths, [0] * len(lengths), n_free, bs, watermark)


def _adm_skips_ahead(lengths, shared, n_free, bs, watermark):
    n = 0
    for length, sh in zip(lengths, shared):
        need = _ceil(length + 1, bs) - sh
        if n_free - need >= watermark:
            n_free, n = n_free - _ceil(length, bs) + sh, n + 1
    return n


def _adm_no_watermark(lengths, shared, n_free, bs, watermark):
    return _adm_plain(lengths, shared, n_free, bs, 0)


def _adm_floor(lengths, shared, n_free, bs, watermark):
    n = 0
    for length, sh in zip(lengths, shared):
        need = (length + 1) // bs - sh
        if n_free - need < watermark:
            break
        n_free, n = n_free - (length // bs - sh), n + 1
    return n


def _adm_edge_cases() -> list[Case]:
    return [
        Case("one request of 15 tokens, blocks of 16, 1 free (its first new token still fits)", ([15], [0], 1, 16, 0)),
        Case("16 tokens need 2 blocks: the first new token opens the second", ([16], [0], 1, 16, 0)),
        Case("3 cached blocks cover most of a 50-token prompt", ([50], [3], 1, 16, 0)),
        Case("the watermark keeps 2 blocks back", ([20, 20], [0, 0], 5, 16, 2)),
        Case("the second request does not fit: the third (small) waits behind it", ([10, 100, 3], [0, 0, 0], 4, 16, 0)),
        Case("an empty queue", ([], [], 10, 16, 0)),
    ]


def _adm_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(14900 + seed)

    def r(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))
    bs, n = (4, 8, 16)[r(0, 3)], r(1, 8)
    lengths = [r(1, 120) for _ in range(n)]
    shared = [r(0, (x - 1) // bs + 1) if r(0, 2) else 0 for x in lengths]
    return Case(f"random #{seed}: {n} requests, blocks of {bs}", (lengths, shared, r(0, 40), bs, r(0, 3)),
                seed=14900 + seed)


register(Exercise(
    name="ch14.admit",
    title="the continuous-batching admission rule -> number of requests admitted from the head of the queue",
    reference=plan_admission,
    edge_cases=_adm_edge_cases,
    random_case=_adm_random_case,
    points=2,
    hint="request i needs ceil((lengths[i] + 1) / block_size) - shared[i] blocks free (its tokens plus the block "
         "its first new token may open, minus the blocks it shares) and must leave `watermark` free; it then "
         "takes ceil(lengths[i] / block_size) - shared[i] blocks. Stop at the first request that does not fit.",
    mistakes={"forgot the block the first generated token may need (no +1)": _adm_no_headroom,
              "counted shared (cached) blocks as new ones": _adm_ignores_shared,
              "skipped past a request that did not fit (not first come, first served)": _adm_skips_ahead,
              "ignored the watermark": _adm_no_watermark,
              "rounded the block count down instead of up": _adm_floor},
    forbidden=[(engine, "plan_admission"), (engine, "can_admit"), (engine, "blocks_needed")],
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch14.q_kv_bytes",
    title="KV-cache bytes per token of Llama 3 8B (32 layers, 8 KV heads of 128, bf16)",
    kind="number", answer=2 * 32 * 8 * 128 * 2, points=1,
    mistakes={
        "32 is the number of query heads; with GQA the cache holds only the 8 key/value heads": 2 * 32 * 32 * 128 * 2,
        "the cache holds keys and values: a factor 2 for the pair": 32 * 8 * 128 * 2,
        "every layer has its own cache: multiply by the 32 layers": 2 * 8 * 128 * 2,
        "bf16 takes 2 bytes a number, not 4": 2 * 32 * 8 * 128 * 4,
    },
    hint="2 (keys and values) x layers x KV heads x head size x bytes per number.",
))

register(Question(
    name="ch14.q_no_cache_passes",
    title="token positions run through the model to generate n tokens after a prompt of P, without a cache",
    kind="expr", answer="n * P + n * (n - 1) / 2", symbols=("n", "P"), points=1,
    mistakes={
        "n + P - 1 is the count with the cache: the prompt once, then one new token per step": "n + P - 1",
        "the context grows by one token each step: step i runs P + i positions, not P": "n * P",
        "the model also reruns the prompt at every step: each step i runs P + i positions": "n * (n - 1) / 2",
    },
    hint="step i (from 0) runs the whole context so far, P + i positions; add them up for i = 0 .. n-1.",
))

register(Question(
    name="ch14.q_speculative_distribution",
    title="the distribution of the tokens speculative sampling emits",
    kind="choice", answer="D", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "a rejected draft token is replaced by a draw from norm(max(0, p - q)), which corrects the draft's bias: "
        "the histogram follows p, not q": "A",
        "the rule is exact, not an approximation: accepting with min(1, p/q) and resampling the rest gives p for "
        "any acceptance rate; the remaining distance is sampling noise": "C",
        "speculative decoding also samples: with temperature 1 the accept/reject rule keeps the target's whole "
        "distribution, not only its greedy choice": "B",
    },
))
