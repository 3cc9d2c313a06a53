"""The scheduler thread: lockstep forward passes over all running requests, as SGLang runs them.

Each loop iteration is one batch: a prefill of waiting requests if any can be admitted, else
one decode step (baseline) or one EAGLE-3 cycle (draft steps, verify, draft-extend) for every
running request. A pass costs modeled milliseconds from `PassCostModel`, times noise; the
thread sleeps to an absolute deadline `t0 + modeled_time * time_scale`, so Python overhead does
not accumulate as long as the host keeps up, and only then makes the pass's tokens visible.
When the server goes idle, modeled time re-anchors to the wall clock.

Log lines and metrics follow SGLang's scheduler (0.5.9 `scheduler_metrics_mixin.py`, 0.5.23
`scheduler_components/metrics_reporter.py`; the release is the `dialect`): a `Prefill batch`
line per prefill, a `Decode batch` line every `decode_log_interval` decode passes, with accept
len = tokens / (requests x cycles) over the interval. Only then are the interval's accept
counts added to the totals behind `/server_info`'s `avg_spec_accept_length`, as in SGLang: a
repetition shorter than one interval after `/flush_cache` leaves it absent.

Device time per pass goes to the categories the imitated release files it under: 0.5.23's
per-pass timers put a draft pass run from a CUDA graph under `eagle_draft` /
`eagle_draft_extend`, an eager one under `decode` / `extend` (the eager runner names passes by
forward mode); 0.5.9 times the whole scheduler batch as `forward_decode` / `forward_extend`.

State inside the server (`faults`: `state:PCT[:MAX]`, `burst:QUEUE:PCT`) slows every pass from
then on, until the process is restarted (or, for the burst, `/freeze_gc`): what a fresh
restart of the same command tells apart from configuration and code. `--sim-verify-log` adds a
line of custom instrumentation after every decode-log line (`[EAGLE] verify 19.02 ms ...`, the
window's mean device ms per verify pass), as the seed's own EAGLE worker printed one.

Size: one scheduler loop and its per-pass bookkeeping, as SGLang's scheduler is one loop.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable

from orchestrator.targets.sim import model
from orchestrator.targets.sim.faults import FaultPlan
from orchestrator.targets.sim.logs import SimLog, traceback_text
from orchestrator.targets.sim.metrics import SGLangMetrics
from orchestrator.targets.sim.noise import Noise
from orchestrator.targets.sim.requests import FINISHED, SimRequest
from orchestrator.targets.sim.tokens import PrefixCache

MAX_TOTAL_NUM_TOKENS = 393216
CRASH_GRACE_S = 0.05  # let the N-th response reach its client before the process dies
STATE_BYTES_PER_REQUEST = 64 * 1024  # what `state:` keeps per request served (its "leak")
GC_PAUSE_S = 0.41  # a gen-2 collection after an overload burst (SGLang issue 30596: ~400 ms)


class Scheduler:
    def __init__(
        self,
        *,
        costs: model.PassCostModel,
        cost_factory: Callable[[], model.PassCostModel] | None,
        noise: Noise,
        faults: FaultPlan,
        metrics: SGLangMetrics,
        log: SimLog,
        time_scale: float,
        max_running_requests: int,
        chunked_prefill_size: int,
        decode_log_interval: int,
        radix_cache: bool,
        device_timer: bool = False,
        verify_log: bool = False,
        gc_warning_s: float | None = None,
    ):
        self.costs = costs
        self.cost_factory = cost_factory  # rebuilds costs when the GPU state file changes
        self.noise = noise
        self.faults = faults
        self.metrics = metrics
        self.log = log
        self.scale = time_scale
        self.max_running = max_running_requests
        self.chunk_budget = chunked_prefill_size
        self.log_interval = decode_log_interval
        self.dialect = metrics.dialect
        self.device_timer = device_timer  # SGLANG_ENABLE_METRICS_DEVICE_TIMER: occupancy in logs
        self.cache = PrefixCache() if radix_cache else None
        self.launch = costs.launch
        self.cond = threading.Condition()
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.t0 = time.perf_counter()
        self.modeled_now = 0.0
        self.hung = False
        self.ready = False  # set once the server is up: crash_after:0 counts from there
        self.completed_client_requests = 0
        self.next_index = 0
        self._crash_at: float | None = None
        self._probs = model.scaled_position_probabilities(
            self.launch.speculative_num_steps, self.launch.speculative_eagle_topk,
            self.launch.speculative_num_draft_tokens, costs.effects.accept_len_mult,
        )  # fmt: skip
        self._accept_len = costs.accept_len()
        self.reset_metrics()
        self.last_gen_throughput = 0.0
        self._last_prefill_tokens = 0
        self._last_prefill_time = 0.0
        self.profiler = None  # a torch_trace.SimProfiler once the server has one
        self.verify_log = verify_log
        self.gc_warning_s = gc_warning_s
        self.burst_hit = False  # the overload burst of `burst:` happened (until /freeze_gc)
        self._retained: list[bytearray] = []  # what `state:` keeps per request served
        self._window_verify_ms = 0.0
        self._window_verify_passes = 0

    # -- public, called from HTTP threads -------------------------------------------------------
    def modeled_clock(self) -> float:
        return (time.perf_counter() - self.t0) / self.scale

    def submit(self, req: SimRequest) -> None:
        with self.cond:
            if not req.warmup:
                req.index = self.next_index
                self.next_index += 1
            self.waiting.append(req)
            self.cond.notify()

    def reset_metrics(self) -> None:
        """What SGLang's flush_cache resets: interval and lifetime accept counters."""
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.spec_num_correct_drafts = 0
        self.spec_num_forward_ct = 0
        self.spec_total_accepted_tokens = 0
        self.spec_total_forward_ct = 0
        self._last_decode_log = self.modeled_now
        self._window_gpu_s = 0.0

    def flush_cache(self) -> bool:
        with self.cond:
            if self.waiting or self.running:
                return False
            if self.cache is not None:
                self.cache.flush()
            self.reset_metrics()
        self.log.tp("Cache flushed successfully!")
        return True

    def internal_state(self) -> dict:
        state = {"last_gen_throughput": self.last_gen_throughput}
        if self.launch.speculative and self.spec_total_forward_ct > 0:
            state["avg_spec_accept_length"] = (
                self.spec_total_accepted_tokens / self.spec_total_forward_ct
            )
        return state

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        thread.start()
        return thread

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        idle = True
        while True:
            with self.cond:
                while not self.waiting and not self.running:
                    idle = True
                    self._check_crash()
                    self.cond.wait(timeout=0.02 if self.faults.crash_after is not None else 0.5)
                self.running = [r for r in self.running if not r.aborted]
                self.waiting = deque(r for r in self.waiting if not r.aborted)
                self._check_burst()
                admit = self._take_prefill_batch()
                batch = list(self.running)
            self._check_crash()
            self._maybe_hold(admit)
            self._maybe_reload_costs()
            # A batch cannot start before its last request arrived. Anchor to the arrival time
            # it recorded, not to when this thread woke up: a 0.2 ms wake-up would otherwise
            # cost 10 modeled ms at time scale 0.02.
            if admit:
                self.modeled_now = max(self.modeled_now, max(r.created for r in admit))
            elif idle:
                self.modeled_now = max(self.modeled_now, self.modeled_clock())
            idle = False
            if admit:
                self._prefill(admit)
            elif batch:
                self._decode(batch)

    def _take_prefill_batch(self) -> list[SimRequest]:
        admit: list[SimRequest] = []
        budget = self.chunk_budget
        while self.waiting and len(self.running) + len(admit) < self.max_running:
            req = self.waiting[0]
            if admit and len(req.input_ids) > budget:
                break
            admit.append(self.waiting.popleft())
            budget -= len(req.input_ids)
        return admit

    def _factor(self) -> float:
        return (self.noise.pass_factor(self.modeled_now)
                * self.faults.degrade_factor(self.completed_client_requests)
                * self.faults.state_factor(self.completed_client_requests, self.burst_hit))

    def _check_burst(self) -> None:
        """`burst:QUEUE:PCT`: the overload that leaves the server slower (under the lock)."""
        at = self.faults.burst_queue
        if at is not None and not self.burst_hit and len(self.waiting) >= at:
            self.burst_hit = True

    def freeze_gc(self) -> None:
        """SGLang's `/freeze_gc`: the long collections after a burst stop (`burst:` ends)."""
        with self.cond:
            self.burst_hit = False
        self.log.tp("Freezing GC in scheduler process. gc_object_counts before/after freeze:"
                    " gen2 moved to the permanent generation")

    def _advance(self, ms: float) -> None:
        """Move modeled time on by `ms` and sleep until the matching wall-clock deadline."""
        self.modeled_now += ms / 1000.0
        delay = self.t0 + self.modeled_now * self.scale - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    def _prefill(self, admit: list[SimRequest]) -> None:
        new_tokens = cached = 0
        for req in admit:
            if self.cache is not None:
                req.cached_tokens = self.cache.match_and_insert(req.input_ids)
            cached += req.cached_tokens
            new_tokens += len(req.input_ids) - req.cached_tokens
        factor = self._factor()
        ms = self.costs.prefill(new_tokens) * factor
        if self.profiler is not None and self.profiler.active:
            tokens = max(new_tokens, 1)
            passes = [("EXTEND", "prefill", len(admit), tokens, False, factor)]
            if self.launch.speculative:
                passes.append(("DRAFT", "draft_prefill", len(admit), tokens, False, factor))
            self.profiler.batch(self.modeled_now, passes, self.costs)
        with self.metrics.lock:
            self.metrics.forward("extend" if self.dialect.per_pass_timer else "forward_extend",
                                 ms / 1000.0)
            if self.dialect.prefill_graph_passes:
                self.metrics.graph_pass("prefill_none")
            self.metrics.realtime("prefill_compute", new_tokens)
            self.metrics.realtime("prefill_cache", cached)
        self._window_gpu_s += ms / 1000.0
        self._log_prefill(admit, new_tokens, cached)
        self._advance(ms)
        done = []
        for req in admit:
            req.first_token_time = req.last_token_time = self.modeled_now
            if req.max_new_tokens > 0:
                req.append_tokens(1)
            with self.metrics.lock:
                self.metrics.ttft.observe(
                    {**self.metrics.tokenizer_labels, "is_streaming": _tf(req.stream)},
                    req.first_token_time - req.created,
                )
            if req.remaining <= 0:
                done.append(req)
        with self.cond:
            self.running.extend(r for r in admit if r.remaining > 0)
        self._publish(admit, done)

    def _decode(self, batch: list[SimRequest]) -> None:
        bs = len(batch)
        launch = self.launch
        if launch.speculative:
            steps = launch.speculative_num_steps
            draft_f = [self._factor() for _ in range(steps)]
            draft_ms = sum(self.costs.draft_step(bs) * f for f in draft_f)
            verify_ms, graph = self.costs.verify(bs)
            verify_f = self._factor()
            verify_ms *= verify_f
            self._window_verify_ms += verify_ms
            self._window_verify_passes += 1
            extend_f = self._factor()
            extend_ms = self.costs.draft_extend(bs) * extend_f
            if self.profiler is not None and self.profiler.active:
                self._profile_cycle(bs, draft_f, graph, verify_f, extend_f)
            gained = [self._accept(req) for req in batch]
            total_ms = draft_ms + verify_ms + extend_ms
            d = self.dialect
            with self.metrics.lock:
                if d.per_pass_timer:
                    self.metrics.forward(d.draft_category(self.costs.graph_ok(bs, "draft")),
                                         draft_ms / 1000.0)
                    self.metrics.forward("target_verify", verify_ms / 1000.0)
                    self.metrics.forward(
                        d.draft_extend_category(self.costs.graph_ok(bs, "draft_extend")),
                        extend_ms / 1000.0)
                else:
                    self.metrics.forward("forward_decode", total_ms / 1000.0)
            self.spec_num_accepted_tokens += sum(gained)
            self.spec_num_correct_drafts += sum(max(0, n - 1) for n in gained)
            self.spec_num_forward_ct += bs
        else:
            total_ms, graph = self.costs.decode(bs)
            factor = self._factor()
            total_ms *= factor
            if self.profiler is not None and self.profiler.active:
                self.profiler.batch(self.modeled_now, [("DECODE", "decode", bs, bs, graph, factor)],
                                    self.costs)
            gained = [min(1, req.remaining) for req in batch]
            with self.metrics.lock:
                self.metrics.forward("decode" if self.dialect.per_pass_timer else "forward_decode",
                                     total_ms / 1000.0)
        self._window_gpu_s += total_ms / 1000.0
        with self.metrics.lock:
            self.metrics.graph_pass("decode_cuda_graph" if graph else "decode_none")
            self.metrics.realtime("decode", sum(gained))
        self._advance(total_ms)
        self.forward_ct_decode += 1
        self.num_generated_tokens += sum(gained)
        done = []
        for req, n in zip(batch, gained, strict=True):
            interval = self.modeled_now - (req.last_token_time or self.modeled_now)
            req.append_tokens(n)
            req.last_token_time = self.modeled_now
            if n > 0:
                with self.metrics.lock:
                    self.metrics.itl.observe(
                        self.metrics.tokenizer_labels, interval / n, n, interval
                    )
            if req.remaining <= 0:
                done.append(req)
        if done:
            with self.cond:
                self.running = [r for r in self.running if r not in done]
        if self.forward_ct_decode % self.log_interval == 0:
            self._log_decode(batch, graph)
        self._publish(batch, done)

    def _profile_cycle(self, bs: int, draft_f: list[float], verify_graph: bool, verify_f: float,
                       extend_f: float) -> None:
        """One EAGLE cycle's passes for the profiler, labelled as SGLang's step spans are: the
        draft runner's passes `DRAFT`, the target's verify `VERIFY`."""
        launch, costs = self.launch, self.costs
        draft_tokens = bs * max(1, launch.speculative_eagle_topk)
        verify_tokens = bs * launch.speculative_num_draft_tokens
        passes = [("DRAFT", "draft", bs, draft_tokens, costs.graph_ok(bs, "draft"), f)
                  for f in draft_f]
        passes.append(("VERIFY", "verify", bs, verify_tokens, verify_graph, verify_f))
        passes.append(("DRAFT", "draft_extend", bs, verify_tokens,
                       costs.graph_ok(bs, "draft_extend"), extend_f))
        self.profiler.batch(self.modeled_now, passes, costs)

    def _accept(self, req: SimRequest) -> int:
        """Tokens this cycle gives `req` (accepted drafts + the bonus token), capped."""
        req.cycles += 1
        req.verify_ct += 1
        if self.noise.stochastic:
            drafts = 0
            for p in self._probs:
                if self.noise.rng.random() >= p:
                    break
                drafts += 1
            tokens = drafts + 1
        else:
            a = self._accept_len
            tokens = model.tokens_after_cycles(req.cycles, a) - model.tokens_after_cycles(
                req.cycles - 1, a
            )
        tokens = max(0, min(tokens, req.remaining))
        accepted = max(0, tokens - 1)
        req.accepted_drafts += accepted
        if len(req.accept_histogram) <= accepted:
            req.accept_histogram.extend([0] * (accepted + 1 - len(req.accept_histogram)))
        req.accept_histogram[accepted] += 1
        return tokens

    def _publish(self, batch: list[SimRequest], done: list[SimRequest]) -> None:
        """Make this pass's tokens visible to the HTTP threads; account finished requests."""
        for req in batch:
            if req in done:
                req.finished_time = self.modeled_now
                self._observe_finished(req)
                req.updates.put(FINISHED)
            else:
                req.updates.put(len(req.output_ids))
            self._maybe_hang(req)

    def _observe_finished(self, req: SimRequest) -> None:
        m = self.metrics
        labels = {**m.tokenizer_labels, "is_streaming": _tf(req.stream)}
        with m.lock:
            m.prompt_tokens.inc(labels, len(req.input_ids))
            m.generation_tokens.inc(labels, len(req.output_ids))
            m.num_requests.inc(labels)
            if req.verify_ct > 0:
                m.spec_verify_calls.inc(m.tokenizer_labels, req.verify_ct)
            if req.cached_tokens > 0:
                m.cached_tokens.inc(
                    {**m.tokenizer_labels, "cache_source": "total"}, req.cached_tokens
                )
            m.e2e.observe(labels, req.e2e_latency() or 0.0)
        if req.warmup:
            return
        self.completed_client_requests += 1
        if self.faults.state_pct_per_k > 0:
            self._retained.append(bytearray(STATE_BYTES_PER_REQUEST))
        crash_after = self.faults.crash_after
        if crash_after is not None and self.completed_client_requests >= crash_after:
            self._crash_at = self._crash_at or time.perf_counter() + CRASH_GRACE_S

    # -- faults ------------------------------------------------------------------------------
    def _check_crash(self) -> None:
        if self.faults.crash_after == 0 and self.ready and self._crash_at is None:
            self._crash_at = time.perf_counter() + CRASH_GRACE_S
        if self._crash_at is not None and time.perf_counter() >= self._crash_at:
            self.log.tp(
                "Scheduler hit an exception: "
                + traceback_text(
                    "RuntimeError",
                    "CUDA error: an illegal memory access was encountered",
                    [("python/sglang/srt/managers/scheduler.py", 2637, "run_scheduler_process",
                      "scheduler.event_loop_normal()"),
                     ("python/sglang/srt/speculative/eagle_worker.py", 312, "verify",
                      "logits_output, can_run_cuda_graph = self.target_worker.forward_batch_generation(")],
                ),
                level="error",
            )  # fmt: skip
            try:
                import resource

                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the worktree
            except (ImportError, ValueError, OSError):
                pass
            os.kill(os.getpid(), signal.SIGABRT)
            time.sleep(1.0)
            os._exit(134)

    def _maybe_hold(self, admit: list[SimRequest]) -> None:
        """The `hold_from` barrier: admit nothing from request N on while its file exists."""
        at, path = self.faults.hold_from, self.faults.hold_path
        if at is None or not path or not any((r.index or 0) >= at for r in admit):
            return
        while os.path.exists(path):
            time.sleep(0.02)

    def _maybe_hang(self, req: SimRequest) -> None:
        at = self.faults.hang_at_request
        if at is None or req.index != at or req.finished:
            return
        if len(req.output_ids) >= max(1, req.max_new_tokens // 2):
            self.hung = True
            self.log.tp("Scheduler stopped making progress (injected hang).", level="warning")
            threading.Event().wait()  # never returns: connections stay open, nothing moves

    def _maybe_reload_costs(self) -> None:
        if self.cost_factory is None:
            return
        # Every batch: the factory only stats the GPU state file, and a power limit or a clock
        # lock set on the running server (NVML acts within milliseconds) must be what the
        # next batch runs at, or a comparison within one lifetime reads part of one setting
        # as the other.
        try:
            costs = self.cost_factory()
        except model.LaunchError as exc:
            self.log.tp(f"GPU state changed but cannot be applied: {exc}", level="warning")
            return
        if costs is not None:
            self.costs = costs

    # -- logs --------------------------------------------------------------------------------
    def _used_tokens(self) -> int:
        return sum(len(r.input_ids) + len(r.output_ids) for r in self.running)

    def _occupancy(self, gap_s: float) -> str:
        """0.5.23's `fwd occupancy` suffix (device timer on): busy share of the log window.
        Modeled time is either a forward pass or idle, so fwd+idle is the whole window."""
        busy = min(100.0 * self._window_gpu_s / gap_s, 100.0) if gap_s > 0 else 0.0
        return f", fwd occupancy: {busy:.2f}%, fwd+idle occupancy: {100.0 if gap_s > 0 else 0.0:.2f}%"

    def _log_prefill(self, admit: list[SimRequest], new_tokens: int, cached: int) -> None:
        gap = self.modeled_now - self._last_prefill_time
        throughput = self._last_prefill_tokens / gap if gap > 0 else 0.0
        self._last_prefill_time, self._last_prefill_tokens = self.modeled_now, new_tokens
        used = self._used_tokens() + new_tokens + cached
        usage = used / MAX_TOTAL_NUM_TOKENS
        head = (f"Prefill batch, #new-seq: {len(admit)}, #new-token: {new_tokens}, "
                f"#cached-token: {cached}, ")  # fmt: skip
        if self.dialect.prefill_log_0523:
            msg = (head + f"token usage: {usage:.2f}, #running-req: "
                   f"{len(self.running)}, #queue-req: {len(self.waiting)}, #pending-token: 0, "
                   f"cuda graph: False, input throughput (token/s): {throughput:.2f}")  # fmt: skip
            if self.device_timer:
                msg += self._occupancy(self.modeled_now - self._last_decode_log)
        else:
            msg = (head + f"token usage: {usage:.2f}, #running-req: {len(self.running)}, "
                   f"#queue-req: {len(self.waiting)}, input throughput (token/s): {throughput:.2f}, "
                   "cuda graph: False")  # fmt: skip
        self.log.tp(msg)
        total = new_tokens + cached
        with self.metrics.lock:
            self.metrics.set_gauge("num_running_reqs", len(self.running))
            self.metrics.set_gauge("num_queue_reqs", len(self.waiting))
            self.metrics.set_gauge("token_usage", usage)
            self.metrics.set_gauge("cache_hit_rate", cached / total if total else 0.0)

    def _log_decode(self, batch: list[SimRequest], graph: bool) -> None:
        gap = self.modeled_now - self._last_decode_log
        self._last_decode_log = self.modeled_now
        self.last_gen_throughput = self.num_generated_tokens / gap if gap > 0 else 0.0
        self.num_generated_tokens = 0
        used = self._used_tokens()
        usage = used / MAX_TOTAL_NUM_TOKENS
        msg = (
            f"Decode batch, #running-req: {len(batch)}, #token: {used}, token usage: {usage:.2f}, "
        )
        accept_len = accept_rate = 0.0
        if self.launch.speculative and self.spec_num_forward_ct > 0:
            accept_len = self.spec_num_accepted_tokens / self.spec_num_forward_ct
            draft = self.launch.speculative_num_draft_tokens
            if self.dialect.accept_rate_from_correct_drafts:
                proposed = self.spec_num_forward_ct * (draft - 1)
                accept_rate = self.spec_num_correct_drafts / proposed if proposed > 0 else 0.0
            else:
                accept_rate = accept_len / draft
            # Only here do the interval's counts reach the totals /server_info reports.
            self.spec_total_accepted_tokens += self.spec_num_accepted_tokens
            self.spec_total_forward_ct += self.spec_num_forward_ct
            self.spec_num_accepted_tokens = self.spec_num_forward_ct = 0
            self.spec_num_correct_drafts = 0
            msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
        msg += (
            f"cuda graph: {graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting)}"
        )
        if self.device_timer and self.dialect.per_pass_timer:
            msg += self._occupancy(gap)
        self._window_gpu_s = 0.0
        self.log.tp(msg)
        self._log_instrumentation(len(batch))
        with self.metrics.lock:
            m = self.metrics
            m.set_gauge("num_running_reqs", len(batch))
            m.set_gauge("num_queue_reqs", len(self.waiting))
            m.set_gauge("gen_throughput", self.last_gen_throughput)
            m.set_gauge("token_usage", usage)
            m.set_gauge("num_used_tokens", used)
            m.set_gauge("spec_accept_length", accept_len)
            m.set_gauge("spec_accept_rate", accept_rate)
            m.set_gauge("is_cuda_graph", 1.0 if graph else 0.0)


    def _log_instrumentation(self, bs: int) -> None:
        """After a decode-log line: the custom verify line (`--sim-verify-log`), and SGLang's
        long-GC warning (`--gc-warning-threshold-secs`) while the server's accumulated state
        (`state:`, `burst:`) slows it by more than 5%."""
        if self.verify_log and self._window_verify_passes:
            mean = self._window_verify_ms / self._window_verify_passes
            self.log.tp(f"[EAGLE] verify {mean:.2f} ms (bs {bs}, draft tokens"
                        f" {self.launch.speculative_num_draft_tokens})")
        self._window_verify_ms, self._window_verify_passes = 0.0, 0
        aged = self.faults.state_factor(self.completed_client_requests, self.burst_hit) > 1.05
        if aged and self.gc_warning_s is not None and GC_PAUSE_S > self.gc_warning_s:
            gen2 = 880_000 + 17 * self.completed_client_requests
            self.log.tp(f"LONG GARBAGE COLLECTION DETECTED | Generation 2 | Duration:"
                        f" {GC_PAUSE_S:.4f}s | # Objects: gen0=1210, gen1=310, gen2={gen2} |"
                        " This may cause latency jitter. Consider calling the freeze_gc API"
                        " after sending a few warmup requests.", "warning")


def _tf(flag: bool) -> str:
    return "true" if flag else "false"
