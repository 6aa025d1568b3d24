"""The one exception hierarchy of ql3.

Every error carries a stable machine-readable ``code``, an HTTP status and whether a retry may help.
Messages are fixed strings (the class docstring by default) so that nothing secret is ever formatted
into them; extra low-cardinality facts go into ``details``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class Ql3Error(Exception):
    """ql3 failed."""

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip().splitlines()[0]
        self.details: Mapping[str, Any] = details
        super().__init__(self.message)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = dict(self.details)
        return body


class ValidationFailed(Ql3Error):
    """The input is invalid."""

    code = "validation_failed"
    http_status = 422


class RetrySafetyRequired(ValidationFailed):
    """max_attempts above 1 needs retry_safe: declare that the command is safe to run again."""

    code = "retry_safety_required"


class ReservedIdempotencyKey(ValidationFailed):
    """Idempotency keys starting with ql3: are reserved for the server (cron fires, approved actions)."""

    code = "reserved_idempotency_key"


class PayloadTooLarge(Ql3Error):
    """The request body is too large."""

    code = "payload_too_large"
    http_status = 413


class NotFound(Ql3Error):
    """The resource does not exist."""

    code = "not_found"
    http_status = 404


class Unauthenticated(Ql3Error):
    """A valid bearer token is required."""

    code = "unauthenticated"
    http_status = 401


class PermissionDenied(Ql3Error):
    """The caller's role does not allow this."""

    code = "permission_denied"
    http_status = 403


class Conflict(Ql3Error):
    """The request conflicts with the current state."""

    code = "conflict"
    http_status = 409


class RunVersionConflict(Conflict):
    """The run changed concurrently; re-read and decide again."""

    code = "run_version_conflict"


class InvalidRunTransition(Conflict):
    """The run cannot move to that status from its current one."""

    code = "invalid_run_transition"


class NameTaken(Conflict):
    """That name is already in use in this project."""

    code = "name_taken"


class TaskDisabled(Conflict):
    """The task is disabled; enable it before starting a run."""

    code = "task_disabled"


class IdempotencyConflict(Conflict):
    """The idempotency key was already used for a different request."""

    code = "idempotency_conflict"


class FenceConflict(Conflict):
    """The caller's fence no longer matches the stored authority."""

    code = "fence_conflict"


class SyncUnavailable(Ql3Error):
    """This server has no git fetcher, so it cannot sync subscriptions."""

    code = "sync_unavailable"
    http_status = 503


class StorageBusy(Ql3Error):
    """The database is busy; retry shortly."""

    code = "storage_busy"
    http_status = 503
    retryable = True


class ReadOnlyTransaction(Ql3Error):
    """A write was attempted inside a read-only unit of work."""

    code = "read_only_transaction"
    http_status = 500


class StorageUnavailable(Ql3Error):
    """The database is unavailable."""

    code = "storage_unavailable"
    http_status = 503
    retryable = True


class MigrationError(Ql3Error):
    """The database schema cannot be migrated safely."""

    code = "migration_error"


class ConfigurationError(Ql3Error):
    """The configuration is invalid."""

    code = "configuration_error"


class SecretUnreadable(Ql3Error):
    """A stored secret cannot be opened with this server's key ($QL3_HOME/variables.key)."""

    code = "secret_unreadable"
    http_status = 500


class SecretsUnavailable(Ql3Error):
    """This server has no key for secrets: it cannot store or use them."""

    code = "secrets_unavailable"
    http_status = 503
