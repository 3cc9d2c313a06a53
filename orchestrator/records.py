"""Frozen records that cross module (and Ray) boundaries.

Records are plain values: a `TrialResult` can be pickled to the controller, stored, reloaded and
compared, and nothing in it refers to a live process. Live handles (processes, actors, open
stores) live in the modules that own them.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from orchestrator.util.pins import pin_list, pins_of

# Trials recorded as a reference (e.g. "how the node measured earlier") may come from another
# system state; they are compared against, never reused or pooled as evidence of the current one.
# kernels: orchestrator/evidence; live, fresh: a running server (orchestrator/live); lifetime:
# a restart that measured several candidates, whose block rows hold each one's values
# (orchestrator/run/blocks.py)
NOT_EVIDENCE_PHASES = frozenset({"reference", "kernels", "live", "fresh", "lifetime"})


class TrialState(StrEnum):
    """Steps of one server lifetime, in order; a trial row records each as it is reached."""

    PENDING = "pending"
    PREPARING = "preparing"
    LAUNCHING = "launching"
    WAITING_READY = "waiting_ready"
    WARMING_UP = "warming_up"
    BENCHMARKING = "benchmarking"
    TEARING_DOWN = "tearing_down"
    DONE = "done"


class Outcome(StrEnum):
    """How a trial ended. Everything but OK makes the candidate untestable *for this trial*:
    a crash is never a measurement, so it can never be mistaken for "slow"."""

    OK = "ok"
    PREPARE_FAILED = "prepare_failed"  # checkout / patch / build failed
    LAUNCH_FAILED = "launch_failed"  # server process exited before it became ready
    NOT_READY = "not_ready"  # alive but never healthy within the timeout
    ENV_MISMATCH = "env_mismatch"  # a requested variable did not reach the server process
    CRASHED = "crashed"  # server died while being benchmarked
    HUNG = "hung"  # server alive but a request stalled past its timeout
    BENCH_FAILED = "bench_failed"  # requests failed with the server alive (HTTP errors)
    TEARDOWN_FAILED = "teardown_failed"  # processes or port still held after teardown
    INTERRUPTED = "interrupted"  # stopped by the user or by the controller going away
    ERROR = "error"  # a bug on our side: recorded, never counted as a result

    @property
    def measured(self) -> bool:
        return self is Outcome.OK


# Outcomes worth another attempt: the server, not the candidate, may be at fault. Kept beside
# the outcomes (not in the controller) so that the drive loop, which reads them, imports no Ray.
RETRYABLE = frozenset({Outcome.LAUNCH_FAILED, Outcome.NOT_READY, Outcome.CRASHED, Outcome.HUNG,
                       Outcome.BENCH_FAILED, Outcome.TEARDOWN_FAILED, Outcome.ERROR})


def _canonical_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in env.items()))



# A candidate's env value that means "this variable must NOT be set" (a difference like
# "NCCL_PROTO was dropped from the environment" must be expressible as a factor level).
UNSET = "<unset>"


def apply_unset(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if v != UNSET}

@dataclass(frozen=True)
class Candidate:
    """One assignment of a level to every factor: what a trial runs."""

    commit: str
    patches: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    clock: str = "default"
    # Server settings that differ from the target config (e.g. speculative_num_steps=3), as
    # sorted (key, JSON value) pairs: the "server settings" factor of sweeps and baselines.
    server: tuple[tuple[str, str], ...] = ()
    # Package versions installed over the node's for this trial (an overlay), as sorted
    # `name==version` pins with normalized names: the "packages" factor. Empty: the node's own.
    packages: tuple[str, ...] = ()

    @classmethod
    def make(
        cls,
        commit: str,
        patches: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        clock: str = "default",
        server: Mapping[str, object] | None = None,
        packages: Sequence[str] | Mapping[str, str] | None = None,
    ) -> Candidate:
        srv = tuple(sorted((str(k), json.dumps(v)) for k, v in (server or {}).items()))
        return cls(commit, tuple(patches), _canonical_env(env or {}), clock, srv,
                   pin_list(pins_of(packages)))

    @property
    def server_dict(self) -> dict[str, object]:
        return {k: json.loads(v) for k, v in self.server}

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def package_dict(self) -> dict[str, str]:
        """`{name: version}` of the pinned packages."""
        return dict(p.split("==", 1) for p in self.packages)

    def to_json(self) -> dict:
        doc = {
            "commit": self.commit,
            "patches": list(self.patches),
            "env": self.env_dict,
            "clock": self.clock,
        }
        if self.server:  # omitted when empty, so keys of plain candidates stay stable
            doc["server"] = self.server_dict
        if self.packages:  # likewise
            doc["packages"] = list(self.packages)
        return doc

    @classmethod
    def from_json(cls, data: Mapping) -> Candidate:
        return cls.make(data["commit"], data.get("patches", ()), data.get("env"),
                        data.get("clock", "default"), data.get("server"), data.get("packages"))

    @property
    def key(self) -> str:
        """Stable identity: equal candidates share trials across a resumed run."""
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def label(self) -> str:
        parts = [self.commit[:10]]
        if self.patches:
            parts.append(f"+{len(self.patches)} patch{'es' if len(self.patches) > 1 else ''}")
        parts += [f"{k}={v}" for k, v in self.env]
        if self.clock != "default":
            parts.append(f"clock={self.clock}")
        parts += [f"{k}={v}" for k, v in self.server]
        parts += list(self.packages)
        return " ".join(parts)


@dataclass(frozen=True)
class Measurement:
    """Metrics of one benchmark repetition inside a trial (not independent of its siblings)."""

    repetition: int
    metrics: Mapping[str, float]
    seconds: float | None = None  # node wall time of this repetition (its share of the cost)


@dataclass(frozen=True)
class TrialResult:
    """What one server lifetime produced. `measurements` is empty unless outcome is OK."""

    outcome: Outcome
    detail: str = ""
    measurements: tuple[Measurement, ...] = ()
    states: tuple[tuple[str, float], ...] = ()  # (TrialState value, unix time) as reached
    started_at: float = 0.0
    ended_at: float = 0.0
    node: str = ""
    fingerprint: Mapping = field(default_factory=dict)
    log_tail: str = ""
    suspect: bool = False
    suspect_reason: str = ""

    def values(self, metric: str) -> list[float]:
        return [
            float(m.metrics[metric])
            for m in self.measurements
            if metric in m.metrics and m.metrics[metric] is not None
            and math.isfinite(float(m.metrics[metric]))
        ]

    def value(self, metric: str) -> float | None:
        """Trial-level value: the mean over repetitions. The restart is the statistical unit."""
        vals = self.values(metric)
        return statistics.fmean(vals) if vals else None

    def metric_names(self) -> list[str]:
        names: dict[str, None] = {}
        for m in self.measurements:
            names.update(dict.fromkeys(m.metrics))
        return list(names)
