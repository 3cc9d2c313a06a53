"""One generation request inside the sim, and the `meta_info` SGLang returns for it.

`meta_info` fields and their formulas follow SGLang's tokenizer manager
(`python/sglang/srt/managers/tokenizer_manager.py`, `_handle_batch_output` and
`_calculate_spec_decoding_metrics`): e2e_latency only once finished; with speculation
spec_accept_rate = accepted drafts / (verify_ct * (num_draft_tokens - 1)) and
spec_accept_length = completion_tokens / verify_ct. The key names are the imitated release's
(`dialect`: 0.5.9 `spec_accept_token_num` / `spec_draft_token_num` / `spec_accept_histogram`,
0.5.23 `spec_num_correct_drafts` / `spec_num_proposed_drafts` /
`spec_correct_drafts_histogram`). All times are modeled seconds.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any

from orchestrator.targets.sim import tokens
from orchestrator.targets.sim.dialect import Dialect, dialect

FINISHED = -1  # update-queue sentinel: the request is done (or the server gave up on it)


@dataclass(eq=False)
class SimRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    stream: bool
    created: float  # modeled seconds since server start
    warmup: bool = False  # the server's own warm-up request: not counted by faults
    index: int | None = None  # client request number, assigned on submission
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    verify_ct: int = 0
    accepted_drafts: int = 0
    accept_histogram: list[int] = field(default_factory=list)
    cycles: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    aborted: bool = False
    updates: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        self.seed = tokens.prompt_seed(self.input_ids)

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_time is not None

    def append_tokens(self, count: int) -> None:
        start = len(self.output_ids)
        self.output_ids.extend(tokens.output_token(self.seed, start + i) for i in range(count))

    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.created


def meta_info(
    req: SimRequest,
    n_tokens: int,
    finished: bool,
    num_draft_tokens: int | None,
    weight_version: str = "default",
    release: Dialect | None = None,
) -> dict[str, Any]:
    """SGLang's meta_info for a snapshot of `n_tokens` output tokens."""
    d = release or dialect(None)
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": {"type": "length", "length": req.max_new_tokens} if finished else None,
        "prompt_tokens": len(req.input_ids),
        "weight_version": weight_version,
        d.retractions_key: 0,
    }
    if d.reasoning_tokens:
        meta["reasoning_tokens"] = 0
    meta.update({"completion_tokens": n_tokens, "cached_tokens": req.cached_tokens})
    if finished:
        meta["e2e_latency"] = req.e2e_latency()
        if num_draft_tokens is not None:
            proposed = req.verify_ct * (num_draft_tokens - 1)
            if req.verify_ct > 0 and proposed > 0:
                meta["spec_accept_rate"] = req.accepted_drafts / proposed
                meta["spec_accept_length"] = n_tokens / req.verify_ct
                meta[d.spec_correct_key] = req.accepted_drafts  # drafts only, in both releases
                meta[d.spec_proposed_key] = proposed
                meta["spec_verify_ct"] = req.verify_ct
            if any(req.accept_histogram):
                meta[d.spec_histogram_key] = list(req.accept_histogram)
    return meta
