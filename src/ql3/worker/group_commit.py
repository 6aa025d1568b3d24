"""Group commit for a worker's calls to the control plane (docs/cluster.md "Batches").

Threads that need a lease step at the same moment (intake threads acknowledging several starts,
settlement completing while the log shipper closes a log) each call ``GroupCommit.call``. The
first caller finding nobody sending becomes the *leader*: it sends what is queued (its own step
and whatever others queued meanwhile, up to ``max_batch``) as one batch, hands every answer to its
caller, and goes on while steps are queued and its own is unanswered. With its own answered it hands
leadership to the oldest waiting caller, so no caller carries the others' work for long. Nothing
waits to fill a batch: an idle worker sends a batch of one at once, and batches grow only as calls
queue behind a batch in flight (group commit), i.e. under load.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

C = TypeVar("C")
A = TypeVar("A")


class _Slot(Generic[C]):
    __slots__ = ("answer", "call", "done", "error", "lead")

    def __init__(self, call: C) -> None:
        self.call = call
        self.done = False
        self.lead = False
        self.answer: object = None
        self.error: BaseException | None = None


class GroupCommit(Generic[C, A]):
    """``send(calls) -> answers`` (one answer per call, in order; an answer that is an exception is
    raised to its caller) for batches of at most ``max_batch`` calls. A ``send`` that raises fails
    every call of that batch with the same exception."""

    def __init__(self, send: Callable[[Sequence[C]], Sequence[A | BaseException]], *, max_batch: int) -> None:
        if not 1 <= max_batch <= 1024:
            raise ValueError("max_batch out of range")
        self._send = send
        self._max = max_batch
        self._cond = threading.Condition()
        self._queue: deque[_Slot[C]] = deque()
        self._sending = False
        self.batches = 0  # sent so far (for the tests and the bench)
        self.calls = 0

    def call(self, call: C) -> A:
        slot: _Slot[C] = _Slot(call)
        with self._cond:
            self._queue.append(slot)
            if self._sending:
                while not slot.done and not slot.lead:
                    self._cond.wait()
            else:
                self._sending = True
                slot.lead = True
        if not slot.done:
            self._lead(slot)
        if slot.error is not None:
            raise slot.error
        return slot.answer  # type: ignore[return-value]

    def _lead(self, own: _Slot[C]) -> None:
        while True:
            with self._cond:
                if own.done:
                    if self._queue:  # hand over to the oldest waiting caller
                        self._queue[0].lead = True
                    else:
                        self._sending = False
                    self._cond.notify_all()
                    return
                batch = [self._queue.popleft() for _ in range(min(self._max, len(self._queue)))]
            self._send_batch(batch)
            with self._cond:
                self._cond.notify_all()

    def _report(self, batch: list[_Slot[C]], exc: BaseException) -> None:
        """Hands a failed batch's error to every caller in it: each raises it from ``call`` (nothing
        is swallowed; a caller sees exactly what its own single call would have raised)."""
        with self._cond:
            for s in batch:
                s.error, s.done = exc, True
            self.batches += 1
            self.calls += len(batch)

    def _send_batch(self, batch: list[_Slot[C]]) -> None:
        try:
            answers = self._send([s.call for s in batch])
            if len(answers) != len(batch):
                raise RuntimeError("a batch answered a different number of calls")
        except BaseException as exc:
            self._report(batch, exc)
            return
        with self._cond:
            for s, answer in zip(batch, answers, strict=True):
                if isinstance(answer, BaseException):
                    s.error = answer
                else:
                    s.answer = answer
                s.done = True
            self.batches += 1
            self.calls += len(batch)
