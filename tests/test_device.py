"""tformer.utils.device: the one device and dtype policy, tested on the CPU with each machine injected
(CUDA of a given compute capability, Apple's MPS, TFORMER_DEVICE), and a scan showing no module decides alone."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend

from tformer.utils import device as policy
from tformer.utils.device import DeviceError, choose

ROOT = Path(__file__).resolve().parent.parent
BF16, FP16 = torch.bfloat16, torch.float16
FLASH, EFFICIENT, MATH = SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH


@pytest.mark.parametrize("cap,dtype,backend", [((7, 5), FP16, EFFICIENT), ((8, 0), BF16, FLASH),
                                               ((9, 0), BF16, FLASH)])
@pytest.mark.parametrize("mps", [False, True])
def test_cuda_first_with_dtype_and_kernel_by_compute_capability(cap, dtype, backend, mps):
    p = choose(small=False, env="", cuda=True, mps=mps, capability=cap)
    assert (p.device.type, p.amp_dtype, p.backend, p.capability) == ("cuda", dtype, backend, cap)
    assert "CUDA" in p.reason


@pytest.mark.parametrize("bf16_safe,dtype", [(False, None), (True, BF16)])
def test_mps_without_cuda_in_float32_unless_doctor_found_bf16_safe(bf16_safe, dtype):
    p = choose(small=False, env="", cuda=False, mps=True, mps_bf16=bf16_safe)
    assert (p.device.type, p.amp_dtype, p.backend, p.capability) == ("mps", dtype, MATH, None)
    assert p.dtype_name == ("bfloat16" if bf16_safe else "float32")


def test_cpu_when_there_is_no_accelerator():
    p = choose(small=False, env="", cuda=False, mps=False)
    assert (p.device.type, p.amp_dtype, p.backend) == ("cpu", None, FLASH)


@pytest.mark.parametrize("asked,native,dtype", [(False, True, None), (False, False, None), (True, False, None),
                                                (True, True, BF16)])
def test_a_cpu_trains_in_bf16_only_when_the_recipe_asks_and_the_cpu_multiplies_bf16_natively(asked, native, dtype):
    assert policy.amp_dtype("cpu", cpu_bf16=asked, cpu_native=native) == dtype
    assert policy.amp_dtype("cuda", capability=(8, 0), cpu_bf16=asked, cpu_native=native) == BF16   # CUDA: as before


def test_the_cpu_bf16_check_reads_this_cpu(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert not policy.cpu_bf16_native() and policy.amp_dtype("cpu", cpu_bf16=True) is None
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert policy.cpu_bf16_native() and policy.amp_dtype("cpu", cpu_bf16=True) == BF16


@pytest.mark.parametrize("cuda,mps", [(True, False), (False, True), (True, True)])
def test_small_mode_stays_on_the_cpu_but_capstone_commands_do_not(cuda, mps):
    assert choose(small=True, env="", cuda=cuda, mps=mps, capability=(9, 0)).device.type == "cpu"
    p = choose(small=True, capstone=True, env="", cuda=cuda, mps=mps, capability=(9, 0), mps_bf16=False)
    assert p.device.type == ("cuda" if cuda else "mps")


@pytest.mark.parametrize("env,kind", [("cpu", "cpu"), ("CUDA", "cuda"), (" mps ", "mps")])
def test_tformer_device_overrides_everything(env, kind):
    for small in (False, True):
        p = choose(small=small, env=env, cuda=True, mps=True, capability=(8, 0), mps_bf16=False)
        assert p.device.type == kind and "TFORMER_DEVICE" in p.reason
    assert choose(env="cpu", cuda=True, mps=False, capability=(8, 0)).amp_dtype is None


@pytest.mark.parametrize("env,cuda,mps,words", [("tpu", True, True, ["one of cpu, cuda, mps", "'tpu'"]),
                                                ("cuda", False, True, ["TFORMER_DEVICE=cuda", "no CUDA GPU"]),
                                                ("mps", True, False, ["TFORMER_DEVICE=mps", "MPS"])])
def test_a_bad_or_missing_device_is_one_clear_error(env, cuda, mps, words):
    with pytest.raises(DeviceError) as e:
        choose(small=False, env=env, cuda=cuda, mps=mps, capability=(8, 0))
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words) and "unset" in msg, msg


def test_the_environment_variable_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv("TFORMER_DEVICE", "cpu")
    assert policy.device() == torch.device("cpu") and policy.resolve().type == "cpu"
    import tformer
    assert tformer.device() == torch.device("cpu")
    monkeypatch.setenv("TFORMER_DEVICE", "tpu")
    with pytest.raises(DeviceError):
        tformer.device()
    assert policy.resolve("cpu") == torch.device("cpu")       # an explicit --device wins over the variable
    with pytest.raises(DeviceError, match="one of cpu, cuda, mps"):
        policy.resolve("meta")
    monkeypatch.setattr(policy, "cuda_available", lambda: False)
    monkeypatch.setattr(policy, "mps_available", lambda: False)
    for name in ("cuda", "cuda:1", "mps"):
        with pytest.raises(DeviceError, match="use cpu"):
            policy.resolve(name)


def test_mps_bf16_finding_is_stored_per_torch_version_in_the_data_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path))
    assert not policy.mps_bf16_safe()
    path = policy.store_mps_bf16(True, 1e-3)
    assert path.parent.parent == tmp_path and torch.__version__ in path.name
    assert policy.mps_bf16_safe() and choose(small=False, env="", cuda=False, mps=True).amp_dtype == BF16
    policy.store_mps_bf16(False, 0.5)
    assert choose(small=False, env="", cuda=False, mps=True).amp_dtype is None
    path.write_text("not json")
    assert not policy.mps_bf16_safe()


@pytest.mark.parametrize("value", ["tpu", "mps"])
def test_a_bad_tformer_device_is_one_line_at_the_command_line(value):
    if value == "mps" and policy.mps_available():
        pytest.skip("this machine has MPS")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TFORMER_DEVICE": value}
    r = subprocess.run([sys.executable, "-m", "tformer", "doctor"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "TFORMER_DEVICE" in r.stderr and value in r.stderr
    assert "Traceback" not in r.stderr and "unset it" in r.stderr


# -- nobody else decides -------------------------------------------------------------------------------------
# Asking torch which accelerators exist, or choosing "cuda" by hand, belongs in tformer/utils/device.py.
# Allowed elsewhere: CUDA RNG state and synchronisation, which act on whatever device a run uses.
ALLOWED = {("training/checkpoint.py", "rng_state"), ("training/checkpoint.py", "set_rng_state"),
           ("measure/timing.py", "synchronize"), ("utils/gpu.py", "dist_plan"),   # its GPU count
           ("doctor.py", "environment")}


def _decisions(tree: ast.AST):
    """(function, line, what) for every device decision in a module."""
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def where(node):
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
        return "<module>"

    for node in ast.walk(tree):
        text = ast.unparse(node) if isinstance(node, (ast.Call, ast.IfExp)) else ""
        if isinstance(node, ast.Call) and text.startswith(("torch.cuda.is_available(", "torch.backends.mps.is_available(",
                                                           "torch.cuda.device_count(")):
            yield where(node), node.lineno, text
        elif isinstance(node, ast.Call) and text.startswith("torch.device(") and node.args and \
                isinstance(node.args[0], ast.Constant) and node.args[0].value in ("cuda", "mps"):
            yield where(node), node.lineno, text
        elif isinstance(node, ast.IfExp) and any(isinstance(n, ast.Constant) and n.value in ("cuda", "mps")
                                                 for n in (node.body, node.orelse)):
            yield where(node), node.lineno, text


def test_no_module_decides_its_own_device():
    offenders = []
    for path in sorted([*(ROOT / "tformer").rglob("*.py"), *(ROOT / "notebooks" / "src").glob("*.py")]):
        rel = path.relative_to(ROOT / "tformer").as_posix() if path.is_relative_to(ROOT / "tformer") else path.name
        if rel == "utils/device.py":
            continue
        for func, line, text in _decisions(ast.parse(path.read_text(encoding="utf-8"))):
            if (rel, func) not in ALLOWED:
                offenders.append(f"{path.relative_to(ROOT)}:{line} ({func}): {text[:80]}")
    assert offenders == [], "ask tformer.utils.device instead:\n" + "\n".join(offenders)


def test_the_scan_sees_a_decision():
    code = ("import torch\ndef f():\n    return torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "def g():\n    return torch.device('mps')\n")
    found = {(f, t.split("(")[0]) for f, _, t in _decisions(ast.parse(code))}
    assert ("f", "torch.cuda.is_available") in found and ("g", "torch.device") in found
    assert any(f == "f" and "if" in t for f, _, t in _decisions(ast.parse(code)))
