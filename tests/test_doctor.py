"""`tformer doctor` end to end on the CPU (every check runs and passes), and a parity check fed a wrong kernel
fails and names it."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tformer import doctor
from tformer.measure import machine
from tformer.utils.device import choose

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """`tformer doctor --json` as typed, from a folder outside the checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("TFORMER_DEVICE", None)
    r = subprocess.run([str(Path(sys.executable).with_name("tformer")), "doctor", "--json"], env=env,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path_factory.mktemp("doctor"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.slow
def test_doctor_on_the_cpu_runs_every_check_and_they_pass(report):
    env = report["environment"]
    assert env["device"] == "cpu" and env["autocast dtype"] == "float32" and env["hub"].startswith("offline")
    for key in ("os", "python", "torch", "why", "cpu cores", "torch threads", "ram", "data cache", "packages"):
        assert env[key] not in (None, ""), key
    names = [c["name"] for c in report["checks"]]
    for op in ("attention (tformer", "SDPA MATH", "SDPA FLASH", "multi-head", "LayerNorm", "cross-entropy",
               "GPT training step", "AdamW", "MoE", "autocast"):
        assert any(op in n for n in names), op
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert report["passed"] and set(statuses.values()) <= {"PASS", "SKIP"}, statuses
    assert statuses["attention (SDPA MATH)"] == "PASS" and statuses["GPT training step: loss and every gradient"] == "PASS"
    for c in report["checks"]:
        if c["status"] == "PASS":
            assert 0 <= c["max_error"] <= c["atol"] and c["dtype"] == "float32"
    e = report["expect"]
    assert e["tokens_per_s"] > 0 and [t["preset"] for t in e["tiers"]] == ["tiny", "small", "gpu", "base", "big"]
    assert all(t["seconds"] > 0 for t in e["tiers"])
    assert sorted(t["seconds"] for t in e["tiers"][2:]) == [t["seconds"] for t in e["tiers"][2:]]   # gpu < base < big
    m = report["machine"]                   # the probe and this machine's row of the README's hardware table
    assert m["probe"]["device"] == "cpu" and m["probe"]["float32"] > 0 and m["class"].startswith("cpu-")
    assert m["line"].startswith("this CPU (") and m["chapters"] == machine.by_name(m["class"]).chapters


@pytest.mark.slow
def test_the_table_has_one_line_per_check(report):
    out = io.StringIO()
    doctor._print(report, file=out)
    text = out.getvalue()
    lines = [ln for ln in text.splitlines() if ln.strip().startswith(("PASS", "FAIL", "SKIP"))]
    assert len(lines) == len(report["checks"])
    assert "tokens/s" in text and "every check passed" in text and "--preset" in text
    assert f"This machine: {report['machine']['line']}" in text and report["machine"]["class"] in text


def _wrong_on_the_device(q, k, v, mask):
    """Right in float64 (the reference run), 1% off in float32: a backend bug of the kind the doctor is for."""
    from tformer.attention import scaled_dot_product_attention
    out = scaled_dot_product_attention(q, k, v, mask)[0]
    return out if out.dtype == torch.float64 else out * 1.01


def test_a_wrong_kernel_fails_and_is_named():
    check = doctor.attention_check(_wrong_on_the_device, name="attention (a broken kernel)")
    r = doctor.run_check(check, torch.device("cpu"))
    assert r.status == "FAIL" and r.name == "attention (a broken kernel)"
    assert r.max_error > check.atol and "largest difference" in r.message and "TFORMER_DEVICE=cpu" in r.advice
    ok = doctor.run_check(doctor.attention_check(), torch.device("cpu"))
    assert ok.status == "PASS" and ok.max_error < 1e-5


def test_a_kernel_that_crashes_fails_without_stopping_the_doctor():
    def crash(q, k, v, mask):
        raise RuntimeError("MPS backend out of memory")
    r = doctor.run_check(doctor.attention_check(crash, name="attention (crashing)"), torch.device("cpu"))
    assert r.status == "FAIL" and "RuntimeError" in r.message and "out of memory" in r.message


def test_each_parity_check_passes_on_the_cpu():
    p = choose(small=False, env="", cuda=False, mps=False)
    for check in doctor.checks(p):
        if "SDPA" in check.name or "GPT" in check.name:
            continue                       # run in the end-to-end test
        r = doctor.run_check(check, torch.device("cpu"))
        assert r.status == "PASS", (r.name, r.message)


def test_versions_that_differ_from_the_tested_ones_are_listed():
    have = torch.__version__.split("+")[0]
    diffs = doctor.version_differences({"torch": have, "pytest": "0.0.1", "no-such-package-xyz": "1.0"})
    assert {d["name"]: d["installed"] for d in diffs} == {"pytest": pytest.__version__, "no-such-package-xyz": None}


def test_the_repository_pins_are_read():
    pins = doctor.pinned()
    assert "torch" in pins and "+" not in pins["torch"]          # the Makefile's pin, without a local label
    assert "numpy" in pins and "transformers" in pins            # requirements/constraints.txt


def test_the_constraints_pin_every_requirement_within_pyprojects_ranges():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + sum(project["optional-dependencies"].values(), [])]
    text = (ROOT / "requirements" / "constraints.txt").read_text()
    assert "\n# python 3.11\n" in text                        # made for CI's Python (the Makefile reads this line)
    pins = {k: v for k, v in doctor.pinned().items() if k != "torch"}
    assert pins and not [v for v in pins.values() if "+" in v], "no local version labels in the constraints"
    for r in reqs:
        if r.marker is not None and not r.marker.evaluate({"python_version": "3.11"}):
            continue
        name = r.name.lower().replace("_", "-")
        want = doctor.pinned()[name] if name == "torch" else pins.get(name)
        assert want is not None, f"{r.name} is not in requirements/constraints.txt: run `make constraints`"
        assert r.specifier.contains(Version(want)), f"{r.name}=={want} is outside pyproject.toml's {r.specifier}"


def test_the_bf16_finding_is_stored_for_the_policy(tmp_path, monkeypatch):
    """What doctor does on MPS, run on the CPU (which has bf16 autocast): the result lands in the data cache."""
    from tformer.utils import device as policy
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path))
    r = doctor.try_bf16(torch.device("cpu"))
    assert r.status == "PASS" and r.dtype == "bfloat16" and 0 < r.max_error <= r.atol, r
    assert policy.mps_bf16_path().is_file() and policy.mps_bf16_safe()
    assert choose(small=False, env="", cuda=False, mps=True).amp_dtype == torch.bfloat16
