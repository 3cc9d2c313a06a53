"""matplotlib, imported and set up only when a figure is drawn.

Importing matplotlib costs about a second (and, on a fresh machine, building its font cache);
the commands and the markdown and HTML renderers are imported by every run, and most of them
draw nothing. So no module imports matplotlib at its top: a plotting function asks here.
Figures are built on `matplotlib.figure.Figure` directly (no pyplot state), so drawing works
without a display, in threads and in tests.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@functools.cache
def matplotlib_module() -> ModuleType:
    """matplotlib, set up for headless drawing on the first call."""
    import matplotlib

    matplotlib.use("Agg")  # before any figure: headless, whatever the environment says
    # Font chatter ("building the font cache", "findfont: ... not found") is matplotlib's
    # business, not the run's: it interleaved with sleuth's own output. Errors still show.
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    return matplotlib


def new_figure(**kwargs) -> Figure:
    """A pyplot-free `Figure(**kwargs)`, matplotlib set up first."""
    matplotlib_module()
    from matplotlib.figure import Figure

    return Figure(**kwargs)
