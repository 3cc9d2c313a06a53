"""An answer first: the one sentence a findings document leads with, and the arithmetic behind
it (`combine`: log-scale sums and remainders with intervals; `compose`: per run kind; `triage`: across the steps of one run;
`phases`: the mechanism; `text`: how numbers read)."""

from orchestrator.answer.combine import LogChange
from orchestrator.answer.compose import (
    assemble,
    for_bisect,
    for_compare,
    for_isolate,
    for_sweep,
    not_tested,
)
from orchestrator.answer.triage import for_system, pick

__all__ = ["LogChange", "assemble", "for_bisect", "for_compare", "for_isolate", "for_sweep", "for_system",
           "not_tested", "pick"]
