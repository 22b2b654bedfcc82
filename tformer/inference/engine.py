"""Continuous batching over the paged KV cache (chapter 14): many requests, arriving and finishing at any time.

`generate_paged` (tformer.inference.paged_cache) serves a fixed list of requests one forward at a time.
A serving engine (vLLM, SGLang, TGI, nano-vllm) instead keeps a *running batch* that changes at every
decoding step:

    waiting  requests in arrival order (first come, first served)
    step     1. admit: while the head of the queue fits in the free blocks, prefill it (its prompt's
                keys/values go into fresh blocks; the last position's logits give its first token)
             2. decode: one forward pass for every running sequence at once, one new token each;
                sequences of different lengths share the pass through their block tables
             3. retire: a sequence that produced a stop token or reached max_tokens gives its blocks back
                at once, so the next step can admit someone else

Preemption is by *recompute*: when a running sequence needs a new block and none is free, the most
recently admitted sequence gives up all its blocks and goes back to the front of the queue with its
tokens so far; when it is admitted again, one prefill rebuilds its cache. The alternative, swapping its
blocks to host memory, needs a second memory tier and a copy each way; here the cache already lives in
host memory and a prefill is the cheapest, most parallel kind of forward (many tokens per weight read),
which is why vLLM also recomputes by default for single-sequence requests.

Prefix sharing (vLLM's automatic prefix caching; SGLang's radix cache in miniature): a *full* block is
keyed by every token up to its end, so two requests starting with the same system prompt map it to the
same physical block, counted once and computed once. Each block has a reference count; when its last
user finishes it is kept, evictable, under its key (a later request with that prefix still finds it)
and is reused for new tokens only when the free list runs dry (least recently used first).

Sampling is per request (greedy, temperature, top-k, top-p through `tformer.sampling`), each
request with its own `torch.Generator` seeded from its `seed`. A shared generator would hand out draws in
the order the batch happens to be in, so a request's tokens would depend on who else is running; a
private generator advances only with that request's own draws, so a seeded request gives the same
tokens alone and in a crowd (the tests check it). A counter-based scheme (Philox keyed by seed and
step) would vectorise the draw, but PyTorch does not expose per-row keys; one small multinomial per
sampled request costs far less than the forward pass it follows. Greedy rows are one batched argmax.

The step is the model's own forward, `model(tokens, cache, positions=...)`, for every running sequence
at once: `positions` gives each row its own position (RoPE or learned), and the cache is a `PagedStep`
over the sequences' block tables (`tformer.inference.paged_cache`). Each attention layer hands it the
new queries, keys and values; it stores the keys and values in their blocks and, in a decoding step,
reads every sequence's blocks in place (`paged_decode_attention`: two `embedding_bag` calls, whose index
lists are built once per step and serve every layer), as vLLM's PagedAttention kernel does; sequences
of any lengths share the call with no padding to the longest. The engine knows nothing of a block's
insides, so any `GPT` runs: learned positions or RoPE, LayerNorm or RMSNorm, MHA or GQA, dense or MoE.

    eng = Engine(model, n_blocks=256, block_size=16)
    r = eng.add_request([1, 2, 3], SamplingParams(max_tokens=20, temperature=0.8, seed=0))
    eng.run()                    # steps until nothing is waiting or running
    r.output                     # the generated token ids; r.finish_reason is "stop" or "length"
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..sampling import sample_next
from .paged_cache import BlockPool, PagedConfig, PagedStep


class QueueFull(RuntimeError):
    """The waiting queue is at its limit; try again later (a server answers 429)."""


@dataclass
class SamplingParams:
    max_tokens: int = 16                       # new tokens at most
    temperature: float = 0.0                   # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None                    # None: drawn from the engine's own generator
    stop_token_ids: tuple[int, ...] = ()       # a token that ends the request (not part of the output)

    def check(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams: max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams: temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"SamplingParams: top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")


@dataclass(eq=False)
class Request:
    id: str
    prompt: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)      # generated tokens (no stop token)
    finish_reason: str | None = None                     # "stop", "length", "abort", "error"
    error: str | None = None
    blocks: list[int] = field(default_factory=list)      # physical block ids, in token order
    n_cached: int = 0                                    # tokens whose keys/values are in `blocks`
    n_shared: int = 0                                    # leading blocks found by prefix sharing (last admission)
    n_preempted: int = 0
    generator: torch.Generator | None = None
    arrival: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    on_token: Callable | None = None                     # on_token(request, token) after each new token
    on_finish: Callable | None = None                    # on_finish(request) once

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def blocks_needed(n_tokens: int, block_size: int) -> int:
    """Blocks that hold n_tokens tokens (the last one may be partly empty)."""
    return -(-n_tokens // block_size)


def can_admit(n_free: int, n_tokens: int, n_shared: int, block_size: int, watermark: int = 0) -> bool:
    """The admission rule: a sequence of n_tokens whose first n_shared blocks are already cached (shared)
    is admitted when the free blocks cover its other blocks, plus the block its first new token may
    open, and still leave `watermark` blocks for the running sequences to grow into."""
    need = blocks_needed(n_tokens + 1, block_size) - n_shared
    return n_free - need >= watermark


def plan_admission(lengths: list[int], shared: list[int], n_free: int, block_size: int, watermark: int = 0) -> int:
    """How many requests from the head of the queue are admitted now (first come, first served).

    lengths[i]: tokens request i needs computed or cached; shared[i]: its leading blocks already cached.
    Requests are taken in order while `can_admit` holds, each taking its blocks from the free count; the
    first that does not fit stops admission (the ones behind it wait too, so it is not starved)."""
    n = 0
    for length, sh in zip(lengths, shared):
        if not can_admit(n_free, length, sh, block_size, watermark):
            break
        n_free -= blocks_needed(length, block_size) - sh
        n += 1
    return n


class PrefixBlocks:
    """Reference-counted blocks over a `BlockPool`, with full blocks findable by their token prefix."""

    def __init__(self, pool: BlockPool, enabled: bool = True):
        self.pool, self.enabled = pool, enabled
        self.bs = pool.cfg.block_size
        self.ref: dict[int, int] = {}                              # block -> users (held blocks only)
        self.key_of: dict[int, tuple] = {}                         # block -> its prefix key (full blocks)
        self.by_key: dict[tuple, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()     # cached, no user: LRU order

    @property
    def n_free(self) -> int:
        """Blocks a new token may take: the free list plus cached blocks nobody uses."""
        return self.pool.n_free + len(self.evictable)

    @property
    def n_shared(self) -> int:
        """Blocks held by more than one sequence."""
        return sum(1 for r in self.ref.values() if r > 1)

    @property
    def n_cached(self) -> int:
        """Full blocks findable by prefix (in use or evictable)."""
        return len(self.by_key)

    def key(self, tokens: list[int], i: int) -> tuple:
        return tuple(tokens[:(i + 1) * self.bs])

    def lookup(self, tokens: list[int]) -> list[int]:
        """Cached blocks for the longest prefix of full blocks of `tokens`, leaving at least one token to
        compute (its logits give the next token)."""
        if not self.enabled:
            return []
        hits = []
        for i in range((len(tokens) - 1) // self.bs):
            b = self.by_key.get(self.key(tokens, i))
            if b is None:
                break
            hits.append(b)
        return hits

    def acquire(self, ids: list[int]) -> None:
        for b in ids:
            self.evictable.pop(b, None)
            self.ref[b] = self.ref.get(b, 0) + 1

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks (reference count 1), evicting least recently used cached blocks if needed."""
        if n > self.n_free:
            raise RuntimeError(f"PrefixBlocks: out of blocks (asked for {n}, {self.n_free} free)")
        while self.pool.n_free < n:
            b, _ = self.evictable.popitem(last=False)
            del self.by_key[self.key_of.pop(b)]
            self.pool.release([b])
        ids = self.pool.allocate(n)
        for b in ids:
            self.ref[b] = 1
        return ids

    def register(self, tokens: list[int], blocks: list[int], n_full: int) -> None:
        """Make the first n_full blocks of a sequence findable by their prefix."""
        if not self.enabled:
            return
        for i in range(n_full):
            k = self.key(tokens, i)
            if k not in self.by_key and blocks[i] not in self.key_of:
                self.by_key[k], self.key_of[blocks[i]] = blocks[i], k

    def release(self, ids: list[int]) -> None:
        for b in ids:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                del self.ref[b]
                if b in self.key_of:
                    self.evictable[b] = None
                else:
                    self.pool.release([b])


# Tokens per KV block for the engine, `tformer serve` and the serving benchmarks: 32 rather than vLLM's 16
# (`PagedConfig`'s default, which chapter 14 keeps). On a CPU a key row of a block (one feature of
# block_size keys, see `paged_decode_attention`) is then 64 bytes in bf16, one cache line, and
# `benchmarks/bench_serve.py` decodes faster (16: half a line per row).
BLOCK_SIZE = 32


class Engine:
    """Continuous batching for a `tformer.models.GPT` over a paged cache; see the module docstring.

    n_blocks, block_size: the pool (it must hold one full-context sequence; block_size: see BLOCK_SIZE).
    max_running: sequences
    decoded together at most. max_waiting: queue length beyond which `add_request` raises `QueueFull`.
    watermark: free blocks kept back at admission for running sequences to grow into. prefill_bucket: a
    prompt's new tokens are padded to a multiple of it, so prefills reuse a few matrix shapes (see
    `forward`; 1: no padding). step_cache: the class of a step's cache (`PagedStep`; a subclass with a
    faster `decode`, such as `benchmarks/paged_decode.py`'s fused kernel, plugs in here).
    """

    def __init__(self, model, n_blocks: int | None = None, block_size: int = BLOCK_SIZE, max_running: int = 64,
                 max_waiting: int = 256, prefix_sharing: bool = True, watermark: int = 1, seed: int = 0,
                 prefill_bucket: int = 32, step_cache: type[PagedStep] = PagedStep):
        cfg = model.cfg
        per_seq = blocks_needed(cfg.context_length, block_size)
        n_blocks = n_blocks if n_blocks is not None else max(4 * per_seq, 64)
        if n_blocks < per_seq + watermark:
            raise ValueError(f"Engine: n_blocks={n_blocks} cannot hold one sequence of context_length="
                             f"{cfg.context_length} ({per_seq} blocks of {block_size}) plus watermark={watermark}")
        p = next(model.parameters())
        self.model = model.eval()
        self.pool = BlockPool(PagedConfig.for_model(model, block_size=block_size, n_blocks=n_blocks, dtype=p.dtype),
                              device=p.device)
        self.blocks = PrefixBlocks(self.pool, prefix_sharing)
        if prefill_bucket < 1:
            raise ValueError(f"Engine: prefill_bucket must be >= 1, got {prefill_bucket}")
        self.bs, self.max_running, self.max_waiting, self.watermark = block_size, max_running, max_waiting, watermark
        self.prefill_bucket, self.step_cache = prefill_bucket, step_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._inbox: deque[Request] = deque()
        self._aborts: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._seeds = torch.Generator().manual_seed(seed)
        self.generated_tokens = 0                     # since construction
        self.prefill_tokens = 0                       # prompt tokens computed (not found cached)
        self.steps = 0
        self.finished: dict[str, int] = {}            # finish_reason -> requests, since construction

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: SamplingParams | None = None, request_id: str | None = None,
                    on_token: Callable | None = None, on_finish: Callable | None = None) -> Request:
        """Queue a request (thread-safe); it is admitted at a later `step`."""
        params = params or SamplingParams()
        params.check()
        prompt = [int(t) for t in prompt]
        ctx, vocab = self.model.cfg.context_length, self.model.cfg.vocab_size
        if not prompt:
            raise ValueError("Engine.add_request: the prompt is empty (expected at least one token)")
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"Engine.add_request: token ids must be in [0, {vocab})")
        if len(prompt) + params.max_tokens > ctx:
            raise ValueError(f"Engine.add_request: prompt of {len(prompt)} tokens + max_tokens={params.max_tokens} "
                             f"exceeds the model's context of {ctx} tokens")
        with self._lock:
            if len(self.waiting) + len(self._inbox) >= self.max_waiting:
                raise QueueFull(f"Engine: {self.max_waiting} requests are already waiting")
            seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seeds))
            req = Request(request_id or f"req-{next(self._ids)}", prompt, params, arrival=time.perf_counter(),
                          generator=torch.Generator(device=self.pool.k.device).manual_seed(seed),
                          on_token=on_token, on_finish=on_finish)
            self._inbox.append(req)
        return req

    def abort(self, request_id: str) -> None:
        """Stop a request (thread-safe); its blocks return at the next step."""
        with self._lock:
            self._aborts.add(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._inbox)

    def run(self, max_steps: int | None = None) -> None:
        """Step until no request is waiting or running."""
        n = 0
        while self.has_work() and (max_steps is None or n < max_steps):
            self.step()
            n += 1

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Request]:
        """Queue every prompt at once and run to completion; the finished requests, in order."""
        params = params if isinstance(params, list) else [params] * len(prompts)
        reqs = [self.add_request(p, q) for p, q in zip(prompts, params)]
        self.run()
        return reqs

    def stats(self) -> dict:
        return {"running": len(self.running), "waiting": len(self.waiting) + len(self._inbox),
                "free_blocks": self.blocks.n_free, "used_blocks": self.pool.cfg.n_blocks - self.blocks.n_free,
                "shared_blocks": self.blocks.n_shared, "cached_blocks": self.blocks.n_cached,
                "total_blocks": self.pool.cfg.n_blocks, "generated_tokens": self.generated_tokens,
                "prefill_tokens": self.prefill_tokens, "steps": self.steps}

    # -- the step -------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Request]:
        """Admit, decode, retire once; returns the requests that finished in this step."""
        finished: list[Request] = []
        with self._lock:
            self.waiting.extend(self._inbox)
            self._inbox.clear()
            aborts, self._aborts = self._aborts, set()
        if aborts:
            for r in [r for r in self.running if r.id in aborts]:
                self._finish(r, "abort", finished)
            for r in [r for r in self.waiting if r.id in aborts]:
                self.waiting.remove(r)
                self._finish(r, "abort", finished)
        decoding = list(self.running)                      # admitted before this step: one token each
        for r in self._admit():
            self._guard([r], self._prefill, finished)
        decoding = [r for r in decoding if not r.done and r in self.running]
        decoding = self._grow(decoding)                    # a block for each new token (preempt if none)
        if decoding:
            self._guard(decoding, self._decode, finished)
        self.steps += 1
        return finished

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting[0]
            toks = r.tokens
            hits = self.blocks.lookup(toks)
            free_after_hits = self.blocks.n_free - sum(1 for b in hits if b in self.blocks.evictable)
            if not can_admit(free_after_hits, len(toks), len(hits), self.bs, self.watermark):
                break
            self.waiting.popleft()
            self.blocks.acquire(hits)
            r.blocks = hits + self.blocks.allocate(blocks_needed(len(toks), self.bs) - len(hits))
            r.n_cached, r.n_shared = len(hits) * self.bs, len(hits)
            self.running.append(r)
            admitted.append(r)
        return admitted

    def _grow(self, decoding: list[Request]) -> list[Request]:
        """Give each decoding sequence room for its new token, preempting the newest sequences if needed."""
        for r in list(decoding):
            if r not in self.running:                      # preempted by an earlier one in this loop
                continue
            while len(r.blocks) * self.bs < len(r.tokens):
                if self.blocks.n_free > 0:
                    r.blocks += self.blocks.allocate(1)
                    break
                victim = self.running[-1]                  # the most recently admitted
                self._preempt(victim)
                if victim is r:
                    break
        return [r for r in decoding if r in self.running]

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        self.blocks.release(r.blocks)
        r.blocks, r.n_cached = [], 0
        r.n_preempted += 1
        self.waiting.appendleft(r)                         # first in line to come back

    def _finish(self, r: Request, reason: str, finished: list[Request], error: str | None = None) -> None:
        if r in self.running:
            self.running.remove(r)
        if r.blocks:
            self.blocks.release(r.blocks)
        r.blocks, r.finish_reason, r.error, r.finished_at = [], reason, error, time.perf_counter()
        self.finished[reason] = self.finished.get(reason, 0) + 1
        finished.append(r)
        if r.on_finish is not None:
            r.on_finish(r)

    def _guard(self, reqs: list[Request], fn, finished: list[Request]) -> None:
        """Run fn(reqs); if it raises for a batch, run each request alone so one bad request fails alone."""
        try:
            fn(reqs, finished)
        except Exception as e:  # noqa: BLE001  (a request's failure must not stop the engine)
            if len(reqs) == 1:
                self._finish(reqs[0], "error", finished, f"{type(e).__name__}: {e}")
                return
            for r in reqs:
                self._guard([r], fn, finished)

    def _prefill(self, reqs: list[Request], finished: list[Request]) -> None:
        (r,) = reqs
        toks = r.tokens
        n_new = len(toks) - r.n_cached
        t_pad = min(-(-n_new // self.prefill_bucket) * self.prefill_bucket,     # round up to the bucket,
                    self.model.cfg.context_length - r.n_cached)                 # within the context
        new = torch.tensor([toks[r.n_cached:] + [0] * (t_pad - n_new)], device=self.pool.k.device)
        pos = torch.arange(r.n_cached, r.n_cached + t_pad, device=new.device)[None]
        logits = self.forward(new, pos, [r], n_real=n_new)[:, n_new - 1]        # (1, V)
        self.prefill_tokens += n_new
        r.n_cached = len(toks)
        self.blocks.register(toks, r.blocks, len(toks) // self.bs)
        self._sample([r], logits, finished)

    def _decode(self, reqs: list[Request], finished: list[Request]) -> None:
        dev = self.pool.k.device
        new = torch.tensor([[r.tokens[-1]] for r in reqs], device=dev)          # (B, 1)
        pos = torch.tensor([[len(r.tokens) - 1] for r in reqs], device=dev)     # (B, 1)
        logits = self.forward(new, pos, reqs)[:, -1]                            # (B, V)
        for r in reqs:
            r.n_cached = len(r.tokens)
        self._sample(reqs, logits, finished)

    def _sample(self, reqs: list[Request], logits: torch.Tensor, finished: list[Request]) -> None:
        toks = logits.argmax(-1).tolist()                                       # greedy rows: one argmax
        for i, r in enumerate(reqs):
            p = r.params
            if p.temperature > 0:
                toks[i] = int(sample_next(logits[i:i + 1].float(), p.temperature, p.top_k, r.generator,
                                          top_p=p.top_p))
        now = time.perf_counter()
        for r, t in zip(reqs, toks):
            if r.first_token_at is None:
                r.first_token_at = now
            if t in r.params.stop_token_ids:
                self._finish(r, "stop", finished)
                continue
            r.output.append(t)
            self.generated_tokens += 1
            if r.on_token is not None:
                r.on_token(r, t)
            if len(r.output) >= r.params.max_tokens:
                self._finish(r, "length", finished)

    # -- the model step: every sequence's new tokens through the model together ----------------------
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, reqs: list[Request],
                n_real: int | None = None) -> torch.Tensor:
        """tokens, positions (B, T) of B sequences' new tokens -> logits (B, T, V): the model's own forward,
        its cache a `PagedStep` over the sequences' blocks (a decoding step, T = 1 and any B, or a prefill of
        one sequence). It stores the new keys/values in each sequence's blocks and attends over all of them.

        n_real (a prefill): only the first n_real tokens are the sequence's; the rest pad T up to a
        bucket (`prefill_bucket`). On a CPU each new matrix shape costs a kernel choice, and in bf16 a
        JIT-compiled AMX kernel (oneDNN), about as long as the prefill itself: padded prompts reuse a few
        shapes. Pads come after every real token, so causal attention keeps them out of the real rows;
        their keys/values are not stored."""
        step = self.step_cache(self.pool, [r.blocks for r in reqs], positions, n_real)
        return self.model(tokens, step.layers, positions=positions)


__all__ = ["BLOCK_SIZE", "Engine", "SamplingParams", "Request", "QueueFull", "PrefixBlocks", "can_admit", "blocks_needed",
           "plan_admission"]
