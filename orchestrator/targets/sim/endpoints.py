"""The HTTP surface of the simulated server, after SGLang's `entrypoints/http_server.py`.

Routes and payloads follow SGLang (the release of `dialect`): `/health` and `/health_generate`
(503 while starting), `/server_info` and the deprecated `/get_server_info`, `/model_info`
(bench_serving reads the tokenizer path from it) and the deprecated `/get_model_info`,
`/flush_cache`, `/generate` (SSE stream of `data: {json}` chunks with cumulative text, then
`data: [DONE]`), `/v1/models`, `/v1/completions` (OpenAI, with `stream_options.include_usage`)
and `/metrics` (404 unless `--enable-metrics`, as in SGLang). Responses use HTTP/1.1 with
chunked encoding for streams, as uvicorn does. Stdlib only: this runs on every trial launch.

Size: one route per SGLang endpoint the sim mirrors, each short; kept together so the
surface reads like SGLang's own `http_server.py`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from orchestrator.targets.sim import tokens
from orchestrator.targets.sim.args import SimConfig
from orchestrator.targets.sim.logs import SimLog
from orchestrator.targets.sim.metrics import SGLangMetrics
from orchestrator.targets.sim.requests import FINISHED, SimRequest, meta_info
from orchestrator.targets.sim.scheduler import Scheduler

CONTEXT_LEN = 262144
MODEL_ARCHITECTURE = "DeepseekV3ForCausalLM"
HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLang's SGLANG_HEALTH_CHECK_TIMEOUT default (modeled seconds)
DEFAULT_MAX_NEW_TOKENS = 128
FLUSH_MESSAGE = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class ServerState:
    """Everything the request handlers share; `status` is "starting" until warm-up is done."""

    def __init__(self, config: SimConfig, log: SimLog, metrics: SGLangMetrics):
        self.config = config
        self.log = log
        self.metrics = metrics
        self.scheduler: Scheduler | None = None
        self.status = "starting"
        self.started_at = time.time()
        self.scheduler_info: dict[str, Any] = {}
        self.packages: dict[str, Any] = {}  # what it found on its paths (sim/packages.py)

    @property
    def served_model_name(self) -> str:
        return str(self.config.server_args["served_model_name"])


class BadRequest(ValueError):
    pass


def _error_body(message: str, code: int = 400) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": HTTPStatus(code).phrase, "param": None,
            "code": code}  # fmt: skip


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True  # like uvicorn: SO_REUSEADDR, which still refuses a live listener

    def __init__(self, address: tuple[str, int], state: ServerState):
        self.state = state
        super().__init__(address, Handler, bind_and_activate=False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up (common for benchmark clients) is not a server error."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        self.state.log.main(f"ERROR:    Exception in ASGI application: {exc!r}", "error")

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    # TCP_NODELAY on every connection, as uvicorn's asyncio transports have it. Without it a
    # response's body (written after its headers) waits for the client's delayed ACK of the
    # headers: about 40 ms on Linux for every /metrics scrape, /flush_cache and /server_info,
    # and a stream chunk can wait for the one before it, which no real server adds.
    disable_nagle_algorithm = True
    server: SimHTTPServer

    # -- plumbing ----------------------------------------------------------------------------
    @property
    def state(self) -> ServerState:
        return self.server.state

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        try:
            phrase = HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        host, port = self.client_address[:2]
        self.state.log.main(
            f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} {phrase}'
        )

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, doc: Any) -> None:
        self._send(code, json.dumps(doc).encode(), "application/json")

    def _text(self, code: int, text: str) -> None:
        self._send(code, text.encode(), "text/plain; charset=utf-8")

    def _body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"Invalid JSON body: {exc}") from exc

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # -- routing -----------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        routes = {
            "/health": ({"GET"}, self.health),
            "/health_generate": ({"GET"}, self.health),
            "/server_info": ({"GET"}, self.server_info),
            "/get_server_info": ({"GET"}, self.server_info),
            "/model_info": ({"GET"}, self.model_info),
            "/get_model_info": ({"GET"}, self.model_info),
            "/v1/models": ({"GET"}, self.models),
            "/metrics": ({"GET"}, self.metrics),
            "/flush_cache": ({"GET", "POST"}, self.flush_cache),
            "/freeze_gc": ({"GET", "POST"}, self.freeze_gc),
            "/generate": ({"POST", "PUT"}, self.generate),
            "/v1/completions": ({"POST"}, self.completions),
            "/sim/packages": ({"GET"}, self.sim_packages),  # the sim's own; not SGLang's
            "/start_profile": ({"GET", "POST"}, self.start_profile),
            "/stop_profile": ({"GET", "POST"}, self.stop_profile),
        }
        if path not in routes or (
            path == "/metrics" and not self.state.config.server_args["enable_metrics"]
        ):
            self._json(404, {"detail": "Not Found"})
            return
        methods, fn = routes[path]
        if method not in methods:
            self._json(405, {"detail": "Method Not Allowed"})
            return
        try:
            fn()
        except BadRequest as exc:
            self._json(400, _error_body(str(exc)))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _starting(self) -> bool:
        if self.state.status == "up":
            return False
        self._json(503, _error_body("The server is not ready yet.", 503))
        return True

    # -- endpoints ---------------------------------------------------------------------------
    def health(self) -> None:
        sched = self.state.scheduler
        if self.state.status != "up" or sched is None:
            self._send(503, b"", "text/plain")
            return
        if sched.hung:  # SGLang's health check times out waiting for the scheduler
            time.sleep(
                min(HEALTH_CHECK_TIMEOUT_S * self.state.config.time_scale, HEALTH_CHECK_TIMEOUT_S)
            )
            self._send(503, b"", "text/plain")
            return
        self._send(200, b"", "text/plain")

    def server_info(self) -> None:
        if self._starting():
            return
        sched = self.state.scheduler
        internal = [sched.internal_state()] if sched else []
        self._json(200, {**self.state.config.server_args, **self.state.scheduler_info,
                         "internal_states": internal,
                         "version": self.state.config.dialect.version})  # fmt: skip

    def sim_packages(self) -> None:
        """The versions this server found and loaded (a real SGLang has no such route: there
        a probe of the server process reads them)."""
        if self._starting():
            return
        self._json(200, self.state.packages)

    def start_profile(self) -> None:
        """SGLang 0.5.23: 200 `Start profiling.`; a refused request is a 500 (RuntimeError)."""
        body = self._body()
        if not isinstance(body, dict):
            raise BadRequest("profile request body must be a JSON object")
        self._profile(lambda p: p.start(body), "Start profiling.\n")

    def stop_profile(self) -> None:
        self._profile(lambda p: p.stop(), "Stop profiling. This will take some time.\n")

    def _profile(self, action: Any, reply: str) -> None:
        scheduler = self.state.scheduler
        profiler = getattr(scheduler, "profiler", None)
        if profiler is None:
            self._text(503, "Server is starting.\n")
            return
        try:
            action(profiler)
        except RuntimeError as exc:  # torch_trace.ProfileRequestError
            self._text(500, f"Internal Server Error: {exc}\n")
            return
        self._text(200, reply)

    def model_info(self) -> None:
        if self._starting():
            return
        args = self.state.config.server_args
        doc = {"model_path": args["model_path"], "tokenizer_path": args["tokenizer_path"],
               "is_generation": True, "preferred_sampling_params": None,
               "weight_version": args["weight_version"], "has_image_understanding": False,
               "has_audio_understanding": False, "model_type": "deepseek_v3",
               "architectures": [MODEL_ARCHITECTURE]}  # fmt: skip
        if self.state.config.dialect.model_info_0523:
            doc.update({"served_model_name": args["served_model_name"],
                        "load_format": args["load_format"], "reasoning_parser": None,
                        "tool_call_parser": None, "disaggregation_mode": "null"})  # fmt: skip
        self._json(200, doc)

    def models(self) -> None:
        if self._starting():
            return
        card = {"id": self.state.served_model_name, "object": "model",
                "created": int(self.state.started_at), "owned_by": "sglang",
                "root": self.state.config.server_args["model_path"], "parent": None,
                "max_model_len": CONTEXT_LEN}  # fmt: skip
        self._json(200, {"object": "list", "data": [card]})

    def metrics(self) -> None:
        self._send(
            200, self.state.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8"
        )

    def freeze_gc(self) -> None:
        """SGLang 0.5.23's `/freeze_gc`: freezes the garbage collector (here: ends the state
        a `burst:` fault left)."""
        if self._starting():
            return
        sched = self.state.scheduler
        if sched is not None:
            sched.freeze_gc()
        self._text(200, "Garbage collection frozen.\n")

    def flush_cache(self) -> None:
        sched = self.state.scheduler
        ok = sched.flush_cache() if sched is not None and self.state.status == "up" else False
        self._text(200 if ok else 400, FLUSH_MESSAGE)

    # -- generation --------------------------------------------------------------------------
    def _new_request(
        self, prompt_ids: list[int], params: dict, stream: bool, rid: str | None, default_max: int
    ) -> SimRequest:
        max_new = params.get("max_new_tokens", default_max)
        if max_new is None:
            max_new = default_max
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
            raise BadRequest(f"max_new_tokens must be a non-negative integer, got {max_new!r}")
        if len(prompt_ids) + max_new > CONTEXT_LEN:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {CONTEXT_LEN} "
                f"tokens. You requested a total of {len(prompt_ids) + max_new} tokens: "
                f"{len(prompt_ids)} tokens from the input messages and {max_new} tokens for the completion."
            )
        sched = self.state.scheduler
        assert sched is not None
        return SimRequest(rid=rid or os.urandom(16).hex(), input_ids=prompt_ids, max_new_tokens=max_new,
                          stream=stream, created=sched.modeled_clock())  # fmt: skip

    def _prompts(self, text: Any, input_ids: Any) -> tuple[list[list[int]], bool]:
        """Prompt token lists and whether the request was a batch."""
        if input_ids is not None:
            if (
                isinstance(input_ids, list)
                and input_ids
                and all(isinstance(x, list) for x in input_ids)
            ):
                return [_check_ids(x) for x in input_ids], True
            return [_check_ids(input_ids)], False
        if text is not None:
            if isinstance(text, list):
                return [tokens.tokenize(str(t)) for t in text], True
            return [tokens.tokenize(str(text))], False
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")

    def _wait_done(self, req: SimRequest) -> None:
        while req.updates.get() != FINISHED:
            pass

    def generate(self) -> None:
        obj = self._body()
        if self._starting():
            return
        if not isinstance(obj, dict):
            raise BadRequest("The request body must be a JSON object.")
        prompts, batch = self._prompts(obj.get("text"), obj.get("input_ids"))
        params = obj.get("sampling_params") or {}
        stream = bool(obj.get("stream", False))
        if batch and stream:
            raise BadRequest("Streaming is supported for single requests only by this server.")
        rids = obj.get("rid")
        reqs = []
        for i, ids in enumerate(prompts):
            p = params[i] if isinstance(params, list) else params
            rid = rids[i] if isinstance(rids, list) else rids
            reqs.append(self._new_request(ids, dict(p), stream, rid, DEFAULT_MAX_NEW_TOKENS))
        for req in reqs:
            self.state.scheduler.submit(req)
        if stream:
            self._stream_generate(reqs[0])
            return
        for req in reqs:
            self._wait_done(req)
        docs = [
            self._generate_doc(r, len(r.output_ids), True, tokens.detokenize(r.output_ids))
            for r in reqs
        ]
        self._json(200, docs if batch else docs[0])

    def _generate_doc(self, req: SimRequest, n: int, finished: bool, text: str) -> dict[str, Any]:
        return {
            "text": text,
            "output_ids": req.output_ids[:n],
            "meta_info": self._meta(req, n, finished),
        }

    def _meta(self, req: SimRequest, n: int, finished: bool) -> dict[str, Any]:
        launch = self.state.config.launch
        draft = launch.speculative_num_draft_tokens if launch.speculative else None
        return meta_info(req, n, finished, draft, self.state.config.server_args["weight_version"],
                         self.state.config.dialect)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _next_update(self, req: SimRequest) -> tuple[int, bool]:
        """Block for the next token count; coalesce updates that piled up (as SGLang does)."""
        item = req.updates.get()
        while item != FINISHED and not req.updates.empty():
            item = req.updates.get()
        if item == FINISHED:
            return len(req.output_ids), True
        return item, False

    def _stream_generate(self, req: SimRequest) -> None:
        self._start_stream()
        text, sent = "", 0
        try:
            while True:
                n, finished = self._next_update(req)
                text += tokens.detokenize(req.output_ids[sent:n])
                sent = n
                doc = self._generate_doc(req, n, finished, text)
                self._chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")
                if finished:
                    break
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            req.aborted = True
            self.close_connection = True

    def completions(self) -> None:
        obj = self._body()
        if self._starting():
            return
        if not isinstance(obj, dict):
            raise BadRequest("The request body must be a JSON object.")
        prompt = obj.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            prompts = [_check_ids(prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(x, list) for x in prompt):
            prompts = [_check_ids(x) for x in prompt]
        elif isinstance(prompt, list):
            prompts = [tokens.tokenize(str(p)) for p in prompt]
        elif isinstance(prompt, str):
            prompts = [tokens.tokenize(prompt)]
        else:
            raise BadRequest("'prompt' is required")
        stream = bool(obj.get("stream", False))
        if stream and len(prompts) != 1:
            raise BadRequest("Streaming is supported for a single prompt only by this server.")
        params = {"max_new_tokens": obj.get("max_tokens", 16)}
        reqs = [self._new_request(ids, params, stream, None, 16) for ids in prompts]
        for req in reqs:
            self.state.scheduler.submit(req)
        cid, created, model_name = (
            "cmpl-" + os.urandom(16).hex(),
            int(time.time()),
            obj.get("model") or self.state.served_model_name,
        )
        if stream:
            include_usage = bool((obj.get("stream_options") or {}).get("include_usage"))
            self._stream_completion(reqs[0], cid, created, model_name, include_usage)
            return
        choices = []
        for i, req in enumerate(reqs):
            self._wait_done(req)
            choices.append({"index": i, "text": tokens.detokenize(req.output_ids), "logprobs": None,
                            "finish_reason": "length", "matched_stop": None})  # fmt: skip
        prompt_tokens = sum(len(r.input_ids) for r in reqs)
        completion_tokens = sum(len(r.output_ids) for r in reqs)
        self._json(200, {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                         "choices": choices, "usage": _usage(prompt_tokens, completion_tokens),
                         "metadata": {"weight_version": "default"}})  # fmt: skip

    def _stream_completion(
        self, req: SimRequest, cid: str, created: int, model_name: str, include_usage: bool
    ) -> None:
        self._start_stream()
        sent = 0

        def chunk(choices: list, usage: dict | None) -> None:
            doc = {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                   "choices": choices, "usage": usage}  # fmt: skip
            self._chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")

        try:
            while True:
                n, finished = self._next_update(req)
                delta = tokens.detokenize(req.output_ids[sent:n])
                sent = n
                chunk([{"index": 0, "text": delta, "logprobs": None,
                        "finish_reason": "length" if finished else None, "matched_stop": None}], None)  # fmt: skip
                if finished:
                    break
            if include_usage:
                chunk([], _usage(len(req.input_ids), len(req.output_ids)))
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            req.aborted = True
            self.close_connection = True


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": None}  # fmt: skip


def _check_ids(ids: Any) -> list[int]:
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids)
    ):
        raise BadRequest("input_ids must be a non-empty list of token ids")
    return list(ids)
