"""The few distribution functions the report path needs, from `scipy.special`.

`scipy.stats` costs about a second of CPU to import (its whole distribution zoo), more than
everything else `sleuth report` does on a 500-trial run but the figures. The Student-t
quantile and tail and the chi-square quantile are single calls into `scipy.special`, which
`scipy.stats` itself uses for them (`stdtrit`, `stdtr`, `chdtri`): the same numbers, without
the import.
"""

from __future__ import annotations

from scipy import special


def t_ppf(q: float, df: float) -> float:
    """Student-t quantile (`scipy.stats.t.ppf(q, df)`)."""
    return float(special.stdtrit(df, q))


def t_sf(x: float, df: float) -> float:
    """Student-t upper tail (`scipy.stats.t.sf(x, df)`)."""
    return float(special.stdtr(df, -x))


def chi2_ppf(q: float, df: float) -> float:
    """Chi-square quantile (`scipy.stats.chi2.ppf(q, df)`)."""
    return float(special.chdtri(df, 1.0 - q))
