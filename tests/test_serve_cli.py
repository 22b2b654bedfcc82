"""`tformer serve` as typed: the entry point in a process of its own, started from a folder outside the checkout
with every option a user can give, then the official `openai` client and plain HTTP against it; and its bad
input, one line on stderr and exit 2, before a model loads. (tests/test_serve.py tests the app in-process.)"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from test_grade_cli import CHECKOUT, one_line_error, tformer_all


def start(cwd, *args) -> tuple[subprocess.Popen, str]:
    """`tformer serve ARGS` in the background; (the process, the URL its first line names) once /health answers."""
    assert not cwd.resolve().is_relative_to(CHECKOUT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(CHECKOUT)
    proc = subprocess.Popen([sys.executable, "-m", "tformer", "serve", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with selectors.DefaultSelector() as sel:                  # the first line, or the process's end: 120 s at most
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if sel.select(timeout=120) else ""
    if not line.startswith("tformer serve: "):
        proc.kill()
        pytest.fail(f"no first line from tformer serve: {line!r} {proc.stderr.read()[-2000:]}")
    url = line.split(" on ")[-1].strip()                      # http://HOST:PORT/v1
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url.removesuffix("/v1") + "/health", timeout=5)
            return proc, url
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"tformer serve never answered on {url}: {proc.stderr.read()[-2000:]}")
            time.sleep(0.2)


def test_every_option_as_typed(tmp_path):
    proc, url = start(tmp_path, "--demo", "--host", "127.0.0.1", "--port", "0", "--name", "tiny-demo",
                      "--api-key", "sekrit", "--dtype", "bfloat16", "--block-size", "8", "--n-blocks", "40",
                      "--max-running", "1", "--max-waiting", "1")
    try:
        host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
        assert host == "127.0.0.1" and int(port) > 0, url           # --port 0: the port the system chose, printed
        health = httpx.get(url.removesuffix("/v1") + "/health").json()
        assert (health["total_blocks"], health["block_size"], health["max_running"], health["max_waiting"],
                health["dtype"]) == (40, 8, 1, 1, "bfloat16"), health
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        c = openai.OpenAI(base_url=url, api_key="sekrit", max_retries=0)
        assert [m.id for m in c.models.list()] == ["tiny-demo"]
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="demo", prompt="a", max_tokens=2)
        first = c.completions.create(model="tiny-demo", prompt="a", max_tokens=200, stream=True)
        next(iter(first))                                           # decoding: the one --max-running allows
        second = c.completions.create(model="tiny-demo", prompt="b", max_tokens=5, temperature=0, stream=True)
        with pytest.raises(openai.RateLimitError):                  # the queue of --max-waiting 1 is full
            c.completions.create(model="tiny-demo", prompt="c", max_tokens=5)
        first.close()
        out = "".join(ch.choices[0].text for ch in second)
        assert out and c.completions.create(model="tiny-demo", prompt="b", max_tokens=5, temperature=0
                                            ).choices[0].text == out   # served again, the same answer
    finally:
        proc.send_signal(signal.SIGINT)                             # Ctrl-C: uvicorn shuts down, then the CLI's
                                                                    # usual word for it: one line, exit 130
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    err = proc.stderr.read()
    assert code == 130 and err.strip() == "tformer serve: interrupted", (code, err[-2000:],
                                                                         proc.stdout.read()[-2000:])


def test_bad_options_are_one_line_before_a_model_loads(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        cases = [(["--port", "70000"], ["--port", "65535"]),
                 (["--port", str(port)], [f"127.0.0.1:{port}", "another --port"]),
                 (["--host", "192.0.2.1", "--port", "0"], ["192.0.2.1", "--port"]),     # not this machine's address
                 (["--n-blocks", "1", "--port", "0"], ["n_blocks=1", "--n-blocks"]),
                 (["--block-size", "0"], ["--block-size", ">= 1"]),
                 (["--max-running", "0"], ["--max-running"]),
                 (["--max-waiting", "-1"], ["--max-waiting"]),
                 (["--dtype", "float8"], ["--dtype", "float8"])]
        procs = tformer_all([("serve", "--demo", *argv) for argv, _ in cases], cwd=tmp_path)
    finally:
        busy.close()
    for (argv, words), proc in zip(cases, procs):
        one_line_error(proc, *words)
    nothing = tformer_all([("serve", "--run", tmp_path / "no-such-run", "--port", str(port))], cwd=tmp_path)[0]
    one_line_error(nothing, "no-such-run", "no such folder")
