"""The journal's typed errors: stable codes, HTTP statuses and which ones a caller may retry."""

from __future__ import annotations

from ql3.domain.errors import Ql3Error


class JournalError(Ql3Error):
    """The worker journal failed."""

    code = "journal_error"


class JournalInvalid(JournalError, ValueError):
    """The journal request is invalid."""

    code = "journal_invalid"
    http_status = 422


class JournalConflict(JournalError):
    """The journal record does not match the expected identity, revision or state."""

    code = "journal_conflict"
    http_status = 409


class JournalFull(JournalError):
    """The worker journal is at capacity."""

    code = "journal_full"
    http_status = 503
    retryable = True


class JournalLocked(JournalError):
    """The worker journal is owned by another journal instance."""

    code = "journal_locked"
    http_status = 503
    retryable = True


class JournalBudgetExceeded(JournalError):
    """The worker journal holds more records than the scan budget allows."""

    code = "journal_budget_exceeded"


class JournalClosed(JournalError):
    """The worker journal is closed."""

    code = "journal_closed"


class JournalCompromised(JournalError):
    """The worker journal lost its single-owner lock and refuses every operation."""

    code = "journal_compromised"


class JournalUnavailable(JournalError):
    """The worker journal cannot be read or written."""

    code = "journal_unavailable"
    http_status = 503
    retryable = True
