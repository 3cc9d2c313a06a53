"""A stand-in inference server on the GPU: a tiny transformer with random weights behind the
HTTP surfaces sleuth reads from SGLang, for a GPU machine where SGLang is not installed.

    python3 experiments/gpu_standin.py --model-path standin/tiny --host 127.0.0.1 --port 30000
        [--tp-size 1] [--enable-metrics] [--decode-log-interval 40]
        [--standin-layers 8] [--standin-hidden 1024] [--device cuda]

It takes the flags sleuth's SGLang adapter passes (so the device check launches it through
that adapter, `targets/sglang.py`, with only the module replaced) and answers what the adapter
and the built-in client use: `/health`, `/health_generate` (a real one-token generation),
`/generate` (streamed `data:` chunks with `meta_info`, or one JSON body), `/flush_cache`,
`/server_info` and `/get_server_info`, `/model_info`, and `/metrics` in SGLang's Prometheus
names (`sglang:forward_execution_seconds_total{category=extend|decode}`, decode passes as
`sglang:cuda_graph_passes_total{mode=decode_none}`, token counters). It logs SGLang's
`Prefill batch` / `Decode batch` lines. So the check measures it through the same client,
`/metrics` deltas and log parser as a real server.

Work is real: each request's prompt runs through the model in one extend pass (causal
attention over the prompt, a KV cache kept), then one token per decode pass, greedy. A decode
pass steps every running request (one after another: batching ragged caches is not the point
of a stand-in); its time, synchronised with the device, is the pass's `decode` seconds. No
speculative decoding, no CUDA graphs (the counters say so). torch is imported only after the
flags are read, so `--help` works anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_standin", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--standin-layers", type=int, default=8)
    p.add_argument("--standin-hidden", type=int, default=1024)
    p.add_argument("--standin-vocab", type=int, default=32768)
    p.add_argument("--device", default="cuda")
    return p.parse_args(argv)


def log(text: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}", flush=True)


class Request:
    def __init__(self, rid: int, ids: list[int], max_new: int):
        self.rid, self.ids, self.max_new = rid, ids, max_new
        self.out: list[int] = []
        self.cache = None
        self.chunks: deque = deque()
        self.ready = threading.Condition()
        self.done = False
        self.started = time.perf_counter()

    def emit(self, finished: bool) -> None:
        meta = {"id": str(self.rid), "prompt_tokens": len(self.ids),
                "completion_tokens": len(self.out), "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": self.max_new} if finished else None,
                "e2e_latency": time.perf_counter() - self.started}
        with self.ready:
            self.chunks.append({"text": "", "output_ids": list(self.out), "meta_info": meta})
            self.done = finished
            self.ready.notify_all()


class Engine:
    """The model, the counters, and the one thread that runs every forward pass."""

    def __init__(self, args: argparse.Namespace):
        import torch

        self.torch, self.args = torch, args
        self.device = torch.device(args.device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        torch.manual_seed(0)
        d, heads = args.standin_hidden, max(1, args.standin_hidden // 64)
        self.heads, self.vocab = heads, args.standin_vocab
        mk = lambda *shape: (torch.randn(*shape, device=self.device, dtype=dtype)  # noqa: E731
                             / shape[-1] ** 0.5)
        self.embed = mk(self.vocab, d)
        self.layers = [{"qkv": mk(3 * d, d), "o": mk(d, d), "up": mk(4 * d, d),
                        "down": mk(d, 4 * d)} for _ in range(args.standin_layers)]
        self.head = mk(self.vocab, d)
        self.lock = threading.Lock()
        self.queue: deque[Request] = deque()
        self.running: list[Request] = []
        self.wake = threading.Event()
        self.counters = {"prompt": 0, "generated": 0, "extend_s": 0.0, "decode_s": 0.0,
                         "passes": 0, "last_gen_throughput": 0.0}
        self.next_id = 0

    # -- the model --------------------------------------------------------------------------
    def forward(self, ids: list[int], cache):
        """Logits of the last position and the new per-layer (k, v) cache."""
        t = self.torch
        F = t.nn.functional
        x = self.embed[t.tensor(ids, device=self.device)].unsqueeze(0)  # [1, T, d]
        new_cache = []
        for i, w in enumerate(self.layers):
            h = F.layer_norm(x, x.shape[-1:])
            q, k, v = (h @ w["qkv"].T).chunk(3, dim=-1)
            split = lambda z: z.view(1, z.shape[1], self.heads, -1).transpose(1, 2)  # noqa: E731
            q, k, v = split(q), split(k), split(v)
            if cache is not None:
                k, v = t.cat([cache[i][0], k], dim=2), t.cat([cache[i][1], v], dim=2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None and len(ids) > 1)
            x = x + a.transpose(1, 2).reshape(x.shape) @ w["o"].T
            x = x + F.gelu(F.layer_norm(x, x.shape[-1:]) @ w["up"].T) @ w["down"].T
            new_cache.append((k, v))
        return (F.layer_norm(x[:, -1], x.shape[-1:]) @ self.head.T), new_cache

    def _timed(self, ids, cache):
        started = time.perf_counter()
        logits, cache = self.forward(ids, cache)
        token = int(logits.argmax(dim=-1).item())  # synchronises with the device
        return token, cache, time.perf_counter() - started

    # -- scheduling -------------------------------------------------------------------------
    def submit(self, ids: list[int], max_new: int) -> Request:
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if not ids or bad:
            raise ValueError(f"input_ids must be 1+ ids in [0, {self.vocab})")
        with self.lock:
            self.next_id += 1
            req = Request(self.next_id, ids, max(1, max_new))
            self.queue.append(req)
        self.wake.set()
        return req

    def loop(self) -> None:
        c = self.counters
        while True:
            if not self.running:  # idle: sleep until a request comes (never between passes)
                self.wake.wait(0.05)
            self.wake.clear()
            with self.lock:
                new = list(self.queue)
                self.queue.clear()
            for req in new:  # extend: the whole prompt in one pass
                token, req.cache, took = self._timed(req.ids, None)
                req.out.append(token)
                c["prompt"] += len(req.ids)
                c["generated"] += 1
                c["extend_s"] += took
                log(f"Prefill batch, #new-seq: 1, #new-token: {len(req.ids)}, #cached-token: 0,"
                    f" token usage: 0.00, #running-req: {len(self.running)}, #queue-req: 0,"
                    f" input throughput (token/s): {len(req.ids) / took:.2f}, cuda graph: False")
                finished = len(req.out) >= req.max_new
                req.emit(finished)
                if not finished:
                    self.running.append(req)
            if not self.running:
                continue
            started = time.perf_counter()  # decode: one pass steps every running request
            for req in self.running:
                token, req.cache, _ = self._timed([req.out[-1]], req.cache)
                req.out.append(token)
                req.emit(len(req.out) >= req.max_new)
            took = time.perf_counter() - started
            c["decode_s"] += took
            c["passes"] += 1
            c["generated"] += len(self.running)
            c["last_gen_throughput"] = len(self.running) / took
            if c["passes"] % max(1, self.args.decode_log_interval) == 0:
                tokens = sum(len(r.ids) + len(r.out) for r in self.running)
                log(f"Decode batch, #running-req: {len(self.running)}, #token: {tokens}, token"
                    f" usage: 0.00, cuda graph: False, gen throughput (token/s):"
                    f" {c['last_gen_throughput']:.2f}, #queue-req: {len(self.queue)}")
            self.running = [r for r in self.running if not r.done]

    def metrics(self) -> str:
        c = self.counters
        rows = [("sglang:prompt_tokens_total", "", c["prompt"]),
                ("sglang:generation_tokens_total", "", c["generated"]),
                ("sglang:cached_tokens_total", "", 0),
                ("sglang:forward_execution_seconds_total", 'category="extend"', c["extend_s"]),
                ("sglang:forward_execution_seconds_total", 'category="decode"', c["decode_s"]),
                ("sglang:cuda_graph_passes_total", 'mode="decode_none"', c["passes"]),
                ("sglang:cuda_graph_passes_total", 'mode="decode_cuda_graph"', 0),
                ("sglang:num_running_reqs", "", len(self.running)),
                ("sglang:num_queue_reqs", "", len(self.queue)),
                ("sglang:gen_throughput", "", c["last_gen_throughput"])]
        return "".join(f"{n}{{{lab}}} {v}\n" if lab else f"{n} {v}\n" for n, lab, v in rows)


def handler(engine: Engine, args: argparse.Namespace):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:  # the access log would drown the batch lines
            pass

        def _send(self, code: int, body, kind: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/health_generate":
                self._finish(engine.submit([1], 1))
                self._send(200, {})
            elif self.path in ("/server_info", "/get_server_info"):
                self._send(200, {**vars(args), "internal_states": [
                    {"last_gen_throughput": engine.counters["last_gen_throughput"]}]})
            elif self.path == "/model_info":
                self._send(200, {"model_path": args.model_path, "is_generation": True})
            elif self.path == "/metrics" and args.enable_metrics:
                self._send(200, engine.metrics(), "text/plain; version=0.0.4")
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.path == "/flush_cache":
                self._send(200, "Cache flushed.\n", "text/plain")
                return
            if self.path != "/generate":
                self._send(404, {"error": f"no route {self.path}"})
                return
            try:
                doc = json.loads(body or b"{}")
                params = doc.get("sampling_params") or {}
                req = engine.submit([int(i) for i in doc.get("input_ids") or []],
                                    int(params.get("max_new_tokens") or 16))
            except (ValueError, TypeError) as exc:
                self._send(400, {"error": str(exc)})
                return
            if not doc.get("stream"):
                self._send(200, self._finish(req))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            while True:
                chunk, last = self._next(req)
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                if last:
                    break
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        @staticmethod
        def _next(req: Request) -> tuple[dict, bool]:
            with req.ready:
                while not req.chunks:
                    req.ready.wait()
                chunk = req.chunks.popleft()
                return chunk, req.done and not req.chunks

        def _finish(self, req: Request) -> dict:
            while True:
                chunk, last = self._next(req)
                if last:
                    return chunk

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_standin: torch is not installed", file=sys.stderr)
        return 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_standin: no CUDA device visible to torch", file=sys.stderr)
        return 1
    log(f"server_args=model_path={args.model_path!r}, tp_size={args.tp_size}, stand-in with"
        f" {args.standin_layers} layers of {args.standin_hidden} on {args.device}")
    engine = Engine(args)
    engine.forward([1, 2, 3], None)  # first kernels (cuBLAS handles, allocator) before ready
    threading.Thread(target=engine.loop, daemon=True).start()
    server = ThreadingHTTPServer((args.host, args.port), handler(engine, args))
    server.daemon_threads = True
    log("The server is fired up and ready to roll!")
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
