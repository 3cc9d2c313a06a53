"""Contrasts when some configurations were measured within one server lifetime.

A difference that changes on a running server (a power limit, a clock lock:
:mod:`orchestrator.system.runtime_settable`) is measured in interleaved blocks within one
lifetime, so each such lifetime yields a value for several subsets at once, and those values
share the restart's own level. Counting them as independent restarts would put the restart
noise into a difference from which it cancels (and, for two subsets of one lifetime on the same
side of a contrast, leave it out where it adds up). The model, on the signed log scale::

    y(lifetime t, subset s) = mu(s) + r(t) + e(t, s),   r ~ N(0, sigma_r^2),  e ~ N(0, sigma_w^2)

a split-plot design: lifetimes are the whole plots (the restart-level differences vary between
them), the live levels the sub-plots. Subset means are the generalised least-squares estimate
under that covariance (block diagonal per lifetime: sigma_r^2 J + sigma_w^2 I), and a
contrast's variance is ``c' (X' V^-1 X)^-1 c``: restart noise counts only where the contrast
compares different lifetimes. The components are estimated apart:

- ``sigma_w^2`` (within a lifetime, between its subsets) from lifetimes that measured the same
  set of subsets: the residuals of their within-lifetime differences around the mean
  differences, i.e. how a paired difference scatters from one lifetime to the next (which
  includes a setting whose effect varies with the lifetime). Where those residuals have few
  degrees of freedom they are pooled with the scatter of the repetitions within each
  (lifetime, subset) cell, unless an F test (5%) says the lifetimes scatter more than the
  repetitions explain: then the residuals alone are used (Bancroft's "sometimes pool").
  Pooling assumes no lifetime-by-setting interaction: that is what the pairing does not
  cover until several lifetimes have measured it.
- ``sigma_r^2 + sigma_w^2`` (a value's whole variance) from the values of each subset across
  lifetimes (as the isolate pools them without lifetimes), on as many degrees of freedom as
  there are lifetimes beyond the first of each restart-level configuration.

The degrees of freedom of a contrast are Satterthwaite's, from how much its variance rests on
each component. With every lifetime measuring one subset this is the plain pooled contrast the
strategy uses otherwise (:class:`~orchestrator.strategies.isolate.stats.SubsetEvidence`
keeps that path, so runs without live differences are unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy.special import fdtrc

POOL_LEVEL = 0.05  # the F test that decides whether the repetitions' scatter is pooled in


@dataclass(frozen=True)
class Components:
    """The two variance components with their degrees of freedom."""

    total: float  # sigma_r^2 + sigma_w^2
    total_df: float
    within: float  # sigma_w^2
    within_df: float
    pooled_repetitions: bool  # within includes the repetitions' scatter (no interaction seen)


def _order(point: Hashable) -> list:
    """A stable order of points: subsets by their members, anything else by itself."""
    return sorted(point) if isinstance(point, frozenset) else [point]


@dataclass
class Cell:
    value: float  # signed log of the cell's mean
    spread: float | None  # sample variance of the repetitions (log scale)
    repetitions: int


def components(lifetimes: Mapping[int, Mapping[Hashable, Cell]],
               values: Mapping[Hashable, list[float]]) -> Components:
    """Estimate both components from the cells of every lifetime (keyed by the points each
    measured) and every point's values across lifetimes."""
    # sigma_r^2 + sigma_w^2: every point's values across lifetimes, on as many degrees of
    # freedom as there are lifetimes beyond the first of each design (the set of points a
    # lifetime measured): values of one lifetime are not independent of each other.
    ss_total = 0.0
    for vals in values.values():
        if len(vals) > 1:
            mean = math.fsum(vals) / len(vals)
            ss_total += math.fsum((v - mean) ** 2 for v in vals)
    nominal = sum(len(v) - 1 for v in values.values() if len(v) > 1)
    per_design: dict[frozenset, int] = {}
    for cells in lifetimes.values():
        per_design[frozenset(cells)] = per_design.get(frozenset(cells), 0) + 1
    df_total = float(sum(n - 1 for n in per_design.values()))
    total = ss_total / nominal if nominal > 0 else math.nan
    # sigma_w^2: residuals of within-lifetime differences, over lifetimes of the same design.
    designs: dict[frozenset, list[Mapping[Hashable, Cell]]] = {}
    for cells in lifetimes.values():
        if len(cells) > 1:
            designs.setdefault(frozenset(cells), []).append(cells)
    ss_w, df_w = 0.0, 0
    ss_b, df_b = 0.0, 0
    for design, group in designs.items():
        subsets = sorted(design, key=_order)
        m, n = len(subsets), len(group)
        y = np.array([[g[s].value for s in subsets] for g in group])
        resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
        ss_w += float((resid ** 2).sum())
        df_w += (n - 1) * (m - 1)
        for g in group:
            for s in subsets:
                c = g[s]
                if c.spread is not None and c.repetitions > 1:
                    ss_b += (c.repetitions - 1) * c.spread / c.repetitions
                    df_b += c.repetitions - 1
    pooled = False
    if df_w == 0 and df_b == 0:
        within, within_df = total, df_total
    elif df_b == 0:
        within, within_df = ss_w / df_w, float(df_w)
    elif df_w == 0:
        within, within_df, pooled = ss_b / df_b, float(df_b), True
    else:
        ms_w, ms_b = ss_w / df_w, ss_b / df_b
        scatter_more = ms_b > 0 and float(fdtrc(df_w, df_b, ms_w / ms_b)) < POOL_LEVEL
        if scatter_more:
            within, within_df = ms_w, float(df_w)
        else:
            within, within_df, pooled = (ss_w + ss_b) / (df_w + df_b), float(df_w + df_b), True
    if not math.isfinite(total):
        total, df_total = within, 0.0
    return Components(total, df_total, within, within_df, pooled)


class SplitPlot:
    """Generalised least-squares subset means and contrasts under the split-plot model."""

    def __init__(self, lifetimes: Mapping[int, Mapping[Hashable, Cell]],
                 comp: Components) -> None:
        self.comp = comp
        self.subsets = sorted({s for cells in lifetimes.values() for s in cells}, key=_order)
        self.index = {s: i for i, s in enumerate(self.subsets)}
        self.lifetimes = [(list(cells), np.array([c.value for c in cells.values()]))
                          for cells in lifetimes.values()]
        self._fits: dict[tuple[float, float], tuple[np.ndarray, np.ndarray]] = {}

    def _fit(self, total: float, within: float) -> tuple[np.ndarray, np.ndarray]:
        key = (total, within)
        if key not in self._fits:
            k = len(self.subsets)
            info, score = np.zeros((k, k)), np.zeros(k)
            within = max(within, 1e-18)
            between = max(total - within, 0.0)
            for subsets, y in self.lifetimes:
                m = len(subsets)
                idx = [self.index[s] for s in subsets]
                shrink = between / (within + m * between)
                v_inv = (np.eye(m) - shrink * np.ones((m, m))) / within
                info[np.ix_(idx, idx)] += v_inv
                score[idx] += v_inv @ y
            cov = np.linalg.pinv(info)
            self._fits[key] = (cov @ score, cov)
        return self._fits[key]

    def means(self) -> dict[Hashable, float]:
        mu, _ = self._fit(self.comp.total, self.comp.within)
        return {s: float(mu[i]) for s, i in self.index.items()}

    def contrast(self, weights: Mapping[Hashable, float]) -> tuple[float, float, float] | None:
        """(estimate, standard error, Satterthwaite degrees of freedom), None when a subset of
        the contrast was not measured."""
        if any(s not in self.index for s in weights):
            return None
        c = np.zeros(len(self.subsets))
        for s, w in weights.items():
            c[self.index[s]] = w
        comp = self.comp
        mu, cov = self._fit(comp.total, comp.within)
        estimate = float(c @ mu)
        var = float(c @ cov @ c)
        if not var > 0:
            return estimate, 0.0, math.inf
        # How the variance moves with each component (numeric, relative steps).
        parts = []
        for which, df in (("total", comp.total_df), ("within", comp.within_df)):
            theta = comp.total if which == "total" else comp.within
            step = max(theta, 1e-12) * 1e-4
            args = (comp.total + step, comp.within) if which == "total" else (
                comp.total, comp.within + step)
            moved = float(c @ self._fit(*args)[1] @ c)
            share = (moved - var) / step * theta  # d var / d log theta
            if abs(share) > 1e-9 * var:
                if df <= 0:
                    return estimate, math.inf, 0.0
                parts.append(share * share / df)
        df = var * var / math.fsum(parts) if parts else math.inf
        return estimate, math.sqrt(var), df


# A lifetime whose every value lies this many standard deviations from the mean of its
# configurations' other lifetimes, all on one side, is an outlier restart (a launch 3x slow
# throughout: log 1.1, forty restart sds at 3% noise): left out of every estimate, as the bisect
# leaves its outlier restarts out. The sd is pooled over the other lifetimes (so the outlier
# does not hide itself) on at least OUTLIER_MIN_DF degrees of freedom; under normal noise a
# lifetime is flagged well under once in ten thousand.
OUTLIER_SIGMAS = 10.0
# Lifetimes the median-based sd needs (`_robust_sd`: the cells of one lifetime share its
# restart level, so it is lifetimes that count), and how far above it the pooled sd must be
# before slow launches are taken to inflate it: under normal noise the two agree (the ratio
# scatters around 1), while one launch in ten 3x slow puts it near 15.
OUTLIER_ROBUST_MIN = 8
CONTAMINATED = 2.0
OUTLIER_MIN_DF = 6


def kept(lifetimes: Mapping[int, Mapping[Hashable, Cell]]
         ) -> tuple[dict[int, Mapping[Hashable, Cell]], dict[Hashable, list[float]]]:
    """The lifetimes without the outliers (:func:`outlier_lifetimes`), and each
    configuration's values in them: what a split-plot fit or a pooled spread reads."""
    flagged = outlier_lifetimes(lifetimes)
    cells = {t: c for t, c in lifetimes.items() if t not in flagged}
    values: dict[Hashable, list[float]] = {}
    for c in cells.values():
        for key, cell in c.items():
            values.setdefault(key, []).append(cell.value)
    return cells, values


def outlier_lifetimes(lifetimes: Mapping[int, Mapping[Hashable, Cell]],
                      threshold: float = OUTLIER_SIGMAS) -> set[int]:
    """Lifetimes whose values all sit more than `threshold` sds from where their
    configurations' other lifetimes put them (:func:`_centre`), all on one side. The sd is
    pooled over the other lifetimes, or, where slow launches inflate that, the median-based
    one (:func:`_robust_sd`). Where as many of a configuration's lifetimes would be left out
    as kept, which ones are the slow ones is not known: all of them are left out, and the
    configuration is measured again (as the bisect takes another restart of a commit whose
    two disagree)."""
    per: dict[Hashable, dict[int, float]] = {}
    for t, cells in lifetimes.items():
        for key, c in cells.items():
            per.setdefault(key, {})[t] = c.value
    robust = _robust_sd(per)
    flagged = set()
    for t, cells in lifetimes.items():
        ss, df = 0.0, 0
        for vals in per.values():
            rest = [v for u, v in vals.items() if u != t]
            if len(rest) >= 2:
                m = math.fsum(rest) / len(rest)
                ss += math.fsum((v - m) ** 2 for v in rest)
                df += len(rest) - 1
        if df < OUTLIER_MIN_DF or not ss > 0:
            continue
        sd = math.sqrt(ss / df)
        if robust is not None and sd > CONTAMINATED * robust:
            sd = robust  # slow launches inflate the pooled sd: judge against the median's
        zs = []
        for key, c in cells.items():
            rest = [v for u, v in per[key].items() if u != t]
            if len(rest) >= 2:
                zs.append((c.value - _centre(rest)) / (sd * _spread(len(rest))))
        if zs and (all(z > threshold for z in zs) or all(z < -threshold for z in zs)):
            flagged.add(t)
    split = {t for vals in per.values() if 2 * len(flagged & vals.keys()) >= len(vals)
             for t in vals}
    return flagged | split


def _centre(rest: list[float]) -> float:
    """Where a configuration's other values put it: their median from three on (two slow
    launches among six shift a mean by a third of their slowness, a median not at all)."""
    return float(np.median(rest)) if len(rest) >= 3 else math.fsum(rest) / len(rest)


def _spread(m: int) -> float:
    """The sd of a value's distance from :func:`_centre` of `m` others, in value sds (a
    median of m normal values varies about pi/2 times as much as their mean)."""
    return math.sqrt(1.0 + (math.pi / 2.0 if m >= 3 else 1.0) / m)


def _robust_sd(per: Mapping[Hashable, Mapping[int, float]]) -> float | None:
    """The noise sd as the median of every value's distance from the median of its
    configuration's other values (scaled to one value's sd), None on fewer than
    OUTLIER_ROBUST_MIN lifetimes. One slow launch in ten puts a tenth of the values 40 sds
    out, which the pooled sd of the rest takes in (3x launches: 0.33 on log values of
    0.02 noise, so none of them stands 10 of those out) and these medians do not."""
    distances = []
    for vals in per.values():
        if len(vals) < 3:
            continue
        values = list(vals.values())
        for i, v in enumerate(values):
            rest = values[:i] + values[i + 1:]
            distances.append(abs(v - _centre(rest)) / _spread(len(rest)))
    if not distances or len({t for vals in per.values() for t in vals}) < OUTLIER_ROBUST_MIN:
        return None
    return float(np.median(distances)) / 0.6744897501960817
