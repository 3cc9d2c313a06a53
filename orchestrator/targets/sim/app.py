"""Start-up of the simulated server, in SGLang's order and with SGLang's log lines.

Order: parse flags -> import the code (the repo's profile; a broken one fails here, exit 1)
-> bind the port (uvicorn's error and exit 1 if taken) -> serve 503 while "loading" (init
distributed / NCCL, weights, KV cache, CUDA graph capture; modeled time x time scale, counted
from the process's launch so its own start-up is inside it: `loadclock`) -> warm-up
request -> "The server is fired up and ready to roll!" -> 200.

Binding before loading is a deliberate difference from SGLang (which binds after loading): it
lets health probes see 503 during the load, and a port collision fails fast.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from orchestrator.targets.sim import gpu_state as gpu_state_mod
from orchestrator.targets.sim import model
from orchestrator.targets.sim import packages as sim_packages
from orchestrator.targets.sim.args import ConfigError, SimConfig, parse
from orchestrator.targets.sim.dialect import DEVICE_TIMER_ENV
from orchestrator.targets.sim.endpoints import ServerState, SimHTTPServer
from orchestrator.targets.sim.faults import FaultPlan, FaultSpecError, parse_faults
from orchestrator.targets.sim.loadclock import LoadClock
from orchestrator.targets.sim.logs import SimLog, traceback_text
from orchestrator.targets.sim.metrics import SGLangMetrics
from orchestrator.targets.sim.noise import Noise
from orchestrator.targets.sim.profile import (
    Effects,
    ProfileError,
    ProfileJSONError,
    load_fragments,
    resolve_effects,
)
from orchestrator.targets.sim.requests import FINISHED, SimRequest
from orchestrator.targets.sim.scheduler import MAX_TOTAL_NUM_TOKENS, Scheduler
from orchestrator.targets.sim.tokens import tokenize
from orchestrator.targets.sim.torch_trace import SimProfiler

MODEL_ARCH = "DeepseekV3ForCausalLM"
DRAFT_ARCH = "LlamaForCausalLMEagle3"
WEIGHT_GB_PER_GPU = 70.12
LOAD_SHARES = {"dist": 0.05, "weights": 0.6, "kv": 0.05, "graphs": 0.3}


def _die(log: SimLog, text: str, code: int = 1) -> None:
    log.raw(text)
    sys.stderr.flush()
    os._exit(code)


def _fail_traceback(log: SimLog, exc_type: str, message: str, where: str, code: str) -> None:
    _die(log, traceback_text(exc_type, message, [
        ("<frozen runpy>", 198, "_run_module_as_main", "return _run_code(code, main_globals, None,"),
        ("python/sglang/launch_server.py", 11, "<module>", "from sglang.srt.entrypoints.http_server import launch_server"),
        (where, 42, "<module>", code),
    ]))  # fmt: skip


def load_effects_or_die(config: SimConfig, log: SimLog, env: Mapping[str, str]) -> Effects:
    """The repo's profile is its code: malformed or import_error -> traceback, exit 1."""
    try:
        fragments = load_fragments(config.profile_path)
    except (ProfileError, OSError) as exc:
        if isinstance(exc, ProfileJSONError):
            exc_type = "json.decoder.JSONDecodeError"
        else:
            exc_type = "ValueError" if isinstance(exc, ProfileError) else type(exc).__name__
        where = "python/sglang/srt/sim_profile.py"
        _fail_traceback(log, exc_type, str(exc), where, "PROFILE = json.load(f)")
    for frag in fragments:
        if frag.unknown_keys:
            log.main(
                f"sim profile {frag.source}: ignoring unknown keys {list(frag.unknown_keys)}",
                "warning",
            )
    effects = resolve_effects(fragments, env)
    if effects.import_error:
        message = effects.import_error
        exc_type = "ImportError"
        head, sep, rest = message.partition(": ")
        if (
            sep
            and head.replace(".", "").replace("_", "").isalnum()
            and head.endswith(("Error", "Exception"))
        ):
            exc_type, message = head, rest
        _fail_traceback(log, exc_type, message, "python/sglang/srt/entrypoints/http_server.py",
                        "from sglang.srt.managers.tokenizer_manager import TokenizerManager")  # fmt: skip
    return effects


def _state_loader(path: str | None, nccl: str | None = None
                  ) -> Callable[[], gpu_state_mod.GpuState]:
    """The GPU state file, with the NCCL version the server loaded (from its packages) in
    place of the system one when a package provides it."""

    def load() -> gpu_state_mod.GpuState:
        state = gpu_state_mod.load(path) if path else gpu_state_mod.default_state()
        return replace(state, nccl_version=nccl) if nccl else state

    return load


def _cost_factory(config: SimConfig, env: Mapping[str, str], effects: Effects, path: str | None,
                  load: Callable[[], gpu_state_mod.GpuState]):
    """Rebuilds the cost model when the GPU state file's mtime changes (None: unchanged)."""
    if not path:
        return None
    last = [_mtime(path)]

    def rebuild() -> model.PassCostModel | None:
        mtime = _mtime(path)
        if mtime == last[0]:
            return None
        last[0] = mtime
        try:
            state = load()
        except (OSError, ValueError):
            return None  # mid-write or removed: keep the previous state
        return model.PassCostModel(config.launch, env, state, effects, os.getpid())

    return rebuild


def _mtime(path: str) -> tuple[int, int]:
    """The file's identity and time: every save renames a new file over it (a new inode), so
    two saves within one tick of a coarse file-system clock still differ."""
    try:
        st = os.stat(path)
        return st.st_ino, st.st_mtime_ns
    except OSError:
        return -1, -1


def _bind(config: SimConfig, state: ServerState, faults: FaultPlan, log: SimLog) -> SimHTTPServer:
    host, port = config.server_args["host"], config.server_args["port"]
    message = f"[Errno 98] error while attempting to bind on address ('{host}', {port}): address already in use"
    if faults.refuse_bind:
        log.main(f"ERROR:    {message}", "error")
        _die(log, "")
    server = SimHTTPServer((host, port), state)
    try:
        server.server_bind()
        server.server_activate()
    except OSError as exc:
        server.server_close()
        if exc.errno in (98, 48):  # EADDRINUSE on Linux / macOS
            log.main(f"ERROR:    {message}", "error")
        else:
            log.main(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                     f"('{host}', {port}): {exc.strerror}", "error")  # fmt: skip
        _die(log, "")
    return server


def _load(
    config: SimConfig,
    env: Mapping[str, str],
    gpu: gpu_state_mod.GpuState,
    effects: Effects,
    faults: FaultPlan,
    log: SimLog,
    clock: LoadClock,
) -> model.PassCostModel:
    """The loading phase: log lines, modeled sleeps, and the failures a real launch can hit.
    The modeled sleeps run on `clock`, which counts them from the process's launch."""
    launch = config.launch
    used = model.visible_gpus(gpu, env)[: launch.tp_size]
    slow_init = any(not g.persistence_mode for g in used)
    total = config.load_seconds * (1.15 if slow_init else 1.0)
    graphs = not launch.disable_cuda_graph
    shares = dict(LOAD_SHARES)
    if not graphs:
        shares["weights"] += shares.pop("graphs")
    log.tp("Init torch distributed begin.")
    while faults.hold_loading and os.path.exists(faults.hold_loading):  # a test's barrier
        time.sleep(0.02)
    clock.sleep_modeled(total * shares["dist"], credited=False)
    try:
        costs = model.PassCostModel(launch, env, gpu, effects, os.getpid())
    except model.LaunchError as exc:
        if exc.kind == "nccl":
            log.tp(f"NCCL WARN {exc}", "warning")
            _die(log, traceback_text(
                "torch.distributed.DistBackendError",
                "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, invalid "
                f"usage (run with NCCL_DEBUG=WARN for details), NCCL version {gpu.nccl_version}\n"
                f"ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n{exc}",
                [("python/sglang/srt/distributed/parallel_state.py", 1420, "init_distributed_environment",
                  "torch.distributed.init_process_group(")],
            ))  # fmt: skip
        _die(log, traceback_text("RuntimeError", str(exc), [
            ("python/sglang/srt/model_executor/model_runner.py", 512, "init_torch_distributed",
             "torch.get_device_module(self.device).set_device(self.gpu_id)")]))  # fmt: skip
    nccl_info(log, env, gpu, launch.tp_size)
    avail = used[0].memory_total_mib / 1024 - 0.4
    log.tp("Init torch distributed ends. mem usage=0.40 GB")
    log.tp(f"Load weight begin. avail mem={avail:.2f} GB")
    clock.sleep_modeled(total * shares["weights"], credited=False)
    if faults.exit_at_start:
        log.tp("Scheduler hit an exception: " + traceback_text(
            "RuntimeError", "CUDA error: uncorrectable ECC error encountered (injected fault)",
            [("python/sglang/srt/model_executor/model_runner.py", 731, "load_model",
              "self.model = get_model(")]), "error")  # fmt: skip
        _die(log, "")
    avail -= WEIGHT_GB_PER_GPU
    log.tp(f"Load weight end. type={MODEL_ARCH}, dtype=torch.bfloat16, avail mem={avail:.2f} GB, "
           f"mem usage={WEIGHT_GB_PER_GPU:.2f} GB.")  # fmt: skip
    if launch.speculative:
        log.tp(f"Load weight begin. avail mem={avail:.2f} GB")
        avail -= 1.21
        log.tp(f"Load weight end. type={DRAFT_ARCH}, dtype=torch.bfloat16, avail mem={avail:.2f} GB, "
               "mem usage=1.21 GB.")  # fmt: skip
    kv_gb = avail - 4.0
    log.tp(f"KV Cache is allocated. #tokens: {MAX_TOTAL_NUM_TOKENS}, KV size: {kv_gb:.2f} GB")
    avail -= kv_gb
    log.tp(f"Memory pool end. avail mem={avail:.2f} GB")
    clock.sleep_modeled(total * shares["kv"])
    if graphs:
        bs_list = [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)
                   if b <= launch.cuda_graph_max_bs]  # fmt: skip
        parts = ["", " draft", " draft extend"] if launch.speculative else [""]
        for part in parts:
            log.tp(
                f"Capture{part} cuda graph begin. This can take up to several minutes. avail mem={avail:.2f} GB"
            )
            if not part:
                log.tp(f"Capture cuda graph bs {bs_list}")
            elapsed = total * shares["graphs"] / len(parts)
            clock.sleep_modeled(elapsed)
            log.tp(f"Capture{part} cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage=0.62 GB. "
                   f"avail mem={avail - 0.62:.2f} GB.")  # fmt: skip
            avail -= 0.62
    args = config.server_args
    log.tp(f"max_total_num_tokens={MAX_TOTAL_NUM_TOKENS}, chunked_prefill_size={args['chunked_prefill_size']}, "
           f"max_prefill_tokens={args['max_prefill_tokens']}, max_running_requests={args['max_running_requests']}, "
           f"context_len=262144, available_gpu_mem={avail:.2f} GB")  # fmt: skip
    return costs


# NCCL echoes every setting it takes from the environment at INFO, but never its own debug
# settings; P2P levels print by name (`src/graph/paths.cc`).
_NCCL_SILENT = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
_P2P_NAMES = {"0": "LOC", "1": "NVL", "2": "PIX", "3": "PXB", "4": "PHB", "5": "SYS"}


def nccl_info(log: SimLog, env: Mapping[str, str], gpu: gpu_state_mod.GpuState,
              ranks: int) -> None:
    """With `NCCL_DEBUG=INFO`, NCCL's INFO lines at communicator init, one set per rank, in
    NCCL's own format (`src/debug.cc`: `host:pid:tid [dev] NCCL INFO ...`): the release
    (`src/init.cc` showVersion) and each variable taken from the environment (`... set by
    environment to V` for strings, `... to N.` for integer parameters, `src/misc/param.cc`)."""
    if env.get("NCCL_DEBUG", "").strip().upper() not in ("INFO", "TRACE"):
        return
    import socket

    host, pid = socket.gethostname(), os.getpid()
    settings = sorted((k, v) for k, v in env.items()
                      if k.startswith("NCCL_") and k not in _NCCL_SILENT and v.strip())
    for rank in range(max(1, ranks)):
        head = f"{host}:{pid}:{pid + rank} [{rank}] NCCL INFO "
        lines = ["Bootstrap: Using lo:127.0.0.1<0>"]
        if rank == 0:
            lines.append(f"NCCL version {gpu.nccl_version}+cuda12.9")
        for var, value in settings:
            lines.append(f"{var} set by environment to {_nccl_value(var, value.strip())}")
        lines.append(f"comm 0x7f3a{rank:04x}0000 rank {rank} nranks {max(1, ranks)} cudaDev"
                     f" {rank} nvmlDev {rank} busId {rank + 1:x}000 commId 0x5e1f2a6b9c3d4e7f"
                     " - Init COMPLETE")
        log.raw("".join(head + line + "\n" for line in lines))


def _nccl_value(var: str, value: str) -> str:
    if var == "NCCL_P2P_LEVEL":
        return _P2P_NAMES.get(value, value.upper())
    try:
        return f"{int(value, 0)}."  # an integer parameter (NCCL_PARAM) ends in a period
    except ValueError:
        return value


def _warmup(scheduler: Scheduler) -> None:
    req = SimRequest(rid="warmup", input_ids=tokenize("The capital city of France is"), max_new_tokens=8,
                     stream=False, created=scheduler.modeled_clock(), warmup=True)  # fmt: skip
    scheduler.submit(req)
    while req.updates.get() != FINISHED:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    env = dict(os.environ)
    try:
        config = parse(argv, env)
        faults = parse_faults(config.fault)
    except (ConfigError, FaultSpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log = SimLog(str(config.server_args["log_level"]))
    effects = load_effects_or_die(config, log, env)
    args = config.server_args
    if config.dialect.server_args_dict:  # 0.5.23: the dict of ServerArgs.resolved_dict()
        log.main(f"server_args={dict(args)!r}")
    else:  # 0.5.9-era launchers: f"{server_args=}", the dataclass repr
        log.main("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in args.items())
                 + ")")
    for note in config.notes:
        log.main(note, "warning")
    try:
        found = sim_packages.find(env, sim_packages.load_node_file(config.packages_path))
    except (OSError, ValueError) as exc:
        _die(log, traceback_text("importlib.metadata.PackageNotFoundError",
                                 f"cannot read the node's packages: {exc}", [
            ("python/sglang/version.py", 1, "<module>", "__version__ = version('sglang')")]))  # fmt: skip
    load_state = _state_loader(config.gpu_state_path, found.nccl_version)
    try:
        gpu = load_state()
    except (OSError, ValueError) as exc:
        _die(log, traceback_text("RuntimeError", f"cannot read GPU state: {exc}", [
            ("python/sglang/srt/utils/common.py", 1801, "get_device_core_count", "torch.cuda.get_device_properties(device_id)")]))  # fmt: skip
    device_timer = env.get(DEVICE_TIMER_ENV, "").strip().lower() in ("1", "true", "yes")
    metrics = SGLangMetrics(str(args["served_model_name"]), config.dialect, device_timer)
    state = ServerState(config, log, metrics)
    state.packages = found.report()
    if found.libraries:
        log.tp(f"sim: NCCL {found.nccl_version} from {found.libraries[sim_packages.NCCL_LIBRARY][0]}",
               "debug")
    server = _bind(config, state, faults, log)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    noise = Noise(
        config.seed, config.noise_restart_cv, config.noise_request_cv, config.drift_pct_per_hour,
        config.noise_outlier_rate, config.noise_outlier_factor,
    )
    clock = LoadClock.from_launch(config.time_scale)  # what start-up took is part of the load
    costs = _load(config, env, gpu, effects, faults, log, clock)
    log.tp(f"sim: restart noise factor {noise.restart_factor:.4f} (seed {noise.seed}), "
           f"time scale {config.time_scale}", "debug")  # fmt: skip
    if noise.outlier:
        log.tp(f"sim: outlier restart: this launch runs {config.noise_outlier_factor:g}x slower")
    state.scheduler_info = {
        "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS,
        "max_req_input_len": 262144 - 5,
    }
    forever = threading.Event()
    if faults.never_ready:
        forever.wait()
    scheduler = Scheduler(
        costs=costs,
        cost_factory=_cost_factory(config, env, effects, config.gpu_state_path, load_state),
        noise=noise, faults=faults, metrics=metrics, log=log, time_scale=config.time_scale,
        max_running_requests=int(args["max_running_requests"]),
        chunked_prefill_size=int(args["chunked_prefill_size"]),
        decode_log_interval=int(args["decode_log_interval"]),
        radix_cache=not args["disable_radix_cache"],
        device_timer=device_timer,
        verify_log=config.verify_log,
        gc_warning_s=args.get("gc_warning_threshold_secs"),
    )  # fmt: skip
    scheduler.profiler = SimProfiler(noise.seed, env)
    state.scheduler = scheduler
    with metrics.lock:
        metrics.set_gauge("max_total_num_tokens", MAX_TOTAL_NUM_TOKENS)
    scheduler.start()
    log.main(f"INFO:     Started server process [{os.getpid()}]")
    log.main("INFO:     Waiting for application startup.")
    log.main("INFO:     Application startup complete.")
    log.main(
        f"INFO:     Uvicorn running on http://{args['host']}:{args['port']} (Press CTRL+C to quit)"
    )
    if not args["skip_server_warmup"]:
        _warmup(scheduler)
        log.main('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    state.status = "up"
    scheduler.ready = True
    log.main("The server is fired up and ready to roll!")
    try:
        forever.wait()
    except KeyboardInterrupt:
        pass
    return 0
