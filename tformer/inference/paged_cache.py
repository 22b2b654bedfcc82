"""A paged KV cache (chapter 14): PagedAttention's memory layout, in plain PyTorch.

A contiguous `KVCache` reserves room for the longest sequence it may ever hold. Serving a batch of
requests of mixed lengths that way wastes every slot between a request's real length and the maximum.
vLLM's PagedAttention (Kwon et al., 2023) stores keys and values in fixed-size *blocks* instead:

    pool     per layer, keys (n_blocks, H_kv, head_dim, block_size) and values (n_blocks, H_kv, block_size,
             head_dim): within a block, keys are stored transposed (vLLM's key cache is too), for the reason
             given at `paged_decode_attention`
    table    per sequence, the list of physical block ids holding its tokens, in order
    allocator  a free list of block ids; a sequence takes a block when its last one is full and gives
             all of them back when it finishes

Token t of a sequence lives in block `table[t // block_size]`, slot `t % block_size`. The only waste is
the unfilled tail of each sequence's last block (< block_size tokens), not (max_len - length).

`PagedKVCache` has the interface of `KVCache` (`append`, `get`, `length`, `truncate`, `nbytes`), so a
model runs on it unchanged: `model(idx, cache=pool.new_caches(batch))`. `append` writes the new keys
into their blocks and returns them gathered in token order; the attention output is then exactly that
of the contiguous cache (the tests assert it). That gather is a copy of the whole cache at every step;
`paged_decode_attention` (what the serving engine uses) reads the blocks in place instead, as vLLM's
PagedAttention kernel does, with two `embedding_bag` calls.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels import fast_attention
from ..sampling import sample_next
from ..utils.checks import check_float, check_rank


@dataclass
class PagedConfig:
    n_layers: int                      # attention layers sharing the pool (one block table for all)
    n_kv_heads: int                    # key/value heads per layer (fewer than query heads for GQA/MQA)
    head_dim: int                      # features per head
    block_size: int = 16               # tokens per block (vLLM's default)
    n_blocks: int = 256                # physical blocks in the pool (its capacity is n_blocks * block_size tokens)
    dtype: torch.dtype = torch.float32

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's keys and values across all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype.itemsize

    @classmethod
    def for_model(cls, model, **kw) -> "PagedConfig":
        """The sizes of a `tformer.models.GPT` (n_layers, n_kv_heads or n_heads, head_dim)."""
        c = model.cfg
        return cls(n_layers=c.n_layers, n_kv_heads=c.n_kv_heads or c.n_heads, head_dim=c.head_dim, **kw)


class BlockPool:
    """Physical storage of every layer's key/value blocks, and the allocator (a free list) over them."""

    def __init__(self, cfg: PagedConfig, device: torch.device | str | None = None):
        if cfg.block_size < 1 or cfg.n_blocks < 1:
            raise ValueError(f"PagedConfig: block_size and n_blocks must be >= 1, got {cfg.block_size}, {cfg.n_blocks}")
        self.cfg = cfg
        shape = (cfg.n_layers, cfg.n_blocks, cfg.n_kv_heads, cfg.block_size, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=cfg.dtype, device=device).transpose(-1, -2).contiguous()  # (L, N, H_kv, hd, bs)
        self.v = torch.zeros(shape, dtype=cfg.dtype, device=device)                                 # (L, N, H_kv, bs, hd)
        self._free = list(range(cfg.n_blocks - 1, -1, -1))              # stack: pop() gives block 0 first

    # -- allocator ------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take n free block ids; raises when the pool cannot supply them (nothing is taken then)."""
        if n > len(self._free):
            raise RuntimeError(f"BlockPool: out of blocks (asked for {n}, {len(self._free)} free of "
                               f"{self.cfg.n_blocks}); finish or preempt a sequence, or make the pool larger")
        return [self._free.pop() for _ in range(n)]

    def release(self, ids: list[int]) -> None:
        """Give block ids back to the free list."""
        self._free.extend(reversed(ids))

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_used(self) -> int:
        return self.cfg.n_blocks - len(self._free)

    def block_bytes(self) -> int:
        """Bytes of one block across all layers, keys and values."""
        return self.cfg.block_size * self.cfg.token_bytes

    def used_bytes(self) -> int:
        """Bytes of the blocks currently handed out."""
        return self.n_used * self.block_bytes()

    def new_caches(self, batch: int = 1) -> list["PagedKVCache"]:
        """One `PagedKVCache` per layer for a new group of `batch` sequences (one block table each)."""
        table = BlockTable(self, batch)
        return [PagedKVCache(table, layer) for layer in range(self.cfg.n_layers)]


class BlockTable:
    """The block tables of `batch` sequences decoded together (equal lengths), shared by all layers.

    `ids` (batch, n_logical_blocks) holds physical block ids; row b lists sequence b's blocks in order.
    Each layer keeps its own length (layer 0 has appended before layer 1 reads its past).
    """

    def __init__(self, pool: BlockPool, batch: int):
        self.pool, self.batch = pool, batch
        self.ids = torch.empty(batch, 0, dtype=torch.long, device=pool.k.device)
        self.lengths = [0] * pool.cfg.n_layers

    @property
    def capacity(self) -> int:
        return self.ids.shape[1] * self.pool.cfg.block_size

    def reserve(self, n_tokens: int) -> None:
        """Make room for n_tokens per sequence, taking blocks from the pool only as needed."""
        need = math.ceil(n_tokens / self.pool.cfg.block_size) - self.ids.shape[1]
        if need > 0:
            new = torch.tensor(self.pool.allocate(need * self.batch), dtype=torch.long, device=self.ids.device)
            self.ids = torch.cat([self.ids, new.view(self.batch, need)], dim=1)

    def trim(self) -> None:
        """Return blocks past the longest layer's length to the pool (after a truncate)."""
        keep = math.ceil(max(self.lengths) / self.pool.cfg.block_size)
        if keep < self.ids.shape[1]:
            self.pool.release(self.ids[:, keep:].flatten().tolist())
            self.ids = self.ids[:, :keep]

    def free(self) -> None:
        """The sequences are finished: every block goes back to the pool."""
        self.lengths = [0] * len(self.lengths)
        self.trim()


class PagedKVCache:
    """One layer's view of a `BlockTable`: the `KVCache` interface over pooled blocks.

    k, v given and returned as (B, H_kv, T, head_dim), as with `KVCache`.
    """

    def __init__(self, table: BlockTable, layer: int):
        self.table, self.layer = table, layer
        self.pool = table.pool

    @property
    def length(self) -> int:
        return self.table.lengths[self.layer]

    def _slots(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Physical (block id (B, T), slot (T,)) of token positions start..end-1."""
        pos = torch.arange(start, end, device=self.table.ids.device)
        bs = self.pool.cfg.block_size
        return self.table.ids[:, pos // bs], pos % bs

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H_kv, T_new, hd) keys/values into their blocks; return all held so far, in order."""
        check_rank(k, 4, "PagedKVCache.append(k)", "(B, H_kv, T_new, head_dim)")
        check_float(k, "PagedKVCache.append(k)")
        c = self.pool.cfg
        if k.shape != v.shape or k.shape[0] != self.table.batch or k.shape[1] != c.n_kv_heads or k.shape[3] != c.head_dim:
            raise ValueError(f"PagedKVCache.append: expected k and v of shape ({self.table.batch}, {c.n_kv_heads}, "
                             f"T_new, {c.head_dim}), got {tuple(k.shape)} and {tuple(v.shape)}")
        start, end = self.length, self.length + k.shape[2]
        self.table.reserve(end)
        blocks, slots = self._slots(start, end)                      # (B, T_new), (T_new,)
        write_kv(self.pool, self.layer, blocks, slots, k.transpose(1, 2), v.transpose(1, 2))
        self.table.lengths[self.layer] = end
        return self.get()

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the held keys/values in token order: (B, H_kv, length, hd) each."""
        n = self.length
        blocks, slots = self._slots(0, n)
        return read_kv(self.pool, self.layer, blocks, slots)

    def truncate(self, length: int) -> None:
        """Forget tokens after `length`; blocks no layer needs any more go back to the pool."""
        if not 0 <= length <= self.length:
            raise ValueError(f"PagedKVCache.truncate: expected 0 <= length <= {self.length}, got {length}")
        self.table.lengths[self.layer] = length
        self.table.trim()

    def reorder(self, index: torch.Tensor) -> None:
        """Beam search would make rows share blocks (copy-on-write, as vLLM does); not built here."""
        raise NotImplementedError("PagedKVCache.reorder: beam search over a paged cache needs shared blocks with "
                                  "copy-on-write; use the contiguous KVCache (tformer.cache) for beam search")

    def nbytes(self) -> int:
        """Bytes of this layer's blocks held by the table (whole blocks: the unfilled tail counts)."""
        c = self.pool.cfg
        return 2 * self.table.ids.numel() * c.n_kv_heads * c.block_size * c.head_dim * self.pool.k.element_size()


def write_kv(pool: BlockPool, layer: int, blocks: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """Store new keys/values (B, T, H_kv, hd) at block ids `blocks` (B, T), slots `slots` (T,) or (B, T).

    Advanced indices around slices put the indexed dimensions first, so both targets are (B, T, H_kv, hd)
    in either layout."""
    pool.k[layer][blocks, :, :, slots] = k.to(pool.k.dtype)
    pool.v[layer][blocks, :, slots] = v.to(pool.v.dtype)


def read_kv(pool: BlockPool, layer: int, blocks: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys/values at block ids `blocks` (B, T), slots `slots` (T,) or (B, T), in that order:
    (B, H_kv, T, hd) each (a copy; see `paged_decode_attention` for reading them in place)."""
    return (pool.k[layer][blocks, :, :, slots].transpose(1, 2),     # (B, T, H_kv, hd) -> (B, H_kv, T, hd)
            pool.v[layer][blocks, :, slots].transpose(1, 2))


@dataclass
class DecodeIndex:
    """Where the keys and values of B sequences (one new query each) lie in the pool, as index lists.

    Built once per decoding step from the block tables and shared by every layer (each layer's pool has
    the same layout). A *held block* is one (sequence, query head, block) that the sequence holds; row
    numbers refer to one layer's keys viewed as (N * H_kv * hd, bs) rows and its values viewed as
    (N * H_kv * bs, hd) rows; see `paged_decode_attention`.
    """
    held: torch.Tensor      # (n_held,) flat (B, H, nb_max) index of each held block
    query: torch.Tensor     # (n_held,) flat (B, H) index of the query that reads it
    k_rows: torch.Tensor    # (n_held * hd,) key rows: a held block's hd feature rows of bs keys each
    k_bags: torch.Tensor    # (B * H * nb_max,) bag offsets into k_rows (a block not held: an empty bag)
    v_rows: torch.Tensor    # (n_held * bs,) value rows: a held block's bs positions (past the length: weight 0)
    v_bags: torch.Tensor    # (B * H,) bag offsets into v_rows, one bag per (sequence, query head)
    hidden: torch.Tensor    # (B, 1, nb_max * bs) bool: the positions past each sequence's length (masked out)
    shape: tuple            # (B, H, nb_max * bs)
    table: torch.Tensor     # (B, nb_max) the block tables and (B,) lengths it was built from (for a kernel
    lengths: torch.Tensor   # that reads the blocks itself, as benchmarks/bench_decode_attention.py's does)

    @classmethod
    def build(cls, table: torch.Tensor, lengths: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int,
              block_size: int) -> "DecodeIndex":
        """table (B, nb_max): each sequence's block ids (any padding past its blocks); lengths (B,): tokens
        each holds (>= 1). Query head h reads key/value head h // (n_heads // n_kv_heads) (GQA)."""
        b, nb = table.shape
        dev, bs, hd = table.device, block_size, head_dim
        kv_head = torch.arange(n_heads, device=dev) // (n_heads // n_kv_heads)                   # (H,)
        n_held = -(-lengths // bs)                                                                  # (B,)
        is_held = (torch.arange(nb, device=dev)[None] < n_held[:, None])[:, None, :].expand(b, n_heads, nb)
        held = is_held.flatten().nonzero().squeeze(1)                                               # (n_held,)
        head_block = (table[:, None, :] * n_kv_heads + kv_head[None, :, None]).flatten()[held]     # (n_held,)
        per_bag = is_held.flatten().long() * hd
        per_query = (n_held * bs).repeat_interleave(n_heads)
        return cls(held=held, query=held // nb,
                   k_rows=(head_block[:, None] * hd + torch.arange(hd, device=dev)).flatten(),
                   k_bags=per_bag.cumsum(0) - per_bag,
                   v_rows=(head_block[:, None] * bs + torch.arange(bs, device=dev)).flatten(),
                   v_bags=per_query.cumsum(0) - per_query,
                   hidden=(torch.arange(nb * bs, device=dev)[None] >= lengths[:, None])[:, None, :],
                   shape=(b, n_heads, nb * bs), table=table, lengths=lengths)


def paged_decode_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, idx: DecodeIndex) -> torch.Tensor:
    """Attention of one new query per sequence over its cached keys/values, read where they lie in the pool.

    q (B, H, 1, hd); k_layer (N, H_kv, hd, bs) and v_layer (N, H_kv, bs, hd): one layer of a `BlockPool`.
    Returns (B, H, 1, hd), equal to softmax(q K^T / sqrt(hd)) V over each sequence's own positions.

    Gathering each sequence's blocks into one tensor first would copy the whole cache at every step and
    layer (and attention would then read the copy). Instead both halves of attention are weighted sums of
    rows picked by index, which is what `F.embedding_bag(mode="sum", per_sample_weights=...)` computes
    without materialising the rows:
      scores  with keys stored (hd, bs) per block and head, one block's bs scores are the sum over
              features d of q_d times row d (bs keys' feature d): a bag of hd rows weighted by q
      output  the sum over positions t of p_t times value row t: a bag of the sequence's rows weighted by
              the softmax probabilities
    Each key and value is read once, as a paged-attention kernel would read it."""
    b, h, t_pad = idx.shape
    hd, bs = k_layer.shape[-2], k_layer.shape[-1]
    w = (q.reshape(b * h, hd) * hd ** -0.5).to(k_layer.dtype).index_select(0, idx.query).flatten()
    s = F.embedding_bag(idx.k_rows, k_layer.reshape(-1, bs), idx.k_bags, mode="sum", per_sample_weights=w)
    s = s.view(b, h, t_pad).masked_fill_(idx.hidden, float("-inf"))          # s is our own: fill in place
    p = torch.softmax(s, dim=-1)          # bf16/fp16 too: the kernels accumulate in float32 for those
    out = F.embedding_bag(idx.v_rows, v_layer.reshape(-1, hd), idx.v_bags, mode="sum",
                          per_sample_weights=p.view(-1, bs).index_select(0, idx.held).flatten())
    return out.view(b, h, 1, hd)


class PagedStep:
    """One serving step's cache: the new tokens of B sequences, at `positions` (B, T), over their block tables.

    The engine runs the model on it: `model(tokens, step.layers, positions=positions)`. Each layer's view
    offers `attend(q, k, v)`, so `MultiHeadAttention` hands it the new queries, keys and values; the view
    stores the keys and values in the sequences' blocks and attends over everything each sequence holds,
    reading the blocks where they lie. Three kinds of step:

        decode   T = 1, any B: `paged_decode_attention` over each sequence's blocks, with one `DecodeIndex`
                 built for the step (on first use) and shared by every layer
        fresh    B = 1, nothing cached: causal attention over its own new keys (nothing read from the pool)
        resume   B = 1 after a prefix hit or a preemption: its keys up to its last new token, gathered from
                 its blocks in token order (one sequence, once per admission)

    n_real: only the first n_real of the T tokens are the sequence's, the rest pad a prefill to a bucket;
    the pads' keys and values are not stored, and causal attention keeps them out of the real rows.
    A faster decode attention (a fused kernel) plugs in by overriding `decode`.
    """

    def __init__(self, pool: BlockPool, tables: list[list[int]], positions: torch.Tensor, n_real: int | None = None):
        b, t = positions.shape
        if t > 1 and b > 1:
            raise ValueError(f"PagedStep: expected one new token per sequence or one sequence, got {b} x {t}")
        bs, dev = pool.cfg.block_size, positions.device
        nb = max(len(ids) for ids in tables)
        self.pool, self.n_real = pool, t if n_real is None else n_real
        self.table = torch.tensor([ids + [0] * (nb - len(ids)) for ids in tables], device=dev)   # (B, nb); pad: block 0
        real = positions[:, :self.n_real]
        self.w_blk, self.w_off = self.table.gather(1, real // bs), real % bs     # where each new token goes
        self.kind = "decode" if t == 1 else "fresh" if int(positions[0, 0]) == 0 else "resume"
        self.lengths = positions[:, 0] + 1                                       # (B,) tokens held after a decode
        self.idx: DecodeIndex | None = None
        if self.kind == "resume":                                                # every key up to the last new token
            key_pos = torch.arange(int(positions[0, -1]) + 1, device=dev)
            stored = key_pos.clamp(max=int(positions[0, self.n_real - 1]))      # a pad's key: read a real one (masked)
            self.k_blk, self.k_off = self.table[:, stored // bs], stored % bs
            self.mask = key_pos[None, None, None, :] <= positions[:, None, :, None]   # (1, 1, T, n_keys)
        self.layers = [PagedStepLayer(self, layer) for layer in range(pool.cfg.n_layers)]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v (B, H_kv, T, hd) of `layer`; q (B, H, T, hd) attends over all it holds: (B, H, T, hd)."""
        n = self.n_real
        write_kv(self.pool, layer, self.w_blk, self.w_off, k[:, :, :n].transpose(1, 2), v[:, :, :n].transpose(1, 2))
        if self.kind == "decode":
            return self.decode(layer, q).to(q.dtype)
        if self.kind == "fresh":
            return fast_attention(q, k, v, is_causal=True)
        kk, vv = read_kv(self.pool, layer, self.k_blk, self.k_off)              # (1, H_kv, n_keys, hd)
        return fast_attention(q, kk.to(q.dtype), vv.to(q.dtype), self.mask)

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q (B, H, 1, hd) over each sequence's blocks of `layer`: `paged_decode_attention`."""
        if self.idx is None:
            c = self.pool.cfg
            self.idx = DecodeIndex.build(self.table, self.lengths, q.shape[1], c.n_kv_heads, c.head_dim, c.block_size)
        return paged_decode_attention(q, self.pool.k[layer], self.pool.v[layer], self.idx)


class PagedStepLayer:
    """One layer's view of a `PagedStep`: the cache `MultiHeadAttention` is given (it calls `attend`)."""

    def __init__(self, step: PagedStep, layer: int):
        self.step, self.layer = step, layer

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.step.attend(self.layer, q, k, v)


def kv_memory(lengths: list[int] | torch.Tensor, max_len: int, block_size: int, bytes_per_token: int = 1) -> dict:
    """KV memory for requests of `lengths` tokens: contiguous (each reserves max_len) vs paged.

    Returns tokens (or bytes, with bytes_per_token) needed, reserved by each scheme, and the fraction
    wasted: contiguous wastes max_len - length per request, paged only the tail of the last block.
    """
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    if lengths.dim() != 1 or (lengths < 0).any() or (lengths > max_len).any():
        raise ValueError(f"kv_memory: expected 1-d lengths in [0, max_len={max_len}], got {lengths.tolist()}")
    used = int(lengths.sum())
    contiguous = len(lengths) * max_len
    paged = int((-(-lengths // block_size)).sum()) * block_size          # ceil(length / bs) blocks each
    return {"used": used * bytes_per_token, "contiguous": contiguous * bytes_per_token,
            "paged": paged * bytes_per_token,
            "contiguous_waste": 1 - used / contiguous if contiguous else 0.0,
            "paged_waste": 1 - used / paged if paged else 0.0}


@torch.no_grad()
def generate_paged(model, prompts: list[torch.Tensor], max_new_tokens: list[int] | int, pool: BlockPool,
                   temperature: float = 0.0, generator: torch.Generator | None = None) -> tuple[list[torch.Tensor], dict]:
    """Serve several requests at once from one `BlockPool`, one token per live request per step.

    prompts: 1-d token tensors of any lengths; max_new_tokens: one per request (or one for all).
    A request takes blocks as it grows and returns them when done, so short requests make room for
    long ones. Returns (outputs: prompt + new tokens per request, stats: peak blocks/bytes in use).
    """
    if isinstance(max_new_tokens, int):
        max_new_tokens = [max_new_tokens] * len(prompts)
    if len(max_new_tokens) != len(prompts):
        raise ValueError(f"generate_paged: {len(prompts)} prompts but {len(max_new_tokens)} max_new_tokens")
    for i, p in enumerate(prompts):
        check_rank(p, 1, f"generate_paged(prompts[{i}])", "(T,) token ids")
        if p.numel() + max_new_tokens[i] > model.cfg.context_length:
            raise ValueError(f"generate_paged: request {i} needs {p.numel() + max_new_tokens[i]} positions, "
                             f"more than context_length={model.cfg.context_length}")
    was_training = model.training
    model.eval()
    out = [p.clone() for p in prompts]
    caches = [pool.new_caches(1) for _ in prompts]
    left = list(max_new_tokens)
    nxt: list[torch.Tensor | None] = [p[None, :] for p in prompts]    # what each request feeds next
    peak_blocks = 0
    while any(n > 0 for n in left):
        for i in range(len(prompts)):
            if left[i] <= 0:
                continue
            logits = model(nxt[i], caches[i])[:, -1, :]               # (1, V)
            tok = sample_next(logits, temperature, None, generator)   # (1, 1)
            out[i] = torch.cat([out[i], tok[0]])
            nxt[i], left[i] = tok, left[i] - 1
            peak_blocks = max(peak_blocks, pool.n_used)
            if left[i] == 0:
                caches[i][0].table.free()                             # finished: blocks back to the pool
    model.train(was_training)
    return out, {"peak_blocks": peak_blocks, "peak_bytes": peak_blocks * pool.block_bytes()}
