"""What restoring each named cause wins back, and each cause's share, when causes overlap or
interact.

An isolate names causes among the differences between a good configuration (the reference's
settings restored) and a bad one (the node as it is). Summing each cause's "added alone"
effect is only right when causes are additive. Two variables that each force the verify pass
eager are +38% alone and +38% together: summed they claim +90% and leave a -29% "remainder"
that is nothing but the overlap, and the sentence invites "revert either one", which wins back
nothing. So the answer is built from a *game* over the named causes instead:

- ``u(S)``: the metric (log scale) of the configuration with the causes in ``S`` present and the
  other named ones restored, minus that of the one with none present. A configuration counts
  for ``S`` whatever the cleared (harmless) differences are: the isolate judged them so. Every
  such configuration the isolate measured is used (good, bad, each cause added alone to good,
  each removed alone from bad, bad without all the named ones, good with all of them): for one,
  two or three causes that is every subset;
- **restore alone** (cause ``i``): ``u(N - {i}) - u(N)``; **restore all**: ``-u(N)``. These are
  what a user wins back by fixing one setting, or all of them, as measured;
- **share** (the attribution rule): the Shapley value of ``u``, the average over every order of
  restoring the causes of what cause ``i`` adds when it is put back. Shares are symmetric
  (overlapping causes get equal halves), sum exactly to ``u(N)`` (so the answer's remainder is
  ``total - u(N)``, never an artefact of the attribution) and equal each cause's own effect
  when causes are additive. When a subset is not measured (four causes: the six pairs), the
  shares are the average of each cause's two measured extremes (added alone to good, removed
  alone from bad), scaled to sum to ``u(N)``: Shapley's value for additive and for two-cause
  games, an approximation otherwise, and the document says which rule was used;
- **relation** of two causes: their interaction contrast ``u(ij) - u(i) - u(j) + u({})``.
  Confidently negative: they overlap ("either alone gives all of it: restore both" when each
  one's restore-alone interval lies within the answer's tolerance, a quarter of the change and
  at least 4%). Confidently positive: synergy ("only together": adding either one alone costs
  nothing worth naming, and restoring either one wins it back).

Each quantity is a linear combination of configuration means, so its standard error comes from
the pooled restart variance of the configurations (log scale) and its degrees of freedom from
the pool. Its intervals hold together: each is at ``1 - 0.05 / (2 n + 1)`` for ``n`` causes
(99% for two), since "restore both; either alone wins back nothing" is one claim made of several
intervals. Pure functions, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.answer.combine import CONFIDENCE, LogChange, tolerance

Subset = frozenset[int]
MAX_CAUSES = 4


@dataclass(frozen=True)
class Game:
    """Configuration means per subset of named causes, with the pooled restart noise."""

    n: int  # number of named causes (players)
    means: dict[Subset, float]  # player subset -> mean log value of its configurations
    counts: dict[Subset, int]  # trials behind each mean
    sigma2: float  # pooled within-configuration variance (log scale)
    df: float
    # Where configurations share server lifetimes (orchestrator/run/paired.py): the
    # split-plot contrast over the game's subsets, (estimate, se, df), else None.
    paired: Callable[[Mapping[Subset, float]], tuple[float, float, float] | None] | None = None

    def has(self, *subsets: Subset) -> bool:
        return all(s in self.means for s in subsets)

    def combine(self, weights: Mapping[Subset, float]) -> LogChange:
        """``sum(w * mean)`` with its standard error; subsets must be measured."""
        if self.paired is not None:
            found = self.paired({s: w for s, w in weights.items() if w})
            if found is not None:
                return LogChange(*found)
        diff = math.fsum(w * self.means[s] for s, w in weights.items())
        var = math.fsum(w * w * self.sigma2 / self.counts[s] for s, w in weights.items())
        if not math.isfinite(var) or self.df <= 0:
            return LogChange(diff, math.inf, 0.0)
        return LogChange(diff, math.sqrt(var), self.df)


def build_game(players: Sequence[Subset], values: Mapping[Subset, Sequence[float]],
               paired=None) -> Game:
    """The game of the named causes from measured configurations.

    ``players``: each cause's differences (a pair that hurts only together is one cause);
    ``values``: log values per configuration (the set of differences applied to good). A
    configuration that splits a cause (one member of a pair present) is not a point of the
    game; every configuration counts for the pooled noise."""
    union = frozenset().union(*players) if players else frozenset()
    pooled: dict[Subset, list[float]] = {}
    ss, dof = 0.0, 0
    for config, vals in values.items():
        vals = [float(v) for v in vals if math.isfinite(v)]
        if len(vals) >= 2:
            mean = math.fsum(vals) / len(vals)
            ss += math.fsum((v - mean) ** 2 for v in vals)
            dof += len(vals) - 1
        present = config & union
        if not vals or any(0 < len(p & present) < len(p) for p in players):
            continue
        key = frozenset(i for i, p in enumerate(players) if p <= present)
        pooled.setdefault(key, []).extend(vals)
    means = {k: math.fsum(v) / len(v) for k, v in pooled.items()}
    counts = {k: len(v) for k, v in pooled.items()}
    sigma2 = ss / dof if dof > 0 else math.inf
    return Game(len(players), means, counts, sigma2, float(dof), paired)


def _shapley_weights(game: Game, i: int) -> dict[Subset, float] | None:
    n = game.n
    others = [j for j in range(n) if j != i]
    weights: dict[Subset, float] = {}
    for size in range(n):
        coef = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
        for rest in itertools.combinations(others, size):
            without = frozenset(rest)
            with_i = without | {i}
            if not game.has(without, with_i):
                return None
            weights[with_i] = weights.get(with_i, 0.0) + coef
            weights[without] = weights.get(without, 0.0) - coef
    return weights


def _extremes_weights(game: Game) -> list[dict[Subset, float]] | None:
    """Each cause's mean of "added alone" and "removed alone", scaled so the shares sum to
    ``u(N)``: the scale is taken from the point estimates (its noise is not propagated)."""
    everyone = frozenset(range(game.n))
    empty = frozenset()
    raw = []
    for i in range(game.n):
        alone, without = frozenset({i}), everyone - {i}
        if not game.has(empty, alone, without, everyone):
            return None
        w: dict[Subset, float] = {}
        for s, c in ((alone, 0.5), (empty, -0.5), (everyone, 0.5), (without, -0.5)):
            w[s] = w.get(s, 0.0) + c
        raw.append(w)
    estimates = [math.fsum(c * game.means[s] for s, c in w.items()) for w in raw]
    whole = game.means[everyone] - game.means[empty]
    total = math.fsum(estimates)
    scale = whole / total if abs(total) > 1e-12 else 1.0
    return [{s: c * scale for s, c in w.items()} for w in raw]


def _interaction(game: Game, i: int, j: int) -> LogChange | None:
    """``u(ij) - u(i) - u(j) + u({})`` with the other causes absent (or, failing that, present)."""
    others = frozenset(range(game.n)) - {i, j}
    for base in (frozenset(), others):
        cells = (base | {i, j}, base | {i}, base | {j}, base)
        if game.has(*cells):
            return game.combine({cells[0]: 1.0, cells[1]: -1.0, cells[2]: -1.0, cells[3]: 1.0})
    return None


def _negligible(change: Mapping | None, bound: float, level: float) -> bool:
    if not change:
        return False
    lo, hi = LogChange(*change["log"]).log_interval(level)
    return -bound <= lo and hi <= bound


def simultaneous_level(n_causes: int, confidence: float = CONFIDENCE) -> float:
    """The level of each interval so that all the attribution states hold together at
    `confidence` (Bonferroni over each cause's share and "restore alone", and "restore all"):
    a user reads them as one claim ("restore both; either alone wins nothing")."""
    return 1.0 - (1.0 - confidence) / (2 * n_causes + 1)


def relation_words(kind: str, labels: tuple[str, str], full: bool, most: bool = False) -> str:
    """`full`: the claim holds within the answer's tolerance; `most`: within half of what
    restoring all wins back (too few restarts to say "all", enough to say "most")."""
    a, b = labels
    if kind == "overlap":
        if full or most:
            return (f"{a} and {b} overlap: either alone gives {'all' if full else 'most'} of"
                    " it: restore both")
        return (f"{a} and {b} overlap: restoring both wins back more than"
                " the two alone add up to")
    if full or most:
        return (f"{a} and {b} hurt {'only' if full else 'mostly'} together: restoring either"
                " one wins it back")
    return f"{a} and {b} hurt more together than apart"


def attribute(players: Sequence[Subset], values: Mapping[Subset, Sequence[float]],
              labels: Sequence[str], *, bad: Subset,
              members: Sequence[tuple[int, str]] = (), paired=None) -> dict | None:
    """The attribution document of the named causes (None without a cause, with more than
    :data:`MAX_CAUSES`, or without the configurations it needs).

    ``bad``: every difference (the bad configuration). ``members``: differences ``(index,
    label)`` of causes that hurt only together, for their own "restore this alone" (the
    configuration bad without that one difference)."""
    if not players or len(players) > MAX_CAUSES:
        return None
    game = build_game(players, values, paired)
    level = simultaneous_level(len(players))

    def js(change: LogChange) -> dict:
        return change.to_json(level)

    everyone, empty = frozenset(range(game.n)), frozenset()
    if not game.has(everyone, empty) or not math.isfinite(game.sigma2):
        return None
    shapley = [_shapley_weights(game, i) for i in range(game.n)]
    rule = "shapley"
    if any(w is None for w in shapley):
        extremes = _extremes_weights(game)
        if extremes is None:
            return None
        shapley, rule = extremes, "extremes"
    causes = []
    for i in range(game.n):
        doc = {"label": labels[i], "share": js(game.combine(shapley[i]))}
        without = everyone - {i}
        if game.has(without):
            doc["restore_alone"] = js(game.combine({without: 1.0, everyone: -1.0}))
        if game.has(frozenset({i})):
            doc["add_alone"] = js(game.combine({frozenset({i}): 1.0, empty: -1.0}))
        causes.append(doc)
    restore_all = game.combine({empty: 1.0, everyone: -1.0})
    bound = tolerance(restore_all)
    relations = []
    for i, j in itertools.combinations(range(game.n), 2):
        contrast = _interaction(game, i, j)
        if contrast is None or not contrast.excludes_zero(level):
            continue
        kind = "overlap" if contrast.diff < 0 else "synergy"
        # Full overlap: restoring either one alone wins back nothing worth naming; full
        # synergy: adding either one alone to good costs nothing worth naming. "Worth naming"
        # is the answer's own tolerance (a quarter of the change, at least 4%), on the whole
        # interval, so a noisy estimate does not claim it.
        key = "restore_alone" if kind == "overlap" else "add_alone"
        full = all(_negligible(causes[k].get(key), bound, level) for k in (i, j))
        most = full or all(_negligible(causes[k].get(key), 0.5 * abs(restore_all.diff),
                                       level)
                           for k in (i, j))
        relations.append({"causes": [i, j], "kind": kind, "contrast": js(contrast),
                          "full": full, "most": most,
                          "words": relation_words(kind, (labels[i], labels[j]), full, most)})
    member_docs = []
    for index, label in members:
        alone = _member_restore(values, game, bad, index)
        if alone is not None:
            member_docs.append({"difference": index, "label": label,
                                "restore_alone": js(alone), "_change": alone})
    for i, player in enumerate(players):
        mine = [m for m in member_docs if m["difference"] in player]
        if len(player) < 2 or len(mine) < len(player):
            continue
        # Restoring any one member wins it back: each one's interval excludes no change, on
        # the side restoring all of them is.
        full = all(abs(m["_change"].diff - restore_all.diff) <= bound
                   and m["_change"].excludes_zero(level) for m in mine)
        names = tuple(m["label"] for m in mine)
        words = (" and ".join(names) + " hurt only together: restoring either one wins it back"
                 if full else " and ".join(names) + " hurt only together")
        relations.append({"causes": [i], "kind": "synergy", "full": full, "most": full,
                          "words": words})
    for m in member_docs:
        m.pop("_change")
    return {"rule": rule, "confidence": level, "causes": causes, "restore_all": js(restore_all),
            "relations": relations, "members": member_docs,
            "noise": {"sigma": math.sqrt(game.sigma2), "df": game.df}}


def _member_restore(values: Mapping[Subset, Sequence[float]], game: Game, everything: Subset,
                    index: int) -> LogChange | None:
    """Bad without one member of a cause that hurts only together, against bad: the exact
    configurations (every difference applied, and every one but ``index``)."""
    bad = [float(v) for v in values.get(everything, ())]
    without = [float(v) for v in values.get(everything - {index}, ())]
    if not bad or not without:
        return None
    mb, mw = math.fsum(bad) / len(bad), math.fsum(without) / len(without)
    var = game.sigma2 * (1.0 / len(bad) + 1.0 / len(without))
    if not math.isfinite(var):
        return None
    return LogChange(mw - mb, math.sqrt(var), game.df)


def _alone(doc: Mapping, metric_pct_text) -> list[str]:
    """Each cause's "restore alone" (with more than one cause), and each member's of a cause
    that hurts only together: all of a pair's members or none (one member's alone, the other
    unmeasured, read as if restoring that one were the advice)."""
    causes = doc.get("causes", [])
    alone = [f"{c['label']} alone {metric_pct_text(c['restore_alone'])}"
             for c in causes if c.get("restore_alone") and len(causes) > 1]
    members = doc.get("members", [])
    pairs = [r for r in doc.get("relations", []) if len(r.get("causes", [])) == 1]
    if members and len(members) >= 2 * max(len(pairs), 1):
        alone += [f"{m['label']} alone {metric_pct_text(m['restore_alone'])}" for m in members]
    return alone


def sentence(doc: Mapping, metric_pct_text) -> str:
    """The attribution's clause of an answer: what restoring wins back, and the relations in
    words. ``metric_pct_text`` lays out one change (``{pct, ci}``) as text."""
    parts = [rel["words"] for rel in doc.get("relations", [])]
    restore = f"restore all: {metric_pct_text(doc['restore_all'])}"
    alone = _alone(doc, metric_pct_text)
    if alone:
        restore += "; restore " + ", ".join(alone)
    parts.append(restore)
    return "; ".join(parts)


def relation_lines(doc: Mapping, metric_pct_text) -> list[tuple[str, str]]:
    """The same as labelled lines: `overlap:` / `together:` per relation, then `restore:`."""
    if not doc or not doc.get("restore_all"):
        return []
    out = [("overlap" if rel.get("kind") == "overlap" else "together", str(rel["words"]))
           for rel in doc.get("relations", [])]
    restore = f"all {metric_pct_text(doc['restore_all'])}"
    alone = _alone(doc, metric_pct_text)
    if alone:
        restore += "; " + ", ".join(alone)
    out.append(("restore", restore))
    return out
