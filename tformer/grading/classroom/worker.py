"""The grading worker: runs a learner's notebook for `tformer grade`, outside the grader's process.

    python -m tformer.grading.classroom.worker   (started by runner.py, never by hand)

It executes the notebook's code cells in order in an IPython shell (magics work, a cell that raises does
not stop the run), with `check` replaced by a collector: a check cell only hands over the learner's
function (`check("ch01.attention", my_attention)` keeps `my_attention`). Then it answers the grader's
requests: for an exercise and a list of inputs it calls the learner's function on each (`run_learner`:
references disabled, time limit) and sends back what it returned. It never sees an expected answer, a
point, a teacher's exercise file or a hidden case before the grader has every public output of the notebook.

This process and every byte it sends belong to the student: the notebook's code runs in it and may rewrite
any of it (this module included). Nothing here is trusted by the grader (runner.py), which caps each frame
before reading it, loads it with `torch.load(weights_only=True)` (tensors, numbers, strings and containers
only: no code runs in the grader), and checks its shape, counts and structure before judging.

Protocol on the worker's original stdin/stdout (the learner's prints go to stderr): frames of an 8-byte
big-endian length followed by a `torch.save` payload.
- The grader's first frame: `{"cells": [(index, source), ...], "fallback": {exercise: function name},
  "questions": [names]}`: the code cells to run (the fast path of `tformer class grade` leaves some out), the
  released stubs' function names (an exercise no `check(...)` handed over, its check cell deleted, is graded
  with the function of that name the notebook defined, if any, and listed in "uncalled"), and which owed names
  are questions (their check call hands over a value, taken as `questions.plain` makes it: builtins only).
- The worker answers `{"cell": i}` before each cell (i increasing) and `{"collected": names}` after it, so the
  grader knows which cell stopped a notebook that exits or hangs, then `{"ready": names, "cell_errors": [...],
  "uncalled": names, "values": {question: value}}`.
- An exercise request: `{"exercise": name, "time_limit": s, "torch_seed": n, "forbidden": [dotted names],
  "cases": [(name, args, kwargs, seed), ...]}`. The worker builds its Exercise from the request alone (the
  forbidden references resolved by import and getattr, guards.resolve); torch's, Python's and NumPy's global
  generators are seeded with `torch_seed` before the learner's function runs. The reply:
  `{"outputs": [(output, (args, kwargs)), ...], "status": s, "error": text, "ignored_limit": bool}`: one pair
  per case that finished, its output and its inputs afterwards (to see in-place edits), copied by `sendable` as
  the call returns (plain CPU tensors, cloned), so a later call cannot change an output already taken. The
  grader loads the whole reply once, with weights_only.
The same loop runs in a process forked from the warm process of tformer/grading/classroom/sandbox.py (`serve`).
"""
from __future__ import annotations

import io
import os
import struct
import sys

import torch


def write_frame(f, obj) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    f.write(struct.pack(">Q", len(data)) + data)
    f.flush()


def read_frame(f):
    head = f.read(8)
    if len(head) < 8:
        raise EOFError("the grader closed the channel")
    (n,) = struct.unpack(">Q", head)
    return torch.load(io.BytesIO(f.read(n)), weights_only=False)   # from the grader: trusted


def sendable(x):
    """What the grader can load with weights_only=True: plain CPU tensors, numbers, strings, containers."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        return torch.Tensor.as_subclass(t.cpu().contiguous().clone(), torch.Tensor)
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, tuple):
        return tuple(sendable(v) for v in x)
    if isinstance(x, list):
        return [sendable(v) for v in x]
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {k: sendable(v) for k, v in x.items()}
    return {"tformer_unsupported": type(x).__name__}


def _seed_everything(seed: int) -> None:
    import random
    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % (1 << 32))


def _cell_line(i: int, source: str) -> str:
    """"code cell 5 (`x = f(y)`): ": where a message comes from (the cell's number among the code cells, and
    its first non-blank line)."""
    from ..messages import _
    line = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    line = line if len(line) <= 60 else line[:57] + "..."
    return _("code cell {n} (`{line}`): ").format(n=i + 1, line=line)


def _no_shell(shell, errors: list[str], current: dict) -> None:
    """Shell commands (`!cmd`, `%pip`, `%sx`, `%system`, `%%bash`, `%%sh`) do not run while grading: each is
    noted once per cell and the rest of the cell runs. Other magics (`%matplotlib inline`, `%timeit`) run."""
    from ..messages import _

    def note(*args, **kwargs):
        msg = _cell_line(current["cell"], current["source"]) + _("shell commands do not run while grading")
        if not errors or errors[-1] != msg:
            errors.append(msg)
        return None

    shell.system = shell.system_piped = shell.system_raw = note
    shell.getoutput = lambda *a, **k: note() or []
    for magic in ("bash", "sh", "script", "system", "sx", "pip", "conda", "mamba"):
        shell.register_magic_function(note, "line_cell" if magic in ("script",) else
                                      ("cell" if magic in ("bash", "sh") else "line"), magic)


def serve(proto_in, proto_out) -> int:
    """Run the cells the grader sends, then answer its requests until it closes the channel."""
    from IPython.core.interactiveshell import InteractiveShell

    import tformer.grading as grading
    from .. import core
    from ..guards import resolve

    collected: dict = {}
    values: dict = {}                                 # a question's answer, as questions.plain made it
    questions: set = set()                            # the owed names that are questions (the first frame's)

    def collect(name, fn):
        if name in questions:
            values[name] = core.plain(fn)             # the value now: `answer` is rebound by the next question
        collected[name] = fn
        return core.Result(name, 0, False, "collected", "graded by tformer grade")

    grading.check = core.check = collect
    # the messages the worker writes (an error's text, the time-limit warning) in the grader's language, the one
    # its report uses (TFORMER_LANG, passed through; "en" unless set), not the notebook's: one language per report
    os.environ["TFORMER_LANG"] = os.environ.get("TFORMER_LANG") or "en"
    first = read_frame(proto_in)
    cells, fallback = first["cells"], first.get("fallback", {})
    questions.update(first.get("questions", []))
    shell = InteractiveShell.instance()
    errors: list[str] = []
    current = {"cell": 0, "source": ""}
    _no_shell(shell, errors, current)
    for i, source in cells:
        current.update(cell=i, source=source)
        write_frame(proto_out, {"cell": i, "of": len(cells)})
        try:
            res = shell.run_cell(source, store_history=False, silent=False)
            err = res.error_in_exec or res.error_before_exec
        except BaseException as e:                    # SystemExit and friends from a cell: note, go on
            err = e
        if err is not None:
            what = f"{type(err).__name__}: {err}".splitlines()[0][:200] if str(err) else type(err).__name__
            errors.append(_cell_line(i, source) + what)
        write_frame(proto_out, {"collected": sorted(collected)})
    uncalled = []                                     # a check cell deleted: the released stub's function, if defined
    for name, fn_name in fallback.items():
        fn = shell.user_ns.get(fn_name)
        if name not in collected and callable(fn):
            collected[name] = fn
            uncalled.append(name)
    write_frame(proto_out, {"ready": sorted(collected), "cell_errors": errors, "uncalled": uncalled,
                            "values": values})

    while True:
        try:
            req = read_frame(proto_in)
        except EOFError:
            return 0
        name, fn = req["exercise"], collected.get(req["exercise"])
        # the request alone: no teacher's file, no registry (a teacher's exercise exists only in the grader)
        ex = core.Exercise(name, "", None, list, None, time_limit=float(req["time_limit"]),
                           forbidden=resolve(req.get("forbidden", [])))
        cases = [core.Case(name, args, kwargs, seed) for name, args, kwargs, seed in req["cases"]]
        _seed_everything(int(req.get("torch_seed", 0)))
        out = core.run_learner(ex, fn, cases, keep=lambda got, after: (sendable((got, after)), None))
        write_frame(proto_out, {"outputs": out.outputs, "status": out.status, "error": out.error,
                                "ignored_limit": out.ignored_limit})


def main(argv: list[str]) -> int:
    # keep the protocol channel private: the learner's code prints to stdout, reads stdin, or closes them
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.__stdout__ = os.fdopen(1, "w", buffering=1, closefd=False)
    return serve(proto_in, proto_out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
