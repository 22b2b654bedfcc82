"""`tformer translate` under the inputs people really pass, faults and concurrency.

Every case goes through the real entry point (`tformer.cli.main`, and `python -m tformer` where the
exit status and the absence of a traceback matter) and checks: one line on stderr saying what was
wrong, exit 2 for bad input / 1 for a failed job, and a run folder left as it was.
"""
import errno
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tformer.cli import main

ROOT = Path(__file__).resolve().parent.parent
# a very small run: 4 steps, a full checkpoint every 2 (so last.pt and last.prev.pt both exist)
TINY_SETS = ["offline_pairs=200", "max_tokens=300", "vocab_size=300", "d_model=32", "n_heads=2", "d_ff=64",
             "n_layers=1", "warmup=2", "save_every=2", "snapshot_every=2", "eval_every=0", "average_last=2"]


def sets(*items):
    return [x for item in items for x in ("--set", item)]


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of `tformer ARGV` in this process."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, *fragments: str) -> str:
    """stderr is one error line (warnings aside) mentioning every fragment, and no traceback."""
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("warning:", "resuming "))]
    assert "Traceback" not in err and len(lines) == 1, err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def digest(folder: Path) -> dict:
    """File name -> sha1 of every file in a run folder (to show a bad call changed nothing)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """One tiny finished run (4 steps), trained through the CLI, and 3 sentences to score with it."""
    root = tmp_path_factory.mktemp("cli")
    run = root / "run"
    assert main(["translate", "train", "--out", str(run), "--preset", "tiny", "--max-steps", "4", "--no-progress",
                 *sets(*TINY_SETS)]) == 0
    assert {"last.pt", "last.prev.pt", "averaged.pt", "choice.json", "tokenizer.json"} <= {p.name for p in run.iterdir()}
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    ref = (run / "data" / "test.de").read_text(encoding="utf-8").splitlines()[:3]
    (root / "src.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (root / "ref.txt").write_text("\n".join(ref) + "\n", encoding="utf-8")
    return run, root / "src.txt", root / "ref.txt"


@pytest.fixture
def run_copy(base_run, tmp_path):
    run, src, ref = base_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    cfg = json.loads((copy / "config.json").read_text())        # the copy's data lives in the copy
    cfg["data"] = str(copy / "data")
    (copy / "config.json").write_text(json.dumps(cfg, indent=2))
    return copy, src, ref


# -- the table, row by row ---------------------------------------------------------------------
def test_train_data_missing(capsys, tmp_path):
    code, _, err = run_cli(capsys, "translate", "train", "--data", "/nonexistent", "--out", tmp_path / "r")
    assert code == 2
    one_line_error(err, "/nonexistent", "does not exist", "train.de")
    assert not (tmp_path / "r").exists()                        # nothing written for a bad call


def test_train_offline_dataset_leaves_no_run_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    code, _, err = run_cli(capsys, "translate", "train", "--dataset", "wmt14", "--out", tmp_path / "r")
    assert code != 0 and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "r").exists()                        # not a folder holding only .lock
    (tmp_path / "mine").mkdir()                                 # a folder the user made is left alone
    code, _, _ = run_cli(capsys, "translate", "train", "--dataset", "wmt14", "--out", tmp_path / "mine")
    assert code != 0 and (tmp_path / "mine").is_dir()


def test_score_run_that_is_not_a_run(capsys, base_run, tmp_path):
    _, src, ref = base_run
    (tmp_path / "notarun").mkdir()
    code, _, err = run_cli(capsys, "translate", "score", "--run", tmp_path / "notarun", "--src", src, "--ref", ref)
    assert code == 2
    one_line_error(err, "is not a translation run", "tformer translate train --out")


def test_score_misaligned_files_refused_before_translating(capsys, base_run, tmp_path, monkeypatch):
    run, _, _ = base_run
    (tmp_path / "s").write_text("".join(f"Sentence {i}.\n" for i in range(50)))
    (tmp_path / "r").write_text("".join(f"Satz {i}.\n" for i in range(10)))
    import tformer.translate.pipeline as pipeline

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")
    monkeypatch.setattr(pipeline, "load_run", no_model)
    code, _, err = run_cli(capsys, "translate", "score", "--run", run, "--src", tmp_path / "s", "--ref", tmp_path / "r")
    assert code == 2
    one_line_error(err, "has 50 lines", "has 10", "line-aligned")


def test_score_truncated_checkpoints(capsys, run_copy):
    run, src, ref = run_copy
    # only averaged.pt torn: named in a warning, the next good weights are used
    data = (run / "averaged.pt").read_bytes()
    (run / "averaged.pt").write_bytes(data[: len(data) // 2])
    code, out, err = run_cli(capsys, "translate", "score", "--run", run, "--src", src, "--ref", ref,
                             "--weights", "averaged", "--beam", "1", "--json")
    assert code == 0 and "Traceback" not in err
    assert "warning:" in err and "averaged.pt is unreadable" in err and "using last.pt instead" in err
    assert json.loads(out)["weights"] == "last.pt"
    # every .pt file torn: refused, each file named
    for p in run.glob("*.pt"):
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 3])
    code, _, err = run_cli(capsys, "translate", "score", "--run", run, "--src", src, "--ref", ref, "--beam", "1")
    assert code == 2
    one_line_error(err, "no readable weights", "are unreadable", "truncated or corrupt",
                   *[f"{p.name}" for p in run.glob("*.pt")])


@pytest.mark.parametrize("content, fragment", [(b"", "is empty"), (b"\n", "is empty"),
                                               (b"Gr\xfc\xdfe aus K\xf6ln\n", "is not UTF-8")])
def test_score_src_empty_or_not_utf8(capsys, base_run, tmp_path, content, fragment):
    run, _, ref = base_run
    (tmp_path / "src").write_bytes(content)
    code, _, err = run_cli(capsys, "translate", "score", "--run", run, "--src", tmp_path / "src", "--ref", ref)
    assert code == 2
    one_line_error(err, "--src", fragment)


def test_score_src_missing(capsys, base_run, tmp_path):
    run, _, ref = base_run
    code, _, err = run_cli(capsys, "translate", "score", "--run", run, "--src", tmp_path / "nope.txt", "--ref", ref)
    assert code == 2
    one_line_error(err, "nope.txt", "does not exist")


@pytest.mark.parametrize("item, fragments", [
    ("lr=abc", ["lr=abc", "lr must be a number"]),
    ("lr=0", ["lr must be > 0"]),
    ("max_steps=1.5", ["max_steps must be an integer"]),
    ("dropout=1.2", ["dropout must be in [0, 1)"]),
    ("schedule=triangle", ["schedule must be one of"]),
    ("vocab_size=50", ["vocab_size must be >= 300"]),
    ("d_model=66", ["d_model (66) must be divisible by n_heads (4)"]),
    ("colour=blue", ["unknown preset field 'colour'"]),
    ("lr", ["expected FIELD=VALUE"]),
])
def test_train_set_parsed_and_range_checked(capsys, tmp_path, item, fragments):
    code, _, err = run_cli(capsys, "translate", "train", "--out", tmp_path / "r", "--set", item)
    assert code == 2
    one_line_error(err, *fragments)
    assert not (tmp_path / "r" / "config.json").exists()


@pytest.mark.parametrize("argv, fragments", [
    (["translate", "train", "--out", "R", "--time-budget", "-5"], ["--time-budget", "expected > 0"]),
    (["translate", "train", "--out", "R", "--time-budget", "nan"], ["--time-budget", "finite"]),
    (["translate", "train", "--out", "R", "--max-steps", "0"], ["--max-steps", "expected >= 1"]),
    (["translate", "score", "--run", "R", "--src", "S", "--ref", "F", "--beam", "0"], ["--beam", "expected >= 1"]),
    (["translate", "--run", "R", "--beam", "0"], ["--beam", "expected >= 1"]),
    (["translate", "train"], ["--out"]),
])
def test_usage_errors_are_one_line_exit_2(capsys, tmp_path, argv, fragments):
    argv = [str(tmp_path / a) if a in ("R", "S", "F") else a for a in argv]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    one_line_error(capsys.readouterr().err, *fragments)
    assert not (tmp_path / "R").exists()


def test_resume_refuses_another_preset_and_model_settings(capsys, run_copy):
    run, _, _ = run_copy
    before = digest(run)
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--preset", "small")
    assert code == 2
    one_line_error(err, "--preset=tiny", "--preset=small", "another --out")
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--set", "d_model=64")
    assert code == 2
    one_line_error(err, "d_model=32", "d_model=64")
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--set", "grad_clip=none")
    assert code == 2                                             # an explicit None is a change, not "not given"
    one_line_error(err, "grad_clip=1.0", "grad_clip=None")
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--src", "de", "--tgt", "en")
    assert code == 2
    one_line_error(err, "--src=en", "--src=de")
    assert digest(run) == before                                 # the run folder was not touched


def test_resume_accepts_and_logs_steps_and_cadence(capsys, run_copy):
    run, _, _ = run_copy
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--max-steps", "5", "--time-budget", "30",
                           "--set", "eval_every=100", "--no-progress")
    assert code == 0, err
    assert "resuming" in err and "max_steps 4 -> 5" in err and "eval_every 0 -> 100" in err
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    note = next(r for r in log if "resume" in r)
    assert note["resume"] == 4 and note["changed"]["max_steps"] == [4, 5] and note["time_budget"] == 30
    assert json.loads((run / "config.json").read_text())["preset"]["max_steps"] == 5
    assert torch.load(run / "last.pt", weights_only=False)["train"]["step"] == 5


# -- checkpoints: torn files, interrupted saves, a full disk -------------------------------------------
def test_train_resumes_from_the_previous_checkpoint_when_last_is_torn(capsys, run_copy):
    run, _, _ = run_copy
    assert torch.load(run / "last.prev.pt", weights_only=False)["train"]["step"] == 2
    data = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(data[:1000])
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--no-progress")
    assert code == 0, err
    assert "last.pt is unreadable" in err and "resuming from last.prev.pt (step 2)" in err
    assert torch.load(run / "last.pt", weights_only=False)["train"]["step"] == 4     # trained steps 3-4 again


def half_writer(exc):
    """A checkpoint writer that writes half of the real bytes, then fails with `exc` (fault injection)."""
    def write(obj, f):
        buf = io.BytesIO()
        torch.save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        raise exc
    return write


def test_an_interrupted_save_leaves_the_previous_checkpoint(capsys, run_copy, monkeypatch):
    import tformer.training.checkpoint
    run, _, _ = run_copy
    before = (run / "last.pt").read_bytes()
    monkeypatch.setattr(tformer.training.checkpoint, "checkpoint_writer", half_writer(KeyboardInterrupt()))
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--max-steps", "6", "--no-progress")
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    assert (run / "last.pt").read_bytes() == before              # untouched, and no half-written files left
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]
    monkeypatch.undo()
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--no-progress")
    assert code == 0, err
    assert torch.load(run / "last.pt", weights_only=False)["train"]["step"] == 6


def test_disk_full_while_saving(capsys, run_copy, monkeypatch):
    import tformer.training.checkpoint
    run, _, _ = run_copy
    before = (run / "last.pt").read_bytes()
    monkeypatch.setattr(tformer.training.checkpoint, "checkpoint_writer",
                        half_writer(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--max-steps", "6", "--set", "snapshot_every=0",
                           "--no-progress")
    assert code == 1
    one_line_error(err, "could not save", "last.pt: No space left on device", "the previous last.pt", "is intact")
    assert (run / "last.pt").read_bytes() == before
    assert torch.load(run / "last.pt", weights_only=False)["train"]["step"] == 4


# -- one job per run folder -------------------------------------------------------------------------------
def test_a_second_job_on_the_same_run_is_refused(capsys, run_copy):
    run, _, _ = run_copy
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from tformer.training import RunLock; "
                               "lock = RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(600)", str(run)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = digest(run)
        code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--max-steps", "5", "--no-progress")
        assert code == 2
        one_line_error(err, "is in use by another training job", f"pid {holder.pid}")
        assert digest(run) == before
    finally:
        holder.send_signal(signal.SIGKILL)                       # dies holding the lock: the kernel frees it
        holder.wait()
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--no-progress")
    assert code == 0, err


def test_a_save_killed_outright_leaves_no_temporary_behind_after_the_next_start(capsys, run_copy):
    run, _, _ = run_copy
    before = (run / "last.pt").read_bytes()
    saver = subprocess.Popen([sys.executable, "-c",
                              "import sys, time, tformer.training.checkpoint as tr\n"
                              "def stuck(obj, f):\n    f.write(b'half a checkpoint'); f.flush(); print('writing', flush=True); time.sleep(600)\n"
                              "tr.checkpoint_writer = stuck\ntr.atomic_save({}, sys.argv[1] + '/last.pt')", str(run)],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert saver.stdout.readline().strip() == "writing"
    saver.send_signal(signal.SIGKILL)                            # no Python cleanup runs
    saver.wait()
    stale = run / f".last.pt.tmp{saver.pid}"
    assert stale.exists() and (run / "last.pt").read_bytes() == before
    code, _, err = run_cli(capsys, "translate", "train", "--out", run, "--no-progress")
    assert code == 0, err
    assert not stale.exists() and not list(run.glob(".*.tmp*"))


# -- the rules for every subcommand ---------------------------------------------------------------------
def test_no_traceback_from_the_real_command_and_debug_shows_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TFORMER_DEBUG", None)
    cmd = [sys.executable, "-m", "tformer", "translate", "train", "--data", str(tmp_path / "nope"), "--out",
           str(tmp_path / "r")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("tformer translate train: error:")
    r = subprocess.run(cmd + ["--debug"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "Traceback" in r.stderr and "FileNotFoundError" in r.stderr
    r = subprocess.run(cmd, capture_output=True, text=True, env={**env, "TFORMER_DEBUG": "1"})
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_an_unexpected_error_is_one_line_exit_1(capsys, base_run, monkeypatch):
    import tformer.translate.pipeline as pipeline
    run, src, ref = base_run
    monkeypatch.setattr(pipeline, "score_lines", lambda *a, **k: {}["bleu"])
    code, _, err = run_cli(capsys, "translate", "score", "--run", run, "--src", src, "--ref", ref)
    assert code == 1
    one_line_error(err, "failed: KeyError", "--debug")


def test_stdin_translation_and_bad_stdin(capsys, base_run, monkeypatch):
    run, src, _ = base_run
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(src.read_bytes()), encoding="utf-8"))
    code, out, err = run_cli(capsys, "translate", "--run", run, "--beam", "1")
    assert code == 0 and len(out.splitlines()) == 3, err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"K\xf6ln\n"), encoding="utf-8"))
    code, _, err = run_cli(capsys, "translate", "--run", run)
    assert code == 2
    one_line_error(err, "standard input is not UTF-8")
    code, _, err = run_cli(capsys, "translate")
    assert code == 2
    one_line_error(err, "give a run")


def typed(*argv, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`tformer ARGV` as typed: the entry point in its own process, from `cwd` outside the checkout."""
    assert not cwd.resolve().is_relative_to(ROOT)
    env = {**{k: v for k, v in os.environ.items() if k != "TFORMER_DEBUG"}, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tformer", *map(str, argv)], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_translate_options_as_typed(base_run, tmp_path):
    """--alpha of stdin translation and --json of score reach what they set; --device and --pair: a run on the
    device asked for, and one line (exit 2, no run folder) for a device or a pair that cannot apply."""
    from tformer.inference.decode import translate
    from tformer.translate import load_run
    run, src, ref = base_run
    lines = src.read_text(encoding="utf-8").splitlines()
    r = typed("translate", "--run", run, "--beam", 2, "--alpha", 1.5, cwd=tmp_path, stdin="\n".join(lines) + "\n")
    model, bpe, _ = load_run(run)
    assert r.returncode == 0 and r.stdout.splitlines() == translate(model, bpe, lines, beam=2, alpha=1.5), r.stderr
    r = typed("translate", "score", "--run", run, "--src", src, "--ref", ref, "--beam", 2, "--alpha", 1.5, "--json",
              "--weights", "last", "--no-progress", cwd=tmp_path)
    res = json.loads(r.stdout)
    assert r.returncode == 0 and (res["beam"], res["alpha"], res["sentences"]) == (2, 1.5, 3) and 0 <= res["bleu"] <= 100
    assert res["weights"] == "last"                                  # --weights: not the averaged ones auto picks
    new = tmp_path / "new"
    r = typed("translate", "train", "--out", new, "--preset", "tiny", "--max-steps", 2, "--device", "cpu",
              "--threads", 1, *sets(*TINY_SETS), cwd=tmp_path)
    assert r.returncode == 0 and "training in float32 on cpu" in r.stdout + r.stderr, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 2
    bad = [(["--device", "banana"], ["device must be one of cpu, cuda, mps", "banana"]),
           (["--data", tmp_path, "--pair", "de-en"], ["--pair de-en", "--dataset wmt14", "--src and --tgt"]),
           (["--pair", "fr-en"], ["--pair fr-en", "the built-in corpus"]),
           (["--pair", "xx-yy"], ["--pair", "xx-yy"])]
    if not torch.cuda.is_available():
        bad.append((["--device", "cuda"], ["'cuda'", "no CUDA GPU"]))
    for argv, words in bad:
        r = typed("translate", "train", "--out", tmp_path / "refused", *argv, cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr[-2000:])
        assert all(w in r.stderr for w in words), (argv, r.stderr)
        assert not (tmp_path / "refused").exists(), argv
    r = typed("translate", "--run", run, "--alpha", -1, cwd=tmp_path, stdin="")
    assert r.returncode == 2 and "--alpha" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


LOCK_WORKER = """
import sys
import torch.distributed as dist
from tformer.training import RunInUseError, acquire_run_lock, setup_distributed
rank, world, _ = setup_distributed()
try:
    lock = acquire_run_lock(sys.argv[1])
    result = "ok"
except RunInUseError:
    result = "refused"
open(f"{sys.argv[2]}.rank{rank}", "w").write(result)
dist.barrier()
dist.destroy_process_group()
"""


def test_the_ranks_of_one_torchrun_job_share_the_lock(tmp_path):
    """Two gloo ranks: both go ahead on a free run folder (rank 0 holds the lock for the job); both are
    refused when another job holds it, so no rank is left waiting at a barrier."""
    script = tmp_path / "worker.py"
    script.write_text(LOCK_WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    run = tmp_path / "run"

    def torchrun(tag):
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            str(script), str(run), str(tmp_path / tag)], env=env, capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0 and "gloo" in r.stderr.lower() and "not available" in r.stderr.lower():
            pytest.skip("this torch build has no gloo backend")
        assert r.returncode == 0, r.stderr[-3000:]
        return [(tmp_path / f"{tag}.rank{i}").read_text() for i in (0, 1)]

    assert torchrun("free") == ["ok", "ok"]
    from tformer.training import RunLock
    with RunLock(run):
        assert torchrun("held") == ["refused", "refused"]


# -- tformer grade: the same conventions ------------------------------------------------------------------
@pytest.mark.parametrize("make, fragments", [
    (lambda d: d / "missing", ["missing", "does not exist"]),
    (lambda d: d, ["no chapter notebooks"]),
    (lambda d: (d / "notes.txt").write_text("x") and d / "notes.txt", ["notes.txt", "is not a notebook"]),
])
def test_grade_bad_path_is_one_line_exit_2(capsys, tmp_path, make, fragments):
    code, out, err = run_cli(capsys, "grade", make(tmp_path), "--json", tmp_path / "report.json")
    assert code == 2
    line = one_line_error(err, *fragments)
    assert line.startswith("tformer grade: error:") and "tformer grade: tformer grade" not in line
    assert not (tmp_path / "report.json").exists()


def test_grade_checks_the_report_path_before_grading(capsys, tmp_path):
    nb = ROOT / "notebooks"
    code, _, err = run_cli(capsys, "grade", next(nb.glob("01_*.ipynb")), "--json", tmp_path / "no" / "such" / "r.json")
    assert code == 2
    one_line_error(err, "--json", "does not exist")
    with pytest.raises(SystemExit) as e:
        main(["grade", str(nb), "--timeout", "0"])
    assert e.value.code == 2
    one_line_error(capsys.readouterr().err, "--timeout", "expected >= 1")


def test_a_missing_extra_is_one_line_naming_it(capsys, monkeypatch, tmp_path):
    """`tformer serve` without the `serve` extra: one line naming the extra, exit 2, no 'bug' report."""
    monkeypatch.setitem(sys.modules, "uvicorn", None)        # `import uvicorn` now fails as if not installed
    code, _, err = run_cli(capsys, "serve", "--demo")
    line = one_line_error(err, "uvicorn", '.[serve]')
    assert code == 2 and "bug" not in line, line


# -- the command answers --help and a usage error before torch loads ---------------------------------------------

# run in a fresh interpreter: build the parser, then `tformer ARGV` for each ARGV given, and report whether torch
# (or numpy, which torch brings) was loaded at each step. argv[1]: where to write the report; argv[2:]: the
# modules of COMMANDS to leave out
PARSER_PROBE = r'''
import argparse, contextlib, io, json, sys
import tformer.cli as cli
report_to, skip = sys.argv[1], sys.argv[2:]
cli.COMMANDS[:] = [m for m in cli.COMMANDS if m not in skip]
heavy = lambda: sorted({m.split(".")[0] for m in sys.modules} & {"torch", "numpy"})
seen = {"import tformer.cli": heavy()}
parser = cli.build_parser()
seen["build_parser()"] = heavy()
commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
runs = [["--help"], ["doctor", "--no-such-flag"], ["class", "grade"], ["class", "merge", "--help"]] + [
    [c, "--help"] for c in commands if c != "capstone"]
codes = {}
for argv in runs:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    codes[" ".join(argv)] = code
    seen["tformer " + " ".join(argv)] = heavy()
json.dump({"seen": seen, "codes": codes, "commands": sorted(commands)}, open(report_to, "w"))
'''


def probe_parser(tmp_path: Path, skip: list[str]) -> dict:
    from test_grade_cli import CHECKOUT
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(CHECKOUT)
    out = tmp_path / "probe.json"
    r = subprocess.run([sys.executable, "-c", PARSER_PROBE, str(out), *skip], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def test_help_and_a_usage_error_answer_without_torch(tmp_path):
    """Building the parser, `tformer --help`, every command's --help (`tformer class merge --help` too) and a usage
    error (`tformer doctor --no-such-flag`, `tformer class grade` without a class) load no torch: each command
    module imports what its handler needs inside the handler. `tformer capstone --help` does load it (listing the
    capstones imports them)."""
    from test_grade_cli import tformer
    report = probe_parser(tmp_path, [])
    assert {"doctor", "translate", "serve", "export", "capstone", "grade", "class", "handout",
            "exercise"} <= set(report["commands"]), report["commands"]
    codes = report["codes"]
    assert codes["--help"] == 0 and codes["doctor --help"] == 0 and codes["class merge --help"] == 0, codes
    assert codes["doctor --no-such-flag"] == 2 and codes["class grade"] == 2, codes
    loaded = {step: mods for step, mods in report["seen"].items() if mods}
    assert not loaded, f"torch loaded before a handler ran: {loaded}"
    for argv in (["--help"], ["doctor", "--help"]):            # and as typed, from outside the checkout
        r = tformer(*argv, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.startswith("usage: tformer") and not r.stderr, (argv, r.stderr[-2000:])
    assert "--no-speed" in tformer("doctor", "--help", cwd=tmp_path).stdout
    r = tformer("class", "grade", cwd=tmp_path)
    assert r.returncode == 2 and "--out" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


FACADE_PROBE = r'''
import json, sys
import tformer
out = {"import tformer": "torch" in sys.modules, "dir": sorted(dir(tformer))}
star = {}
exec("from tformer import *", star)
out["star"] = sorted(k for k in star if not k.startswith("__"))
out["all"] = sorted(tformer.__all__)
out["after star"] = "torch" in sys.modules
out["switches"] = "tformer.utils.runtime" in sys.modules
from tformer import MultiHeadAttention
import tformer.attention
out["same"] = MultiHeadAttention is tformer.MultiHeadAttention is tformer.attention.MultiHeadAttention
try:
    tformer.no_such_name
except AttributeError as e:
    out["missing"] = str(e)
json.dump(out, sys.stdout)
'''


def test_the_package_names_load_lazily_and_all_of_them_still_import(tmp_path):
    """`import tformer` loads no torch; `from tformer import *`, `from tformer import X` and `tformer.X` give
    every name of __all__ (torch loads then, and the run-time switches with it); `import torch; import tformer`,
    as the notebooks start, applies the switches at once."""
    from test_grade_cli import CHECKOUT
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(CHECKOUT)
    r = subprocess.run([sys.executable, "-c", FACADE_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["import tformer"] is False
    assert set(out["all"]) <= set(out["dir"]) and "__version__" in out["dir"]
    assert out["star"] == out["all"], set(out["star"]) ^ set(out["all"])
    assert out["after star"] and out["switches"] and out["same"]
    assert "no_such_name" in out["missing"]
    r = subprocess.run([sys.executable, "-c", "import sys, torch, tformer; print('tformer.utils.runtime' in sys.modules)"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "True", r.stderr[-3000:]
