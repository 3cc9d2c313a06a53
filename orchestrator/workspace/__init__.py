"""Git workspace: resolve refs, list commit ranges, and build isolated trial checkouts."""

from __future__ import annotations

from orchestrator.workspace.commits import CommitInfo, path_matches
from orchestrator.workspace.git import Workspace

__all__ = ["CommitInfo", "Workspace", "path_matches"]
