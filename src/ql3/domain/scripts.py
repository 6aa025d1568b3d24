"""A project's scripts (docs/scripts.md): path rules, size limits, content digests, the default
command for a script task, and the QingLong-style ``cron:`` header a subscription reads.

Scripts live in the database, one immutable revision per change. A run of a task that names a script
carries the script's content and digest in its offer (``ScriptPayload`` in ``domain/execution.py``):
a remote worker needs nothing but the offer, and checks the digest before it writes the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from ql3.domain.digests import sha256_hex
from ql3.domain.errors import ValidationFailed

MAX_SCRIPT_BYTES: Final = 128 * 1024  # fits a JSON body under the API's 256 KiB cap
MAX_PATH_CHARS: Final = 255
MAX_SCRIPTS_PER_PROJECT: Final = 2000
# sealed (AES-GCM, base64) it still fits the subscriptions column's 16384 characters
MAX_DEPLOY_KEY_CHARS: Final = 12000
# One path segment: letters (any script), digits, dot, dash, underscore, plus and @; never ``.``/``..``.
_SEGMENT_RE: Final = re.compile(r"[\w.@+-]+")
# The same rule as one pattern, for the API document (``validate_script_path`` is what decides).
PATH_PATTERN: Final = r"^[\w@+-][\w.@+-]*(?:/[\w@+-][\w.@+-]*)*$"
INTERPRETERS: Final[dict[str, str]] = {
    ".py": "python3",
    ".js": "node",
    ".mjs": "node",
    ".cjs": "node",
    ".sh": "bash",
    ".ts": "ts-node",
}


def validate_script_path(value: object, what: str = "path") -> str:
    """A relative POSIX path inside the project's scripts: no ``..``, no absolute path, no hidden or
    empty segment, no backslash or control character, at most 255 characters."""
    if not isinstance(value, str) or not value:
        raise ValidationFailed(f"invalid {what}: empty", field=what)
    rule = (
        "a relative path of letters, digits, '.', '_', '-', '+', '@' segments"
        " (no '..', no leading '/' or '.')"
    )
    parts = value.split("/")
    if len(value) > MAX_PATH_CHARS:
        raise ValidationFailed(f"invalid {what}: too long", field=what)
    for part in parts:
        if part in ("", ".", "..") or part.startswith(".") or _SEGMENT_RE.fullmatch(part) is None:
            raise ValidationFailed(f"invalid {what}: {rule}", field=what)
    return value


def validate_script_content(value: object, what: str = "content") -> str:
    """UTF-8 text without NUL, at most ``MAX_SCRIPT_BYTES``."""
    if not isinstance(value, str):
        raise ValidationFailed(f"invalid {what}", field=what)
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValidationFailed(f"{what} is not valid text", field=what) from None
    if size > MAX_SCRIPT_BYTES:
        raise ValidationFailed(
            f"{what} is too large: {size} bytes, the limit is {MAX_SCRIPT_BYTES}", field=what
        )
    if "\x00" in value:
        raise ValidationFailed(f"{what} contains NUL (scripts are text)", field=what)
    return value


def script_digest(content: str) -> str:
    """``sha256`` of the content's UTF-8 bytes, hex."""
    return sha256_hex(content.encode())


def default_command(path: str) -> str:
    """The command a script task runs when none is given: the interpreter its suffix names, on the
    file the worker wrote (``$QL3_SCRIPT``)."""
    for suffix, interpreter in INTERPRETERS.items():
        if path.endswith(suffix):
            return f'{interpreter} "$QL3_SCRIPT"'
    return '"$QL3_SCRIPT"'


_UNSAFE_NAME_RE: Final = re.compile(r"[^A-Za-z0-9._-]+")


def task_name_for(path: str) -> str:
    """The name of the task made for a script (``ql3 script run``, a subscription's ``cron:`` header):
    the path with ``/`` as ``_`` and any other character outside the name rule as ``-``."""
    name = _UNSAFE_NAME_RE.sub("-", path.replace("/", "_")).strip("-._") or "script"
    return name[:128]


# A subscription's repository: https, http, ssh or file URLs, or scp-like ``user@host:path``. Never
# git's ``ext::`` transport (it runs a command) nor a bare local path.
_URL_RE: Final = re.compile(r"(?:(?:https?|ssh|file)://[^\s]+|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+)")
_BRANCH_RE: Final = re.compile(r"[A-Za-z0-9._/-]{1,255}")


def validate_repo_url(value: object) -> str:
    if not isinstance(value, str) or len(value) > 2048 or _URL_RE.fullmatch(value) is None:
        raise ValidationFailed(
            "invalid repository URL: use https://, http://, ssh://, file:// or user@host:path", field="repo"
        )
    return value


def validate_branch(value: object) -> str:
    if (
        not isinstance(value, str)
        or _BRANCH_RE.fullmatch(value) is None
        or value.startswith(("-", "/"))
        or ".." in value
    ):
        raise ValidationFailed("invalid branch name", field="branch")
    return value


def validate_glob(value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 255 or any(ord(c) < 32 for c in value):
        raise ValidationFailed("invalid path pattern", field="path")
    return value


def validate_deploy_key(value: object) -> str:
    """An SSH private key in OpenSSH or PEM form (checked for its armour only)."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_DEPLOY_KEY_CHARS
        or "-----BEGIN " not in value
        or "PRIVATE KEY-----" not in value
    ):
        raise ValidationFailed(
            "invalid deploy key: an SSH private key (-----BEGIN ... PRIVATE KEY-----)", field="deploy_key"
        )
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptHeader:
    """What a QingLong-style header says: the cron expression and the title, each when present."""

    cron: str | None
    title: str | None


# QingLong's forms: ``cron: 0 8 * * *``, ``cron "0 8 * * *" script-path=..., tag=Title``, and a title in
# ``new Env('Title')`` or ``title: Title`` / ``name: Title``.
_CRON_COLON_RE: Final = re.compile(r"^[\s#/*;'\"-]*cron\s*[:=]\s*['\"]?([^'\"\n]+?)['\"]?\s*$", re.I | re.M)
_CRON_QUOTED_RE: Final = re.compile(r"^[\s#/*;-]*cron\s+['\"]([^'\"\n]+)['\"](.*)$", re.I | re.M)
_TAG_RE: Final = re.compile(r"tag\s*=\s*([^,\n]+)")
_ENV_TITLE_RE: Final = re.compile(r"new\s+Env\(\s*['\"]([^'\"\n]{1,120})['\"]")
_TITLE_RE: Final = re.compile(
    r"^[\s#/*;-]*(?:title|name)\s*[:=]\s*['\"]?([^'\"\n]{1,120}?)['\"]?\s*$", re.I | re.M
)
HEADER_BYTES: Final = 4096


def parse_header(content: str) -> ScriptHeader:
    """The ``cron:`` line and title in the first 4 KiB of a script (None for what is absent)."""
    head = content[:HEADER_BYTES]
    cron: str | None = None
    title: str | None = None
    quoted = _CRON_QUOTED_RE.search(head)
    if quoted is not None:
        cron = quoted.group(1).strip()
        tag = _TAG_RE.search(quoted.group(2))
        if tag is not None:
            title = tag.group(1).strip()
    else:
        colon = _CRON_COLON_RE.search(head)
        if colon is not None:
            cron = colon.group(1).strip()
    if title is None:
        found = _ENV_TITLE_RE.search(head) or _TITLE_RE.search(head)
        if found is not None:
            title = found.group(1).strip()
    return ScriptHeader(cron=cron or None, title=title or None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    project_id: str
    path: str
    revision: int
    digest: str
    size_bytes: int
    updated_at_ms: int
    updated_by: str
    content: str | None  # None in listings


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptRevision:
    project_id: str
    path: str
    revision: int
    content: str | None  # None for a deletion, and in listings
    digest: str | None  # None for a deletion
    author: str
    source: str
    created_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    id: str
    project_id: str
    name: str
    repo_url: str
    branch: str | None
    path_glob: str | None
    cron: str | None
    deploy_key: str | None
    next_sync_at_ms: int | None
    created_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionSync:
    id: str
    subscription_id: str
    project_id: str
    trigger_type: str
    status: str
    commit_sha: str | None
    summary: str | None
    log: str
    started_at_ms: int
    ended_at_ms: int | None
    run_id: str | None = None  # the run of the task ql3-sync-NAME that made it
