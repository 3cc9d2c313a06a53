"""The borrowed GPU machine's Python, imitated on any machine: put this directory first on
PYTHONPATH and only what that machine's image has can be imported from site-packages.

Why: the device check (`experiments/gpu_check.py`) runs on a machine with no package registry,
and what it needs beyond the image travels with the working tree (`experiments/gpu_carry.py`
builds that folder). A module the image lacks and the carried folder does not hold (Ray,
Optuna, a new top-level import on the trial path) must fail here, in the rehearsal test, not
after minutes of borrowed GPU time. Modules outside site-packages (the standard library, the
project, the carried folder) are never refused.

Top-level names, not distributions, because that is what an import statement names.
"""

from __future__ import annotations

import importlib.machinery
import sys

# The image: python3 with PyTorch (and what torch itself pulls in), nvidia-ml-py, numpy,
# scipy, matplotlib, httpx, rich, pyyaml, and their dependencies.
IMAGE = frozenset({
    "torch", "torchgen", "functorch", "triton", "nvidia", "sympy", "mpmath", "networkx",
    "jinja2", "markupsafe", "fsspec", "filelock", "typing_extensions",
    "pynvml", "numpy", "scipy",
    "matplotlib", "mpl_toolkits", "pylab", "contourpy", "cycler", "fontTools", "kiwisolver",
    "PIL", "pyparsing", "dateutil", "six", "packaging",
    "httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi",
    "rich", "markdown_it", "mdurl", "pygments", "yaml", "_yaml",
    "pip", "setuptools", "pkg_resources", "_distutils_hack", "wheel",
})
SITE_DIRS = ("site-packages", "dist-packages")


def _installed(spec) -> bool:
    places = [spec.origin or "", *(spec.submodule_search_locations or [])]
    return any(part in str(p).split("/") for p in places for part in SITE_DIRS)


class DeviceImage:
    """A meta path finder that refuses installed top-level modules the image does not have."""

    @staticmethod
    def find_spec(fullname: str, path=None, target=None):
        if "." in fullname or fullname in IMAGE or fullname in sys.builtin_module_names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname)
        if spec is not None and _installed(spec):
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (not on the GPU machine's image, and not carried"
                " with the working tree)", name=fullname)
        return None


if not any(isinstance(f, DeviceImage) for f in sys.meta_path):
    sys.meta_path.insert(0, DeviceImage())
