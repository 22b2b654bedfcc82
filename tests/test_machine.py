"""The machine's probe and its class (tformer.measure.machine): one table, read by `tformer doctor`, the README
and the capstones.

* A probe measures a positive float32 rate in about a second, names the CPU and its threads.
* Each class is picked by the probe it is meant for (fake probes), in the table's order; a wrong name is an
  error naming the classes.
* The README's hardware table is the module's table, row for row.
* `tformer doctor` prints the probe's line and its class (tests/test_doctor.py, as typed).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tformer.measure import machine

ROOT = Path(__file__).resolve().parents[1]


def fake(device="cpu", float32=68.0, bf16_units=False, capability=None, threads=2) -> machine.Probe:
    return machine.Probe(device, "a test machine", threads, float32, bf16_units=bf16_units, capability=capability)


def test_a_probe_measures_this_cpu():
    p = machine.probe("cpu", seconds=0.1, n=256)
    assert p.device == "cpu" and p.float32 > 0 and p.threads >= 1 and p.name
    assert p.line().startswith(f"this CPU ({p.name}): ") and "GFLOP/s float32" in p.line()
    assert (p.low is None) == (not p.bf16_units)
    assert machine.classify(p).name in machine.NAMES


@pytest.mark.parametrize("probe, name", [
    (fake(), "cpu-avx2"),
    (fake(float32=machine.FAST_CPU - 1, threads=8), "cpu-avx2"),
    (fake(float32=machine.FAST_CPU, threads=8), "cpu-fast"),
    (fake(float32=177.0), "cpu-avx2"),                     # 2 fast cores are still 2 cores (a recent EPYC)
    (fake(float32=40.0, bf16_units=True), "cpu-bf16"),      # bf16 units first, whatever its float32 rate
    (fake("mps", 2000.0), "mps"),
    (fake("cuda", 8000.0, capability=(7, 5)), "gpu-fp16"),  # a T4
    (fake("cuda", 50000.0, capability=(9, 0)), "gpu"),
])
def test_each_class_takes_the_probe_it_is_for(probe, name):
    assert machine.classify(probe).name == name


def test_a_class_by_name_and_a_wrong_name():
    assert machine.by_name("cpu-avx2").name == "cpu-avx2"
    with pytest.raises(ValueError, match="unknown machine class 'avx2': expected one of gpu, gpu-fp16, mps"):
        machine.by_name("avx2")


def test_the_readme_shows_the_table():
    text = (ROOT / "README.md").read_text()
    assert machine.markdown_table() in text, "README.md's hardware table differs from tformer.measure.machine's"
