"""tformer/ imports only downward: each layer builds on the ones below it and never reaches back up.

    python tests/test_layers.py     prints the layer map, then every import that runs back up a layer,
                                    every cycle and the count of imports inside functions

Every import counts, at module level or inside a function, relative or absolute. The facade
tformer/__init__.py is exempt by name (it gathers names from every layer); a few pairs of modules are
exempt with their reason in EXCEPTIONS below.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tformer"

# Bottom first. A module belongs to the layer of its longest listed prefix; it may import its own layer
# and the ones below.
LAYERS = [
    ("ground", ["tformer.utils", "tformer.data"],
     "run-time switches, the device policy, errors, checks, plots; every loader and tokenizer"),
    ("core", ["tformer.masks", "tformer.kernels", "tformer.attention", "tformer.positional", "tformer.activations", "tformer.blocks",
              "tformer.dropout", "tformer.sparse", "tformer.efficient", "tformer.cache", "tformer.sampling",
              "tformer.moe"],
     "what the chapters build: attention and what surrounds it, the KV cache, sampling, mixture of experts"),
    ("models", ["tformer.models"], "the models, built from the core's blocks"),
    ("training and inference", ["tformer.training", "tformer.inference"],
     "training a model; generating from it"),
    ("measurement", ["tformer.measure"], "timing, tokens/s and MFU of training and inference"),
    ("commands", ["tformer.capstones", "tformer.translate", "tformer.serve", "tformer.grading", "tformer.grading.classroom",
                  "tformer.doctor", "tformer.cli", "tformer.__main__"],
     "what a learner or a teacher types: tformer capstone | translate | serve | grade | doctor"),
]

FACADE = "tformer"      # tformer/__init__.py: the names a chapter uses most, from every layer

# (importer, imported): why this import may run back up. At most three.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("tformer.models.gpt", "tformer.training.losses"):
        "GPT.loss fuses the output head into the cross-entropy (linear_cross_entropy), so the (B*T, vocab) logits "
        "are never kept; the fused loss is one of the losses and stays with them, called inside GPT.loss",
    ("tformer.models.transformer", "tformer.training.losses"):
        "Transformer.loss fuses its output head into the label-smoothed cross-entropy the same way "
        "(linear_cross_entropy, with the padding ignored), called inside Transformer.loss",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> int | None:
    best, rank = -1, None
    for i, (_, prefixes, _) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    return rank


def _resolve(target: str, known: dict[str, Path]) -> str | None:
    """The known module an import of `target` runs: itself, else its nearest enclosing package."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def imports(known: dict[str, Path] | None = None):
    """Every import of a tformer module inside tformer/: (importer, imported, file, line, in_function)."""
    known = known or modules()
    found = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                in_function.update(id(n) for n in ast.walk(node) if n is not node)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # `from pkg import mod` imports pkg.mod when it is a module, else a name of pkg
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
            for t in dict.fromkeys(targets):
                if t == "tformer" or t.startswith("tformer."):
                    resolved = _resolve(t, known)
                    if resolved and resolved != name:
                        found.append((name, resolved, path.relative_to(ROOT), node.lineno, id(node) in in_function))
    return found


def upward(found=None, exceptions=None):
    """The imports that run from a lower layer to a higher one, the facade and the exceptions left out."""
    found = imports() if found is None else found
    exceptions = EXCEPTIONS if exceptions is None else exceptions
    return [(a, b, f, n) for a, b, f, n, _ in found
            if a != FACADE and (a, b) not in exceptions
            and layer_of(a) is not None and layer_of(b) is not None and layer_of(b) > layer_of(a)]


def cycles(found=None):
    """The import cycles among tformer's modules (Tarjan's strongly connected components of two or more)."""
    found = imports() if found is None else found
    graph: dict[str, set[str]] = {}
    for a, b, *_ in found:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_map() -> str:
    known = modules()
    lines = ["tformer's layers, bottom first (a module imports its own layer and those below):"]
    for i, (label, prefixes, what) in enumerate(LAYERS):
        names = sorted(n for n in known if layer_of(n) == i)
        lines.append(f"  {i} {label}: {what}")
        lines.append("      " + ", ".join(p.removeprefix("tformer.") for p in prefixes)
                     + f"  ({len(names)} modules)")
    lines.append("  exempt: tformer/__init__.py (the facade)")
    lines += [f"  exception: {a} -> {b}: {why}" for (a, b), why in EXCEPTIONS.items()]
    return "\n".join(lines)


def describe(a, b, f, n) -> str:
    return f"{f}:{n}: {a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"


def test_every_module_has_a_layer():
    lost = [n for n in modules() if n != FACADE and layer_of(n) is None]
    assert not lost, f"place these modules in a layer of tests/test_layers.py: {lost}\n\n{layer_map()}"


def test_no_import_runs_back_up_a_layer():
    up = upward()
    assert not up, ("imports that run back up a layer:\n  " + "\n  ".join(describe(*u) for u in up)
                    + f"\n\n{layer_map()}")


def test_the_exceptions_are_few_named_and_used():
    assert len(EXCEPTIONS) <= 3, "at most three exceptions to the layers"
    found = {(a, b) for a, b, *_ in imports()}
    for (a, b), why in EXCEPTIONS.items():
        assert why.strip(), f"{a} -> {b} needs its reason"
        assert (a, b) in found, f"{a} no longer imports {b}: remove the exception"
        assert layer_of(b) > layer_of(a), f"{a} -> {b} runs downward: it needs no exception"


def test_no_import_cycles():
    found = cycles()
    assert not found, "import cycles (imports inside functions count):\n  " + "\n  ".join(
        " <-> ".join(c) for c in found)


def test_no_import_cycles_among_the_benchmarks():
    # the scripts of benchmarks/ import one another by name (each puts its folder on sys.path)
    bench = ROOT / "benchmarks"
    names = {p.stem for p in bench.glob("*.py")}
    found = []
    for p in sorted(bench.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [(p.stem, t, p.relative_to(ROOT), node.lineno, False) for t in targets if t in names]
    loops = cycles(found)
    assert not loops, "import cycles among benchmarks/:\n  " + "\n  ".join(" <-> ".join(c) for c in loops)


def private_imports(root: Path = PACKAGE) -> list[str]:
    """`from M import _name` anywhere in the package: a private name used outside its module (gettext's `_`
    is the one public underscore)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                found += [f"{path.relative_to(root.parent)}:{node.lineno} imports {a.name} from {node.module}"
                          for a in node.names if a.name.startswith("_") and a.name != "_" and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_name(tmp_path):
    assert private_imports() == [], "make the name public (it crosses modules): " + "; ".join(private_imports())
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("from .b import _helper, _\n")
    assert private_imports(tmp_path / "pkg") == ["pkg/a.py:1 imports _helper from b"]        # the check sees one


def test_the_test_sees_an_import_back_up(tmp_path, monkeypatch):
    # a ground module that imports the trainer inside a function is caught, with its file and line
    bad = tmp_path / "tformer" / "utils" / "bad.py"
    bad.parent.mkdir(parents=True)
    (tmp_path / "tformer" / "__init__.py").write_text("")
    (tmp_path / "tformer" / "utils" / "__init__.py").write_text("")
    (tmp_path / "tformer" / "training").mkdir()
    (tmp_path / "tformer" / "training" / "__init__.py").write_text("from ..utils import bad\n")
    bad.write_text("import os\n\n\ndef f():\n    from ..training import Trainer\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "tformer")
    up = upward()
    assert [describe(*u) for u in up] == [
        f"{Path('tformer/utils/bad.py')}:5: tformer.utils.bad (ground) imports tformer.training "
        "(training and inference)"]
    assert cycles() == [["tformer.training", "tformer.utils.bad"]]


def counts() -> dict[str, int]:
    found = imports()
    up, raw = upward(found), upward(found, exceptions={})
    trees = [ast.parse(p.read_text(encoding="utf-8")) for p in modules().values()]
    inside = {id(n) for t in trees for f in ast.walk(t) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f) if n is not f}
    in_functions = sum(1 for t in trees for n in ast.walk(t)
                       if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) in inside)
    return {"upward import statements": len({(f, n) for *_, f, n in raw}),
            "upward module pairs": len({(a, b) for a, b, *_ in raw}),
            "upward module pairs outside the exceptions": len({(a, b) for a, b, *_ in up}),
            "import cycles": len(cycles(found)),
            "imports inside functions (all)": in_functions,
            "imports of tformer inside functions": sum(1 for *_, inf in found if inf),
            "tformer modules": len(modules())}


if __name__ == "__main__":
    print(layer_map())
    for u in upward():
        print("  up:", describe(*u))
    for c in cycles():
        print("  cycle:", " <-> ".join(c))
    for k, v in counts().items():
        print(f"{k}: {v}")
