"""Every anchored validator refuses a value with a trailing newline.

Python's ``$`` also matches just before a final ``\\n``, so ``PATTERN.match("name\\n")`` accepts it;
the validators use ``fullmatch``. A newline in a name, an env key or a label key would split a log
line, an environment block or a header.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ql3.domain import approvals, cancellation, ids, lookup, tasks, workers
from ql3.domain.errors import ValidationFailed

_UUID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"

CASES: list[tuple[str, Callable[[str], object], str]] = [
    ("task name", tasks.validate_name, "nightly-backup"),
    ("env key", lambda v: tasks.build_spec({"command": "true", "env": {v: "x"}}), "API_KEY"),
    ("require label key", lambda v: tasks.build_spec({"command": "true", "require": {v: "x"}}), "zone"),
    ("worker id", workers.validate_worker_id, "worker-1"),
    ("approval code", approvals.validate_code, "ok_code"),
    ("approval client id", lambda v: approvals.validate_client_id(v, "id"), "client-1"),
    ("approval owner", approvals.validate_owner, "owner-1"),
    ("cancellation owner", cancellation.validate_owner, "owner-1"),
    ("cancellation token", cancellation.validate_token, "A" * 43),
    ("id prefix", lookup.validate_prefix, "0190a1b2"),
]


@pytest.mark.parametrize(("what", "check", "good"), CASES, ids=[c[0] for c in CASES])
def test_a_trailing_newline_is_refused(what: str, check: Callable[[str], object], good: str) -> None:
    check(good)  # the value itself is valid
    with pytest.raises(ValidationFailed):
        check(good + "\n")


def test_an_id_with_a_trailing_newline_is_not_an_id() -> None:
    assert ids.is_id(_UUID)
    assert not ids.is_id(_UUID + "\n")


def test_a_digest_with_a_trailing_newline_is_not_a_digest() -> None:
    digest = "ab" * 32
    assert approvals.is_hex_digest(digest)
    assert not approvals.is_hex_digest(digest + "\n")
