"""What each command is asked to do: one small frozen record per command, built once from the
run's settings at the command's entry.

`RunSettings` (`schema.py`) is the composed tree Hydra fills and the run stores; it holds the
shared settings (target, bench, cluster, the candidate's keys) beside fields that only one
command reads (`good`/`bad`, a sweep's `trials`, a scenario's `out`, ...), typed loosely
because Hydra composes one schema for every command (`good` is a ref for a bisect and a
candidate spec for an isolate). A command does not read those fields from the tree: its entry
builds its request (`BisectRequest.of(settings)`, ...), which checks the command's own
arguments (one `UserError` line, exit 2, before anything is written) and holds them typed (a
ref as `str`, paths as a tuple). The rest of the command reads the request.

A resumed run, or a report replaying one, reads a request whose arguments were checked when
the run started: `stored(settings)` builds it without the checks, so a run an older release
accepted still resumes. A command run as a step of another (an investigation's bisect, an
isolate's compare) gets its request from that command's own (`InvestigateRequest.bisect_step`,
`CompareRequest.step` with the caller's budget), never by rewriting the settings.

One module for every command, so a newcomer finds what each command is asked in one place;
the records are small and their checks are the commands' refusals, nothing more.

Size: one record per command (eleven of them) with its checks beside it; splitting them by
command would scatter the one place a newcomer reads what each command is asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import params as experiment_params
from orchestrator.config.schema import RunSettings
from orchestrator.config.settings import as_dict
from orchestrator.errors import UserError
from orchestrator.metrics import check_metric, regression_direction

if TYPE_CHECKING:  # Optuna comes with them: imported when a sweep's request is built
    from orchestrator.strategies.sweep.search import SweepSettings
    from orchestrator.strategies.sweep.space import SearchSpace


def check_confidence(confidence: float) -> float:
    """A posterior mass to reach: strictly between a coin flip and certainty."""
    if not 0.5 < confidence < 1.0:
        raise UserError(f"confidence must be between 0.5 and 1 (exclusive), got {confidence}")
    return float(confidence)


def check_budget(max_trials: int | None) -> int | None:
    """A bisect's or an isolate's restart budget: the endpoints and a split need four."""
    if max_trials is not None and max_trials < 4:
        raise UserError(f"max_trials must be at least 4 (got {max_trials})")
    return max_trials


def _check_metric(settings: RunSettings) -> str:
    """The metric, known to the metric table (or one a `command` target's bench reports)."""
    target = settings.target
    check_metric(settings.metric, custom=target.name == "command", target=as_dict(target))
    return settings.metric


def _text(value: object) -> str | None:
    return str(value) if value else None


@dataclass(frozen=True)
class _Search:
    """What a bisect and an investigation both ask: the metric and its `direction` as given
    (`auto` follows the metric table), how surely, within how many restarts, which history
    (`first_parent`, `paths`), and the "then" the change is chased from: `reference` names an
    earlier run, `was` states the good level directly (one or the other: `check_common`)."""

    metric: str
    direction: str
    confidence: float
    max_trials: int | None
    first_parent: bool
    paths: tuple[str, ...]
    reference: str | None
    was: float | None

    @staticmethod
    def _fields(settings: RunSettings) -> dict[str, Any]:
        return dict(metric=settings.metric, direction=settings.direction,
                    confidence=float(settings.confidence), max_trials=settings.max_trials,
                    first_parent=settings.first_parent,
                    paths=tuple(str(p) for p in settings.paths),
                    reference=_text(settings.reference),
                    was=float(settings.was) if settings.was is not None else None)


@dataclass(frozen=True)
class BisectRequest(_Search):
    """`sleuth bisect`: the range (or a package's releases) to search and how surely.

    `good`/`bad` are refs (or, with `package`, two versions of that package)."""

    good: str
    bad: str
    package: str  # `package=NAME`: its releases are the points, not commits
    package_pre: bool

    @classmethod
    def of(cls, settings: RunSettings) -> BisectRequest:
        """The request, its arguments checked (the shared checks are `check_common`'s)."""
        _check_metric(settings)
        regression_direction(settings.metric, settings.direction)
        good, bad = settings.good, settings.bad
        if not good or not bad:
            raise UserError("bisect needs both endpoints: good=REF bad=REF")
        if not isinstance(good, str | int) or not isinstance(bad, str | int):
            raise UserError("bisect endpoints are refs (good=REF bad=REF); candidate specs such"
                            " as good.commit=... are for sleuth isolate")
        check_confidence(settings.confidence)
        check_budget(settings.max_trials)
        if settings.package.name.strip():
            _check_release(settings)
        return cls.stored(settings)

    @classmethod
    def stored(cls, settings: RunSettings) -> BisectRequest:
        """The request of a run checked when it started (a resume, a report's replay); an
        investigation's stored settings may hold no endpoints (its reference is one)."""
        package = settings.package.name.strip()
        shared = cls._fields(settings)
        shared["first_parent"] = shared["first_parent"] or bool(package)  # releases are a line
        return cls(good=str(settings.good or ""), bad=str(settings.bad or ""), package=package,
                   package_pre=settings.package.pre, **shared)


def _check_release(settings: RunSettings) -> None:
    """A package name and two exact versions, the package not also pinned for every point."""
    from orchestrator.util.pins import canonical, check_version, parse_pin, pins_of

    name = settings.package.name.strip()
    try:
        parse_pin(f"{name}==0")
    except UserError:
        raise UserError(f"package={name}: not a package name (package=NAME, e.g."
                        " package=nvidia-nccl-cu12)") from None
    check_version(name, settings.good)
    check_version(name, settings.bad)
    if canonical(name) in pins_of(list(settings.packages.pins)):
        raise UserError(f"package={name} is searched: leave it out of packages=[...]")


@dataclass(frozen=True)
class TrialRequest:
    """`sleuth trial`: how many server restarts of the run's candidate (`restarts=N`; three
    or more make a reference for `sleuth investigate`)."""

    restarts: int

    @classmethod
    def of(cls, settings: RunSettings) -> TrialRequest:
        """The request (its range, `restarts >= 1`, was checked at composition)."""
        return cls(restarts=int(settings.restarts))


@dataclass(frozen=True)
class ScenarioRequest:
    """`sleuth scenario`: where to write a scenario and its shape, or (`apply`) which of an
    existing scenario's recorded node states to put the simulated nodes in."""

    out: Path
    commits: int
    seed: int
    preset: str
    apply: str | None  # reference | now

    @classmethod
    def of(cls, settings: RunSettings) -> ScenarioRequest:
        """The request, `out` made absolute (the command says the usage without one). The
        preset is checked by the generator, before it writes anything."""
        return cls(out=Path(str(settings.out)).expanduser().resolve(),
                   commits=int(settings.commits), seed=int(settings.seed),
                   preset=str(settings.preset), apply=settings.apply)


def candidate_spec(node: object) -> dict[str, Any]:
    """One side of an isolate (`good.commit=REF good.env.X=V bad.clock=...`) as a plain
    mapping, its patches absolute (saved so, a resume finds them from anywhere)."""
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise UserError("isolate takes candidate specs: good.commit=REF good.env.X=V bad.clock=..."
                        " (or reference=RUN)")
    spec = as_dict(node)
    if "patches" in spec:
        spec["patches"] = [str(Path(str(p)).expanduser().resolve()) for p in spec["patches"]]
    return spec


@dataclass(frozen=True)
class IsolateRequest:
    """`sleuth isolate`: the two configurations whose differences are tested (`good`/`bad`,
    candidate specs; empty with a `reference`, whose re-measured differences are tested
    instead), on which metric, how surely and within how many restarts.

    The specs are plain mappings the record does not copy on reading: take a copy
    (`as_dict(req.good)`) before changing one."""

    metric: str
    direction: str
    confidence: float
    max_trials: int | None
    reference: str | None
    good: Mapping[str, Any] = field(default_factory=dict)  # no sides: the compare's differences
    bad: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: RunSettings) -> IsolateRequest:
        """The request, its arguments checked (the shared checks are `check_common`'s): the
        metric, confidence, budget, and (without a reference) each side's spec."""
        check_metric(settings.metric, target=as_dict(settings.target))
        check_confidence(settings.confidence)
        check_budget(settings.max_trials)
        reference = _text(settings.reference)
        good = bad = {}
        if reference is None:
            good, bad = candidate_spec(settings.good), candidate_spec(settings.bad)
        return cls(good=good, bad=bad, metric=settings.metric, direction=settings.direction,
                   confidence=float(settings.confidence), max_trials=settings.max_trials,
                   reference=reference)


def compare_reference(settings: RunSettings) -> str:
    """The run (or fingerprint file) a compare re-measures: `reference=`, or the older
    spelling `experiment.params.reference=`; refused first when neither is given."""
    given = experiment_params.parse(settings.experiment.params).reference or settings.reference
    if not given:
        raise UserError("compare needs a reference: sleuth compare reference=RUN_DIR_OR_FINGERPRINT")
    return str(given)


@dataclass(frozen=True)
class CompareRequest:
    """`sleuth compare`: the reference to re-measure now, on which metric, within how many
    restarts (`max_trials`; None: `experiment.params.max_trials`, else 9)."""

    reference: str
    metric: str
    max_trials: int | None

    @classmethod
    def of(cls, settings: RunSettings) -> CompareRequest:
        """The request, its reference given and its metric known."""
        reference = compare_reference(settings)
        check_metric(settings.metric, target=as_dict(settings.target))
        return cls(reference=reference, metric=settings.metric,
                   max_trials=settings.max_trials)

    @classmethod
    def step(cls, settings: RunSettings, max_trials: int | None) -> CompareRequest:
        """The compare an isolate or an investigation runs as its first step, with that
        command's budget for it (checked with that command's request)."""
        given = experiment_params.parse(settings.experiment.params).reference \
            or settings.reference
        return cls(reference=str(given or ""), metric=settings.metric, max_trials=max_trials)


@dataclass(frozen=True)
class SweepRequest:
    """`sleuth sweep` (and an investigation's `recover=true` step): the search space, the
    search's settings (`trials` as its budget, sampler, seed, direction, the knobs of
    `experiment.params`), the metric, and the confidence an answer so far is stated at."""

    space: SearchSpace
    search: SweepSettings
    metric: str
    confidence: float

    @classmethod
    def of(cls, settings: RunSettings) -> SweepRequest:
        """The request, every check that needs no repository made: space, budget, knobs,
        sampler (a grid only over a finite space small enough to walk)."""
        from orchestrator.config import sweep as setup
        from orchestrator.strategies.sweep.search import MAX_GRID

        search = setup.settings(settings)
        space = setup.space(settings, as_dict(settings.target))
        if search.sampler == "grid":
            size = space.size()
            if size is None or size > MAX_GRID:
                raise UserError(f"sampler=grid needs a finite space of at most {MAX_GRID} "
                                f"configurations (this one: {size or 'continuous'}); use tpe")
        return cls(space=space, search=search, metric=settings.metric,
                   confidence=float(settings.confidence))


@dataclass(frozen=True)
class InvestigateRequest(_Search):
    """`sleuth investigate`: from a `reference` (an earlier run or fingerprint file), or from
    `good`, to `bad` (refs; `bad` empty: the reference's own commit), and whether to end with
    a `recover` sweep. Its steps get their requests from it (`bisect_step`, `isolate_step`)."""

    good: str | None
    bad: str | None
    recover: bool

    @classmethod
    def of(cls, settings: RunSettings) -> InvestigateRequest:
        """The request, its arguments checked (the shared checks are `check_common`'s;
        whether a reference or both ends are given is the plan's, since the demo hands
        its reference over directly)."""
        _check_metric(settings)
        check_confidence(settings.confidence)
        check_budget(settings.max_trials)
        for side in ("good", "bad"):
            value = getattr(settings, side)
            if value is not None and not isinstance(value, str | int):
                raise UserError(f"investigate takes refs ({side}=REF); candidate specs such as"
                                f" {side}.commit=... are for sleuth isolate")
        return cls(good=_text(settings.good), bad=_text(settings.bad), recover=settings.recover,
                   **cls._fields(settings))

    def bisect_step(self, good: str, bad: str) -> BisectRequest:
        """The bisect of the range `good..bad` (SHAs) under today's system."""
        shared = {f.name: getattr(self, f.name) for f in fields(_Search)}
        return BisectRequest(good=good, bad=bad, package="", package_pre=False, **shared)

    def isolate_step(self) -> IsolateRequest:
        """The isolate of the differences the compare found (no specs: they come from it)."""
        return IsolateRequest(metric=self.metric, direction=self.direction,
                              confidence=self.confidence, max_trials=self.max_trials,
                              reference=self.reference)


@dataclass(frozen=True)
class DemoRequest:
    """`sleuth demo`: the size and seed of the scenario it builds (its preset is the demo's
    own); the investigation and the sweep it runs take their requests from the settings."""

    commits: int
    seed: int

    @classmethod
    def of(cls, settings: RunSettings) -> DemoRequest:
        """The request (`commits >= 1` was checked at composition)."""
        return cls(commits=int(settings.commits), seed=int(settings.seed))


@dataclass(frozen=True)
class RunRequest:
    """`sleuth report RUN [out=DIR]` and `sleuth resume RUN [max_trials=N]`: the run (an id
    under `runs_dir` or a directory), where a report's files go (None: the run directory),
    and a resumed bisect's new budget."""

    run: str
    out: Path | None = None
    max_trials: int | None = None

    @classmethod
    def of(cls, settings: RunSettings) -> RunRequest:
        """The request; without a run, the command's usage in one line."""
        if not settings.run_id:
            raise UserError(f"which run? usage: sleuth {settings.command} RUN (a run id or run"
                            " directory)")
        out = Path(str(settings.out)).expanduser().resolve() if settings.out else None
        # As `sleuth bisect run_id=RUN max_trials=N` checks it: a resume is no way around it
        return cls(run=str(settings.run_id), out=out, max_trials=check_budget(settings.max_trials))


TRACE_SUFFIXES = (".json", ".json.gz")
MODE_NAMES = ("target_verify", "draft", "decode", "extend", "step", "all", "other")


def _trace_files(side: str, given: object) -> tuple[Path, ...]:
    """The trace files one side of `sleuth kernels` names: a directory (its `*.json` and
    `*.json.gz` files), a file, a glob (the shell leaves `then=runs/*.gz` alone), or a list of
    those. Refused in one line when a path is missing or a directory holds no trace file."""
    import glob

    if given in (None, "", []):
        raise UserError("kernels needs both sides: sleuth kernels then=DIR|FILES"
                        " now=DIR|FILES [mode=...]")
    items = list(given) if isinstance(given, list | tuple) else [given]
    files: list[Path] = []
    for item in items:
        text = str(item)
        path = Path(text).expanduser()
        if glob.has_magic(text):
            matched = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
            if not matched:
                raise UserError(f"{side}={text}: no file matches")
            files += matched
        elif path.is_dir():
            found = sorted(p for p in path.iterdir()
                           if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise UserError(f"{side}={text}: the directory holds no trace file"
                                f" (*{', *'.join(TRACE_SUFFIXES)})")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise UserError(f"{side}={text}: no such file or directory")
    return tuple(dict.fromkeys(p.resolve() for p in files))


@dataclass(frozen=True)
class KernelsRequest:
    """`sleuth kernels then=... now=... [mode=...]`: the trace files of each side (one per
    restart, see orchestrator/commands/kernels.py for how files group into restarts) and the
    forward modes to compare (empty: every mode both sides have; `all`: each trace as one
    pass of its whole device time)."""

    then: tuple[Path, ...]
    now: tuple[Path, ...]
    modes: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: RunSettings) -> KernelsRequest:
        """The request, both sides' paths checked (what the files hold is the command's
        check, before it writes anything)."""
        then = _trace_files("then", settings.then)
        now = _trace_files("now", settings.now)
        modes = tuple(m.strip() for m in str(settings.mode or "").split(",") if m.strip())
        unknown = [m for m in modes if m not in MODE_NAMES]
        if unknown:
            raise UserError(f"mode={','.join(unknown)}: not a forward mode (one or more of"
                            f" {', '.join(MODE_NAMES)})")
        if "all" in modes and len(modes) > 1:
            raise UserError("mode=all reads each trace as one pass: give it alone")
        return cls(then=then, now=now, modes=modes)
