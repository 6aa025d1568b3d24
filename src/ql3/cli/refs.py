"""Names and short ids: what a person types and reads instead of full UUIDs.

``resolve_args`` turns a unique id prefix given on the command line into the full id (the server
answers ``GET /projects/P/resolve/KIND/PREFIX``, bounded, ``ambiguous_id`` listing candidates);
tokens, notification channels, subscriptions and workers are also found by name;
``TaskNames`` and ``principal_name`` turn ids back into names for tables; ``suggest_task`` finds the
closest task name for a not-found error.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any, Final

from ql3.cli.client import ApiClient, seg
from ql3.cli.errors import CliError
from ql3.domain.ids import is_id
from ql3.domain.lookup import MIN_PREFIX, PREFIX_RE

TASK_PAGE: Final = 200  # one page of task names; a project with more shows the rest as short ids
KIND_WORDS: Final = {
    "run": "run",
    "approval": "approval request",
    "action": "approved action",
    "task": "task",
    "token": "token",
    "channel": "channel",
    "rule": "rule",
    "subscription": "subscription",
    "worker": "worker",
}
LIST_HINT: Final = {
    "run": "ql3 run list",
    "approval": "ql3 approval list",
    "action": "ql3 action list",
    "task": "ql3 task list",
    "token": "ql3 token list",
    "channel": "ql3 notify channel list",
    "rule": "ql3 notify rule list",
    "subscription": "ql3 subscription list",
    "worker": "ql3 worker list",
}
# Kinds found by name or unique id prefix (``GET .../resolve/KIND/REF``), and which of the two the
# command's own route then takes: channels and subscriptions are addressed by name, the rest by id.
NAMED_USE: Final = {"token": "id", "worker": "id", "rule": "id", "channel": "name", "subscription": "name"}
# Words that are not references: ``ql3 token rotate me``.
_KEYWORDS: Final = {"token": frozenset({"me"})}
# Approval ids made from an idempotency key: ``idem.`` and 48 hex digits.
_IDEM_LENGTH: Final = 53


def _is_full(kind: str, value: str) -> bool:
    return is_id(value) or (kind == "approval" and value.startswith("idem.") and len(value) == _IDEM_LENGTH)


def _looks_like_prefix(value: str) -> bool:
    return len(value) >= MIN_PREFIX and bool(PREFIX_RE.fullmatch(value.lower()))


def resolve_id(api: ApiClient, project: str, kind: str, value: str) -> str:
    """The full id for ``value`` (a full id or a unique prefix of one)."""
    if _is_full(kind, value) or not _looks_like_prefix(value):
        return value
    try:
        _, body = api.call("GET", f"/projects/{seg(project)}/resolve/{kind}/{seg(value.lower())}")
    except CliError as exc:
        raise _explained(exc, kind, value) from None
    return str(body["id"])


def _explained(exc: CliError, kind: str, value: str) -> CliError:
    word = KIND_WORDS[kind]
    if exc.code == "ambiguous_id":
        candidates = list(exc.details.get("candidates") or [])
        more = ", ..." if exc.details.get("more") else ""
        return CliError(
            "ambiguous_id",
            f"{value!r} matches several {word}s: {', '.join(candidates)}{more}; give more characters",
            details=exc.details,
        )
    if exc.code == "not_found" and exc.details.get("kind") == kind:
        return CliError("not_found", f"no {word} id starts with {value!r} (see: {LIST_HINT[kind]})")
    return exc


def resolve_task(api: ApiClient, project: str, value: str) -> str:
    """A task is named by name or id; a string that is neither but a unique id prefix is resolved."""
    if is_id(value) or not _looks_like_prefix(value):
        return value
    try:
        api.call("GET", f"/projects/{seg(project)}/tasks/{seg(value)}")
        return value  # a task of that name (or id) exists
    except CliError as exc:
        if exc.code != "not_found":
            raise
    try:
        _, body = api.call("GET", f"/projects/{seg(project)}/resolve/task/{seg(value.lower())}")
    except CliError as exc:
        if exc.code == "ambiguous_id":
            raise _explained(exc, "task", value) from None
        return value  # let the command report the missing task (with a suggestion)
    return str(body["id"])


def resolve_named(api: ApiClient, project: str, kind: str, value: str) -> str:
    """What the command's route takes for ``value``, a name or a unique id prefix of a named kind.

    Several matches are an ``ambiguous_id`` error listing them; no match (or no right to look) leaves
    ``value`` as given, so the command reports its own not-found error."""
    try:
        _, body = api.call("GET", f"/projects/{seg(project)}/resolve/{kind}/{seg(value)}")
    except CliError as exc:
        if exc.code == "ambiguous_id":
            raise _explained_named(exc, kind, value) from None
        if exc.code in ("not_found", "permission_denied", "validation_failed", "invalid_request"):
            return value
        raise
    return str(body[NAMED_USE[kind]] or body["id"])


def _explained_named(exc: CliError, kind: str, value: str) -> CliError:
    candidates = list(exc.details.get("candidates") or [])
    more = ", ..." if exc.details.get("more") else ""
    return CliError(
        "ambiguous_id",
        f"{value!r} names or starts several {KIND_WORDS[kind]}s: {', '.join(candidates)}{more};"
        " give more characters or the full id",
        details=exc.details,
    )


def _needs_lookup(kind: str, value: str) -> bool:
    if value in _KEYWORDS.get(kind, ()):
        return False
    if kind in NAMED_USE:
        return not (kind == "token" and is_id(value))
    if kind == "task":
        return not is_id(value) and _looks_like_prefix(value)
    return not _is_full(kind, value) and _looks_like_prefix(value)


def resolve_args(args: argparse.Namespace) -> None:
    """Replace every declared reference in ``args`` by the full id (or the task's name as given).

    Commands declare theirs with ``parser.set_defaults(refs={attr: kind})``. No request is made
    unless a value can only be a prefix."""
    declared: dict[str, str] = getattr(args, "refs", None) or {}
    pending = {attr: kind for attr, kind in declared.items() if getattr(args, attr, None)}
    args.given = {attr: str(getattr(args, attr)) for attr in pending}
    lookups = {attr: kind for attr, kind in pending.items() if _needs_lookup(kind, args.given[attr])}
    if not lookups:
        return
    project = str(getattr(args, "project", "default"))
    with ApiClient.from_environment() as api:
        for attr, kind in lookups.items():
            value = args.given[attr]
            if kind == "task":
                full = resolve_task(api, project, value)
            elif kind in NAMED_USE:
                full = resolve_named(api, project, kind, value)
            else:
                full = resolve_id(api, project, kind, value)
            setattr(args, attr, full)


class TaskNames:
    """Task ids to names, from one page of the task list fetched on first use."""

    def __init__(self, api: ApiClient, project: str) -> None:
        self._api = api
        self._project = project
        self._names: dict[str, str] | None = None

    def name(self, task_id: str, given: object = None) -> str:
        """The run's own ``task_name`` when the server sends one, else the listed name, else a short id."""
        if isinstance(given, str) and given:
            return given
        if self._names is None:
            self._names = {}
            try:
                _, page = self._api.call(
                    "GET", f"/projects/{seg(self._project)}/tasks", params={"limit": TASK_PAGE}
                )
            except CliError as exc:
                if exc.code not in ("permission_denied", "not_found"):
                    raise
            else:
                self._names = {str(t["id"]): str(t["name"]) for t in page["items"]}
        return self._names.get(task_id, task_id[:13])


def principal_name(api: ApiClient, project: str, principal_id: str | None) -> str | None:
    """``alice (user)`` for a principal id, or the id when it cannot be named."""
    if not principal_id:
        return None
    try:
        _, body = api.call("GET", f"/projects/{seg(project)}/principals/{seg(principal_id)}")
    except CliError as exc:
        if exc.code not in ("not_found", "permission_denied"):
            raise
        return principal_id
    return f"{body['name']} ({body['kind']})"


def action_label(action_type: Any, action_ref: Any, names: TaskNames) -> str:
    """``run.create deploy`` rather than ``run.create <task uuid>``."""
    ref = str(action_ref)
    shown = names.name(ref) if str(action_type) == "run.create" and is_id(ref) else ref
    return f"{action_type} {shown}"


def suggest_task(project: str, name: str) -> str:
    """`` did you mean 'hello'?`` for a task name that does not exist (one bounded list call)."""
    try:
        with ApiClient.from_environment() as api:
            _, page = api.call("GET", f"/projects/{seg(project)}/tasks", params={"limit": TASK_PAGE})
    except CliError:
        return ""
    names = [str(t["name"]) for t in page["items"]]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return ""
