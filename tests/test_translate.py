"""The translation pipeline: offline corpus, BPE, token batching, decoding, BLEU, and the end-to-end run."""
from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

from tformer.data import (DataUnavailableError, SharedBPE, TokenBatcher, collate, generate_pairs, multi30k,
                          read_parallel, wmt14, write_offline_corpus)
from tformer.data.corpus import NounPhrase
from tformer.inference.decode import beam_search, greedy_decode, length_penalty
from tformer.training.metrics import sacrebleu_score, split_compounds, tokenized_bleu
from tformer.models import Transformer, TransformerConfig


# -- offline corpus -----------------------------------------------------------------------------------
def test_corpus_agreement_and_reordering():
    en, de = generate_pairs(400, seed=0)
    assert (en, de) == generate_pairs(400, seed=0) and en != generate_pairs(400, seed=1)[0]
    pairs = dict(zip(en, de))
    # the participle goes last, "dass" sends the verb to the end, adverb fronting inverts
    perfect = [(e, d) for e, d in pairs.items() if " has " in e and " that " not in e]
    assert perfect and all(d.rstrip(".").split()[-1].startswith("ge") or d.rstrip(".").split()[-1] == "beobachtet"
                           for e, d in perfect)
    that = [(e, d) for e, d in pairs.items() if " that " in e]
    assert that and all(", dass " in d for e, d in that)
    today = [d for e, d in pairs.items() if e.startswith("Today ")]
    assert today and all(d.split()[1] in {v[3] for v in __import__("tformer.data.corpus", fromlist=["VERBS"]).VERBS}
                         | {v[4] for v in __import__("tformer.data.corpus", fromlist=["VERBS"]).VERBS} for d in today)


def test_noun_phrase_cases():
    import random
    rng = random.Random(0)
    seen = set()
    for _ in range(300):
        np_ = NounPhrase(rng)
        if np_.noun[0] == "dog" and np_.definite and not np_.plural and np_.adjs:
            adj = np_.adjs[0][1]
            assert np_.de("nom").startswith(f"der {adj}e ") and np_.de("acc").startswith(f"den {adj}en ")
            seen.add("def")
        if np_.noun[0] == "car" and not np_.definite and not np_.plural and len(np_.adjs) == 1:
            assert np_.de("nom") == f"ein {np_.adjs[0][1]}es Auto" and np_.en().startswith(("a ", "an "))
            seen.add("indef")
    assert seen == {"def", "indef"}


def test_offline_corpus_files(tmp_path):
    folder = write_offline_corpus(tmp_path, n_train=200, n_val=30, n_test=30)
    tr_en, tr_de = read_parallel(folder, "en", "de", "train")
    te_en, _ = read_parallel(folder, "en", "de", "test")
    assert len(tr_en) == len(tr_de) == 200 and len(te_en) == 30
    assert not set(te_en) & set(tr_en)
    with pytest.raises(FileNotFoundError, match="train.fr"):
        read_parallel(folder, "en", "fr")


def test_offline_sources_fail_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataUnavailableError, match="offline corpus|--data"):
        wmt14("en-de")
    with pytest.raises(DataUnavailableError, match="--data"):
        multi30k()
    with pytest.raises(ValueError, match="pair"):
        wmt14("en-xx")
    local = tmp_path / "m30k"
    local.mkdir()
    for s in ("train", "val", "test_2016_flickr"):
        for lang in ("de", "en"):
            (local / f"{s}.{lang}").write_text("x\n")
    assert multi30k(local) == local


# -- BPE and batching ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bpe():
    en, de = generate_pairs(600, seed=3)
    return SharedBPE.train(en + de, vocab_size=400)


def test_bpe_round_trip(bpe, tmp_path):
    lines = ["Der glückliche Vogel hat den Ball gesehen.", "Heute sieht die Katze einen grünen Baum."]
    ids = bpe.encode(lines)
    assert all(min(r) > 3 for r in ids) and bpe.decode(ids) == lines
    assert bpe.decode([ids[0] + [bpe.eos_id, 17, 18]]) == lines[:1]     # stops at </s>
    bpe.save(tmp_path / "tok.json")
    assert SharedBPE.load(tmp_path / "tok.json").encode(lines) == ids
    assert bpe.decode(bpe.encode(["Straße ☃ naïve"])) == ["Straße ☃ naïve"]   # byte level: no <unk>


def test_token_batcher():
    g = torch.Generator().manual_seed(0)
    src = [list(range(4, 4 + int(n))) for n in torch.randint(1, 30, (300,), generator=g)]
    tgt = [list(range(5, 5 + int(n))) for n in torch.randint(1, 30, (300,), generator=g)]
    tb = TokenBatcher(src, tgt, max_tokens=120, seed=1)
    seen = []
    for b in tb:
        assert b.src.numel() <= 120 and b.tgt_in.numel() <= 120
        assert (b.tgt_in[:, 0] == 1).all() and ((b.tgt_out == 2).sum(1) == 1).all()
        assert torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1].masked_fill(b.tgt_out[:, :-1] == 2, 0))
        seen += b.src.tolist()
    assert len(seen) == 300
    tb.set_epoch(0)
    e0 = [b.src.shape for b in tb]
    tb.set_epoch(1)
    e1 = [b.src.shape for b in tb]
    tb.set_epoch(0)
    assert e0 == [b.src.shape for b in tb] and e0 != e1 and sorted(e0) == sorted(e1)
    # two ranks: each global batch split in two, the union is the global batch
    r0, r1 = (TokenBatcher(src, tgt, 120, seed=1, rank=r, world=2) for r in (0, 1))
    for whole, a, b in zip(TokenBatcher(src, tgt, 120, seed=1, world=1), r0, r1):
        rows = sorted(map(tuple, whole.src.tolist()))
        got = sorted(tuple(r) for r in a.src.tolist() + b.src.tolist())
        trim = lambda rs: sorted(tuple(x for x in r if x) for r in rs)  # noqa: E731  (padding widths differ)
        assert trim(rows) == trim(got)
    with pytest.raises(ValueError, match="longest"):
        TokenBatcher(src, tgt, max_tokens=10)
    with pytest.raises(ValueError, match="aligned"):
        TokenBatcher(src, tgt[:-1], 100)
    with pytest.raises(ValueError, match="non-zero"):
        collate([], [])


# -- decoding -----------------------------------------------------------------------------------------
def tiny_model(vocab=12, seed=0, max_len=64):
    torch.manual_seed(seed)
    cfg = TransformerConfig(src_vocab_size=vocab, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
                            n_decoder_layers=2, dropout=0.0, context_length=max_len)
    m = Transformer(cfg).eval()
    with torch.no_grad():                       # sharper distributions so that ties are impossible
        m.head.weight.mul_(4.0)
    return m


def greedy_no_cache(model, src, max_extra):
    """Reference: recompute the whole prefix every step (no cache), one sentence at a time."""
    outs = []
    for row in src:
        row = row[row != 0][None]
        limit = row.shape[1] + max_extra
        ys = torch.tensor([[1]])
        for t in range(limit):
            logits = model(row, ys)[0, -1]
            logits[[0, 1]] = -math.inf
            nxt = 2 if t + 1 >= limit else int(logits.argmax())
            ys = torch.cat([ys, torch.tensor([[nxt]])], 1)
            if nxt == 2:
                break
        outs.append(ys[0, 1:].tolist())
    return outs


def strip(row):
    row = list(row)
    return row[:row.index(2) + 1] if 2 in row else row


@torch.no_grad()
def test_greedy_matches_uncached_reference():
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 4, 2, 0, 0], [10, 11, 5, 2, 0]])
    got = greedy_decode(model, src, max_extra=6)
    assert [strip(r) for r in got.tolist()] == greedy_no_cache(model, src, 6)
    # beam 1 without length penalty is greedy search
    assert torch.equal(beam_search(model, src, beam=1, alpha=0.0, max_extra=6), got)


@torch.no_grad()
def test_beam_search_is_exact_when_the_beam_holds_everything():
    """With V=2 real tokens and at most 3 output tokens there are few hypotheses: a beam this wide must
    return the best one by log P / lp, found here by brute-force enumeration with full forwards."""
    vocab = 6                                   # <pad> <s> </s> <unk> a b
    model = tiny_model(vocab=vocab, seed=3)
    src = torch.tensor([[4, 5, 2], [5, 5, 2]])
    max_extra, alpha = 0, 0.6                   # limit = 3 tokens (source length 3)
    out, score = beam_search(model, src, beam=32, alpha=alpha, max_extra=max_extra, return_scores=True)
    for b in range(2):
        best, best_seq = -math.inf, None
        for n in range(0, 3):                   # n content tokens, then </s>
            for body in itertools.product([3, 4, 5], repeat=n):
                seq = list(body) + [2]
                ys = torch.tensor([[1] + seq])
                full = torch.log_softmax(model(src[b:b + 1], ys[:, :-1])[0].double(), -1)
                total = float(full.gather(1, torch.tensor(seq)[:, None]).sum())
                s = total / length_penalty(len(seq), alpha)
                if s > best:
                    best, best_seq = s, seq
        assert strip(out[b].tolist()) == best_seq
        assert float(score[b]) == pytest.approx(best, abs=1e-4)


def test_beam_search_bad_input():
    model = tiny_model()
    with pytest.raises(ValueError, match="beam"):
        beam_search(model, torch.tensor([[4, 2]]), beam=0)
    with pytest.raises(TypeError, match="token ids"):
        greedy_decode(model, torch.randn(1, 3))


# -- BLEU ---------------------------------------------------------------------------------------------
def test_bleu_two_ways():
    hyps = ["The cat sat on the mat.", "A well-known man-made lake is near."]
    refs = ["The cat sat on the mat.", "A well-known man-made lake lies near."]
    res = sacrebleu_score(hyps, refs)
    assert res.score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert "tok:13a" in res.signature and "version" in res.signature
    assert sacrebleu_score(refs, refs).score == pytest.approx(100.0)
    tok = tokenized_bleu(hyps, refs)
    assert tok.score > res.score            # split compounds add matching n-grams
    assert split_compounds("man-made") == "man ##AT##-##AT## made"
    assert tokenized_bleu(hyps, refs, compound_split=False).score < tok.score
    with pytest.raises(ValueError, match="aligned"):
        sacrebleu_score(hyps, refs[:1])
    with pytest.raises(TypeError, match="lists"):
        sacrebleu_score("a b", "a b")


def test_the_papers_metric_tokenizes_as_moses_and_splits_as_get_ende_bleu():
    """Sentences where the Moses tokenizer (tokenizer.perl -l de, via sacremoses) and a regex stand-in
    differ, each tokenized form worked out by hand from tokenizer.perl's rules: punctuation is split off
    except . ' , - inside a word or number, quotes and apostrophes are escaped, German (any language but
    en, fr, it) splits an apostrophe from both sides, English keeps it on the suffix."""
    from tformer.training.metrics import moses_tokenize
    cases = [
        ('Er sagte: "Das ist\'s!"', "de", "Er sagte : &quot; Das ist &apos; s ! &quot;"),
        ("Don't stop.", "en", "Don &apos;t stop ."),
        ("Don't stop.", "de", "Don &apos; t stop ."),
        ("Er zahlte 1.000,50 Euro für 3,5 %.", "de", "Er zahlte 1.000,50 Euro für 3,5 % ."),
        ("It costs $5,000, or 4.50 each.", "en", "It costs $ 5,000 , or 4.50 each ."),
        ("„Gut“, sagte sie (wirklich).", "de", "„ Gut “ , sagte sie ( wirklich ) ."),
        ("Tom & Jerry", "en", "Tom &amp; Jerry"),
    ]
    for line, lang, want in cases:
        assert moses_tokenize(line, lang) == want, (line, lang)
    # get_ende_bleu.sh's perl substitution: matches do not overlap, so a one-letter middle piece stays joined
    assert split_compounds("E-Mail-Adresse") == "E ##AT##-##AT## Mail ##AT##-##AT## Adresse"
    assert split_compounds("Vitamin-B-Mangel") == "Vitamin ##AT##-##AT## B-Mangel"
    assert split_compounds("Euro - ein") == "Euro - ein"                     # a free-standing dash is no compound
    # the tokens are what gets counted: 8 tokens, 7/8 unigrams, 5/7 bigrams, 3/6 trigrams, 2/5 4-grams match
    # ("1.000,50" and "3,5" one token each), equal lengths: BLEU = (1/8)^(1/4)
    hyp, ref = ["Er zahlte 1.000,50 Euro für 3,5 %."], ["Er zahlte 1.000,50 Euro für 4,5 %."]
    assert tokenized_bleu(hyp, ref).score == pytest.approx(100 * 2 ** -0.75)
    # multi-bleu.perl does not smooth: no trigram in common is 0, where sacreBLEU's exp smoothing is not
    hyp, ref = ["Der Hund läuft."], ["Die Katze läuft."]
    assert tokenized_bleu(hyp, ref).score == 0.0 and sacrebleu_score(hyp, ref).score > 0.0
    assert "-l en" in tokenized_bleu(hyp, ref, lang="en").signature


# -- end to end ---------------------------------------------------------------------------------------
E2E = dict(offline_pairs=500, max_tokens=400, max_steps=24, snapshot_every=8, save_every=8, eval_every=0,
           vocab_size=320, warmup=8)


def test_end_to_end_interrupt_resume_decode_score(tmp_path, capsys):
    from tformer.cli import main
    from tformer.translate import load_run, score_files, train_run
    full = tmp_path / "full"
    train_run(full, "tiny", progress=False, **E2E)
    part = tmp_path / "part"
    train_run(part, "tiny", progress=False, stop_after=11, **E2E)            # "interrupted" after 11 steps
    assert torch.load(part / "last.pt", weights_only=False)["train"]["step"] == 11
    assert not (part / "averaged.pt").exists()
    train_run(part, "tiny", progress=False, **E2E)                            # same RUN: resumes
    a = torch.load(full / "last.pt", weights_only=False)["model"]
    b = torch.load(part / "last.pt", weights_only=False)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (part / "averaged.pt").exists() and len(list(part.glob("snapshot_*.pt"))) == 3
    choice = json.loads((part / "choice.json").read_text())   # averaged or last, by validation loss
    better = "averaged" if choice["val_loss_averaged"] <= choice["val_loss_last"] else "last"
    assert choice["weights"] == better and choice["snapshots"][-1] == "snapshot_0000024.pt"
    # decode greedy and beam, score with sacreBLEU
    src, ref = part / "data" / "test.en", part / "data" / "test.de"
    greedy = score_files(part, src, ref, beam=1)
    beam = score_files(part, src, ref, beam=4)
    assert greedy["weights"] == choice["weights"]
    for res in (greedy, beam):
        assert 0.0 <= res["bleu"] <= 100.0 and "tok:13a" in res["signature"] and res["sentences"] == 300
        assert all(isinstance(h, str) for h in res["hypotheses"])
    model, bpe, info = load_run(part, "last")
    assert info["weights"] == "last" and info["src"] == "en" and info["tgt"] == "de"
    capsys.readouterr()
    assert main(["translate", "score", "--run", str(part), "--src", str(src), "--ref", str(ref), "--beam", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bleu"] == pytest.approx(greedy["bleu"]) and "signature" in out


def test_the_base_recipe_end_to_end_as_typed(tmp_path, capsys):
    """`tformer translate train --preset base` at tiny sizes on generated lines (the built-in corpus: a learner's
    clone has no ../shared): the paper's recipe as the preset holds it (the noam schedule, label smoothing 0.1,
    dropout on sub-layer outputs only, no clipping), the last 5 snapshots averaged; then `score` with beam 4
    and the length penalty 0.6, and both metrics."""
    from tformer.cli import main
    from tformer.inference.decode import translate
    from tformer.training.checkpoint import load_checkpoint
    from tformer.translate import load_run
    run = tmp_path / "base"
    sizes = dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, vocab_size=320, max_tokens=500, max_len=48,
                 max_steps=30, warmup=10, snapshot_minutes=0, snapshot_every=6, save_every=10, eval_every=0,
                 offline_pairs=500)
    sets = [x for k, v in sizes.items() for x in ("--set", f"{k}={v}")]
    assert main(["translate", "train", "--preset", "base", "--out", str(run), "--no-progress", *sets]) == 0
    capsys.readouterr()
    info = json.loads((run / "config.json").read_text())
    p = info["preset"]
    assert info["preset_name"] == "base" and {k: p[k] for k in sizes} == sizes
    assert (p["schedule"], p["label_smoothing"], p["dropout"], p["attn_dropout"], p["ffn_dropout"], p["grad_clip"],
            p["average_last"], p["lr"]) == ("noam", 0.1, 0.1, 0.0, 0.0, None, 5, 7.0e-4)     # base's, not overridden
    # the average of the last 5 snapshots (steps 6 ... 30), tensor by tensor
    snaps = sorted(run.glob("snapshot_*.pt"))
    assert [q.name for q in snaps] == [f"snapshot_{s:07d}.pt" for s in (6, 12, 18, 24, 30)]
    averaged = load_checkpoint(run / "averaged.pt")
    states = [load_checkpoint(q) for q in snaps]
    for k in ("src_embed.weight", "decoder.layers.1.ffn.fc2.weight"):
        torch.testing.assert_close(averaged[k], torch.stack([sd[k] for sd in states]).mean(0))
    assert not torch.equal(states[0]["src_embed.weight"], states[-1]["src_embed.weight"])   # it trained
    assert json.loads((run / "choice.json").read_text())["snapshots"] == [q.name for q in snaps]
    # beam 4 with the paper's length penalty, both metrics, on 20 test sentences (the corpus's, not trained on)
    src = (run / "data" / "test.en").read_text().splitlines()[:20]
    ref = (run / "data" / "test.de").read_text().splitlines()[:20]
    (tmp_path / "src.en").write_text("\n".join(src) + "\n")
    (tmp_path / "ref.de").write_text("\n".join(ref) + "\n")
    assert main(["translate", "score", "--run", str(run), "--src", str(tmp_path / "src.en"), "--ref",
                 str(tmp_path / "ref.de"), "--beam", "4", "--alpha", "0.6", "--json", "--no-progress", "--out",
                 str(tmp_path / "hyp.de")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["beam"], res["alpha"], res["sentences"]) == (4, 0.6, 20)
    hyps = (tmp_path / "hyp.de").read_text().splitlines()
    model, bpe, run_info = load_run(run)
    assert res["weights"] == run_info["weights"] and hyps == translate(model, bpe, src, beam=4, alpha=0.6)
    assert res["bleu"] == pytest.approx(sacrebleu_score(hyps, ref).score)
    assert res["tokenized_bleu"] == pytest.approx(tokenized_bleu(hyps, ref, lang="de").score)
    assert "tok:13a" in res["signature"] and 0 <= res["tokenized_bleu"] <= 100


# -- the nn.Transformer peer -----------------------------------------------------------------------------
@torch.no_grad()
def test_peer_decodes_like_its_full_forward():
    """The peer's prefix "cache" gives the logits of a full forward, so greedy and beam search decode it."""
    from tformer.translate.peer import TorchTransformer
    torch.manual_seed(0)
    peer = TorchTransformer(20, 16, 2, 2, 32, 0.0, context_length=40).eval()
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 4, 2, 0, 0]])
    tgt = torch.tensor([[1, 5, 9, 3], [1, 4, 4, 7]])
    full = peer(src, tgt)
    memory, pad = peer.encode(src)
    cache = peer.new_cache()
    steps = torch.cat([peer.decode(tgt[:, t:t + 1], memory, pad, cache) for t in range(4)], 1)
    torch.testing.assert_close(steps, full)
    got = greedy_decode(peer, src, max_extra=6)
    assert [strip(r) for r in got.tolist()] == greedy_no_cache(peer, src, 6)
    # beam search reorders the prefix "cache": each returned hypothesis's score is its full forward's
    out, score = beam_search(peer, src, beam=3, alpha=0.6, max_extra=6, return_scores=True)
    for b in range(2):
        seq = strip(out[b].tolist())
        ys = torch.tensor([[1] + seq])
        lp = torch.log_softmax(peer(src[b:b + 1][:, src[b] != 0], ys[:, :-1])[0].double(), -1)
        total = float(lp.gather(1, torch.tensor(seq)[:, None]).sum())
        assert float(score[b]) == pytest.approx(total / length_penalty(len(seq), 0.6), abs=1e-4)


def test_peer_starts_like_the_course_model():
    """Same size, same scale at the start: the tied table's scaled rows have std 1 in both models, the
    positions' scale (a peer whose table is 4x smaller learns far more slowly), and the layers are Xavier."""
    from tformer.translate.peer import TorchTransformer
    from tformer.translate.pipeline import RunInputError, build_model
    from tformer.translate.presets import get_preset
    torch.manual_seed(0)
    p = get_preset("small")
    ours = build_model(p, 8000)
    peer = build_model(get_preset("small", arch="torch"), 8000)
    with pytest.raises(RunInputError, match="one dropout for everything"):
        build_model(get_preset("gpu", arch="torch"), 8000)            # attn_dropout=0 is the course model's alone
    assert get_preset("gpu", attn_dropout=None).attn_dropout is None  # an explicit None is applied, not skipped
    assert isinstance(peer, TorchTransformer)
    assert abs(ours.num_params() - peer.num_params()) / ours.num_params() < 0.01
    for table in (ours.src_embed.weight, peer.embed.weight):
        assert float(table.detach().std()) * p.d_model ** 0.5 == pytest.approx(1.0, rel=0.05)
    w = peer.core.encoder.layers[0].linear1.weight                # Xavier uniform: bound sqrt(6 / (fan_in + fan_out))
    assert float(w.detach().abs().max()) == pytest.approx((6 / sum(w.shape)) ** 0.5, rel=0.02)


def test_peer_evaluates_under_cpu_bf16_autocast():
    """nn.Transformer's inference fast path does not see CPU autocast (it checks CUDA's); the peer takes
    the regular path there, so validation and decoding under --peer-bf16 work and agree with float32."""
    from tformer.translate.peer import TorchTransformer
    torch.manual_seed(0)
    peer = TorchTransformer(50, 32, 4, 2, 64, 0.1, context_length=16).eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    tgt = torch.tensor([[1, 10, 11], [1, 12, 0]])
    with torch.no_grad():
        full = peer(src, tgt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = peer(src, tgt)
    assert low.dtype == torch.bfloat16 and torch.backends.mha.get_fastpath_enabled()   # the flag is restored
    torch.testing.assert_close(low.float(), full, atol=0.1, rtol=0.05)


def test_peer_trains_and_scores_through_the_pipeline(tmp_path):
    from tformer.translate import load_run, score_files, train_run
    from tformer.translate.peer import TorchTransformer
    run = tmp_path / "peer"
    train_run(run, "tiny", progress=False, arch="torch", **{**E2E, "max_steps": 8})
    model, _, info = load_run(run, "last")
    assert isinstance(model, TorchTransformer) and info["preset"]["arch"] == "torch"
    res = score_files(run, run / "data" / "test.en", run / "data" / "test.de", beam=2)
    assert res["sentences"] == 300 and 0.0 <= res["bleu"] <= 100.0
    with pytest.raises(ValueError, match="arch must be one of"):
        train_run(tmp_path / "bad", "tiny", progress=False, arch="keras", **E2E)


# -- a published model: tformer translate score --hf --------------------------------------------------
CHECKOUT = Path(__file__).resolve().parents[1]


def tformer_command(*args, cwd: Path, **env) -> subprocess.CompletedProcess:
    """`python -m tformer ...` as typed, from a folder outside the checkout (the checkout's package first on
    the path), with Hugging Face's cache in `cwd` and offline: nothing is downloaded."""
    assert not cwd.resolve().is_relative_to(CHECKOUT)
    environ = {**os.environ, "PYTHONPATH": str(CHECKOUT), "HF_HOME": str(cwd / "hf-home"), "HF_HUB_OFFLINE": "1",
               **env}
    return subprocess.run([sys.executable, "-m", "tformer", *map(str, args)], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory):
    """A random-init MarianMTModel and its MarianTokenizer saved with save_pretrained, as the hub's
    opus-mt-de-en folders are: source.spm and target.spm (SentencePiece models trained here on generated
    German and English lines) over one vocab.json (</s> 0, <unk> 1, the pieces, <pad> last)."""
    transformers = pytest.importorskip("transformers")
    spm = pytest.importorskip("sentencepiece")
    import io
    out = tmp_path_factory.mktemp("published") / "opus-mt-de-en"          # named as the model: --testset finds it
    out.mkdir()
    en, de = generate_pairs(300, seed=7)
    vocab = {"</s>": 0, "<unk>": 1}
    for side, lines in (("source", de), ("target", en)):
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=120,
                                       character_coverage=1.0, minloglevel=2)
        (out / f"{side}.spm").write_bytes(buf.getvalue())
        sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
        for piece in map(sp.id_to_piece, range(sp.get_piece_size())):
            if piece not in vocab and not (piece.startswith("<") and piece.endswith(">")):
                vocab[piece] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab))
    tok = transformers.MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                                       source_lang="de", target_lang="en")
    tok.save_pretrained(out)
    cfg = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=16, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, encoder_layers=1, decoder_layers=1, max_position_embeddings=128,
        pad_token_id=len(vocab) - 1, decoder_start_token_id=len(vocab) - 1, eos_token_id=0, forced_eos_token_id=0,
        activation_function="swish", scale_embedding=True)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(cfg)
    with torch.no_grad():                         # wider than HF's init, so that no two logits nearly tie
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "layer_norm" in name and name.endswith("weight")
                        else 0.3 * torch.randn_like(p))
        model.final_logits_bias.normal_()
    model.save_pretrained(out)
    return out


@torch.no_grad()
def hf_greedy_text(folder: Path, lines: list[str]) -> list[str]:
    """The reference: Hugging Face's own model and tokenizer, argmax step by step (the start token is pad, pad
    never chosen), up to tformer's length limit (source tokens + 50), decoded by the tokenizer."""
    import transformers
    tok = transformers.MarianTokenizer.from_pretrained(folder)
    hf = transformers.MarianMTModel.from_pretrained(folder).eval()
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id
    out = []
    for line in lines:
        src = torch.tensor([tok(line)["input_ids"]])                         # ends in </s>
        ys, limit = [pad], src.shape[1] + 50
        for t in range(limit):
            logits = hf(input_ids=src, decoder_input_ids=torch.tensor([ys])).logits[0, -1]
            logits[pad] = -math.inf
            ys.append(eos if t + 1 >= limit else int(logits.argmax()))
            if ys[-1] == eos:
                break
        out.append(tok.decode(ys[1:-1], skip_special_tokens=True))
    return out


def test_score_a_published_model_as_typed(marian_folder, tmp_path):
    """`tformer translate score --hf DIR`: the model converted into tformer's Transformer and the real
    MarianTokenizer wrapped for the pipeline translate as Hugging Face's own model does (greedy, so its
    argmax is the reference), the JSON has today's keys and the card's figure; an offline name is one line."""
    en, de = generate_pairs(6, seed=11)
    (tmp_path / "src.de").write_text("\n".join(de) + "\n")
    (tmp_path / "ref.en").write_text("\n".join(en) + "\n")
    proc = tformer_command("translate", "score", "--hf", marian_folder, "--src", "src.de", "--ref", "ref.en",
                           "--beam", 1, "--testset", "newstest2014", "--json", "--out", "hyp.en", "--no-progress",
                           cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)
    assert set(res) == {"bleu", "signature", "detail", "tokenized_bleu", "beam", "alpha", "sentences", "seconds",
                        "weights", "card_bleu", "card_source"}
    assert (res["sentences"], res["beam"], res["weights"], res["card_bleu"]) == (6, 1, str(marian_folder), 34.0)
    assert "opus-mt-de-en" in res["card_source"] and "tok:13a" in res["signature"]
    hyps = (tmp_path / "hyp.en").read_text().splitlines()
    assert hyps == hf_greedy_text(marian_folder, de) and all(hyps)
    # a name that is neither a folder nor in Hugging Face's cache, offline: one line, exit 2, no download
    proc = tformer_command("translate", "score", "--hf", "Helsinki-NLP/opus-mt-de-en", "--src", "src.de", "--ref",
                           "ref.en", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Helsinki-NLP/opus-mt-de-en" in proc.stderr and "HF_HUB_OFFLINE" in proc.stderr
    assert not any((tmp_path / "hf-home").rglob("*.safetensors"))


def test_score_takes_a_run_or_a_published_model(marian_folder, tmp_path, capsys, monkeypatch):
    from tformer.cli import main
    from tformer.translate.cli import TESTSETS_WITH_CARDS
    from tformer.translate.pipeline import TESTSETS, card_bleu
    assert TESTSETS_WITH_CARDS == TESTSETS and card_bleu("Helsinki-NLP/opus-mt-en-de", "newstest2018")[0] == 45.2
    (tmp_path / "a.de").write_text("Hallo.\n")
    files = ["--src", tmp_path / "a.de", "--ref", tmp_path / "a.de"]

    def one_line_error(argv, *words):
        try:
            code = main(["translate", "score", *map(str, argv)])
        except SystemExit as e:                                           # argparse's usage errors
            code = e.code
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and all(w in err for w in words), (code, err)
    one_line_error(files, "--run", "--hf")                                # one of the two is required
    one_line_error(["--run", tmp_path, "--hf", marian_folder, *files], "not allowed with")
    one_line_error(["--hf", marian_folder, "--weights", "last", *files], "--weights")
    one_line_error(["--run", tmp_path, "--testset", "newstest2014", *files], "--testset", "--hf")
    from tformer.utils.errors import UserError
    with pytest.raises(UserError, match="no model card figure for 'opus-mt-en-de'.*opus-mt-de-en on newstest2014"):
        card_bleu("Helsinki-NLP/opus-mt-en-de", "newstest2014")            # the card gives 2016 and 2018 only
    monkeypatch.setitem(sys.modules, "sentencepiece", None)               # not installed: the extra is named
    one_line_error(["--hf", marian_folder, *files], "sentencepiece", ".[translate]")

