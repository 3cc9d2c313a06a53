"""The shape of the history a bisection searches: a chain of commits, or a commit graph.

Hypothesis ``h`` ("commit ``h`` is the first bad one") says which points read bad. On a chain
(``first_parent`` mode) that is every point at or after ``h``. On the full graph it is every
point that *descends* from ``h``: a commit carries a change exactly when the change is in its
history, which is how ``git bisect`` treats a graph. A topological order is not enough: a side
branch's commits come before the mainline commits that are merged with it later, and those do
not contain it, so "later in the list" does not mean "bad".

Points are indices into the candidate list: 0 is the good commit, ``n - 1`` the bad one, and
on the graph every parent comes before its children. Points that are not descendants of the
good commit (a parent outside the range, on a branch forked before it) are good under every
hypothesis: like ``git bisect``, an ancestor of a good commit is taken to be good.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class History:
    """Which points read bad under which hypothesis; the parents a culprit is verified against."""

    def __init__(self, n: int, parents: Sequence[Sequence[int]] | None = None,
                 assumed_good: Sequence[int] = ()) -> None:
        self.n = n
        self.linear = parents is None
        if parents is None:
            self.parents: tuple[tuple[int, ...], ...] = ((),) + tuple((i - 1,) for i in range(1, n))
            self._anc = None
            self.hypotheses = np.arange(1, n)
            return
        if len(parents) != n:
            raise ValueError(f"parents needs {n} entries, got {len(parents)}")
        clean = []
        for child, ps in enumerate(parents):
            ps = tuple(int(p) for p in ps)
            if any(not 0 <= p < child for p in ps):
                raise ValueError(f"point {child}: parents must be earlier points, got {ps}")
            clean.append(ps)
        self.parents = tuple(clean)
        anc = np.zeros((n, n), dtype=bool)  # anc[x, y]: y is x or an ancestor of x
        for child, ps in enumerate(self.parents):
            anc[child, child] = True
            for p in ps:
                anc[child] |= anc[p]
        if not anc[n - 1].all():
            raise ValueError("every point must be an ancestor of the bad commit (the last point)")
        self._anc = anc
        # Hypotheses: every commit in the range (all but the good commit and the parents
        # listed from outside the range).
        good = np.zeros(n, dtype=bool)
        good[[0, *assumed_good]] = True
        if good[n - 1]:
            raise ValueError("the bad commit cannot be assumed good")
        self.hypotheses = np.flatnonzero(~good)

    def bad_matrix(self, hyps: np.ndarray, points: np.ndarray) -> np.ndarray:
        """``R[i, j]``: point ``points[j]`` reads bad when ``hyps[i]`` is the first bad commit."""
        if self._anc is None:
            return points[None, :] >= hyps[:, None]
        return self._anc[np.ix_(points, hyps)].T

    def reads_bad(self, point: int, hyps: np.ndarray) -> np.ndarray:
        """For each hypothesis, does ``point`` read bad under it?"""
        if self._anc is None:
            return hyps <= point
        return self._anc[point, hyps]

    def descends(self, point: int, culprit: int) -> bool:
        if self._anc is None:
            return point >= culprit
        return bool(self._anc[point, culprit])

    def testable_parents(self, culprit: int, untestable: np.ndarray) -> tuple[int, ...]:
        """The culprit's parents, each replaced by its nearest testable ancestor on a chain
        (an untestable parent hides which of the two is the first bad commit)."""
        if self._anc is None:
            parent = culprit - 1
            while parent > 0 and untestable[parent]:
                parent -= 1
            return (parent,)
        return self.parents[culprit]
