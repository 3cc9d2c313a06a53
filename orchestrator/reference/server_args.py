"""A server's resolved settings (the log's `server_args=`, a live server's `/server_info`) as
the target's settings, and the settings two servers ran with side by side.

SGLang's `ServerArgs` has hundreds of fields; a target sets a few of them (tensor-parallel
size, the speculative decoding settings, CUDA graphs). Those are taken as the target's settings
so the reference's configuration is re-measured as it ran, the same way a reference run's
`config.yaml` is. Every other field is compared field by field with what a trial's server
reports now (`fingerprint["server_args"]`): a difference there is stated, with the note that
this target does not set it.

Field names are SGLang's: 0.5.23 split `cuda_graph_max_bs` into `..._decode` / `..._prefill` and
turned `disable_cuda_graph` into `cuda_graph_backend_{decode,prefill}`; both spellings map.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from orchestrator.system.redact import redact_config

# Fields that say where a server listens, how it logs, or who may call it: never a cause of a
# slower server, and different on every launch.
_WHERE = re.compile(r"(^|_)(host|port|ports|addr|address|url|urls|endpoint|seed|log|logs|"
                    r"level|name|id|ids|dir|path_prefix)($|_)|api_key|token|secret|password|"
                    r"^enable_metrics$|^decode_log_interval$|^prometheus|^file_storage")
# Fields a target takes from a logged configuration, spelled as in the target's settings.
_SPECULATIVE = ("speculative_algorithm", "speculative_draft_model_path",
                "speculative_num_steps", "speculative_eagle_topk",
                "speculative_num_draft_tokens")
_SHARED = ("tp_size", "trust_remote_code", "mem_fraction_static", "context_length",
           "attention_backend", "model_path")


def _graph_settings(args: Mapping) -> dict[str, Any]:
    """`cuda_graph_max_bs` and `disable_cuda_graph` (the decode side: what verify replays)
    from either release's spelling."""
    out: dict[str, Any] = {}
    max_bs = args.get("cuda_graph_max_bs_decode", args.get("cuda_graph_max_bs"))
    if isinstance(max_bs, int) and not isinstance(max_bs, bool):
        out["cuda_graph_max_bs"] = max_bs
    disabled = (args.get("cuda_graph_backend_decode") == "disabled"
                or bool(args.get("disable_decode_cuda_graph"))
                or bool(args.get("disable_cuda_graph")))
    if any(k in args for k in ("cuda_graph_backend_decode", "disable_decode_cuda_graph",
                               "disable_cuda_graph")):
        out["disable_cuda_graph"] = disabled
    return out


def target_settings(args: Mapping, target: Any) -> dict[str, Any]:
    """The settings of `target` (its typed record) that `args` fixes, with the target's name
    (which the reference's configuration is compared by). A field the logged server left
    unset (None) keeps the target's own value unless the target's field takes None too."""
    known = {f.name: f for f in fields(target)}
    out: dict[str, Any] = {"name": target.name}
    algo = args.get("speculative_algorithm")
    wanted: dict[str, Any] = {k: args[k] for k in _SHARED if k in args}
    if "speculative_algorithm" in args:
        wanted["speculative_algorithm"] = algo
        if algo:
            wanted.update({k: args[k] for k in _SPECULATIVE[1:] if k in args})
    wanted.update(_graph_settings(args))
    for key, value in wanted.items():
        if key not in known:
            continue
        current = getattr(target, key)
        if value is None and current is not None and not _optional(known[key]):
            continue
        if isinstance(current, bool) != isinstance(value, bool) and current is not None:
            continue  # a release that spells it another way: left as the target has it
        if isinstance(current, int) and not isinstance(current, bool) and isinstance(value, float):
            if not value.is_integer():
                continue
            value = int(value)
        out[key] = value
    return out


def _optional(field: Any) -> bool:
    return "None" in str(field.type) or field.default is None


def comparable(key: str) -> bool:
    """Whether a field of two servers' settings is compared (not where or how it logs)."""
    return not _WHERE.search(key)


def setting_differences(then: Mapping, now: Mapping) -> list[tuple[str, Any, Any]]:
    """`(field, then, now)` for each field both servers report with different values, secrets
    redacted. A field one release has and the other lacks is not a difference: releases add
    and rename fields."""
    out = []
    for key in sorted(set(then) & set(now)):
        if not comparable(key):
            continue
        a, b = redact_config(then[key], key), redact_config(now[key], key)
        if _same(a, b):
            continue
        out.append((key, a, b))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return float(a) == float(b)
    return a == b
