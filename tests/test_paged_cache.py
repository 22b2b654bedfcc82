"""Paged KV cache: same outputs as the contiguous KVCache; the allocator; memory accounting."""
import pytest
import torch

from tformer.cache import make_caches
from tformer.models import GPT, GPTConfig
import torch.nn.functional as F

from tformer.inference.paged_cache import (BlockPool, DecodeIndex, PagedConfig, generate_paged, kv_memory,
                                           paged_decode_attention, write_kv)


def _model(n_kv_heads=2, seed=0):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=40, context_length=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, d_model=32)
    return GPT(cfg).double().eval()


@pytest.mark.parametrize("n_kv_heads,block_size", [(4, 4), (2, 3), (1, 16)])
def test_outputs_equal_contiguous_cache_and_full_forward(n_kv_heads, block_size):
    m = _model(n_kv_heads)
    pool = BlockPool(PagedConfig.for_model(m, block_size=block_size, n_blocks=64, dtype=torch.float64))
    paged, contiguous = pool.new_caches(batch=3), make_caches(2, 64)
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 40, (3, 15), generator=g)
    chunks = [seq[:, :6], seq[:, 6:7], seq[:, 7:11], seq[:, 11:12], seq[:, 12:15]]  # prefill, steps, a chunk
    outs = []
    for x in chunks:
        a, b = m(x, paged), m(x, contiguous)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        outs.append(a)
    torch.testing.assert_close(torch.cat(outs, 1), m(seq), rtol=1e-10, atol=1e-10)  # no cache at all
    k_p, v_p = paged[1].get()
    k_c, v_c = contiguous[1].get()
    assert torch.equal(k_p, k_c) and torch.equal(v_p, v_c)
    assert pool.n_used == 3 * -(-15 // block_size)                 # ceil(15 / bs) blocks per sequence


def test_blocks_are_scattered_yet_read_back_in_order():
    m = _model()
    pool = BlockPool(PagedConfig.for_model(m, block_size=2, n_blocks=32, dtype=torch.float64))
    a, b = pool.new_caches(1), pool.new_caches(1)
    x, y = torch.randint(0, 40, (1, 9)), torch.randint(0, 40, (1, 9))
    out_a, out_b = [], []
    for t in range(9):                                          # two sequences growing in turn: interleaved blocks
        out_a.append(m(x[:, t:t + 1], a))
        out_b.append(m(y[:, t:t + 1], b))
    ids = a[0].table.ids[0].tolist()
    assert ids == [0, 2, 4, 6, 8]                               # every other block: b took the ones between
    torch.testing.assert_close(torch.cat(out_a, 1), m(x), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.cat(out_b, 1), m(y), rtol=1e-10, atol=1e-10)


def test_allocator_truncate_free_and_out_of_blocks():
    m = _model()
    pool = BlockPool(PagedConfig.for_model(m, block_size=4, n_blocks=5, dtype=torch.float64))
    caches = pool.new_caches(1)
    m(torch.randint(0, 40, (1, 10)), caches)                    # 10 tokens -> 3 blocks
    assert pool.n_used == 3 and caches[0].length == 10
    assert caches[0].nbytes() == 2 * 3 * 2 * 4 * 8 * 8         # K+V, 3 blocks, 2 heads, bs 4, hd 8, float64
    n_layers = m.cfg.n_layers
    assert pool.cfg.token_bytes == 2 * n_layers * 2 * 8 * 8      # K+V, every layer, 2 heads, hd 8, float64
    assert pool.block_bytes() == 4 * pool.cfg.token_bytes and pool.used_bytes() == 3 * pool.block_bytes()
    for c in caches:
        c.truncate(5)                                           # rollback: 5 tokens need 2 blocks
    assert pool.n_used == 2
    with pytest.raises(ValueError, match="0 <= length"):
        caches[0].truncate(6)
    other = pool.new_caches(1)
    with pytest.raises(RuntimeError, match="out of blocks"):
        m(torch.randint(0, 40, (1, 13)), other)                 # needs 4 blocks, 3 free
    assert pool.n_used == 2                                     # a failed allocation takes nothing
    caches[0].table.free()
    assert pool.n_free == 5
    with pytest.raises(ValueError, match=r"\(1, 2, T_new, 8\)"):
        caches[0].append(torch.zeros(1, 3, 1, 8, dtype=torch.float64), torch.zeros(1, 3, 1, 8, dtype=torch.float64))


def test_generate_paged_matches_generate_and_saves_memory():
    m = _model()
    pool = BlockPool(PagedConfig.for_model(m, block_size=4, n_blocks=40, dtype=torch.float64))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 40, (n,), generator=g) for n in (3, 11, 6, 1)]
    new = [9, 2, 14, 5]
    outs, stats = generate_paged(m, prompts, new, pool)
    for p, n, o in zip(prompts, new, outs):
        assert torch.equal(o, m.generate(p[None], n, temperature=0)[0])
    assert pool.n_used == 0                                     # every finished request gave its blocks back
    longest = max(len(p) + n for p, n in zip(prompts, new))
    assert stats["peak_blocks"] * 4 < len(prompts) * longest    # less than reserving max length for each


def test_kv_memory_accounting():
    r = kv_memory([1, 16, 17, 40], max_len=64, block_size=16)
    assert r["used"] == 74 and r["contiguous"] == 256 and r["paged"] == (1 + 1 + 2 + 3) * 16
    assert r["contiguous_waste"] == pytest.approx(1 - 74 / 256) and r["paged_waste"] == pytest.approx(1 - 74 / 112)
    assert kv_memory([64], 64, 16, bytes_per_token=10)["paged"] == 640
    with pytest.raises(ValueError, match="max_len=8"):
        kv_memory([9], 8, 4)


def test_beam_search_reorder_says_what_to_use_instead():
    pool = BlockPool(PagedConfig(n_layers=1, n_kv_heads=1, head_dim=4, block_size=2, n_blocks=4))
    with pytest.raises(NotImplementedError, match="contiguous KVCache"):
        pool.new_caches(2)[0].reorder(torch.tensor([1, 0]))


def _scattered_sequences(n_heads, n_kv_heads, dtype):
    """Six sequences written into scattered blocks of layer 1 (ragged lengths: a partly filled last
    block, one token, several blocks; sequence 5 shares sequence 4's first block, as prefix sharing does),
    their queries and their `DecodeIndex`; keys and values returned as the pool holds them."""
    bs, hd = 4, 8
    pool = BlockPool(PagedConfig(n_layers=2, n_kv_heads=n_kv_heads, head_dim=hd, block_size=bs, n_blocks=40,
                                 dtype=dtype))
    g = torch.Generator().manual_seed(n_heads + n_kv_heads)
    lens = [1, 3, 4, 5, 17, 9]
    free = torch.randperm(40, generator=g).tolist()
    tables = [[free.pop() for _ in range(-(-n // bs))] for n in lens]
    tables[5][0] = tables[4][0]                                   # sequence 5 shares sequence 4's first block
    keys = [torch.randn(n, n_kv_heads, hd, generator=g, dtype=torch.float64).to(dtype) for n in lens]
    vals = [torch.randn(n, n_kv_heads, hd, generator=g, dtype=torch.float64).to(dtype) for n in lens]
    keys[5][:bs], vals[5][:bs] = keys[4][:bs], vals[4][:bs]       # ... so its first tokens are the same
    for table, k, v in zip(tables, keys, vals):
        pos = torch.arange(len(k))
        write_kv(pool, 1, torch.tensor(table)[pos // bs][None], pos % bs, k[None], v[None])
    nb = max(map(len, tables))
    idx = DecodeIndex.build(torch.tensor([t + [0] * (nb - len(t)) for t in tables]), torch.tensor(lens), n_heads,
                            n_kv_heads, hd, bs)
    q = torch.randn(len(lens), n_heads, 1, hd, generator=g, dtype=torch.float64).to(dtype)
    return pool, idx, q, keys, vals


def _sdpa_alone(q, k, v):
    """float64 SDPA of one sequence's query (1, H, 1, hd) over its own keys/values (n, H_kv, hd)."""
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q.double(), k.double().transpose(0, 1).repeat_interleave(rep, 0)[None],
                                          v.double().transpose(0, 1).repeat_interleave(rep, 0)[None])


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_paged_decode_attention_reads_blocks_in_place(n_heads, n_kv_heads):
    """One query per sequence over its own keys, read from scattered blocks: equal (float64) to SDPA over
    that sequence's keys alone, for ragged lengths, GQA, and a block two sequences share."""
    pool, idx, q, keys, vals = _scattered_sequences(n_heads, n_kv_heads, torch.float64)
    out = paged_decode_attention(q, pool.k[1], pool.v[1], idx)
    assert out.shape == q.shape
    for i, (k, v) in enumerate(zip(keys, vals)):
        torch.testing.assert_close(out[i:i + 1], _sdpa_alone(q[i:i + 1], k, v), rtol=0, atol=1e-12)
    assert not pool.k[0].any()                                    # another layer's blocks untouched


def test_paged_decode_attention_in_bf16_is_within_its_rounding():
    """A bf16 pool (what the engine serves in on a CPU with bf16 units): scores, softmax and the weighted
    sum stay within bf16 rounding of float64 attention over the same stored values (one stale or unmasked
    position would be off by far more than 0.02: the values are N(0, 1))."""
    pool, idx, q, keys, vals = _scattered_sequences(4, 2, torch.bfloat16)
    out = paged_decode_attention(q, pool.k[1], pool.v[1], idx)
    assert out.dtype == torch.bfloat16
    for i, (k, v) in enumerate(zip(keys, vals)):
        torch.testing.assert_close(out[i:i + 1].double(), _sdpa_alone(q[i:i + 1], k, v), rtol=0, atol=2e-2)
