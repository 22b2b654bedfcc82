"""Write requirements/constraints.txt: the installed version of every package the project needs.

    python requirements/freeze.py            (or `make constraints`, which then runs the tests)

It walks the requirements of pyproject.toml (dependencies and every extra) and of EXTRA below, and
theirs, with the markers of this interpreter, and pins what is installed. torch is left out: the
Makefile installs it first (CPU or CUDA build) and pins its version there (TORCH_VERSION).
The file is made for CI's Python (the version it names in its header); `make` uses it only there.
"""
from __future__ import annotations

import platform
import re
import sys
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "requirements" / "constraints.txt"
SKIP = {"torch", "tformer"}
# packages that parts of the course install on top (serving, the OpenAI-compatible client, translation of the
# site, Chinese word segmentation): pinned too, so that adding them later does not float
EXTRA = ["fastapi", "uvicorn", "prometheus-client", "openai", "httpx", "sphinx-intl", "jieba"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(reqs: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    todo = [(Requirement(r), ()) for r in reqs]
    seen: set[tuple[str, tuple]] = set()
    while todo:
        req, _ = todo.pop()
        name = _norm(req.name)
        if name in SKIP:
            continue
        extras = tuple(sorted(req.extras))
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            print(f"warning: {req.name} is not installed; not pinned", file=sys.stderr)
            continue
        pins[name] = dist.version
        for r in dist.requires or []:
            sub = Requirement(r)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in (extras or ("",))):
                todo.append((sub, ()))
    return pins


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    reqs = [r for r in reqs if Requirement(r).marker is None or Requirement(r).marker.evaluate()]
    pins = closure(reqs + EXTRA)
    py = ".".join(platform.python_version_tuple()[:2])
    lines = [f"# Versions `make test` last passed with, on Python {py} ({platform.system()}): pip constraints.",
             "# Made by `make constraints` (requirements/freeze.py); torch is pinned in the Makefile (TORCH_VERSION).",
             f"# python {py}"]
    lines += [f"{name}=={version}" for name, version in sorted(pins.items())]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(pins)} packages for Python {py}")
    make = re.search(r"^TORCH_VERSION\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    torch_version = metadata.version("torch").split("+")[0]
    if make and make.group(1) != torch_version:
        print(f"note: torch {torch_version} is installed but the Makefile pins TORCH_VERSION ?= {make.group(1)}; "
              f"change that line if the tests pass with {torch_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
