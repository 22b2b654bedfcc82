"""Which code cells of a learner's notebook must run to grade it: the fast path of `tformer class grade`.

Most of a chapter's code cells are its experiments, the same in every student's copy. The exercises need far
fewer: their own definition and check cells and what those use. The rule:

- A cell that differs from every released cell of its notebook always runs. The released cells are the code
  cells of the learner notebooks the course hands out, `notebooks/NN_*.ipynb` and `notebooks/zh/NN_*.ipynb`
  (the same code in both); cells are matched by content (trailing spaces and blank lines aside), so a moved
  cell is still recognised and an edited one always runs.
- A released cell runs when it calls `check`, when it is the notebook's first code cell (the imports), when
  it changes torch's defaults (`set_default_dtype`, ...), or when it binds or changes a name that a running
  cell needs; repeated until nothing more is needed. "Needs" is every global name a running cell reads,
  inside its functions too (so a helper or a global a learner's function uses is defined as in a full run);
  "binds or changes" is an assignment, import, `def`, `class`, `del`, an assignment to an attribute or
  item, or an in-place method call (`x.add_(...)`, `params.update(...)`) on that name; calls and
  assignments on an imported module (`torch.manual_seed(0)`) do not count, except those that change torch's
  defaults (above). The worker seeds the global generators before each check, so skipped seeding is harmless.
- A released cell that cannot be parsed runs.

Every cell that defines a needed name runs, wherever it is, in the notebook's order: the exercises' functions
are called after the last cell, so they see the same globals as in a full run.
"""
from __future__ import annotations

import ast
import builtins
import functools
import symtable
from dataclasses import dataclass, field
from pathlib import Path

from .notebooks import read_cells, released_dirs, released_notebooks

_BUILTINS = frozenset(dir(builtins))
_MUTATORS = frozenset({"update", "append", "extend", "insert", "pop", "popitem", "clear", "setdefault", "remove",
                       "add", "discard", "sort", "reverse", "load_state_dict", "add_module", "register_buffer",
                       "register_parameter", "register_forward_hook", "register_forward_pre_hook", "apply", "train",
                       "eval", "to", "cuda", "cpu", "float", "double", "half", "bfloat16", "zero_grad", "step",
                       "backward", "fit", "requires_grad_", "share_memory", "seed", "manual_seed"})
_GLOBAL_STATE = frozenset({"set_default_dtype", "set_default_device", "set_default_tensor_type",
                           "set_flush_denormal", "use_deterministic_algorithms", "set_grad_enabled"})


def normalize(source: str) -> str:
    """A cell's source as cells are matched: trailing spaces and leading/trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in source.strip("\n").splitlines()).strip("\n")


def released_cells(dirs: tuple[Path, ...] | None = None) -> dict[str, frozenset[str]]:
    """Notebook stem -> the normalized sources of its released code cells (English and Chinese, and a
    teacher's released notebooks)."""
    return _released_cells(dirs if dirs is not None else released_dirs())


@functools.lru_cache(maxsize=None)
def _released_cells(dirs: tuple[Path, ...]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for stem, paths in released_notebooks(dirs).items():
        for path in paths:
            try:
                cells = read_cells(path)
            except ValueError:
                continue
            found.setdefault(stem, set()).update(normalize(src) for src in cells)
    return {stem: frozenset(cells) for stem, cells in found.items()}


@dataclass
class CellNames:
    defines: set[str] = field(default_factory=set)    # names the cell binds (assignment, import, def, ...)
    changes: set[str] = field(default_factory=set)    # names whose object it changes (x.a = , x.add_(...))
    imports: set[str] = field(default_factory=set)    # names it binds to modules
    needs: set[str] = field(default_factory=set)      # global names it reads
    checks: bool = False                              # it calls check(...)
    global_state: bool = False                        # it changes torch's defaults
    parsed: bool = True


def python_of(source: str) -> str:
    """IPython syntax (magics, `!cmd`) as Python; a `%%` cell magic's body as the cell."""
    lines = source.lstrip("\n").splitlines()
    if lines and lines[0].startswith("%%"):
        source = "\n".join(lines[1:])
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def _globals_read(table: symtable.SymbolTable, out: set[str]) -> None:
    for child in table.get_children():
        for sym in child.get_symbols():
            if sym.is_referenced() and (sym.is_global() or (child.get_type() == "class" and not sym.is_local())):
                out.add(sym.get_name())
        _globals_read(child, out)


@functools.lru_cache(maxsize=4096)
def cell_names(source: str) -> CellNames:
    """What one cell binds and reads at the notebook's global level."""
    names = CellNames()
    try:
        code = python_of(source)
        tree = ast.parse(code)
        table = symtable.symtable(code, "<cell>", "exec")
    except Exception:                    # SyntaxError, ValueError, RecursionError, IPython's transformer: unparsed
        names.parsed = False
        return names
    for sym in table.get_symbols():
        if sym.is_assigned() or sym.is_imported() or sym.is_namespace():
            names.defines.add(sym.get_name())
        if sym.is_imported():
            names.imports.add(sym.get_name())
        if sym.is_referenced():
            names.needs.add(sym.get_name())
    _globals_read(table, names.needs)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.defines.update(node.names)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            base = node
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if isinstance(base, ast.Name):
                names.changes.add(base.id)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "check":
                names.checks = True
            if isinstance(f, ast.Attribute):
                if f.attr in _GLOBAL_STATE:
                    names.global_state = True
                base = f.value
                while isinstance(base, (ast.Attribute, ast.Subscript)):
                    base = base.value
                if isinstance(base, ast.Name) and (f.attr in _MUTATORS or (f.attr.endswith("_") and not f.attr.startswith("_"))):
                    names.changes.add(base.id)
    names.needs -= _BUILTINS
    return names


@dataclass
class Plan:
    run: list[int]              # indices (among the code cells) to run, in order
    skipped: list[int]          # released cells left out
    edited: list[int]           # cells that differ from every released cell (always run)


def plan(cells: list[str], released: frozenset[str] | None) -> Plan:
    """The code cells to run for grading (indices into `cells`); every cell when `released` is None."""
    if not released:
        return Plan(list(range(len(cells))), [], list(range(len(cells))))
    keys = [normalize(c) for c in cells]
    edited = [i for i, k in enumerate(keys) if k not in released]
    run = set(edited)
    for i, src in enumerate(cells):
        n = cell_names(src)
        if i in run or not keys[i]:
            continue
        first = i == next((j for j, k in enumerate(keys) if k), None)
        if first or n.checks or n.global_state or not n.parsed:
            run.add(i)
    modules = set().union(*(cell_names(c).imports for c in cells)) if cells else set()
    binds = [cell_names(c).defines | (cell_names(c).changes - modules) for c in cells]
    needed: set[str] = set()
    grew = True
    while grew:
        grew = False
        for i in sorted(run):
            needed |= cell_names(cells[i]).needs
        for i, src in enumerate(cells):
            if i not in run and keys[i] and binds[i] & needed:
                run.add(i)
                grew = True
    order = sorted(run)
    return Plan(order, [i for i in range(len(cells)) if i not in run and keys[i]], edited)
