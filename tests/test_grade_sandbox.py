"""The Landlock sandbox of `tformer grade CLASS`: a worker reads its own student's folder and the course, never
another student's folder, and writes only into its own temporary folder (tformer/grading/classroom/sandbox.py, landlock.py)."""
from __future__ import annotations

import json
import os
import sys

import pytest

from tformer.grading.classroom import landlock, run

needs_landlock = pytest.mark.skipif(landlock.landlock_abi() == 0,
                              reason="this kernel has no Landlock (Linux 5.13+ with Landlock enabled)")


def test_only_the_rights_the_abi_knows_are_handled():
    assert landlock._fs_rights(1) == (1 << 13) - 1                     # EXECUTE .. MAKE_SYM
    assert landlock._fs_rights(2) == (1 << 14) - 1                     # + REFER
    assert landlock._fs_rights(3) == landlock._fs_rights(4) == (1 << 15) - 1   # + TRUNCATE (4 adds network rights)
    assert landlock._fs_rights(5) == landlock._fs_rights(7) == (1 << 16) - 1   # + IOCTL_DEV


def _tries(ruleset: int, tries: list) -> list[str]:
    """Each (path, mode) opened in a forked child under the ruleset: 'ok' or 'refused'."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                      # the child: enforce, then try each access, report in one line
        code = 70
        try:
            os.close(r)
            landlock.landlock_enforce(ruleset)
            got = []
            for path, mode in tries:
                try:
                    open(path, mode).close()
                    got.append("ok")
                except PermissionError:
                    got.append("refused")
            os.write(w, json.dumps(got).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.close(ruleset)
    got = os.read(r, 1000)
    os.close(r)
    assert os.waitpid(pid, 0)[1] == 0
    return json.loads(got)


@needs_landlock
def test_the_ruleset_holds_in_a_forked_child(tmp_path):
    mine, theirs, tmp = tmp_path / "cls" / "a", tmp_path / "cls" / "b", tmp_path / "tmp"
    for d in (mine, theirs, tmp):
        d.mkdir(parents=True)
    (mine / "mine.txt").write_text("mine")
    (theirs / "secret.txt").write_text("secret")
    got = _tries(landlock.landlock_ruleset(*landlock.worker_paths([mine], tmp)),
                 [(mine / "mine.txt", "r"), (theirs / "secret.txt", "r"), (mine / "new.txt", "w"),
                  (tmp_path / "cls" / "new.txt", "w"), (tmp / "scratch.txt", "w")])
    assert got == ["ok", "refused", "refused", "refused", "ok"]
    assert not (mine / "new.txt").exists() and not (tmp_path / "cls" / "new.txt").exists()


@needs_landlock
def test_a_canvas_student_reads_only_their_own_files(tmp_path):
    """A Canvas download is one flat folder: the worker gets its student's files, not the folder."""
    flat, tmp = tmp_path / "canvas", tmp_path / "tmp"
    for d in (flat, tmp):
        d.mkdir()
    mine, theirs = flat / "ann_11_101_01_attention.ipynb", flat / "bob_12_102_01_attention.ipynb"
    for f in (mine, theirs):
        f.write_text("{}")
    got = _tries(landlock.landlock_ruleset(*landlock.worker_paths([mine], tmp, closed=flat)),
                 [(mine, "r"), (theirs, "r"), (flat / "new.txt", "w")])
    assert got == ["ok", "refused", "refused"]


@needs_landlock
def test_a_notebook_cannot_read_another_student_or_write_outside_its_temporary_folder(tmp_path):
    from test_grade_class import _cells, _write
    sol = _cells("01_attention", True)
    cls = tmp_path / "class"
    _write(cls / "bob" / "01_attention.ipynb", sol)
    spy = [f"open({str(cls / 'bob' / '01_attention.ipynb')!r}).read()",
           f"open({str(cls / 'eve' / 'copied.txt')!r}, 'w').write('x')",
           f"open({str(cls / 'planted.txt')!r}, 'w').write('x')",
           "import tempfile\nwith tempfile.NamedTemporaryFile() as f:\n    f.write(b'fine')"]
    _write(cls / "eve" / "01_attention.ipynb", sol[:1] + spy + sol[1:])
    grades = run.grade_class(cls, tmp_path / "out", timeout=30, workers=2, progress=False, log=lambda *a: None)
    assert grades["settings"]["landlock_abi"] == landlock.landlock_abi()
    st = {s["student"]: s for s in grades["students"]}
    errors = st["eve"]["notebooks"][0]["cell_errors"]
    assert sum("PermissionError" in e for e in errors) == 3, errors   # the read and both writes; the temp file worked
    assert not (cls / "eve" / "copied.txt").exists() and not (cls / "planted.txt").exists()
    for s in ("bob", "eve"):                          # the exercises are graded as without the sandbox
        assert {n: e["status"] for n, e in st[s]["exercises"].items()} == {"ch01.attention": "passed",
                                                                           "ch01.softmax": "passed"}, s
    assert st["bob"]["notebooks_with_errors"] == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
