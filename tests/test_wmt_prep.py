"""Translation data at WMT14's size: packed integer ids, the array batcher, the encoded-data cache of a run,
and benchmarks/bench_wmt_prep.py run as typed at a small size."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tformer.data import PackedIds, SharedBPE, TokenBatcher, collate, collate_packed, generate_pairs
from tformer.data.batching import id_dtype, split_by_tokens
from tformer.translate import pipeline
from tformer.translate.presets import get_preset

ROOT = Path(__file__).resolve().parent.parent


def ragged(rng, n, low=0, high=40, vocab=40_000):
    return [rng.integers(4, vocab, int(rng.integers(low, high))).tolist() for _ in range(n)]


def test_packed_ids_hold_what_the_lists_hold():
    rows = [[5, 6, 7], [], [8], [9, 10]]
    p = PackedIds.from_lists(rows)
    assert p.ids.dtype == np.uint16 and p.offsets.tolist() == [0, 3, 3, 4, 6] and p.lengths.tolist() == [3, 0, 1, 2]
    assert len(p) == 4 and p[3].tolist() == [9, 10] and p.tolist() == rows
    both = PackedIds.concatenate([p, PackedIds.from_lists([[70_000], [1, 2]])])
    assert both.tolist() == rows + [[70_000], [1, 2]] and both.ids.dtype == np.int32
    assert id_dtype(37_000) == np.uint16 and id_dtype(65_536) == np.uint16 and id_dtype(65_537) == np.int32
    with pytest.raises(ValueError, match="offsets"):
        PackedIds(np.arange(3), np.array([0, 2]))


def greedy_cuts(widths, max_tokens):
    """The batcher's cut as it was written first: one Python step per sentence (the reference)."""
    starts, start, width = [0], 0, 0
    for i, w in enumerate(widths):
        width = max(width, w)
        if (i - start + 1) * width > max_tokens:
            starts.append(i)
            start, width = i, w
    return starts if len(widths) else []


def test_split_by_tokens_cuts_where_the_one_sentence_at_a_time_loop_cuts():
    rng = np.random.default_rng(0)
    for trial in range(200):
        widths = np.sort(rng.integers(1, 60, int(rng.integers(0, 500)))) if trial % 2 else rng.integers(1, 60, 300)
        max_tokens = int(rng.integers(60, 2000))
        assert split_by_tokens(widths, max_tokens).tolist() == greedy_cuts(widths.tolist(), max_tokens), trial


def test_the_batcher_on_packed_ids_gives_the_batches_of_lists_and_of_collate():
    rng = np.random.default_rng(1)
    src, tgt = ragged(rng, 500), ragged(rng, 500)
    for world, max_len in ((1, None), (2, 30), (3, 12)):
        for rank in range(world):
            a = TokenBatcher(src, tgt, 600, seed=3, max_len=max_len, rank=rank, world=world)
            b = TokenBatcher(PackedIds.from_lists(src), PackedIds.from_lists(tgt), 600, seed=3, max_len=max_len,
                             rank=rank, world=world)
            assert [x.tolist() for x in a.batches] == [x.tolist() for x in b.batches] and a.n_pairs == b.n_pairs
            for batch, ref_rows, got in zip(a.order(), (a.batches[i][rank::world] for i in a.order()), b):
                ref = collate([src[i] for i in ref_rows], [tgt[i] for i in ref_rows])
                assert all(r.dtype == g.dtype == torch.int64 and torch.equal(r, g) for r, g in zip(ref, got))
                assert got.src.numel() <= 600 and got.tgt_in.numel() <= 600
    with pytest.raises(ValueError, match="at least one"):
        collate_packed(PackedIds.from_lists(src), PackedIds.from_lists(tgt), np.array([], dtype=np.int64))


@pytest.fixture(scope="module")
def bpe():
    en, de = generate_pairs(600, seed=3)
    return SharedBPE.train(en + de, vocab_size=400)


def test_encode_packed_is_encode_in_chunks(bpe):
    en, de = generate_pairs(300, seed=4)
    lines = en + de + ["", "Straße ☃ naïve", "  two  spaces "]
    packed = bpe.encode_packed(lines, chunk=97)
    assert packed.ids.dtype == np.uint16 and packed.tolist() == bpe.encode(lines)
    assert bpe.encode_packed([]).tolist() == []


def small_run(tmp_path, bpe):
    from tformer.data import write_offline_corpus
    out = tmp_path / "run"
    out.mkdir()
    data = write_offline_corpus(tmp_path / "data", n_train=400, n_val=50, n_test=10)
    bpe.save(out / "tokenizer.json")
    return out, {"src": "en", "tgt": "de", "data": str(data)}


def test_a_resumed_run_reads_its_encoded_data_instead_of_the_text(tmp_path, bpe, monkeypatch, capsys):
    out, info = small_run(tmp_path, bpe)
    p = get_preset("tiny")
    _, batches, val = pipeline.prepare_data(out, p, info)
    assert (out / pipeline.ENCODED).exists()
    first = [b.src for b in batches]

    def no_text(*a, **k):
        raise AssertionError("read the text although the encoded data was there")
    with monkeypatch.context() as m:
        m.setattr(pipeline, "read_parallel", no_text)
        _, again, _ = pipeline.prepare_data(out, p, info)
    assert all(torch.equal(x, y) for x, y in zip(first, (b.src for b in again))) and len(first) == len(again)
    # other data (or another tokenizer) is encoded again; so is an unreadable cache, with a warning
    key = pipeline.data_key(out, info)
    train_en = Path(info["data"]) / "train.en"
    train_en.write_text(train_en.read_text().replace("dog", "cat"))
    assert pipeline.load_encoded(out / pipeline.ENCODED, pipeline.data_key(out, info)) is None
    _, changed, _ = pipeline.prepare_data(out, p, info)
    old, new = (pipeline.load_encoded(out / pipeline.ENCODED, k) for k in (key, pipeline.data_key(out, info)))
    assert old is None and new is not None and new[0].tolist() == bpe.encode(train_en.read_text().splitlines())
    (out / pipeline.ENCODED).write_bytes(b"not a zip file")
    _, healed, _ = pipeline.prepare_data(out, p, info)
    assert "unreadable" in capsys.readouterr().err and len(healed) == len(changed)


def test_a_full_disk_while_saving_the_encoded_data_is_a_warning(tmp_path, bpe, monkeypatch, capsys):
    import errno
    out, info = small_run(tmp_path, bpe)
    (out / f".{pipeline.ENCODED}.tmp").write_bytes(b"left by a killed job")

    def full(f, **arrays):
        f.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(pipeline.np, "savez", full)
    _, batches, _ = pipeline.prepare_data(out, get_preset("tiny"), info)
    assert len(batches) > 0 and "No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json"]


def test_bench_wmt_prep_as_typed(tmp_path):
    """`python benchmarks/bench_wmt_prep.py --pairs 2000 ...` from outside the checkout: a table with every
    stage, the loader against the GPU, and the same figures in JSON."""
    lengths = tmp_path / "lengths.en"
    lengths.write_text("one two three\nfour five\nsix seven eight nine ten\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_wmt_prep.py"), "--pairs", "2000",
                          "--types", "20000", "--loader-seconds", "1", "--lengths-from", str(lengths),
                          "--json", "out.json", "--no-progress"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    table = [line for line in res.stdout.splitlines() if line.startswith("| ")]
    stages = [line.split("|")[1].strip() for line in table[1:]]
    assert stages == ["corpus", "read", "bpe", "encode", "save", "resume", "batch", "loader"], res.stdout
    words = re.search(r"([\d.]+) / ([\d.]+) words a line", res.stdout)
    assert words and all(2 <= float(w) <= 5 for w in words.groups()) and "(uint16)" in res.stdout  # the file's 3, 2, 5
    assert "one GPU consumes about 390,000 target tokens/s" in res.stdout
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["pairs"] == 2000 and out["loader_batches_per_s"] > 0 and 0 < out["peak_rss_gib"] < 24
    assert {r["stage"] for r in out["rows"]} == set(stages) and not list(tmp_path.glob("wmt_prep_*"))
