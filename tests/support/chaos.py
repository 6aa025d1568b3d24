"""The seeded chaos driver: ledger-writing runs, cancels, ``kill -9`` of ``ql3 serve`` and of task
processes, then the promises checked (docs/reliability.md).

Used by ``tests/acceptance/test_chaos.py`` (a short run per database) and by ``scripts/chaos`` (the
longer run). Everything comes from one seed: the mix of tasks, the order of the runs, which runs are
cancelled, when the server is killed and which task process dies. The seed is printed first.

Every command appends to a ledger file outside ``QL3_HOME``: ``S <run> <attempt>`` when it starts,
``E <run> <attempt>`` just before it exits. It first takes an ``flock`` on a file named after its run
and keeps the descriptor open in every child, so a second copy of a run started while any process of
an earlier copy is alive writes ``OVERLAP`` instead: that is a duplicate execution. A second attempt
after a proven loss (the earlier copy's processes all dead, its attempt recorded ``lost``) is a retry.

At the end (after the last restart, every run terminal within a bound) the driver checks:

- 0 duplicates: no ``OVERLAP``, no attempt started twice, more than one attempt per run only for a
  retry-safe task and only after the earlier attempts were recorded lost;
- 0 runs lost without a record: every run terminal, a failure has an exit code or an error code, a
  cancelled run a cancel request, ``timed_out`` only for the tasks with a timeout;
- 0 stuck: every run terminal within ``settle_timeout_s`` after the last restart;
- 0 orphans: no process carrying this chaos run's tag in its environment is alive at the end, except
  the background children of a command that ended by itself (left alone by contract);
- exact outcomes: a run nothing but server crashes touched ends as its task dictates (exit code and
  whole log, 1 MiB of output included), or, only if its command never started, failed with a reason.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.server import start_server, stop

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
PROJECT = "default"
BIG_LINE = "0123456789abcdef\n"
BIG_BYTES = 1024 * 1024
BIG_LOG = ((BIG_LINE * (BIG_BYTES // len(BIG_LINE) + 1))[:BIG_BYTES] + "\n").encode()

DEADLINE_TIMEOUT_MS = 3000
DEADLINE_GRACE_MS = 1000

# The ledger prologue and epilogue of every command (POSIX sh; fd 9 holds the run's lock).
_PROLOGUE = (
    'L="$CHAOS_LEDGER"; exec 9>>"$L/$QL3_RUN_ID.lock"; '
    'if flock -n 9; then echo "S $QL3_RUN_ID $QL3_ATTEMPT_ID" >>"$L/ledger"; '
    'else echo "OVERLAP $QL3_RUN_ID $QL3_ATTEMPT_ID" >>"$L/ledger"; fi; '
)
_EPILOGUE = 'echo "E $QL3_RUN_ID $QL3_ATTEMPT_ID" >>"$L/ledger"'


@dataclass(frozen=True)
class Kind:
    """One task of the mix: its body, its options and what a run of it must end as."""

    name: str
    body: str
    weight: int
    status: str
    exit_code: int | None  # None: not checked (a stopped command's status is the signal's)
    log: Callable[[str], bytes] | None  # the whole log, from the run id; None: not checked
    options: dict[str, Any] = field(default_factory=dict)

    def command(self) -> str:
        return _PROLOGUE + self.body.replace("@E", _EPILOGUE)


KINDS: tuple[Kind, ...] = (
    Kind(
        "instant", 'echo "instant $QL3_RUN_ID"; @E', 30, "succeeded", 0, lambda r: f"instant {r}\n".encode()
    ),
    Kind("sleeper", "echo a; sleep 1.5; echo b; @E", 18, "succeeded", 0, lambda r: b"a\nb\n"),
    Kind(
        "bigout",
        f"yes {BIG_LINE.strip()} | head -c {BIG_BYTES}; echo; @E",
        8,
        "succeeded",
        0,
        lambda r: BIG_LOG,
    ),
    Kind("failing", "echo failing; @E; exit 3", 14, "failed", 3, lambda r: b"failing\n"),
    Kind(
        "term_ignorer",
        # A child that ignores TERM: only the KILL after the grace ends it (and it must end).
        "echo t; (trap '' TERM; sleep 600) & sleep 600; wait; @E",
        6,
        "timed_out",
        None,
        None,
        {"timeout_ms": 2000, "grace_ms": 1000},
    ),
    Kind(
        "timeout", "echo s; sleep 20; @E", 7, "timed_out", None, None, {"timeout_ms": 1000, "grace_ms": 1000}
    ),
    Kind(
        "deadline",
        # A heartbeat every 0.2 s until its 3 s timeout stops it: runs of it straddle server kills, and
        # the ledger shows how long each copy lived past its deadline (the host executor keeps it).
        'while :; do echo "H $QL3_RUN_ID $QL3_ATTEMPT_ID $(date +%s%3N)" >>"$L/ledger"; sleep 0.2; done',
        8,
        "timed_out",
        None,
        None,
        {"timeout_ms": DEADLINE_TIMEOUT_MS, "grace_ms": DEADLINE_GRACE_MS},
    ),
    Kind(
        "retrier",
        "echo r; sleep 1; echo done; @E",
        17,
        "succeeded",
        0,
        lambda r: b"r\ndone\n",
        {"retry_safe": True, "max_attempts": 3},
    ),
)
CRON_KIND = Kind("cron", 'echo "cron $QL3_RUN_ID"; @E', 0, "succeeded", 0, lambda r: f"cron {r}\n".encode())


@dataclass
class ChaosConfig:
    runs: int = 160
    server_kills: int = 5
    task_kills: int = 10
    cancels: int = 16
    seed: int | None = None
    database_url: str | None = None
    workdir: Path | None = None
    slots: int = 4
    settle_timeout_s: float = 120.0
    submit_interval_s: float = 0.15
    log: Callable[[str], None] = print


@dataclass
class ChaosReport:
    seed: int
    violations: list[str]
    figures: dict[str, Any]

    def summary(self) -> str:
        lines = [f"chaos seed={self.seed}"]
        lines += [f"  {k}: {v}" for k, v in self.figures.items()]
        lines += [f"  VIOLATION {v}" for v in self.violations[:50]]
        if len(self.violations) > 50:
            lines.append(f"  ... {len(self.violations) - 50} more")
        return "\n".join(lines)


def pick_seed(explicit: int | None = None) -> int:
    if explicit is not None:
        return explicit
    env = os.environ.get("QL3_CHAOS_SEED")
    return int(env) if env else random.SystemRandom().randrange(1, 2**31)


# -- the server ------------------------------------------------------------------------------------


class ServerProcess:
    """``ql3 serve`` on one home (and database), restartable after a ``kill -9``; each start goes through
    the suite's one server starter (``tests/support/server.py``: a free port, retried on a clash)."""

    def __init__(self, home: Path, database_url: str | None, slots: int) -> None:
        self.home = home
        self.database_url = database_url
        self.slots = slots
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.starts = 0

    def start(self, timeout_s: float = 60.0) -> None:
        extra = ["--slots", str(self.slots)]
        if self.database_url:
            extra += ["--database-url", self.database_url]
        server = start_server(self.home, *extra, new_session=True, timeout_s=timeout_s)
        self.starts += 1
        self.process, self.url = server.process, server.url

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, timeout_s=30.0)

    def token(self) -> str:
        token: str = json.loads((self.home / "credentials").read_text())["token"]
        return token


class Api:
    """The HTTP API of whichever server process is current; waits out restarts."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self._token = ""

    def call(self, method: str, path: str, *, body: Any = None, retry_s: float = 90.0) -> httpx.Response:
        deadline = time.monotonic() + retry_s
        while True:
            if not self._token:
                self._token = self.server.token()
            try:
                response = httpx.request(
                    method,
                    f"{self.server.url}{path}",
                    json=body,
                    headers={"Authorization": f"Bearer {self._token}"},
                    timeout=30.0,
                )
                if response.status_code < 500:
                    return response
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: no answer within {retry_s} s")
            time.sleep(0.2)

    def json(self, method: str, path: str, body: Any = None) -> Any:
        response = self.call(method, path, body=body)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response.json()


# -- task processes --------------------------------------------------------------------------------


def tagged_processes(tag: str) -> dict[int, str]:
    """Live processes whose environment carries ``CHAOS_TAG=<tag>``: pid -> run id."""
    needle = f"CHAOS_TAG={tag}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                variables = fh.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle not in variables or state == b"Z":
            continue
        run = next((v[11:].decode() for v in variables if v.startswith(b"QL3_RUN_ID=")), "")
        found[int(entry)] = run
    return found


# -- the run -----------------------------------------------------------------------------------------


@dataclass
class Submitted:
    run_id: str
    kind: Kind


def run_chaos(config: ChaosConfig) -> ChaosReport:
    seed = pick_seed(config.seed)
    config.log(f"chaos seed={seed} (repeat with QL3_CHAOS_SEED={seed})")
    rng = random.Random(seed)
    owned_workdir = config.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="ql3-chaos-")) if config.workdir is None else config.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    home, ledger = workdir / "home", workdir / "ledger"
    ledger.mkdir(exist_ok=True)
    (ledger / "ledger").touch()
    tag = f"{seed}-{os.getpid()}-{time.monotonic_ns()}"
    server = ServerProcess(home, config.database_url, config.slots)
    api = Api(server)
    violations: list[str] = []
    figures: dict[str, Any] = {"seed": seed}
    started = time.monotonic()
    server.start()
    try:
        return _drive(config, rng, seed, server, api, ledger, tag, violations, figures, started)
    finally:
        server.stop()
        for pid in tagged_processes(tag):  # never leave anything behind, even after a failure
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if owned_workdir and not violations:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)


def _drive(
    config: ChaosConfig,
    rng: random.Random,
    seed: int,
    server: ServerProcess,
    api: Api,
    ledger: Path,
    tag: str,
    violations: list[str],
    figures: dict[str, Any],
    started: float,
) -> ChaosReport:
    base = f"/api/v1/projects/{PROJECT}"
    env = {"CHAOS_LEDGER": str(ledger), "CHAOS_TAG": tag}
    task_ids: dict[str, Kind] = {}
    for kind in (*KINDS, CRON_KIND):
        body: dict[str, Any] = {
            "name": f"chaos-{kind.name}",
            "command": kind.command(),
            "env": env,
            "environment_policy": "isolated",
            "cwd": str(ledger),
            **kind.options,
        }
        if kind is CRON_KIND:
            body["cron"] = "* * * * *"
        task_ids[api.json("POST", f"{base}/tasks", body)["id"]] = kind

    weights = [k.weight for k in KINDS]
    plan = [rng.choices(KINDS, weights)[0] for _ in range(config.runs)]
    n = config.runs
    kill_at = set(rng.sample(range(n // 8, n), min(config.server_kills, n - n // 8)))
    cancel_at = set(rng.sample(range(n), min(config.cancels, n)))
    task_kill_at = set(rng.sample(range(n // 10, n), min(config.task_kills, n - n // 10)))
    submitted: list[Submitted] = []
    cancelled: set[str] = set()
    touched: dict[str, str] = {}  # run id -> what chaos did to it (besides server crashes)
    server_kills = task_kills = 0
    last_restart = time.monotonic()

    for i, kind in enumerate(plan):
        run = api.json(
            "POST", f"{base}/tasks/chaos-{kind.name}/runs", {"idempotency_key": f"chaos-{seed}-{i}"}
        )
        submitted.append(Submitted(run["id"], kind))
        if i in cancel_at:
            # A recent run that has not ended yet (queued or running), if there is one.
            recent = [s for s in submitted[-12:] if s.run_id not in cancelled]
            alive = [
                s for s in recent if api.json("GET", f"{base}/runs/{s.run_id}")["status"] not in TERMINAL
            ]
            if alive:
                victim = rng.choice(alive)
                result = api.json("POST", f"{base}/runs/{victim.run_id}/cancel")["result"]
                if result != "already_terminal":
                    cancelled.add(victim.run_id)
                    touched.setdefault(victim.run_id, "cancelled")
        if i in task_kill_at:
            live = sorted(tagged_processes(tag).items())
            if live:
                pid, run_id = rng.choice(live)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    task_kills += 1
                    touched[run_id] = "task process killed"
        if i in kill_at:
            time.sleep(rng.random() * 0.5)
            server.kill9()
            server_kills += 1
            server.start()
            last_restart = time.monotonic()
        time.sleep(rng.random() * 2 * config.submit_interval_s)
    config.log(f"chaos: {n} runs submitted, {server_kills} server kills, {task_kills} task kills")

    # Settle: every run terminal within the bound after the last restart.
    final: dict[str, dict[str, Any]] = {}
    pending = {s.run_id for s in submitted}
    last_settled: dict[str, Any] = {}
    kinds = {s.run_id: s.kind.name for s in submitted}
    while pending and time.monotonic() - last_restart < config.settle_timeout_s:
        for run_id in sorted(pending):
            run = api.json("GET", f"{base}/runs/{run_id}")
            if run["status"] in TERMINAL:
                final[run_id] = run
                pending.discard(run_id)
                last_settled = run
        if pending:
            time.sleep(0.5)
    settled_after_s = time.monotonic() - last_restart
    for run_id in sorted(pending):
        status = api.json("GET", f"{base}/runs/{run_id}")["status"]
        violations.append(
            f"stuck: run {run_id} still {status} {config.settle_timeout_s:.0f} s after the last restart"
        )

    # Cron: stop it, then wait for its runs.
    cron_task = next(t for t, k in task_ids.items() if k is CRON_KIND)
    api.json("POST", f"{base}/tasks/{cron_task}/disable")
    cron_runs: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        page = api.json("GET", f"{base}/runs?task={cron_task}&limit=100")
        cron_runs = [r for r in page["items"] if r["task_id"] == cron_task]
        if all(r["status"] in TERMINAL for r in cron_runs):
            break
        time.sleep(0.5)

    # Logs through the API, while the server is up.
    logs: dict[str, bytes] = {}
    for run_id, run in final.items():
        if run["status"] in ("succeeded", "failed"):
            logs[run_id] = api.call("GET", f"{base}/runs/{run_id}/logs/raw").content
    for run in cron_runs:
        if run["status"] == "succeeded":
            logs[run["id"]] = api.call("GET", f"{base}/runs/{run['id']}/logs/raw").content

    # Orphans: nothing of a run that ended lost, cancelled or timed out (or whose process ql3 had to
    # give up on) is alive once all are terminal; the stop of a group is asynchronous. A command that
    # ended by itself with a receipt (its shell killed by this driver included: exit 137) leaves the
    # background children it started alone, by contract (tests/unit/execution/
    # test_shim_death_takes_its_group.py); the cleanup below kills those.
    def must_be_gone(run_id: str) -> bool:
        run = final.get(run_id, {})
        ended_by_itself = run.get("status") == "succeeded" or (
            run.get("status") == "failed" and run.get("error_code") == "EXIT_NONZERO"
        )
        return not ended_by_itself

    def orphans_now() -> dict[int, str]:
        return {pid: run_id for pid, run_id in tagged_processes(tag).items() if must_be_gone(run_id)}

    deadline = time.monotonic() + 20
    orphans = orphans_now()
    while orphans and time.monotonic() < deadline:
        time.sleep(0.5)
        orphans = orphans_now()
    for pid, run_id in sorted(orphans.items()):
        status = final.get(run_id, {}).get("status", "?")
        violations.append(f"orphan: pid {pid} of run {run_id} ({status}) alive at the end")

    server.stop()
    attempts = _attempts(server)
    _check(submitted, final, cron_runs, attempts, logs, touched, cancelled, ledger, violations)

    statuses = Counter(r["status"] for r in final.values())
    lifetimes = sorted(heartbeat_lifetimes(ledger).values())
    overshoots = [ms - DEADLINE_TIMEOUT_MS for ms in lifetimes]
    figures.update(
        {
            "deadline_attempts": len(lifetimes),
            "deadline_overshoot_ms_p50_max": (
                f"{overshoots[len(overshoots) // 2]} / {overshoots[-1]}" if overshoots else "-"
            ),
            "runs": n,
            "cron_runs": len(cron_runs),
            "server_kills": server_kills,
            "task_kills": task_kills,
            "cancels": len(cancelled),
            "statuses": dict(sorted(statuses.items())),
            "retried_runs": sum(1 for a in attempts.values() if len(a) > 1),
            "lost_attempts": sum(1 for a in attempts.values() for x in a if x["status"] == "lost"),
            "settled_after_last_restart_s": round(settled_after_s, 1),
            "last_to_settle": " ".join(
                str(x)
                for x in (
                    kinds.get(last_settled.get("id", ""), "-"),
                    last_settled.get("status"),
                    last_settled.get("error_code"),
                    last_settled.get("attempt"),
                )
            ),
            "duration_s": round(time.monotonic() - started, 1),
            "duplicates": sum(1 for v in violations if v.startswith("duplicate")),
            "violations": len(violations),
        }
    )
    report = ChaosReport(seed=seed, violations=violations, figures=figures)
    config.log(report.summary())
    return report


def _attempts(server: ServerProcess) -> dict[str, list[dict[str, Any]]]:
    """Every attempt, by run, in attempt order (read from the database once the server stopped)."""
    query = (
        "SELECT run_id, id, attempt, status, exit_code, error_code FROM run_attempts ORDER BY run_id, attempt"
    )
    rows: list[tuple[Any, ...]]
    if server.database_url and server.database_url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(server.database_url) as conn:
            rows = list(conn.execute(query).fetchall())
    else:
        path = server.home / "ql3.db"
        if server.database_url:
            path = Path(server.database_url.removeprefix("sqlite:///").removeprefix("sqlite://"))
        lite = sqlite3.connect(path)
        try:
            rows = lite.execute(query).fetchall()
        finally:
            lite.close()
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run_id, attempt_id, number, status, exit_code, error_code in rows:
        by_run[run_id].append(
            {
                "id": attempt_id,
                "n": number,
                "status": status,
                "exit_code": exit_code,
                "error_code": error_code,
            }
        )
    return by_run


def heartbeat_lifetimes(ledger: Path) -> dict[str, int]:
    """Per attempt of the ``deadline`` kind, ms from its first heartbeat to its last."""
    seen: dict[str, tuple[int, int]] = {}
    for line in (ledger / "ledger").read_text().splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "H":
            at = int(parts[3])
            first, _last = seen.get(parts[2], (at, at))
            seen[parts[2]] = (first, at)
    return {attempt: last - first for attempt, (first, last) in seen.items()}


def _read_ledger(ledger: Path) -> tuple[dict[str, list[str]], Counter[tuple[str, str]], set[str], list[str]]:
    starts: dict[str, list[str]] = defaultdict(list)  # run -> attempts started, in order
    start_count: Counter[tuple[str, str]] = Counter()
    ends: set[str] = set()
    overlaps: list[str] = []
    for line in (ledger / "ledger").read_text().splitlines():
        if line.startswith("H "):
            continue  # heartbeats: heartbeat_lifetimes
        word, run_id, attempt_id = line.split()
        if word == "S":
            start_count[(run_id, attempt_id)] += 1
            if attempt_id not in starts[run_id]:
                starts[run_id].append(attempt_id)
        elif word == "E":
            ends.add(attempt_id)
        else:
            overlaps.append(f"{run_id} attempt {attempt_id}")
    return starts, start_count, ends, overlaps


def _check(
    submitted: list[Submitted],
    final: dict[str, dict[str, Any]],
    cron_runs: list[dict[str, Any]],
    attempts: dict[str, list[dict[str, Any]]],
    logs: dict[str, bytes],
    touched: dict[str, str],
    cancelled: set[str],
    ledger: Path,
    violations: list[str],
) -> None:
    starts, start_count, ends, overlaps = _read_ledger(ledger)
    violations.extend(f"duplicate: run {o} started while an earlier copy was alive" for o in overlaps)
    # Deadlines kept on the host, whatever the server was doing: no copy outlives its timeout by more
    # than its grace plus one second (the heartbeat starts after the spawn, so this is conservative).
    bound = DEADLINE_TIMEOUT_MS + DEADLINE_GRACE_MS + 1000
    violations.extend(
        f"deadline: attempt {a} lived {ms} ms, more than {bound} ms"
        for a, ms in heartbeat_lifetimes(ledger).items()
        if ms > bound
    )
    violations.extend(
        f"duplicate: run {r} attempt {a} started {c} times" for (r, a), c in start_count.items() if c > 1
    )
    every = [(s.run_id, s.kind) for s in submitted] + [(r["id"], CRON_KIND) for r in cron_runs]
    finals = {**final, **{r["id"]: r for r in cron_runs}}
    scheduled = Counter(r.get("scheduled_for_ms") for r in cron_runs)
    violations.extend(f"duplicate: two cron runs for {ms}" for ms, c in scheduled.items() if ms and c > 1)

    for run_id, kind in every:
        run = finals.get(run_id)
        if run is None or run["status"] not in TERMINAL:
            continue  # reported as stuck
        status, exit_code, error_code = run["status"], run["exit_code"], run["error_code"]
        ran = starts.get(run_id, [])
        mine = attempts.get(run_id, [])
        by_id = {a["id"]: a for a in mine}
        what = f"run {run_id} ({kind.name}, {status}, exit {exit_code}, {error_code})"
        # Duplicates: only attempts the database knows, and a second one only after a recorded loss.
        for attempt_id in ran:
            if attempt_id not in by_id:
                violations.append(f"duplicate: {what} ran attempt {attempt_id} the database does not know")
        if len(ran) > 1:
            if not kind.options.get("retry_safe"):
                violations.append(
                    f"duplicate: {what} ran {len(ran)} attempts of a task that is not retry-safe"
                )
            for attempt_id in ran[:-1]:
                if by_id.get(attempt_id, {}).get("status") != "lost":
                    violations.append(
                        f"duplicate: {what} ran again after attempt {attempt_id} that was not lost"
                    )
        # A record for every outcome.
        if status == "failed" and exit_code is None and not error_code:
            violations.append(f"lost without a record: {what}")
        if status == "cancelled" and run_id not in cancelled:
            violations.append(f"cancelled without a cancel: {what}")
        if status == "timed_out" and "timeout_ms" not in kind.options:
            violations.append(f"timed out without a timeout: {what}")
        last = mine[-1] if mine else None
        if status == "succeeded" and (exit_code != 0 or last is None or last["id"] not in ends):
            violations.append(f"false success: {what} (no end in the ledger for its last attempt)")
        for attempt in mine:
            if attempt["status"] == "lost" and attempt["id"] in ends and run_id not in touched:
                violations.append(
                    f"false loss: {what} attempt {attempt['n']} finished its command but was lost"
                )
        # Exact outcomes for the runs only server crashes touched.
        # (A killed child makes the shell print "Killed": a touched run's log is not compared.)
        if run_id in touched:
            continue
        if status == kind.status and kind.exit_code in (None, exit_code):
            if (
                kind.log is not None
                and status in ("succeeded", "failed")
                and logs.get(run_id) != kind.log(run_id)
            ):
                got = logs.get(run_id, b"")
                violations.append(
                    f"log: {what}: {len(got)} bytes sha256 {hashlib.sha256(got).hexdigest()[:12]},"
                    f" expected {len(kind.log(run_id))}"
                )
            continue
        never_started = last is not None and last["id"] not in ran
        if status == "failed" and exit_code is None and error_code and never_started:
            continue  # the launch window: the command never started, and the run says why
        violations.append(f"outcome: {what}; expected {kind.status} exit {kind.exit_code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--kills", type=int, default=20, help="kill -9 of ql3 serve")
    parser.add_argument(
        "--task-kills", type=int, default=None, help="kill -9 of task processes (default 2x kills)"
    )
    parser.add_argument("--cancels", type=int, default=None, help="default runs / 10")
    parser.add_argument("--seed", type=int, default=None, help="default QL3_CHAOS_SEED or random")
    parser.add_argument("--database-url", default=None, help="postgresql://... (default SQLite in the home)")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="kept after a failure (default a temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors exit 2; ql3's tools use 64 (EX_USAGE)
        return 64 if exc.code else 0
    if args.runs < 1 or args.kills < 0 or args.slots < 1:
        print("scripts/chaos: --runs and --slots must be positive, --kills not negative", file=sys.stderr)
        return 64
    config = ChaosConfig(
        runs=args.runs,
        server_kills=args.kills,
        task_kills=args.task_kills if args.task_kills is not None else 2 * args.kills,
        cancels=args.cancels if args.cancels is not None else max(1, args.runs // 10),
        seed=args.seed,
        database_url=args.database_url,
        workdir=args.workdir,
        slots=args.slots,
    )
    report = run_chaos(config)
    if args.json:
        print(json.dumps(report.figures))
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
