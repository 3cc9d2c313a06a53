"""`python -m orchestrator.targets.sim [SGLang flags] [--sim-* flags]`."""

from __future__ import annotations

import sys

from orchestrator.targets.sim.app import main

if __name__ == "__main__":
    sys.exit(main())
