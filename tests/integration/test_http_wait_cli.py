"""The CLI's wait and follow loops (``ql3.cli.watch``) against the real app in-process.

The poller's sleep is the test's lever: each sleep is a point where the world moves on (a log grows, a
retry starts, the run ends), so every step of the loops is deterministic and no test waits for real.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ql3.application import runs
from ql3.cli import watch
from ql3.cli.client import ApiClient
from ql3.cli.errors import CliError
from ql3.domain.ids import new_id
from ql3.storage.sqlite.adapter import SqliteDatabase


class Steps:
    """A fake sleep that runs the next scripted change of the world on each call."""

    def __init__(self, *changes: Callable[[], None]) -> None:
        self.changes = list(changes)
        self.sleeps: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.changes:
            self.changes.pop(0)()
        elif len(self.sleeps) > 200:
            raise AssertionError("the loop kept polling after the script ended")


@pytest.fixture
def api(logs_client: Any, owner: dict[str, str]) -> Iterator[ApiClient]:
    """The CLI's own client, sending its requests to the in-process app."""
    client = ApiClient.__new__(ApiClient)
    client.base = "http://testserver"
    client._http = type(logs_client)(logs_client.app, base_url="http://testserver/api/v1", headers=owner)
    yield client
    client.close()


def move(db: SqliteDatabase, run_id: str, *path: str) -> Callable[[], None]:
    """A change that walks the run through ``path`` with real transitions."""

    def change() -> None:
        for to in path:
            current = db.transaction(lambda tx: runs.lock_run(tx, run_id), write=False)
            extra = {"finished_at_ms": 1} if to in ("succeeded", "failed", "cancelled", "timed_out") else {}
            if to == "failed":
                extra["exit_code"] = 7
            version = current.version

            def move_one(tx: Any, v: int = version, to: str = to, extra: dict[str, Any] = extra) -> None:
                runs.transition(tx, run_id, v, to, actor_type="system", **extra)

            db.transaction(move_one)

    return change


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def change() -> None:
        first()
        second()

    return change


def append(path: Path, data: bytes) -> Callable[[], None]:
    def change() -> None:
        with path.open("ab") as fh:
            fh.write(data)

    return change


def new_attempt(
    db: SqliteDatabase, run_id: str, number: int, logs_root: Path, data: bytes
) -> Callable[[], None]:
    """A retry: the run gets attempt ``number`` whose log already holds ``data``."""

    def change() -> None:
        attempt_id = new_id()
        db.transaction(
            lambda tx: tx.run(
                "attempt_insert",
                {
                    "id": attempt_id,
                    "run_id": run_id,
                    "attempt": number,
                    "status": "claimed",
                    "executor_type": "local_process",
                    "now": tx.now_ms(),
                },
            )
        )
        (logs_root / f"{attempt_id}.log").write_bytes(data)

    return change


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        (("dispatching", "running", "succeeded"), "succeeded", 0),
        (("dispatching", "running", "failed"), "failed", 2),
        (("timed_out",), "timed_out", 3),
        (("cancelled",), "cancelled", 4),
        (("dispatching", "running", "lost", "failed"), "failed", 2),
    ],
    ids=["succeeded", "failed", "timed_out", "cancelled", "lost-then-failed"],
)
def test_waiting_ends_with_the_runs_outcome_as_exit_status(
    db: SqliteDatabase, api: ApiClient, started_run: Any, path: tuple[str, ...], status: str, code: int
) -> None:
    # Given a queued run that reaches its outcome while the CLI polls (a lost run is not an outcome)
    run = started_run()
    steps = Steps(lambda: None, move(db, run["id"], *path[:-1]), move(db, run["id"], path[-1]))

    # When the CLI waits for it
    final = watch.wait_for_run(api, "default", run, watch.Poller(sleep=steps))

    # Then it returns the terminal run, whose exit status is the outcome's
    assert final["status"] == status
    assert watch.outcome_exit(final) == code
    assert len(steps.sleeps) == 3


def test_the_poll_interval_starts_at_50_ms_and_grows_to_500_ms(
    db: SqliteDatabase, api: ApiClient, started_run: Any
) -> None:
    run = started_run()
    steps = Steps(*[lambda: None] * 7, move(db, run["id"], "cancelled"))

    watch.wait_for_run(api, "default", run, watch.Poller(sleep=steps))

    assert steps.sleeps == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5]


def test_a_wait_timeout_gives_up_with_exit_5(db: SqliteDatabase, api: ApiClient, started_run: Any) -> None:
    # Given a run that never ends and a clock that moves 0.3 s per poll
    run = started_run()
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += 0.3

    # When the CLI waits at most 1 s
    with pytest.raises(CliError) as raised:
        watch.wait_for_run(
            api, "default", run, watch.Poller(timeout_s=1.0, clock=lambda: now[0], sleep=sleep)
        )

    # Then it stops with the wait-timeout exit status after about a second
    assert (raised.value.code, raised.value.exit_code) == ("wait_timeout", 5)
    assert 1.0 <= now[0] <= 1.3


def test_follow_prints_the_log_as_it_grows_until_the_run_ends(
    db: SqliteDatabase, api: ApiClient, started_run: Any, logs_root: Path
) -> None:
    # Given a running run whose log grows between polls, then ends
    run = started_run()
    log = logs_root / f"{run['attempt_id']}.log"
    log.write_bytes(b"one\n")
    move(db, run["id"], "dispatching", "running")()
    printed = io.StringIO()
    seen_at_each_sleep: list[str] = []

    def snapshot_then(change: Callable[[], None]) -> Callable[[], None]:
        def step() -> None:
            seen_at_each_sleep.append(printed.getvalue())
            change()

        return step

    steps = Steps(
        snapshot_then(append(log, b"two\n")),
        snapshot_then(lambda: None),
        snapshot_then(append(log, b"three\n")),
        snapshot_then(move(db, run["id"], "succeeded")),
    )

    # When the log is followed
    last = watch.print_log(
        api, "default", run["id"], follow=True, poller=watch.Poller(sleep=steps), out=printed
    )

    # Then each line was printed before the next was written, and the loop ended with the run
    assert seen_at_each_sleep == ["one\n", "one\ntwo\n", "one\ntwo\n", "one\ntwo\nthree\n"]
    assert printed.getvalue() == "one\ntwo\nthree\n"
    assert last["complete"] is True


def test_follow_finishes_the_old_attempt_and_goes_on_with_a_retry(
    db: SqliteDatabase, api: ApiClient, started_run: Any, logs_root: Path
) -> None:
    # Given attempt 1 that writes more after the follower read it, then a retry (attempt 2)
    run = started_run()
    first = logs_root / f"{run['attempt_id']}.log"
    first.write_bytes(b"attempt 1 start\n")
    retry = new_attempt(db, run["id"], 2, logs_root, b"attempt 2\n")
    steps = Steps(
        append(first, b"attempt 1 middle\n"),
        lambda: None,
        _both(append(first, b"attempt 1 end\n"), retry),  # last words, then the retry
        move(db, run["id"], "cancelled"),
    )
    printed = io.StringIO()

    # When the run's log is followed
    last = watch.print_log(
        api, "default", run["id"], follow=True, poller=watch.Poller(sleep=steps), out=printed
    )

    # Then all of attempt 1 comes first, then attempt 2, and the loop ends on attempt 2
    assert printed.getvalue() == "attempt 1 start\nattempt 1 middle\nattempt 1 end\nattempt 2\n"
    assert (last["attempt"], last["complete"]) == (2, True)


def test_without_follow_the_log_is_printed_to_its_current_end_in_pages(
    api: ApiClient, started_run: Any, logs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a running log of 10,000 bytes and pages of 4 KiB
    run = started_run()
    (logs_root / f"{run['attempt_id']}.log").write_bytes(b"z" * 10_000)
    monkeypatch.setattr(watch, "LOG_PAGE_BYTES", 4096)
    steps = Steps()
    printed = io.StringIO()

    # When it is printed without --follow
    last = watch.print_log(api, "default", run["id"], poller=watch.Poller(sleep=steps), out=printed)

    # Then it all comes out without a single sleep, and the run is not complete
    assert printed.getvalue() == "z" * 10_000
    assert steps.sleeps == []
    assert (last["next_offset"], last["eof"], last["complete"]) == (10_000, True, False)


def test_a_named_attempt_is_printed_rather_than_the_latest(
    db: SqliteDatabase, api: ApiClient, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    (logs_root / f"{run['attempt_id']}.log").write_bytes(b"old\n")
    new_attempt(db, run["id"], 2, logs_root, b"new\n")()

    latest, named = io.StringIO(), io.StringIO()
    watch.print_log(api, "default", run["id"], out=latest)
    watch.print_log(api, "default", run["id"], attempt=1, out=named)

    assert (latest.getvalue(), named.getvalue()) == ("new\n", "old\n")


def test_a_server_that_is_briefly_unreachable_is_retried(
    db: SqliteDatabase, api: ApiClient, started_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a finished run and an API that fails twice as if restarting
    run = started_run()
    move(db, run["id"], "cancelled")()
    real_call = api.call
    failures = [CliError("unreachable", "down"), CliError("timeout", "slow")]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop(0)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(api, "call", flaky)
    steps = Steps()

    # When the CLI polls it
    final = watch.Poller(sleep=steps).call(api, "GET", watch.run_path("default", run["id"]))

    # Then it got through after two short sleeps
    assert final["status"] == "cancelled"
    assert steps.sleeps == [0.05, 0.1]


def test_a_refusal_is_not_retried(api: ApiClient, started_run: Any) -> None:
    steps = Steps()

    with pytest.raises(CliError) as raised:
        watch.Poller(sleep=steps).call(api, "GET", watch.run_path("default", new_id()))

    assert raised.value.code == "not_found"
    assert steps.sleeps == []
