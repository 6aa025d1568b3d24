"""The server's log lines carry their structured fields: a failing loop says which loop, the stable
error code and the exception type, on one bounded line, and never the exception's message."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

from ql3.cli.logformat import MAX_LINE_CHARS, MAX_VALUE_CHARS, FieldsFormatter

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from ql3.cli import logformat
    from ql3.application.lifecycle import LifecycleRunner
    from ql3.domain.errors import StorageUnavailable

    logformat.configure(sys.stderr)
    waits = []

    def wake(timeout_s):
        waits.append(1)
        if len(waits) == 1:
            raise StorageUnavailable("connection to postgresql://app:hunter2@db failed")
        time.sleep(0.01)
        return False

    def cycle():
        if not waits:
            return False
        raise KeyError("DB_PASSWORD=hunter2")

    runner = LifecycleRunner("cancellation", cycle, wake=wake, backstop_s=0.05)
    runner.start()
    deadline = time.monotonic() + 10
    while len(runner.diagnostics) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    """
)


def test_a_failing_loop_logs_its_name_code_and_type_through_the_servers_formatter() -> None:
    # Given the server's logging set-up and a loop whose wait, then whose cycle, fail
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )

    # Then each failure line names the loop, where it failed, the code and the exception type
    lines = [line for line in done.stderr.splitlines() if "cycle failed" in line]
    assert len(lines) >= 2, done.stderr
    assert "WARNING ql3.lifecycle cycle failed action=lifecycle.cycle_failed loop=cancellation" in lines[0]
    assert "stage=wait code=storage_unavailable error_type=StorageUnavailable" in lines[0]
    assert "stage=cycle code=internal_error error_type=KeyError" in lines[1]
    # And never the exceptions' messages
    assert "hunter2" not in done.stderr and "postgresql://" not in done.stderr


def _format(**extra: object) -> str:
    record = logging.makeLogRecord({"name": "ql3.t", "levelname": "WARNING", "msg": "m", **extra})
    return FieldsFormatter().format(record)


def test_field_values_are_single_line_and_bounded() -> None:
    line = _format(loop="a b\nc", code="x" * 500, count=3, obj=object())

    assert "\n" not in line
    assert "loop=a_b_c" in line and "count=3" in line and "obj=object" in line
    code = line.split("code=")[1].split()[0]
    assert len(code) == MAX_VALUE_CHARS and code.endswith("~")


def test_the_whole_line_is_bounded() -> None:
    line = _format(**{f"k{i}": "v" * 70 for i in range(100)})

    assert len(line) == MAX_LINE_CHARS
