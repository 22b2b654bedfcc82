"""What the grader reads in a notebook's source itself, whatever its worker says (the worker process and every
byte it sends belong to the student: TEACHING.md's threat model).

    stub_exercises(cells, stem, released)   the exercises whose graded function is still the released stub
    flags(cells)                            cells that reach into the grader, one line each, for the teacher

A released stub never earns points: the function a check cell hands in (the last binding of its name before
that call; for an exercise whose check cell is gone, the released name's last binding in the notebook) is
compared, as a syntax tree without docstrings and without its own name, with the stub of the released learner
notebooks of that stem (notebooks/, notebooks/zh/, an assignment's `released` folder). A function whose whole
body raises NotImplementedError (no decorator) is a stub too: it cannot compute anything. Anything the scan
cannot follow (a name rebound by an assignment, an import, `globals()`) is graded as the worker's verdict says.

The flags name the obvious forgeries (an import of tformer.grading beyond `check`, `gc.get_objects`, an
assignment to an attribute of something imported from tformer, `sys.modules` edits, frame walking, the
protocol's own names): a teacher reads them; they change no grade. A scan is no guarantee.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

from ..messages import N_

# what a notebook may take from tformer.grading (the released notebooks import `check`)
ALLOWED_GRADING = frozenset({"check", "load_exercises"})
# names of the grader's and the worker's internals: a notebook has no use for them
INTERNALS = frozenset({"run_learner", "write_frame", "read_frame", "sendable", "judge", "judge_question", "Outcome",
                       "serve", "_seed_everything", "named_mistakes", "exercise_cases", "hidden_cases", "REGISTRY",
                       "proto_out", "proto_in"})
NAMED_INTERNALS = INTERNALS - {"judge", "serve", "Outcome"}     # as a bare name (a learner may call a variable judge)
GC_WALKERS = frozenset({"get_objects", "get_referrers", "get_referents"})
FRAME_WALKERS = {("sys", "_getframe"), ("inspect", "currentframe"), ("inspect", "stack"), ("inspect", "getouterframes"),
                 ("inspect", "getinnerframes"), ("inspect", "trace")}
FRAME_ATTRS = frozenset({"f_back", "f_globals", "f_locals", "tb_frame", "gi_frame", "cr_frame", "__globals__"})
TRACERS = {("sys", "settrace"), ("sys", "setprofile"), ("threading", "settrace"), ("threading", "setprofile"),
           ("sys", "addaudithook")}
PIPES = ("/proc/self/fd", "/dev/fd/", "/proc/self/mem")       # the worker's open files: its protocol pipe among them


@functools.lru_cache(maxsize=8192)
def parse(source: str) -> ast.Module | None:
    """A cell's syntax tree (IPython's magics and `!cmd` as the worker's shell reads them); None if it does not
    parse. Cached (a class's notebooks share most cells): never change a tree it returns."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    try:
        from .cells import python_of
        return ast.parse(python_of(source))
    except Exception:                                 # IPython's transformer, or still not Python
        return None


# --- the released stub ------------------------------------------------------------------------------------

def _is_docstring(st: ast.stmt) -> bool:
    return isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)


def _dump(node, root=None) -> str:
    """ast.dump without positions, every docstring dropped, the function `root`'s own name as "_" (the tree is
    only read: trees are cached and shared between the grader's threads)."""
    if isinstance(node, ast.AST):
        parts = []
        for name, value in ast.iter_fields(node):
            if name == "body" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and value and _is_docstring(value[0]):
                value = value[1:] or [ast.Pass()]
            if name == "name" and node is root:
                value = "_"
            parts.append(f"{name}={_dump(value)}")
        return f"{type(node).__name__}({', '.join(parts)})"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(v) for v in node) + "]"
    return repr(node)


def _shape(fn: ast.AST) -> str:
    """A function's syntax tree as compared with the stub's: docstrings and its own name dropped, no positions."""
    return _dump(fn, root=fn)


def _only_raises_not_implemented(fn: ast.AST) -> bool:
    """A function whose body (docstrings aside) is one `raise NotImplementedError...`, undecorated."""
    body = [st for st in fn.body if not _is_docstring(st)]
    if fn.decorator_list or len(body) != 1 or not isinstance(body[0], ast.Raise):
        return False
    exc = body[0].exc
    exc = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _top_statements(body: list[ast.stmt]):
    """The statements that run at a cell's top level, in order: inside if/for/while/try/with too, never inside a
    function or a class."""
    for st in body:
        yield st
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _top_statements(getattr(st, field, []) or [])
        for h in getattr(st, "handlers", []) or []:
            yield from _top_statements(h.body)
        for case in getattr(st, "cases", []) or []:
            yield from _top_statements(case.body)


_OPAQUE_CALLS = frozenset({"globals", "exec", "eval", "vars", "setattr"})


def _bound(st: ast.stmt) -> tuple[frozenset[str], bool]:
    """The names statement `st` (its own part, not its nested block) binds at the top level, and whether it may
    bind names the scan cannot see (globals(), exec, a star import)."""
    names: set[str] = set()
    opaque = False
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(st.name)
        heads: list = list(st.decorator_list)
    elif isinstance(st, (ast.Import, ast.ImportFrom)):
        for a in st.names:
            if a.name == "*":
                opaque = True
            names.add(a.asname or a.name.split(".")[0])
        heads = []
    elif isinstance(st, (ast.Try, getattr(ast, "TryStar", ast.Try))):
        names |= {h.name for h in st.handlers if h.name}
        heads = [h.type for h in st.handlers if h.type is not None]
    else:
        heads = []
        for field in ("targets", "target", "value", "iter", "test", "subject", "items", "exc", "msg"):
            v = getattr(st, field, None)
            if v is not None:
                heads += v if isinstance(v, list) else [v]
        heads += [c.pattern for c in getattr(st, "cases", []) or []]
    for h in heads:
        for n in ast.walk(h):
            if isinstance(n, ast.Name):
                if isinstance(n.ctx, (ast.Store, ast.Del)):
                    names.add(n.id)
                elif n.id in _OPAQUE_CALLS or n.id == "__builtins__":
                    opaque = True
            elif isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name):
                names.add(n.target.id)
            elif type(n).__name__ in ("MatchAs", "MatchStar") and getattr(n, "name", None):
                names.add(n.name)
    return frozenset(names), opaque


@functools.lru_cache(maxsize=8192)
def _index(source: str) -> tuple[tuple, tuple] | None:
    """One cell as the stub rule reads it (cached by source: a class shares most cells): its top-level
    statements as (line, names bound, opaque, the def node or None), and its check("id", name) calls as
    (id, line, name). None: the cell does not parse."""
    tree = parse(source)
    if tree is None:
        return None
    stmts = []
    for st in _top_statements(tree.body):
        names, opaque = _bound(st)
        if names or opaque:
            fn = st if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
            stmts.append((st.lineno, names, opaque, fn))
    calls = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and isinstance(node.args[1], ast.Name)):
            calls.append((node.args[0].value, node.lineno, node.args[1].id))
    return tuple(stmts), tuple(calls)


def _last_binding(index: list, name: str, upto: tuple[int, int] | None):
    """The def node of `name`'s last top-level binding before position `upto` (cell index, line; None: after
    every cell), or None when that binding is not a def, or is one the scan cannot follow, or there is none."""
    found = None
    for i, cell in enumerate(index):
        if upto is not None and i > upto[0]:
            break
        if cell is None:
            continue
        for line, names, opaque, fn in cell[0]:
            if upto is not None and i == upto[0] and line >= upto[1]:
                continue
            if name in names or opaque:
                found = fn if (fn is not None and fn.name == name and not opaque) else None
    return found


def _check_calls(index: list) -> dict[str, tuple[int, int, str]]:
    """exercise id -> (cell index, line, function name) of the last `check("id", name)` in the notebook (the
    worker keeps the function of the last call)."""
    calls: dict[str, tuple[int, int, str]] = {}
    for i, cell in enumerate(index):
        for ex, line, fn in cell[1] if cell is not None else ():
            if ex not in calls or (i, line) >= calls[ex][:2]:
                calls[ex] = (i, line, fn)
    return calls


def _released_stubs(released: list[Path]) -> tuple[dict[str, set[str]], dict[str, str], bool]:
    """From the released notebooks (files, or folders of them): exercise -> the shapes of its stub function,
    exercise -> the name its check cell hands in, and whether any released notebook could be read."""
    files: list[Path] = []
    for p in released:
        p = Path(p)
        files += sorted(p.glob("*.ipynb")) if p.is_dir() else [p]
    key = []
    for f in files:
        try:
            st = f.stat()
            key.append((str(f), st.st_mtime_ns, st.st_size))
        except OSError:
            continue
    return _released_stubs_of(tuple(key))


@functools.lru_cache(maxsize=256)
def _released_stubs_of(key: tuple) -> tuple[dict[str, set[str]], dict[str, str], bool]:
    from .notebooks import read_cells
    shapes: dict[str, set[str]] = {}
    names: dict[str, str] = {}
    found = False
    for f in (Path(k[0]) for k in key):
        try:
            index = [_index(c) for c in read_cells(f)]
        except ValueError:
            continue
        found = True
        for ex, (i, line, fn) in _check_calls(index).items():
            names.setdefault(ex, fn)
            st = _last_binding(index, fn, (i, line))
            if st is not None:
                shapes.setdefault(ex, set()).add(_shape(st))
    return shapes, names, found


def stub_exercises(cells: list[str], stem: str, released: list[Path]) -> tuple[set[str], bool]:
    """(the exercises whose graded function is the released stub, whether a released notebook was found).
    `cells`: the notebook's code cells; `released`: the released learner notebooks of `stem` (or folders of
    them). A question hands in a value, not a function: never a stub here. Without a released notebook only
    the NotImplementedError rule applies."""
    from ..core import REGISTRY
    shapes, names, found = _released_stubs(released)
    index = [_index(c) for c in cells]
    calls = _check_calls(index)
    stubs = set()
    for ex in set(names) | set(calls):
        if ex in REGISTRY and not REGISTRY[ex].takes_cases:
            continue
        if ex in calls:
            i, line, fn = calls[ex]
            st = _last_binding(index, fn, (i, line))
        else:                                       # its check cell gone: the released name, after every cell
            st = _last_binding(index, names[ex], None)
        if st is not None and (_only_raises_not_implemented(st) or _shape(st) in shapes.get(ex, ())):
            stubs.add(ex)
    return stubs, found


STUB_MESSAGE = N_("your function is still the released stub: it earns no points, whatever the notebook's process "
                  "reported")


def apply(report, cells: list[str], stem: str, released: list[Path] | None = None) -> bool:
    """The grader's own reading applied to a runner.NotebookReport, in place (a class run's and one learner's
    `tformer grade PATH`, after grade_cells): each row of a released stub "not attempted" with no points and
    `stub` set (a row never run stays "not run"), `report.flags` the flags. Returns whether a released notebook
    was found (else only the NotImplementedError rule applied)."""
    import dataclasses
    from ..messages import _
    from .notebooks import released_notebooks
    stubs, found = stub_exercises(cells, stem, released_notebooks().get(stem, []) if released is None else released)
    report.rows = [dataclasses.replace(row, passed=False, status="not attempted", message=_(STUB_MESSAGE), mistakes=[],
                                       fraction=None, stub=True)
                   if row.exercise in stubs and row.status != "not run" else row for row in report.rows]
    report.flags = flags(cells)
    return found


# --- flags for the teacher --------------------------------------------------------------------------------

def _tformer_module(name: str) -> bool:
    return name == "tformer" or name.startswith("tformer.")


def _grading_module(name: str) -> bool:
    return name == "tformer.grading" or name.startswith("tformer.grading.")


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _cell_flags(tree: ast.Module, imported: dict[str, str]) -> list[str]:
    """The reasons one cell is flagged; `imported` (name -> the tformer module or object it was bound from) is
    updated with the cell's imports (a later cell may use a name an earlier one imported)."""
    why: list[str] = []

    def say(text: str) -> None:
        if text not in why:
            why.append(text)

    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if _tformer_module(a.name):
                    imported[a.asname or a.name.split(".")[0]] = a.asname and a.name or a.name.split(".")[0]
                if _grading_module(a.name):
                    say(f"imports {a.name}")
                if a.name in ("gc", "ctypes") or a.name.startswith("ctypes."):
                    imported[a.asname or a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            for a in n.names:
                if _tformer_module(n.module):
                    imported[a.asname or a.name] = f"{n.module}.{a.name}"
                if n.module == "tformer" and a.name == "grading":
                    say("imports tformer.grading")
                elif _grading_module(n.module) and not (n.module == "tformer.grading" and a.name in ALLOWED_GRADING):
                    say(f"imports {a.name} from {n.module}")
                if n.module == "gc" and a.name in GC_WALKERS | {"*"}:
                    say(f"uses gc.{a.name} (walks the process's objects)")
                if n.module in ("sys", "inspect") and (n.module, a.name) in FRAME_WALKERS:
                    say(f"uses {n.module}.{a.name} (walks the call stack)")
                if (n.module, a.name) in TRACERS:
                    say(f"uses {n.module}.{a.name} (watches every call)")
                if n.module == "sys" and a.name == "modules":
                    say("uses sys.modules")
                if a.name in INTERNALS:
                    say(f"names {a.name}, a part of the grader")
        elif isinstance(n, ast.Attribute):
            d = _dotted(n)
            if n.attr in GC_WALKERS and d.split(".")[0] in {k for k, v in imported.items() if v == "gc"} | {"gc"}:
                say(f"uses gc.{n.attr} (walks the process's objects)")
            elif (d.rsplit(".", 1)[0], n.attr) in FRAME_WALKERS:
                say(f"uses {d} (walks the call stack)")
            elif (d.rsplit(".", 1)[0], n.attr) in TRACERS:
                say(f"uses {d} (watches every call)")
            elif n.attr in FRAME_ATTRS:
                say(f"reads .{n.attr} (a frame's variables)")
            elif n.attr in INTERNALS:
                say(f"names {n.attr}, a part of the grader")
            if _grading_module(d) and d != "tformer.grading.check":
                say(f"uses {d}")
            if d == "sys.modules" and not isinstance(n.ctx, ast.Load):
                say("edits sys.modules")
        elif isinstance(n, ast.Name) and n.id in NAMED_INTERNALS:
            say(f"names {n.id}, a part of the grader")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            s = n.value
            if "tformer.grading" in s or any(w in s for w in ("run_learner", "write_frame", "read_frame")):
                say(f"names {s[:60]!r} in a string")
            elif any(w in s for w in PIPES):
                w = next(w for w in PIPES if w in s).rstrip("/")
                say(f"names {w} (the process's open files, its protocol pipe among them)")
        # assignments to an attribute of something imported from tformer (a module, a class, a function)
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
            for t in targets:
                for tt in ast.walk(t):
                    if isinstance(tt, (ast.Attribute, ast.Subscript)) and not isinstance(tt.ctx, ast.Load):
                        base = _root(tt)
                        d = _dotted(tt.value) if isinstance(tt, ast.Attribute) else _dotted(tt.value)
                        if isinstance(base, ast.Name) and base.id in imported and _tformer_module(imported[base.id]):
                            say(f"assigns to {d or base.id}.{tt.attr if isinstance(tt, ast.Attribute) else '[...]'} "
                                f"(an attribute of {imported[base.id]})")
                        if d == "sys.modules" or (isinstance(tt, ast.Attribute) and _dotted(tt) == "sys.modules"):
                            say("edits sys.modules")
        if isinstance(n, ast.Call):
            f = n.func
            fd = _dotted(f)
            if fd in ("setattr", "delattr", "object.__setattr__") and n.args:
                base = _root(n.args[0])
                if isinstance(base, ast.Name) and base.id in imported and _tformer_module(imported[base.id]):
                    say(f"calls {fd} on {imported[base.id]}")
                elif isinstance(base, ast.Name) and base.id == "sys":
                    say(f"calls {fd} on sys")
            if isinstance(f, ast.Attribute) and _dotted(f.value) == "sys.modules" and f.attr in (
                    "pop", "update", "setdefault", "clear", "popitem", "__setitem__", "__delitem__"):
                say("edits sys.modules")
            if fd in ("__import__", "importlib.import_module", "import_module"):
                arg = n.args[0] if n.args else None
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    say(f"calls {fd} with a name built at run time")
                elif _grading_module(arg.value):
                    say(f"imports {arg.value}")
            if fd in ("exec", "eval", "compile") and n.args and not (
                    isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)):
                say(f"calls {fd} on code built at run time (the scan cannot read it)")
            code: list[str] = []
            if fd in ("exec", "eval", "compile") and n.args and isinstance(n.args[0], ast.Constant) \
                    and isinstance(n.args[0].value, str):
                code = [n.args[0].value]
            elif isinstance(f, ast.Attribute) and f.attr in ("run_line_magic", "run_cell_magic"):
                fd = "%" + str(getattr(n.args[0], "value", "magic")) if n.args else "magic"   # %time CODE, %%timeit
                code = [a.value for a in n.args[1:] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            for text in code:
                inner = parse(text)
                if inner is not None:
                    for w in _cell_flags(inner, imported):
                        say(f"{fd}(...) {w}" if not fd.startswith("%") else f"{fd} {w}")
    uses = [w for w in why if w.startswith("uses tformer.grading")]
    return [w for w in why if not (w in uses and any(u.startswith(w + ".") for u in uses))]


def flags(cells: list[str]) -> list[str]:
    """Cells that reach into the grader, one line each: "code cell N: imports tformer.grading.core; assigns
    to C.run_learner (an attribute of tformer.grading.core)". N counts the code cells from 1, as the cell errors
    do. A cell that does not parse is not flagged (it raises in the worker too)."""
    out = []
    imported: tuple = ()
    for i, src in enumerate(cells):
        why, imported = _flags_of(src, imported)
        if why:
            out.append(f"code cell {i + 1}: " + "; ".join(why[:6]) + ("; ..." if len(why) > 6 else ""))
    return out


@functools.lru_cache(maxsize=8192)
def _flags_of(source: str, imported: tuple) -> tuple[tuple[str, ...], tuple]:
    """One cell's flags, given what earlier cells imported (sorted (name, origin) pairs), and what is imported
    after it (cached: a class's notebooks share most cells)."""
    tree = parse(source)
    if tree is None:
        return (), imported
    names = dict(imported)
    why = _cell_flags(tree, names)
    return tuple(why), tuple(sorted(names.items()))

