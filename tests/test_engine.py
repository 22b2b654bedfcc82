"""Continuous batching (tformer.inference.engine): every request's tokens equal the request decoded alone."""
import random

import pytest
import torch

from tformer.cache import make_caches
from tformer.inference.engine import Engine, QueueFull, SamplingParams, blocks_needed, can_admit
from tformer.inference.paged_cache import read_kv
from tformer.models.gpt import GPT, GPTConfig
from tformer.serve.runs import context_init_


def tiny(seed=0, **kw):
    """A float64 GPT whose next token depends on its context (`context_init_`): equal outputs then say
    that attention read the right keys."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=61, context_length=96, n_layers=2, n_heads=4, d_model=32)
    cfg.update(kw)
    return context_init_(GPT(GPTConfig(**cfg))).double().eval()


def alone(model, prompt, max_tokens, stop=()):
    """The independent reference: the model's own generate (contiguous KV cache), cut at a stop token."""
    out = model.generate(torch.tensor([prompt]), max_tokens, temperature=0.0)[0, len(prompt):].tolist()
    for i, t in enumerate(out):
        if t in stop:
            return out[:i], "stop"
    return out, "length"


def run_arrivals(eng, arrivals):
    """arrivals: list of (step, prompt, params); add each at its step, step until all finish."""
    reqs, i, step = [], 0, 0
    arrivals = sorted(arrivals, key=lambda a: a[0])
    while i < len(arrivals) or eng.has_work():
        while i < len(arrivals) and arrivals[i][0] <= step:
            reqs.append(eng.add_request(arrivals[i][1], arrivals[i][2]))
            i += 1
        eng.step()
        step += 1
    return reqs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_equals_alone_random_arrivals(seed):
    """Property test (float64): random arrival steps, prompt lengths and max_tokens; a small pool forces
    preemption; a shared prefix exercises block sharing. Each request's tokens equal it decoded alone."""
    model = tiny(seed)
    rng = random.Random(seed)
    system = [rng.randrange(61) for _ in range(20)]
    arrivals = []
    for _ in range(14):
        n = rng.randint(1, 40)
        prompt = (system if rng.random() < 0.4 else []) + [rng.randrange(61) for _ in range(n)]
        arrivals.append((rng.randint(0, 30), prompt, SamplingParams(max_tokens=rng.randint(1, 30))))
    eng = Engine(model, n_blocks=blocks_needed(96, 8) + 4, block_size=8, max_running=6)
    reqs = run_arrivals(eng, arrivals)
    for r, (_, prompt, p) in zip(reqs, sorted(arrivals, key=lambda a: a[0])):
        assert r.output == alone(model, prompt, p.max_tokens)[0]
        assert r.finish_reason == "length"
    assert eng.blocks.n_free == eng.pool.cfg.n_blocks and not eng.blocks.ref     # every block back
    assert sum(r.n_preempted for r in reqs) > 0                                  # the pool was tight


def test_stop_token_and_rope_gqa():
    model = tiny(3, positional="rope", n_kv_heads=2)
    rng = random.Random(3)
    prompts = [[rng.randrange(61) for _ in range(rng.randint(1, 30))] for _ in range(6)]
    stop = tuple(alone(model, prompts[0], 12)[0][5:6])                           # a token request 0 emits
    eng = Engine(model, n_blocks=40, block_size=4)
    reqs = eng.generate(prompts, SamplingParams(max_tokens=12, stop_token_ids=stop))
    for r, p in zip(reqs, prompts):
        out, why = alone(model, p, 12, stop)
        assert (r.output, r.finish_reason) == (out, why)
    assert reqs[0].finish_reason == "stop" and len(reqs[0].output) <= 5


def test_seeded_sampling_same_alone_and_in_a_crowd():
    model = tiny(4)
    prompt = [5, 6, 7, 8, 9]
    p = SamplingParams(max_tokens=25, temperature=1.0, top_k=20, top_p=0.9, seed=123)
    solo = Engine(model, n_blocks=40, block_size=8).generate([prompt], p)[0].output
    rng = random.Random(0)
    crowd = [(rng.randint(0, 5), [rng.randrange(61) for _ in range(rng.randint(1, 30))],
              SamplingParams(max_tokens=rng.randint(1, 30), temperature=1.0, seed=rng.randrange(1000)))
             for _ in range(8)] + [(3, prompt, p)]
    reqs = run_arrivals(Engine(model, n_blocks=40, block_size=8, max_running=5), crowd)
    mine = [r for r in reqs if r.params is p][0]
    assert mine.output == solo
    other = Engine(model, n_blocks=40, block_size=8).generate([prompt], SamplingParams(25, 1.0, 20, 0.9, seed=124))
    assert other[0].output != solo                                              # the seed matters


def test_prefix_sharing_counts_and_frees():
    model = tiny(5)
    system = list(range(1, 33))                                                  # 4 full blocks of 8
    eng = Engine(model, n_blocks=60, block_size=8)
    a = eng.add_request(system + [40, 41], SamplingParams(max_tokens=20))
    eng.step()                                                                  # a is prefilled
    b = eng.add_request(system + [50], SamplingParams(max_tokens=20))
    eng.step()
    assert b.n_shared == 4 and a.blocks[:4] == b.blocks[:4]
    assert eng.blocks.n_shared == 4
    assert eng.prefill_tokens == 34 + 1                                          # b computed one token
    eng.run()
    assert a.output == alone(model, system + [40, 41], 20)[0]
    assert b.output == alone(model, system + [50], 20)[0]
    assert eng.blocks.n_free == 60 and not eng.blocks.ref
    c = eng.generate([system + [60]], SamplingParams(max_tokens=3))[0]           # evictable blocks still found
    assert c.n_shared == 4


def test_abort_frees_blocks_and_others_unchanged():
    model = tiny(6)
    prompts = [[i + 1] * (10 + i) for i in range(4)]
    eng = Engine(model, n_blocks=60, block_size=8)
    reqs = [eng.add_request(p, SamplingParams(max_tokens=30)) for p in prompts]
    for _ in range(5):
        eng.step()
    eng.abort(reqs[1].id)
    eng.run()
    assert reqs[1].finish_reason == "abort" and len(reqs[1].output) < 30
    for i in (0, 2, 3):
        assert reqs[i].output == alone(model, prompts[i], 30)[0]
    assert eng.blocks.n_free == 60


def test_fault_in_one_request_fails_it_alone():
    model = tiny(7)
    poison = 60

    def hook(module, args):
        if (args[0] == poison).any():
            raise RuntimeError("injected fault")
    handle = model.tok_embed.register_forward_pre_hook(hook)
    try:
        eng = Engine(model, n_blocks=60, block_size=8)
        good = [eng.add_request([1, 2, 3], SamplingParams(max_tokens=10)),
                eng.add_request([4, 5], SamplingParams(max_tokens=10))]
        bad = eng.add_request([1, poison], SamplingParams(max_tokens=10))
        eng.run()
    finally:
        handle.remove()
    assert bad.finish_reason == "error" and "injected fault" in bad.error
    assert [r.output for r in good] == [alone(model, [1, 2, 3], 10)[0], alone(model, [4, 5], 10)[0]]
    assert eng.blocks.n_free == 60


def test_admission_rule_and_errors():
    assert can_admit(n_free=3, n_tokens=16, n_shared=0, block_size=8, watermark=0)   # 16 + 1 tokens: 3 blocks
    assert not can_admit(n_free=3, n_tokens=16, n_shared=0, block_size=8, watermark=1)
    assert can_admit(n_free=1, n_tokens=16, n_shared=2, block_size=8, watermark=0)
    model = tiny(8)
    with pytest.raises(ValueError, match="context of 96"):
        Engine(model, n_blocks=60, block_size=8).add_request([1] * 90, SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        Engine(model, n_blocks=5, block_size=8)
    eng = Engine(model, n_blocks=60, block_size=8, max_waiting=2)
    eng.add_request([1], SamplingParams(max_tokens=2))
    eng.add_request([1], SamplingParams(max_tokens=2))
    with pytest.raises(QueueFull):
        eng.add_request([1], SamplingParams(max_tokens=2))


@pytest.mark.parametrize("bucket", [1, 7, 32])
def test_prefill_pads_to_bucket_and_matches_alone(bucket, monkeypatch):
    """Prefills run at a multiple of `prefill_bucket` tokens (or up to the context when that is shorter),
    fresh and after a prefix hit; the pads change no request's tokens and hold no cache slot."""
    model = tiny(9)
    shapes = []                                               # (tokens cached before, T, n_real) of each prefill
    real_forward = Engine.forward

    def spy(self, tokens, positions, reqs, n_real=None):
        logits = real_forward(self, tokens, positions, reqs, n_real)
        if tokens.shape[1] > 1 or n_real is not None:                           # a prefill: check the cache
            start = int(positions[0, 0])
            shapes.append((start, tokens.shape[1], n_real))
            n = start + n_real                                                   # tokens now cached
            caches = make_caches(model.cfg.n_layers)
            model(torch.tensor([reqs[0].tokens[:n]]), caches)                    # the same tokens, no pads
            pos = torch.arange(n)
            blocks = torch.tensor(reqs[0].blocks)[pos // self.bs][None]
            for layer, c in enumerate(caches):
                for got, want in zip(read_kv(self.pool, layer, blocks, pos % self.bs), c.get()):
                    torch.testing.assert_close(got, want)                        # no pad overwrote a real slot
        return logits
    monkeypatch.setattr(Engine, "forward", spy)
    system = list(range(1, 17))                                                  # 2 full blocks of 8
    rng = random.Random(bucket)
    prompts = ([[rng.randrange(61) for _ in range(n)] for n in (1, 9, 30, 33)]
               + [system + [40] * 3, system + [50] * 60])
    eng = Engine(model, n_blocks=80, block_size=8, prefill_bucket=bucket)
    reqs = [eng.add_request(p, SamplingParams(max_tokens=12)) for p in prompts[:-1]]
    eng.step()
    reqs.append(eng.add_request(prompts[-1], SamplingParams(max_tokens=12)))     # after the system prompt is cached
    eng.run()
    assert reqs[-1].n_shared == 2                                                # a prefix hit: 16 tokens not recomputed
    for r, p in zip(reqs, prompts):
        assert r.output == alone(model, p, 12)[0]
    assert sorted(n for _, _, n in shapes) == sorted([1, 9, 30, 33, 19, 60])    # every real token, once
    for start, t, n in shapes:
        assert t % bucket == 0 or start + t == model.cfg.context_length, (bucket, start, t)
        assert t - n < bucket
    assert eng.prefill_tokens == sum(n for _, _, n in shapes)
    assert eng.blocks.n_free == 80 and not eng.blocks.ref
    with pytest.raises(ValueError, match="prefill_bucket must be >= 1"):
        Engine(model, n_blocks=80, block_size=8, prefill_bucket=0)


def test_a_faster_decode_plugs_in_as_the_step_caches():
    """Engine(step_cache=) is the cache every layer of every step attends through: a subclass of `PagedStep`
    whose `decode` reads the blocks differently (from the tables the step carries) gives the same tokens,
    once per decoding step and layer, as a fused kernel would plug in."""
    from tformer.inference.paged_cache import DecodeIndex, PagedStep, paged_decode_attention
    model, calls = tiny(3), []

    class Rebuilt(PagedStep):                             # rebuilds the index from the tables, every layer
        def decode(self, layer, q):
            calls.append(q.shape[0])
            c = self.pool.cfg
            idx = DecodeIndex.build(self.table, self.lengths, q.shape[1], c.n_kv_heads, c.head_dim, c.block_size)
            return paged_decode_attention(q, self.pool.k[layer], self.pool.v[layer], idx)
    eng = Engine(model, n_blocks=60, block_size=8, step_cache=Rebuilt)
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16]]
    reqs = eng.generate(prompts, SamplingParams(max_tokens=9))
    assert [r.output for r in reqs] == [alone(model, p, 9)[0] for p in prompts]
    assert len(calls) == model.cfg.n_layers * 8 and calls[0] == len(prompts)    # 8 decoding steps after the prefills


def test_the_engine_runs_the_models_own_forward(monkeypatch):
    """The engine has no forward of its own: every step is `model(tokens, cache, positions=...)`, so a
    block whose insides the engine never saw (post-LN here) serves its own tokens too."""
    model = tiny(6)
    for blk in model.blocks:
        blk.norm_first = False                            # post-LN: the engine used to assume pre-LN
    seen = []
    real = type(model).forward

    def spy(self, idx, cache=None, positions=None):
        seen.append((tuple(idx.shape), positions is not None))
        return real(self, idx, cache, positions)
    monkeypatch.setattr(type(model), "forward", spy)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
    eng = Engine(model, n_blocks=40, block_size=8)
    reqs = eng.generate(prompts, SamplingParams(max_tokens=6))
    monkeypatch.undo()
    assert [r.output for r in reqs] == [alone(model, p, 6)[0] for p in prompts]
    assert seen and all(has_pos for _, has_pos in seen)


@pytest.mark.parametrize("preset", ["llama", "qwen3"])
def test_a_llama_and_a_qwen3_style_model_serve_their_own_tokens(preset):
    """RMSNorm, SwiGLU, GQA, RoPE, an untied head (Qwen3: QK-norm and a head size of its own): every
    request's tokens equal the model's own generate, as for the GPT-2-style model."""
    torch.manual_seed(5)
    sizes = dict(vocab_size=61, context_length=96, n_layers=2, n_heads=4, n_kv_heads=2, d_model=32)
    cfg = GPTConfig.llama(**sizes) if preset == "llama" else GPTConfig.qwen3(**sizes, head_dim=16)
    model = context_init_(GPT(cfg)).double().eval()
    rng = random.Random(5)
    prompts = [[rng.randrange(61) for _ in range(rng.randint(1, 30))] for _ in range(5)]
    eng = Engine(model, n_blocks=40, block_size=8)
    reqs = eng.generate(prompts, SamplingParams(max_tokens=10))
    assert [r.output for r in reqs] == [alone(model, p, 10)[0] for p in prompts]
