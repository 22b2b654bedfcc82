"""`tformer serve` (an OpenAI-compatible server) and `tformer export --to hf RUN DIR`.

    tformer serve --demo                          # a small random model, the byte-level tokenizer
    tformer serve --run runs/ch11 --port 8000     # a run folder (tformer.serve.runs)
    tformer serve --hf path/to/gpt2 --api-key KEY # a local GPT-2-format folder; a bearer key required
    tformer serve --run runs/ch11 --dtype bfloat16 # weights and KV cache in bf16 (faster on CPUs with AMX)
    tformer export --to hf runs/ch11 exported/
"""
from __future__ import annotations

import argparse
import signal
from pathlib import Path


def _load(args):
    """(model in args.dtype, tokenizer, name) from --run, --hf or --demo."""
    import torch
    model, tok, name = _load_float32(args)
    return model.to(getattr(torch, args.dtype)), tok, name


def _check_source(args) -> None:
    from ..utils.errors import UserError
    chosen = [x for x in (args.run, args.hf) if x] + (["demo"] if args.demo else [])
    if len(chosen) != 1:
        raise UserError("give exactly one of --run RUN, --hf DIR or --demo")
    if not args.demo and not Path(args.run or args.hf).is_dir():
        raise UserError(f"{args.run or args.hf}: no such folder")


def _load_float32(args):
    """The model `_check_source` accepted (serve checks it before binding its socket)."""
    from ..utils.errors import UserError
    from .runs import demo_model, load_gpt_run, load_hf
    if args.demo:
        return (*demo_model(), "demo")
    path = Path(args.run or args.hf)
    try:
        if args.run:
            model, tok, _ = load_gpt_run(path)
        else:
            model, tok = load_hf(path)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    return model, tok, args.name or path.name


def _listen(host: str, port: int):
    """The socket the server will listen on, bound here (with SO_REUSEADDR, as uvicorn binds) so that a port in
    use or an address this machine does not have is one line before the model loads, and `--port 0` prints the
    port the system chose."""
    import socket

    from ..utils.errors import UserError
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)    # as uvicorn picks the family
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (socket.gaierror, UnicodeError) as e:
        sock.close()
        raise UserError(f"--host {host}: not an address to listen on ({getattr(e, 'strerror', None) or e})") from None
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e} (another server on that port? give "
                        f"another --port)") from None
    return sock


def serve(args) -> int:
    from ..inference.engine import BLOCK_SIZE
    from ..utils.errors import UserError
    from .app import build_app
    _check_source(args)
    sock = _listen(args.host, args.port)
    with sock:
        model, tok, name = _load(args)
        try:
            app = build_app(model, tok, name=args.name or name, api_key=args.api_key,
                            block_size=args.block_size or BLOCK_SIZE, n_blocks=args.n_blocks,
                            max_running=args.max_running, max_waiting=args.max_waiting)
        except ValueError as e:                         # the pool cannot hold one sequence
            raise UserError(f"{str(e).removeprefix('Engine: ')}: give a larger --n-blocks (or leave it out)") from None
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"tformer serve: {args.name or name} ({model.num_params() / 1e6:.1f}M parameters) on "
              f"http://{host}:{sock.getsockname()[1]}/v1", flush=True)
        server = _uvicorn_server(app)
        server.run(sockets=[sock])
    if signal.SIGINT in server.stopped_by:
        raise KeyboardInterrupt                         # the CLI's word for Ctrl-C: one line, exit 130
    return 0


def _uvicorn_server(app):
    """uvicorn's server for app, remembering the signals that stopped it (`stopped_by`). uvicorn shuts down
    gracefully on Ctrl-C, then raises the signal again for the caller to see as KeyboardInterrupt, through
    asyncio's runner and its own SIGINT handler; one loaded test run saw the process end with exit 0 and no
    line instead (not reproduced since), so serve() does not rely on that path: it decides from this record."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            self.stopped_by.append(sig)
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, log_level="warning"))
    server.stopped_by = []
    return server


def export(args) -> int:
    from ..utils.errors import UserError
    from .export import gpt2_incompatibility, to_hf_gpt2
    from .runs import load_gpt_run
    if args.to != "hf":
        raise UserError(f"--to {args.to}: only 'hf' (a Hugging Face GPT-2 folder) is supported")
    try:
        model, tok, _ = load_gpt_run(args.run)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    why = gpt2_incompatibility(model.cfg)
    if why:
        raise UserError(f"cannot export {args.run} to GPT-2 format: {why}")
    to_hf_gpt2(model, tok, args.dir)
    print(f"tformer export: wrote {args.dir} (load it with transformers.AutoModelForCausalLM.from_pretrained)")
    return 0


def add_cli(sub) -> None:
    from ..cli import add_debug, positive_int, tcp_port
    p = sub.add_parser("serve", help="an OpenAI-compatible server (continuous batching over a paged cache)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="a run folder (config.json, model.safetensors, tokenizer.json)")
    p.add_argument("--hf", help="a local Hugging Face GPT-2-format folder")
    p.add_argument("--demo", action="store_true", help="a small randomly initialised model (offline, seconds)")
    p.add_argument("--name", help="the model name clients send (default: the folder's name, or 'demo')")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=tcp_port, default=8000,
                   help="port to listen on (default 8000; 0: any free port)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/ routes")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="weights and KV cache (bfloat16: half the bytes; on a CPU with bf16 units, Intel AMX or "
                        "AVX512-BF16, benchmarks/bench_serve.py runs faster in it)")
    p.add_argument("--block-size", type=positive_int, default=None,
                   help="tokens per KV block (default: the engine's, tformer.inference.engine.BLOCK_SIZE)")
    p.add_argument("--n-blocks", type=positive_int, default=None, help="KV blocks in the pool")
    p.add_argument("--max-running", type=positive_int, default=64, help="sequences decoded together at most")
    p.add_argument("--max-waiting", type=positive_int, default=256, help="queue length before answering 429")
    add_debug(p)
    p.set_defaults(func=serve)
    e = sub.add_parser("export", help="write a run as a Hugging Face GPT-2 folder",
                       description="tformer export --to hf RUN DIR")
    e.add_argument("--to", required=True, help="the format: hf")
    e.add_argument("run", help="a run folder")
    e.add_argument("dir", help="the folder to write")
    add_debug(e)
    e.set_defaults(func=export)
