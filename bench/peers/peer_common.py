"""The job body shared by every peer, and the record file it writes.

Each job runs ``subprocess.run(["true"])`` and then appends one fixed-width line
``<tag> <start_ns> <end_ns>`` to the file named by ``$BENCH_RECORD_FILE``. The append is a
single ``os.write`` on an ``O_APPEND`` descriptor (atomic for such small writes on a local
file system), so the cost is identical for all peers and tiny next to the fork/exec of
``true``. The driver counts completed jobs from the file size and reads the timestamps back.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

RECORD_ENV = "BENCH_RECORD_FILE"
DSN_ENV = "BENCH_PG_DSN"
HUEY_DB_ENV = "BENCH_HUEY_DB"
CONCURRENCY_ENV = "BENCH_CONCURRENCY"

RECORD_LEN = 51  # 10 + 1 + 19 + 1 + 19 + 1 bytes


@dataclass(frozen=True)
class Record:
    tag: int
    start_ns: int
    end_ns: int


def format_record(tag: int, start_ns: int, end_ns: int) -> bytes:
    line = f"{tag:10d} {start_ns:19d} {end_ns:19d}\n".encode()
    if len(line) != RECORD_LEN:
        raise ValueError(f"record is {len(line)} bytes, expected {RECORD_LEN}")
    return line


def run_true_and_record(tag: int) -> None:
    """The benchmark job: run `true`, then append one record."""
    start_ns = time.time_ns()
    subprocess.run(["true"], check=True)
    end_ns = time.time_ns()
    fd = os.open(os.environ[RECORD_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, format_record(tag, start_ns, end_ns))
    finally:
        os.close(fd)


def count_records(path: str) -> int:
    try:
        return os.stat(path).st_size // RECORD_LEN
    except FileNotFoundError:
        return 0


def read_records(path: str) -> list[Record]:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return []
    out: list[Record] = []
    for i in range(len(data) // RECORD_LEN):
        tag, start, end = data[i * RECORD_LEN : (i + 1) * RECORD_LEN].split()
        out.append(Record(int(tag), int(start), int(end)))
    return out


def concurrency() -> int:
    return int(os.environ.get(CONCURRENCY_ENV, "2"))
