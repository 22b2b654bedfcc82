"""Chapter 6: masks: the causal mask (aligned for a KV cache) and causal + padding from token ids."""
import torch

from ... import masks
from ...masks import causal_mask, combine_masks, padding_mask
from ..core import Case, Exercise, register
from ..questions import Question

FORBIDDEN = [(masks, "causal_mask"), (masks, "padding_mask"), (masks, "lengths_mask"),
              (masks, "sliding_window_mask"), (masks, "combine_masks")]


# --- causal mask -----------------------------------------------------------------------------------------

def _causal_edge_cases() -> list[Case]:
    return [Case("T_q=T_k=1", (1, 1)), Case("T_q=T_k=3", (3, 3)),
            Case("one new query over 4 cached keys (T_q=1, T_k=5)", (1, 5)), Case("T_q=2, T_k=4", (2, 4))]


def _causal_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(9500 + seed)
    t_q = int(torch.randint(1, 12, (1,), generator=g))
    t_k = t_q + (int(torch.randint(0, 6, (1,), generator=g)) if seed % 2 else 0)
    return Case(f"random #{seed}: T_q={t_q}, T_k={t_k}", (t_q, t_k), seed=9500 + seed)


def causal_reference(t_q, t_k):
    """(T_q, T_k) bool, True = may attend; the queries are the last T_q of the T_k positions."""
    return causal_mask(t_q, t_k)


def _causal_upper(t_q, t_k):
    q = torch.arange(t_q)[:, None] + (t_k - t_q)
    return torch.arange(t_k)[None, :] >= q


def _causal_strict(t_q, t_k):
    q = torch.arange(t_q)[:, None] + (t_k - t_q)
    return torch.arange(t_k)[None, :] < q


def _causal_top_left(t_q, t_k):
    return torch.ones(t_q, t_k, dtype=torch.bool).tril()


def _causal_inverted(t_q, t_k):               # True on the future: the "positions to block" convention
    q = torch.arange(t_q)[:, None] + (t_k - t_q)
    return torch.arange(t_k)[None, :] > q


register(Exercise(
    name="ch06.causal_mask",
    title="causal mask (T_q, T_k), bool, True = may attend",
    reference=causal_reference,
    edge_cases=_causal_edge_cases,
    random_case=_causal_random_case,
    points=1,
    hint="query i sits at position i + (T_k - T_q) (earlier keys are cached); it may see keys j <= that "
         "position, itself included. Return a bool tensor: torch.arange and a comparison are enough.",
    mistakes={"future instead of past (upper triangle)": _causal_upper,
              "diagonal excluded (a token must see itself: j <= i, not j < i)": _causal_strict,
              "aligned top-left: ignores the cached keys when T_k > T_q": _causal_top_left,
              "inverted (True where attention is forbidden: that is the -inf convention)": _causal_inverted},
    forbidden=FORBIDDEN,
))


# --- causal + padding from token ids --------------------------------------------------------------------------

def _tokens(g, b, t, pad_id, min_len=0):
    lengths = torch.randint(min_len, t + 1, (b,), generator=g)
    tok = torch.randint(pad_id + 1, pad_id + 20, (b, t), generator=g)
    return tok.masked_fill(torch.arange(t)[None, :] >= lengths[:, None], pad_id)


def _cp_edge_cases() -> list[Case]:
    return [
        Case("one token, no padding", (torch.tensor([[5]]), 0)),
        Case("one sequence that is all padding", (torch.tensor([[0, 0, 0]]), 0)),
        Case("batch of 2, second row padded", (torch.tensor([[4, 5, 6, 7], [8, 9, 0, 0]]), 0)),
        Case("pad_id = 1 (token 0 is a real token)", (torch.tensor([[0, 3, 1], [1, 1, 1]]), 1)),
    ]


def _cp_random_case(seed: int) -> Case:
    g = torch.Generator().manual_seed(9700 + seed)
    b, t = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g))
    pad_id = int(torch.randint(0, 3, (1,), generator=g))
    return Case(f"random #{seed}: B={b} T={t} pad_id={pad_id}", (_tokens(g, b, t, pad_id), pad_id), seed=9700 + seed)


def causal_padding_reference(tokens, pad_id):
    """(B, T) ids -> (B, 1, T, T) bool: key j visible to query i iff j <= i and token j is not padding."""
    t = tokens.shape[1]
    return combine_masks(causal_mask(t), padding_mask(tokens, pad_id)).expand(tokens.shape[0], 1, t, t)


def _cp_pad_queries(tokens, pad_id):
    t = tokens.shape[1]
    keep = tokens != pad_id
    return (torch.ones(t, t, dtype=torch.bool).tril() & keep[:, None, :, None]).expand(tokens.shape[0], 1, t, t)


def _cp_pad_inverted(tokens, pad_id):
    t = tokens.shape[1]
    pad = tokens == pad_id
    return (torch.ones(t, t, dtype=torch.bool).tril() & pad[:, None, None, :]).expand(tokens.shape[0], 1, t, t)


def _cp_or(tokens, pad_id):
    t = tokens.shape[1]
    return (torch.ones(t, t, dtype=torch.bool).tril() | (tokens != pad_id)[:, None, None, :]).expand(
        tokens.shape[0], 1, t, t)


register(Exercise(
    name="ch06.causal_padding_mask",
    title="causal + padding mask (B, 1, T, T) from token ids",
    reference=causal_padding_reference,
    edge_cases=_cp_edge_cases,
    random_case=_cp_random_case,
    points=2,
    hint="padding hides *keys* (columns): shape (B, 1, 1, T) = tokens != pad_id. AND it with the causal (T, T) "
         "mask; broadcasting gives (B, 1, T, T) (use .expand if you need the full shape).",
    mistakes={"padding applied to the queries (rows) instead of the keys (columns)": _cp_pad_queries,
              "padding mask inverted (True on the pad tokens)": _cp_pad_inverted,
              "masks combined with OR instead of AND": _cp_or},
    forbidden=FORBIDDEN,
))


# --- questions of understanding ------------------------------------------------------------------------

register(Question(
    name="ch06.q_mask_value",
    title="how a mask hides a key",
    kind="choice", answer="D", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "a score of 0 is not a weight of 0: exp(0) = 1, so the key still gets its share": "B",
        "the mask goes on the scores, before the softmax: zeroing weights after it leaves rows that no longer "
        "sum to 1": "C",
        "a finite penalty only shrinks the weight: the key still leaks into the output": "A",
    },
))

register(Question(
    name="ch06.q_causal_4x4",
    title="the entries (query i, key j) a 4 x 4 causal mask allows",
    kind="choice", answer="B", choices=("A", "B", "C", "D"), points=1,
    mistakes={
        "a position may attend to itself: the diagonal is allowed": "A",
        "keys after the query are the future: rows are queries, columns keys, and query i sees keys up to i": "C",
        "allowing every entry is no mask at all (a bidirectional layer): the causal mask hides j > i": "D",
    },
))

register(Question(
    name="ch06.q_padding",
    title="what the padding mask hides",
    kind="choice", answer="A", choices=("A", "B", "C"), points=1,
    mistakes={
        "hiding the padded queries leaves every real query reading the padding: hide the padded keys, and "
        "ignore the padded queries' outputs": "B",
        "a padding token's embedding is a vector like any other: without the mask the padding leaks into the "
        "real positions": "C",
    },
))
