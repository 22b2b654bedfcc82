"""The grading protocol from the grader's side: every byte a worker sends is the student's, so the grader
decides from checked data only: the reply's shape and counts, no teacher file in the worker, hidden cases last,
frame caps and the notebook's budget.

Most tests play the worker with a thread on a pair of pipes (`Fake`): it reads the grader's frames and writes
forged ones. Two run a real worker (`_Subprocess`) on a tiny notebook."""
from __future__ import annotations

import io
import json
import os
import struct
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch

from tformer.grading import REGISTRY, Case, Exercise, load_exercises
from tformer.grading import core
from tformer.grading.classroom import runner
from tformer.grading.classroom.runner import _Subprocess, grade_cells, to_json, worker_env
from tformer.grading.classroom.worker import read_frame, sendable, write_frame
from tformer.grading.guards import dotted, resolve

load_exercises()
NB = Path("01_attention.ipynb")


class Fake:
    """A worker played by a thread: `script(inp, out, fake)` reads the grader's frames from `inp` and writes its
    own to `out`; `fake.requests` records every exercise request it read (see `answer`)."""

    def __init__(self, script):
        r1, w1 = os.pipe()                            # grader -> fake
        r2, w2 = os.pipe()                            # fake -> grader
        self.rfd, self.wfile = r2, os.fdopen(w1, "wb")
        self.inp, self.out = os.fdopen(r1, "rb"), os.fdopen(w2, "wb")
        self.killed = threading.Event()
        self.requests: list[dict] = []
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script):
        try:
            script(self.inp, self.out, self)
        except Exception:
            pass
        finally:
            self.killed.wait(30)
            for f in (self.inp, self.out):
                try:
                    f.close()
                except OSError:
                    pass

    def kill(self):
        self.killed.set()
        self.wfile.close()
        os.close(self.rfd)


def launcher(script, log: list | None = None):
    def launch():
        fake = Fake(script)
        if log is not None:
            log.append(fake)
        return fake
    return launch


def ready(inp, out, names, values=None):
    """Read the first frame and say every name is ready (no cells run)."""
    first = read_frame(inp)
    write_frame(out, {"ready": list(names), "cell_errors": [], "uncalled": [], "values": values or {}})
    return first


def answer(reply):
    """A script: ready with every owed name, then reply(request) -> the reply frame, for each request."""
    def script(inp, out, fake):
        first = ready(inp, out, ["ch01.softmax", "ch01.attention", *EXTRA])
        fake.first = first
        while True:
            req = read_frame(inp)
            fake.requests.append(req)
            write_frame(out, reply(req))
    return script


EXTRA: list[str] = []


def ok(outputs, req, status="ok"):
    return {"outputs": [sendable((o, (args, kwargs))) for o, (_, args, kwargs, _) in zip(outputs, req["cases"])],
            "status": status, "error": "", "ignored_limit": False}


def softmax_outputs(req):
    return [torch.softmax(args[0], -1) for _, args, _, _ in req["cases"]]


def rows(report):
    return {r.exercise: r for r in report.rows}


# --- verdicts from checked data only ------------------------------------------------------------------------

def test_a_forged_reply_that_computes_the_answer_passes_so_the_harness_is_sound():
    rep = grade_cells(NB, [], launcher(answer(lambda req: ok(softmax_outputs(req), req))), 5, owed=["ch01.softmax"])
    assert rows(rep)["ch01.softmax"].status == "passed", rows(rep)


@pytest.mark.parametrize("reply, words", [
    (lambda req: ok([], req), "0 outputs for"),                                    # "ok" with no outputs
    (lambda req: ok(softmax_outputs(req)[:-1], req), "outputs for"),               # one short
    (lambda req: ok(softmax_outputs(req), req, status="passed"), "unknown status"),
    (lambda req: ok(softmax_outputs(req)[:3], req, status="not attempted"), "outputs for"),
    (lambda req: ok(softmax_outputs(req), req, status="error"), "outputs for"),   # as many as cases: no failing one
    (lambda req: ok([(o, o) for o in softmax_outputs(req)], req), "not what the exercise returns"),
    (lambda req: ok([{"x": o} for o in softmax_outputs(req)], req), "not what the exercise returns"),
    (lambda req: ok([1.0 for o in softmax_outputs(req)], req), "not what the exercise returns"),
    (lambda req: {**ok(softmax_outputs(req), req), "outputs": [b"junk"] * len(req["cases"])}, "wrong shape"),
    (lambda req: {**ok(softmax_outputs(req), req), "outputs": "x"}, "wrong shape"),
    (lambda req: [1, 2, 3], "wrong shape"),
    (lambda req: {**ok(softmax_outputs(req), req), "outputs": [sendable(o) for o in softmax_outputs(req)]}, "wrong shape"),
    (lambda req: {**ok(softmax_outputs(req), req), "outputs": [sendable((o, 5)) for o in softmax_outputs(req)]}, "inputs"),
    (lambda req: {**ok(softmax_outputs(req), req), "outputs": [sendable((o, ((o, o), {}))) for o in softmax_outputs(req)]},
     "not what the exercise returns"),
])
def test_a_reply_counts_only_when_its_status_counts_and_structure_fit(reply, words):
    rep = grade_cells(NB, [], launcher(answer(reply)), 5, owed=["ch01.softmax"])
    row = rows(rep)["ch01.softmax"]
    assert row.status == "error" and not row.passed and words in row.message, row
    assert len(row.message.splitlines()) == 1


def test_judge_never_passes_all_zero_cases():
    ex = REGISTRY["ch01.softmax"]
    cases = core.exercise_cases(ex)
    for outcome in (core.Outcome(), core.Outcome(status="weird"), core.Outcome([torch.ones(1)], [], "ok")):
        res = core.judge(ex, cases, outcome)
        assert res.status == "error" and not res.passed and "passed all" not in res.message, res
    assert core.judge(ex, [], core.Outcome()).status == "error"            # an exercise without cases passes nothing


def test_a_compressed_payload_is_refused_before_it_inflates():
    def script(inp, out, fake):
        read_frame(inp)
        buf = io.BytesIO()
        torch.save({"ready": ["ch01.softmax"], "pad": torch.zeros(1 << 18)}, buf)
        z, packed = zipfile.ZipFile(io.BytesIO(buf.getvalue())), io.BytesIO()
        with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as w:
            for info in z.infolist():
                w.writestr(info.filename, z.read(info.filename))
        data = packed.getvalue()
        out.write(struct.pack(">Q", len(data)) + data)
        out.flush()
    rep = grade_cells(NB, [], launcher(script), 5, owed=["ch01.softmax"])
    assert rows(rep)["ch01.softmax"].status == "not run" and "not plain data" in " ".join(rep.cell_errors), rep


@pytest.mark.parametrize("frames", [
    [{"cell": 0}, {"collected": []}, {"cell": 0}],                 # a cell number that does not increase
    [{"cell": 7}],                                                 # not a cell that was sent
    [{"cell": 0}, {"ready": ["ch01.softmax"], "cell_errors": [], "uncalled": [], "values": {}}],  # ready mid-cell
    [{"ready": 5}],                                                # ready of the wrong shape
    ["just a string"],
])
def test_frames_of_the_wrong_shape_or_order_are_the_notebooks_error(frames):
    def script(inp, out, fake):
        read_frame(inp)
        for f in frames:
            write_frame(out, f)
        fake.killed.wait(30)
    log = []
    t0 = time.monotonic()
    rep = grade_cells(NB, [(0, "x = 1"), (1, "y = 2")], launcher(script, log), 5, owed=["ch01.softmax"])
    assert time.monotonic() - t0 < 4
    assert rows(rep)["ch01.softmax"].status == "not run"
    assert any("protocol" in e for e in rep.cell_errors), rep.cell_errors


def test_garbage_bytes_never_crash_the_grader():
    def script(inp, out, fake):
        read_frame(inp)
        out.write(struct.pack(">Q", 100) + os.urandom(100))
        out.flush()
        fake.killed.wait(30)
    rep = grade_cells(NB, [(0, "x = 1")], launcher(script), 5, owed=["ch01.softmax"])
    assert rows(rep)["ch01.softmax"].status == "not run" and rep.cell_errors


# --- frames capped before they are read, a byte budget per notebook ------------------------------------------

def test_an_oversized_frame_header_is_refused_unread_and_memory_stays_bounded():
    def script(inp, out, fake):
        ready(inp, out, ["ch01.softmax"])
        read_frame(inp)
        out.write(struct.pack(">Q", 1 << 40) + b"\0" * (4 << 20))   # claims 1 TiB, sends 4 MiB and waits
        out.flush()
        fake.killed.wait(30)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        rep = grade_cells(NB, [], launcher(script), 5, owed=["ch01.softmax"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    row = rows(rep)["ch01.softmax"]
    assert row.status == "error" and "more than" in row.message and "bytes" in row.message, row
    assert time.monotonic() - t0 < 3 and peak < 16 << 20, peak


def test_a_ready_frame_over_one_mib_is_refused():
    def script(inp, out, fake):
        read_frame(inp)
        write_frame(out, {"ready": ["ch01.softmax"], "cell_errors": ["x" * (2 << 20)], "uncalled": [], "values": {}})
        fake.killed.wait(30)
    rep = grade_cells(NB, [], launcher(script), 5, owed=["ch01.softmax"])
    assert rows(rep)["ch01.softmax"].status == "not run" and "more than" in " ".join(rep.cell_errors)


def test_a_reply_is_capped_by_the_size_of_its_request():
    big = lambda req: {**ok(softmax_outputs(req), req), "pad": torch.zeros(1 << 20)}   # 4 MiB more than asked
    rep = grade_cells(NB, [], launcher(answer(big)), 5, owed=["ch01.softmax"])
    assert rows(rep)["ch01.softmax"].status == "error" and "more than" in rows(rep)["ch01.softmax"].message


def test_the_notebooks_byte_budget_ends_it(monkeypatch):
    monkeypatch.setattr(runner, "NOTEBOOK_BYTES", 300_000)
    EXTRA[:] = ["ch01.attention"]
    try:
        pad = lambda req: {**ok(softmax_outputs(req), req), "pad": torch.zeros(40_000)}   # over 160 kB each
        rep = grade_cells(NB, [], launcher(answer(pad)), 5, owed=["ch01.softmax", "ch01.attention"])
    finally:
        EXTRA[:] = []
    r = rows(rep)
    assert r["ch01.softmax"].status == "passed"
    assert r["ch01.attention"].status == "error" and "in all" in r["ch01.attention"].message
    assert "in all" in rep.stopped


# --- one time budget per notebook, the cell limit never restarts ---------------------------------------------

def test_cells_that_keep_sending_frames_stop_at_the_notebook_budget():
    def script(inp, out, fake):
        read_frame(inp)
        for i in range(100):                          # each cell well within its limit, forever in all
            write_frame(out, {"cell": i, "of": 100})
            if fake.killed.wait(0.3):
                return
            write_frame(out, {"collected": []})
    log = []
    t0 = time.monotonic()
    rep = grade_cells(NB, [(i, "pass") for i in range(100)], launcher(script, log), 1.0,
                      owed=["ch01.softmax", "ch01.q_saturation"], notebook_timeout=1.5)
    took = time.monotonic() - t0
    assert took < 3, took
    assert len(log) == 1
    assert "stopped after 1.5 s" in rep.stopped
    for r in rep.rows:
        assert r.status == "timeout" and "stopped after 1.5 s (the notebook's time budget)" in r.message, r
    data = to_json([rep])["notebooks"][0]
    assert data["stopped"] == rep.stopped and data["flags"] == [] and data["exercises"][0]["stub"] is False


def test_a_cell_that_repeats_its_number_cannot_restart_its_limit():
    def script(inp, out, fake):
        read_frame(inp)
        while not fake.killed.is_set():
            write_frame(out, {"cell": 0, "of": 1})
            fake.killed.wait(0.2)
    log = []
    t0 = time.monotonic()
    rep = grade_cells(NB, [(0, "pass")], launcher(script, log), 1.0, owed=["ch01.softmax"], notebook_timeout=20)
    assert time.monotonic() - t0 < 3 and not rep.stopped
    assert "protocol" in " ".join(rep.cell_errors) and rows(rep)["ch01.softmax"].status == "not run"


def test_a_timed_out_exercise_reruns_the_notebook_once(monkeypatch):
    monkeypatch.setattr(runner, "REPLY_MARGIN", 0.3)
    monkeypatch.setattr(REGISTRY["ch01.softmax"], "time_limit", 0.2)
    monkeypatch.setattr(REGISTRY["ch01.attention"], "time_limit", 0.2)
    EXTRA[:] = ["ch01.q_saturation"]

    def script(inp, out, fake):
        ready(inp, out, ["ch01.softmax", "ch01.attention"])
        while True:
            fake.requests.append(read_frame(inp))     # never answers
    log = []
    try:
        t0 = time.monotonic()
        rep = grade_cells(NB, [], launcher(script, log), 5, owed=["ch01.softmax", "ch01.attention", "ch01.q_saturation"])
    finally:
        EXTRA[:] = []
    r = rows(rep)
    assert len(log) == 2 and time.monotonic() - t0 < 3
    assert r["ch01.softmax"].status == r["ch01.attention"].status == "timeout"
    assert r["ch01.q_saturation"].status == "not run" and "not run again" in r["ch01.q_saturation"].message


# --- hidden cases: after every public reply, pass/fail only ------------------------------------------------

@pytest.fixture
def hidden():
    saved = {k: list(v) for k, v in core.HIDDEN.items()}
    secret = torch.tensor([[1234.5678, 2.0]])
    core.add_hidden_cases("ch01.softmax", lambda: [Case("secret", (secret.clone(),))])
    core.add_hidden_cases("ch01.attention", lambda: [Case("secret", (secret.clone(), secret.clone(), secret.clone()))])
    yield secret
    core.HIDDEN.clear()
    core.HIDDEN.update(saved)


def test_hidden_cases_are_sent_after_every_public_reply_in_requests_of_their_own(hidden):
    def reply(req):
        if req["exercise"] == "ch01.softmax":
            return ok(softmax_outputs(req), req)
        outs = [(q, torch.ones(q.shape[:-1] + (k.shape[-2],))) for _, (q, k, v, *_), _, _ in req["cases"]]
        return ok(outs, req)
    log = []
    rep = grade_cells(NB, [], launcher(answer(reply), log), 5, owed=["ch01.softmax", "ch01.attention"])
    order = [(req["exercise"], all(c[0].startswith("hidden") for c in req["cases"])) for req in log[0].requests]
    assert order == [("ch01.softmax", False), ("ch01.attention", False), ("ch01.softmax", True),
                     ("ch01.attention", True)], order
    assert all(not any(c[0].startswith("hidden") for c in req["cases"]) for req in log[0].requests[:2])
    assert log[0].requests[0]["forbidden"] == dotted(REGISTRY["ch01.softmax"].forbidden)
    assert log[0].first["questions"] == [] and "ch01.softmax" not in log[0].first["questions"]
    r = rows(rep)
    assert r["ch01.softmax"].status == "passed" and r["ch01.attention"].status == "failed"
    assert "1234" not in json.dumps(to_json([rep]))


def _notebook(path: Path, cells: list[str]) -> list[tuple[int, str]]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)
    return list(enumerate(cells))


def test_a_function_that_keeps_its_first_output_leaks_no_hidden_input(tmp_path, hidden):
    """Real worker: the function writes the hidden input into the tensor it returned first; outputs are taken as
    each call returns and the hidden request comes after every public reply, so no message holds the secret."""
    cells = _notebook(tmp_path / "01_attention.ipynb", [
        "import torch\nfrom tformer.grading import check\nkept = []\n"
        "def sm(x):\n    y = torch.exp(x - x.amax(-1, keepdim=True))\n    y = y / y.sum(-1, keepdim=True)\n"
        "    if kept:                                   # every later input, the hidden one too, into the first output\n"
        "        n = min(x.numel(), kept[0].numel())\n        kept[0].view(-1)[:n] = x.reshape(-1)[:n]\n"
        "    else:\n        kept.append(y)\n"
        "    return y * 3 if ((x > 1000) & (x < 1e4)).any() else y     # wrong on the hidden case only\n"
        "check('ch01.softmax', sm)",
    ])
    rep = grade_cells(NB, cells, lambda: _Subprocess(tmp_path, worker_env()), 60, owed=["ch01.softmax"])
    row = rows(rep)["ch01.softmax"]
    assert row.status == "failed" and "hidden case(s) failed" in row.message, row
    assert "FAILED" not in row.message                # every public case passed: their outputs were taken at once
    assert "1234" not in json.dumps(to_json([rep])), row.message


def test_a_patched_run_learner_with_the_stub_gets_no_points(tmp_path):
    cells = _notebook(tmp_path / "01_attention.ipynb", [
        "import tformer.grading.core as C\nfrom tformer.grading import check\n"
        "C.run_learner = lambda ex, fn, cases, *a, **k: C.Outcome()",
        "def softmax(x):\n    raise NotImplementedError\ncheck('ch01.softmax', softmax)",
        "def attention(q, k, v, mask=None):\n    raise NotImplementedError\ncheck('ch01.attention', attention)",
    ])
    rep = grade_cells(NB, cells, lambda: _Subprocess(tmp_path, worker_env()), 60,
                      owed=["ch01.softmax", "ch01.attention"])
    assert rep.earned == 0, rep.rows
    for r in rep.rows:
        assert r.status == "error" and "0 outputs for" in r.message, r


# --- the worker gets names, not a teacher's file --------------------------------------------------------------

def test_forbidden_references_travel_as_dotted_names():
    for ex in REGISTRY.values():
        if isinstance(ex, Exercise):
            names = dotted(ex.forbidden)
            assert all(isinstance(n, str) for n in names)
            assert [(id(o), a) for o, a in resolve(names)] == [(id(o), a) for o, a in ex.forbidden], ex.name
    assert resolve(["no.such.module.f", 5, "torch.no_such_attr_owner.x"]) == []


def test_the_worker_env_names_no_teacher_file():
    env = worker_env()
    assert "TFORMER_GRADE_EXERCISES" not in env and env["TFORMER_GRADE_WORKER"] == "1"


def test_run_learner_keeps_each_output_as_its_call_returns():
    kept = []

    def f(x):
        if kept:
            kept[0].fill_(99.0)
        y = x * 2
        kept.append(y)
        return y
    ex = Exercise("t.keep", "t", reference=lambda x: x * 2, edge_cases=list, random_case=None)
    cases = [Case("a", (torch.ones(2),)), Case("b", (torch.ones(2),))]
    out = core.run_learner(ex, f, cases, keep=lambda got, after: (sendable((got, after)), None))
    first = out.outputs[0][0]
    assert torch.equal(first, torch.full((2,), 2.0)) and out.status == "ok"


def test_run_notebook_keeps_one_deadline_over_a_sleeping_notebook(tmp_path):
    """Real worker: cells that sleep within the per-cell limit, one after another, stop at the notebook's budget."""
    from tformer.grading.classroom.runner import run_notebook
    _notebook(tmp_path / "01_attention.ipynb", ["import time", "time.sleep(4)", "time.sleep(4)", "time.sleep(4)",
                                                "from tformer.grading import check\ncheck('ch01.softmax', lambda x: x)"])
    t0 = time.monotonic()
    rep = run_notebook(tmp_path / "01_attention.ipynb", timeout=5, notebook_timeout=7)
    assert time.monotonic() - t0 < 10
    assert rep.stopped.startswith("stopped after 7 s"), rep
    assert all(r.status == "timeout" and not r.passed for r in rep.rows), rep.rows


def test_a_run_after_hidden_inputs_went_out_reports_no_text_of_its_own(hidden):
    """The first worker dies on a hidden request; the rerun (for the next exercise's hidden cases) could print
    what the first left on disk: its cell errors stay out of the report."""
    def reply(req):
        if req["exercise"] == "ch01.softmax":
            return ok(softmax_outputs(req), req)
        return ok([(q, torch.ones(q.shape[:-1] + (k.shape[-2],))) for _, (q, k, v, *_), _, _ in req["cases"]], req)

    runs = iter(range(1, 10))

    def script(inp, out, fake):
        n = next(runs)                                # 1: the first worker, 2: the rerun
        read_frame(inp)
        errors = ["code cell 1: ValueError: 1234.5678"] if n > 1 else []
        write_frame(out, {"ready": ["ch01.softmax", "ch01.attention"], "cell_errors": errors, "uncalled": [],
                          "values": {}})
        while True:
            req = read_frame(inp)
            fake.requests.append(req)
            if req["cases"][0][0].startswith("hidden") and n == 1:
                out.close()                           # dies on the first hidden request
                return
            write_frame(out, reply(req))
    log = []
    rep = grade_cells(NB, [], launcher(script, log), 5, owed=["ch01.softmax", "ch01.attention"])
    r = rows(rep)
    assert len(log) == 2 and r["ch01.softmax"].status == "error" and r["ch01.attention"].status == "failed", r
    assert "1234" not in json.dumps(to_json([rep])), rep.cell_errors
