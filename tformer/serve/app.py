"""An OpenAI-compatible HTTP server over the continuous-batching engine (FastAPI + uvicorn).

    POST /v1/completions         {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream"}
    POST /v1/chat/completions    {"model", "messages": [{"role", "content"}], ...}: chapter 11's chat template
    GET  /v1/models  /metrics (Prometheus text: running/waiting requests, blocks, tokens/s, TTFT)
    GET  /health                 the engine's state and settings (blocks, block size, queue limits, dtype)

The engine runs in its own thread (`EngineThread`), stepping while there is work; a request handler
queues its prompt and waits on an asyncio queue that the engine's callbacks fill. PyTorch releases the
GIL inside its kernels, so the event loop keeps accepting requests while a step runs. A client that
disconnects mid-stream aborts its request: its blocks return at the next step.

Errors are OpenAI-style JSON, {"error": {"message", "type", "param", "code"}}, with the status the
official client maps to its exceptions: 400 bad request (naming the field), 401 bad key, 404 unknown
model, 429 full queue (with Retry-After), 500 a request that failed inside the model.

    app = build_app(model, tokenizer, name="demo")
    server = start_in_background(app, port=0)      # tests and notebooks: server.url, server.stop()
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..inference.engine import Engine, QueueFull, SamplingParams
from ..training.sft import ASSISTANT, END, USER

UNSUPPORTED = {"logprobs": None, "top_logprobs": None, "tools": None, "tool_choice": None, "functions": None,
               "function_call": None, "suffix": None, "echo": False, "logit_bias": None, "response_format": None,
               "best_of": 1, "n": 1}
KNOWN = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
         "stop", "stream", "stream_options", "user", "presence_penalty", "frequency_penalty"} | set(UNSUPPORTED)


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class EngineThread:
    """Steps an `Engine` in a background thread while it has work."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._wake = threading.Event()
        self._stop = False
        self.tokens_window: list[tuple[float, int]] = []          # (time, generated_tokens) samples
        self.thread = threading.Thread(target=self._loop, name="tformer-engine", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop:
            if self.engine.has_work():
                self.engine.step()
                now = time.perf_counter()
                self.tokens_window = [(t, n) for t, n in self.tokens_window if now - t < 10.0]
                self.tokens_window.append((now, self.engine.generated_tokens))
            else:
                self._wake.wait(0.05)
                self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    def tokens_per_second(self) -> float:
        """Tokens generated over the last 10 s (from the oldest step sample in it to now): it falls to 0
        within 10 s of going idle."""
        now = time.perf_counter()
        w = [(t, n) for t, n in self.tokens_window if now - t < 10.0]
        if len(w) < 2 or now - w[0][0] <= 0:
            return 0.0
        return (w[-1][1] - w[0][1]) / (now - w[0][0])

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self.thread.join(timeout=10)


def chat_prompt(messages) -> str:
    """Chapter 11's SFT template: "User: ...\\nAssistant: ..." turns, each answer closed by <|endoftext|>;
    system messages go first, as plain text. The prompt ends where the next answer begins."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list of {\"role\", \"content\"}", param="messages")
    system, text, first = [], "", True
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise APIError(400, f"messages[{i}]: expected {{\"role\": \"system\"|\"user\"|\"assistant\", "
                                "\"content\": a string}", param="messages")
        if m["role"] == "system":
            system.append(m["content"])
        elif m["role"] == "user":
            text += ("" if first else "\n") + USER + m["content"] + ASSISTANT
            first = False
        else:
            text += m["content"] + END
    if first:
        raise APIError(400, "'messages' has no user message", param="messages")
    return ("\n".join(system) + "\n" if system else "") + text


class Server:
    """The model, its tokenizer and the engine thread behind the routes."""

    def __init__(self, model, tokenizer, name: str, engine: Engine | None = None, api_key: str | None = None,
                 **engine_kw):
        self.model, self.tok, self.name, self.api_key = model, tokenizer, name, api_key
        self.engine = engine or Engine(model, **engine_kw)
        self.eos_id = tokenizer.token_to_id("<|endoftext|>")
        self.loop_thread = EngineThread(self.engine)
        self.context = model.cfg.context_length
        self.created = int(time.time())

    # -- parsing ----------------------------------------------------------------------------------
    def params(self, body: dict, n_prompt: int, chat: bool) -> tuple[SamplingParams, list[str]]:
        for k in body:
            if k not in KNOWN:
                raise APIError(400, f"'{k}' is not supported by this server", param=k)
        for k, ok in UNSUPPORTED.items():
            if k in body and body[k] is not None and body[k] != ok and not (k == "logprobs" and body[k] is False):
                raise APIError(400, f"'{k}' is not supported by this server (only {k}={ok!r})", param=k)
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        room = self.context - n_prompt
        if mt is None:
            mt = room if chat else min(16, room)
        if isinstance(mt, bool) or not isinstance(mt, int) or mt <= 0:
            raise APIError(400, f"'max_tokens' must be a positive integer, got {mt!r}", param="max_tokens")
        if n_prompt + mt > self.context:
            raise APIError(400, f"the prompt ({n_prompt} tokens) + max_tokens ({mt}) exceeds the model's context of "
                                f"{self.context} tokens", param="max_tokens", code="context_length_exceeded")
        temp = body.get("temperature", 1.0)
        top_p, top_k, seed = body.get("top_p"), body.get("top_k"), body.get("seed")
        if temp is None:
            temp = 1.0
        if not isinstance(temp, (int, float)) or not 0 <= temp <= 2:
            raise APIError(400, f"'temperature' must be a number in [0, 2], got {temp!r}", param="temperature")
        if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
            raise APIError(400, f"'top_p' must be in (0, 1], got {top_p!r}", param="top_p")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise APIError(400, f"'top_k' must be a positive integer, got {top_k!r}", param="top_k")
        if seed is not None and not isinstance(seed, int):
            raise APIError(400, f"'seed' must be an integer, got {seed!r}", param="seed")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise APIError(400, "'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
        return SamplingParams(max_tokens=mt, temperature=float(temp), top_k=top_k,
                              top_p=None if top_p in (None, 1, 1.0) else float(top_p), seed=seed,
                              stop_token_ids=(self.eos_id,) if self.eos_id is not None else ()), stop

    def prompt_ids(self, body: dict, chat: bool) -> list[int]:
        if chat:
            if "messages" not in body:
                raise APIError(400, "missing 'messages'", param="messages")
            return self.tok.encode(chat_prompt(body["messages"])).ids
        if "prompt" not in body:
            raise APIError(400, "missing 'prompt'", param="prompt")
        p = body["prompt"]
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            p = p[0]
        if isinstance(p, str):
            ids = self.tok.encode(p).ids
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids = p
        else:
            raise APIError(400, "'prompt' must be a string, a list of one string, or a list of token ids", param="prompt")
        if not ids:
            raise APIError(400, "'prompt' is empty", param="prompt")
        if any(not 0 <= t < self.model.cfg.vocab_size for t in ids):
            raise APIError(400, f"'prompt' token ids must be in [0, {self.model.cfg.vocab_size})", param="prompt")
        if len(ids) >= self.context:
            raise APIError(400, f"the prompt is {len(ids)} tokens; this model's context is {self.context} tokens "
                                "(prompt + max_tokens must fit)", param="prompt", code="context_length_exceeded")
        return ids

    # -- running a request ------------------------------------------------------------------------
    def submit(self, ids: list[int], params: SamplingParams):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def on_token(r, t):
            loop.call_soon_threadsafe(q.put_nowait, ("token", t))

        def on_finish(r):
            loop.call_soon_threadsafe(q.put_nowait, ("finish", r))
        try:
            req = self.engine.add_request(ids, params, request_id=uuid.uuid4().hex, on_token=on_token,
                                          on_finish=on_finish)
        except QueueFull as e:
            raise APIError(429, f"the server is busy: {e}; retry later", "rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except ValueError as e:
            raise APIError(400, str(e)) from None
        self.loop_thread.wake()
        return req, q

    async def texts(self, req, q, stop: list[str]):
        """Yield text deltas as tokens arrive; the last item is (None, finish_reason). Stop strings cut the
        text (not included) and end the request; text that could start a stop string is held back."""
        out: list[int] = []
        sent, hold = "", max((len(s) for s in stop), default=1) - 1
        try:
            while True:
                kind, val = await q.get()
                if kind == "finish":
                    text = self.tok.decode(out)
                    if val.finish_reason == "error":
                        raise APIError(500, f"the request failed inside the model: {val.error}", "server_error")
                    reason = {"abort": "stop"}.get(val.finish_reason, val.finish_reason)
                    if text[len(sent):]:
                        yield text[len(sent):]
                    yield None, reason
                    return
                out.append(val)
                text = self.tok.decode(out)
                cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
                if cut >= 0:
                    self.engine.abort(req.id)
                    if text[len(sent):cut]:
                        yield text[len(sent):cut]
                    req.usage_completion = len(out)
                    yield None, "stop"
                    return
                safe = len(text) - hold if stop else len(text)
                while safe > len(sent) and text[safe - 1] == "\ufffd":      # an unfinished UTF-8 character
                    safe -= 1
                if safe > len(sent):
                    yield text[len(sent):safe]
                    sent = text[:safe]
        finally:
            if not req.done:
                self.engine.abort(req.id)                                 # disconnected, or stopped early
                self.loop_thread.wake()

    def usage(self, req) -> dict:
        n = getattr(req, "usage_completion", len(req.output))
        return {"prompt_tokens": len(req.prompt), "completion_tokens": n, "total_tokens": len(req.prompt) + n}


def build_app(model, tokenizer, name: str = "tformer", api_key: str | None = None, engine: Engine | None = None,
              **engine_kw):
    """The FastAPI app serving `model` (a tformer GPT) with `tokenizer` (a `tokenizers.Tokenizer`) as `name`."""
    srv = Server(model, tokenizer, name, engine=engine, api_key=api_key, **engine_kw)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        srv.loop_thread.stop()
    app = FastAPI(title="tformer", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.server = srv
    reg = CollectorRegistry()
    eng = srv.engine
    for key, doc in [("running", "requests being decoded"), ("waiting", "requests in the queue"),
                     ("free_blocks", "KV blocks free (incl. cached, evictable)"), ("used_blocks", "KV blocks in use"),
                     ("shared_blocks", "KV blocks shared by more than one request"),
                     ("cached_blocks", "full KV blocks findable by prefix")]:
        Gauge(f"tformer_{key}", doc, registry=reg).set_function(lambda k=key: eng.stats()[k])
    Gauge("tformer_generated_tokens", "tokens generated since start", registry=reg).set_function(
        lambda: eng.generated_tokens)
    Gauge("tformer_tokens_per_second", "generated tokens/s over the last 10 s", registry=reg).set_function(
        srv.loop_thread.tokens_per_second)
    ttft = Histogram("tformer_time_to_first_token_seconds", "time to first token", registry=reg,
                     buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
    done = Counter("tformer_requests", "finished requests", ["finish_reason"], registry=reg)

    def error(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return error(e)

    @app.exception_handler(404)
    async def _not_found(request, e):
        return error(APIError(404, f"no route {request.method} {request.url.path}", "not_found_error"))

    @app.exception_handler(405)
    async def _bad_method(request, e):
        return error(APIError(405, f"{request.method} is not allowed on {request.url.path}"))

    @app.exception_handler(Exception)
    async def _crash(request, e):
        return error(APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error"))

    def auth(request: Request) -> None:
        """With --api-key, every /v1/ route wants 'Authorization: Bearer KEY'. (Checked in each handler, not
        in an HTTP middleware: Starlette's BaseHTTPMiddleware wraps streaming responses and turns a client's
        disconnect into an error of its own.)"""
        if srv.api_key and request.headers.get("authorization", "") != f"Bearer {srv.api_key}":
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                           "authentication_error", code="invalid_api_key")

    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")

    @app.get("/health")
    async def health():
        """The engine's state and how it was set up (what `tformer serve`'s options chose)."""
        return {"status": "ok", **eng.stats(), "block_size": eng.bs, "max_running": eng.max_running,
                "max_waiting": eng.max_waiting, "dtype": dtype}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        auth(request)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": srv.created, "owned_by": "tformer"}]}

    async def body_of(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except ClientDisconnect:
            raise APIError(400, "the client disconnected before sending its request") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        if body.get("model") not in (None, name):
            raise APIError(404, f"the model '{body.get('model')}' does not exist; this server serves '{name}'",
                           "not_found_error", param="model", code="model_not_found")
        return body

    async def complete(request: Request, chat: bool):
        auth(request)
        body = await body_of(request)
        ids = srv.prompt_ids(body, chat)
        params, stop = srv.params(body, len(ids), chat)
        req, q = srv.submit(ids, params)
        rid = ("chatcmpl-" if chat else "cmpl-") + req.id
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def observe():
            if req.first_token_at is not None:
                ttft.observe(req.first_token_at - req.arrival)

        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

            def chunk(text, reason, first=False):
                if chat:
                    delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
                    choice = {"index": 0, "delta": delta, "finish_reason": reason}
                else:
                    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
                c = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created, "model": name,
                     "choices": [choice]}
                if include_usage:
                    c["usage"] = None
                return f"data: {json.dumps(c)}\n\n"

            async def events():
                gen = srv.texts(req, q, stop)
                try:
                    if chat:
                        yield chunk("", None, first=True)
                    async for item in gen:
                        if isinstance(item, tuple):
                            yield chunk(None if chat else "", item[1])
                            done.labels(item[1]).inc()
                            if include_usage:
                                u = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created,
                                     "model": name, "choices": [], "usage": srv.usage(req)}
                                yield f"data: {json.dumps(u)}\n\n"
                        else:
                            yield chunk(item, None)
                    observe()
                    yield "data: [DONE]\n\n"
                except APIError as e:
                    done.labels("error").inc()
                    yield f"data: {json.dumps(e.body())}\n\n"
                finally:
                    await gen.aclose()

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        parts, reason = [], None
        try:
            async for item in srv.texts(req, q, stop):
                if isinstance(item, tuple):
                    reason = item[1]
                else:
                    parts.append(item)
        except APIError:
            done.labels("error").inc()
            raise
        observe()
        done.labels(reason).inc()
        text = "".join(parts)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": reason} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        return {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice],
                "usage": srv.usage(req)}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    return app


class Background:
    """A uvicorn server in a thread: `.url` (http://127.0.0.1:PORT), `.stop()`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                                    lifespan="on", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, name="tformer-http", daemon=True)
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            if not self.thread.is_alive() or time.time() - t0 > 30:
                raise RuntimeError(f"the server did not start on {host}:{port}")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_in_background(app, host: str = "127.0.0.1", port: int = 0) -> Background:
    """Serve `app` from a background thread (port 0 = any free port); returns the handle with `.url`, `.stop()`."""
    return Background(app, host, port)

