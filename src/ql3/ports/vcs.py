"""Fetching a git repository for a subscription (docs/scripts.md "Subscriptions"); the adapter is
``vcs/git.py`` (the ``git`` command)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class GitCredentials:
    """A private repository's credential: an SSH deploy key, or an HTTPS token. Never in a repr."""

    deploy_key: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResult:
    ok: bool
    commit: str | None
    log: str  # git's own output, with credentials masked


class GitFetcher(Protocol):
    def fetch(
        self, *, url: str, branch: str | None, credentials: GitCredentials, dest: Path, timeout_s: float
    ) -> FetchResult:
        """Clone the branch's head (shallow) into ``dest``, an empty directory."""
        ...
