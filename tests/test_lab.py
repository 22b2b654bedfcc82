"""`make lab` starts JupyterLab (also as root) and serves the chapter notebooks: a user's first minute."""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent          # the environment running the tests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_as_printed_adds_allow_root_only_for_root():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-o", "install", "lab", f"VENV={VENV}", "LAB_ARGS=--ip=0.0.0.0 --no-browser"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if "jupyter lab" in x)
    assert line.endswith("--ip=0.0.0.0 --no-browser notebooks/")
    assert ("--allow-root" in line) == (os.geteuid() == 0)


def test_make_doctor_runs_the_venvs_doctor():
    """The README's `make doctor`: the venv's `tformer doctor` (tests/test_doctor.py runs that command)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "--no-print-directory", "-n", "-o", "install", "doctor", f"VENV={VENV}"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"{VENV}/bin/tformer doctor" in out.splitlines(), out           # under `make test` too


def test_make_lab_serves_the_chapter_notebooks(tmp_path):
    if shutil.which("make") is None or not (VENV / "bin" / "jupyter").exists():
        pytest.skip("needs make and jupyter in the test environment")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "BROWSER": "true"}
    # exactly `make lab` (install already done: -o install), with the usual server options
    cmd = ["make", "-o", "install", "lab", f"VENV={VENV}",
           f"LAB_ARGS=--no-browser --ip=127.0.0.1 --port={port} --ServerApp.port_retries=0 "
           f"--IdentityProvider.token={token}"]
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/api/contents?token={token}"
        listing, deadline = None, time.monotonic() + 180      # start-up on a busy CPU: wait, never assert a time
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    listing = json.load(r)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        assert listing is not None, f"JupyterLab did not answer:\n{(tmp_path / 'lab.log').read_text()[-3000:]}"
        served = {item["name"] for item in listing["content"]}
        chapters = {p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
        assert chapters and chapters <= served
        # no "official Jupyter news" pop-up: make install put the override into the environment
        plugin = "@jupyterlab/apputils-extension:notification"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab/api/settings/{plugin}?token={token}", timeout=10) as r:
            setting = json.load(r)
        defaults = {k: v.get("default") for k, v in setting["schema"]["properties"].items()}
        assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, defaults
        with pytest.raises(urllib.error.HTTPError) as e:       # and it wants the token
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=5)
        assert e.value.code == 403
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
