"""Group commit (worker/group_commit.py): a lone call goes at once as a batch of one; calls that
queue behind a batch in flight go together; an answer that is an error reaches only its caller; a
failed send fails its whole batch; batches never exceed their bound; nobody is left waiting."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from ql3.worker.group_commit import GroupCommit


class Refused(Exception):
    pass


def test_a_lone_call_is_sent_at_once_as_a_batch_of_one() -> None:
    sent: list[list[int]] = []

    def send(calls: Sequence[int]) -> list[int]:
        sent.append(list(calls))
        return [c * 2 for c in calls]

    group: GroupCommit[int, int] = GroupCommit(send, max_batch=8)
    assert group.call(3) == 6
    assert group.call(4) == 8
    assert sent == [[3], [4]]


def test_calls_queued_behind_a_batch_in_flight_go_together_and_each_gets_its_answer() -> None:
    first_in_flight = threading.Event()
    release = threading.Event()
    sent: list[list[int]] = []

    def send(calls: Sequence[int]) -> list[int | BaseException]:
        sent.append(list(calls))
        if len(sent) == 1:
            first_in_flight.set()
            release.wait(10)
        return [Refused() if c == 13 else c + 100 for c in calls]

    group: GroupCommit[int, int] = GroupCommit(send, max_batch=64)
    results: dict[int, object] = {}

    def caller(n: int) -> None:
        try:
            results[n] = group.call(n)
        except Refused as exc:
            results[n] = exc

    leader = threading.Thread(target=caller, args=(0,))
    leader.start()
    assert first_in_flight.wait(10)
    others = [threading.Thread(target=caller, args=(n,)) for n in (11, 12, 13, 14)]
    for t in others:
        t.start()
    # wait until all four are queued behind the batch in flight
    for _ in range(1000):
        with group._cond:
            if len(group._queue) == 4:
                break
        threading.Event().wait(0.01)
    release.set()
    for t in [leader, *others]:
        t.join(10)
    assert sent[0] == [0] and sorted(sent[1]) == [11, 12, 13, 14] and len(sent) == 2
    assert results[0] == 100 and results[11] == 111 and results[14] == 114
    assert isinstance(results[13], Refused)  # only its own caller sees it


def test_a_failed_send_fails_every_call_of_its_batch_and_only_that_batch() -> None:
    calls_seen: list[list[str]] = []

    def send(calls: Sequence[str]) -> list[str]:
        calls_seen.append(list(calls))
        if "boom" in calls:
            raise ConnectionError("unreachable")
        return [c.upper() for c in calls]

    group: GroupCommit[str, str] = GroupCommit(send, max_batch=4)
    with pytest.raises(ConnectionError):
        group.call("boom")
    assert group.call("ok") == "OK"


def test_batches_never_exceed_their_bound_and_no_caller_is_left_waiting() -> None:
    gate = threading.Event()
    sizes: list[int] = []

    def send(calls: Sequence[int]) -> list[int]:
        sizes.append(len(calls))
        gate.wait(0.05)
        return list(calls)

    group: GroupCommit[int, int] = GroupCommit(send, max_batch=3)
    out: list[int] = []
    lock = threading.Lock()

    def caller(n: int) -> None:
        value = group.call(n)
        with lock:
            out.append(value)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(out) == list(range(40))
    assert max(sizes) <= 3 and sum(sizes) == 40
    assert group.calls == 40 and group.batches == len(sizes)
    with group._cond:
        assert not group._queue and not group._sending


def test_the_bound_is_checked() -> None:
    with pytest.raises(ValueError):
        GroupCommit(lambda calls: list(calls), max_batch=0)
