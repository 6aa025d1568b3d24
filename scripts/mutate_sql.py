"""Mutation testing of the PostgreSQL server-side functions (scripts/mutate-sql; see docs/testing.md).

mutmut mutates Python only, but on PostgreSQL the claim and every Run write run as plpgsql:
``ql3_claim`` (migration 0010) and ``ql3_write_run`` (migration 0011), a second copy of what
``application/lease_claims.py``, ``lease_results.py`` and ``runs.py`` do statement by statement on
SQLite; the batch claim, ``ql3_claim_batch`` (migration 0013); the locked reads of a lease holder's
result, ``ql3_fence_rows`` (migration 0012); and the common case of each result in one statement,
``ql3_lease_result`` (migration 0014). This
script applies one simple mutation at a time to a function's body, installs the mutant with
``CREATE OR REPLACE FUNCTION`` into a throwaway, migrated database ``ql3_mutsql_<pid>`` on the local
PostgreSQL (``QL3_TEST_PG_DSN``), and runs the PostgreSQL half of the contract tests that reach the
function with that database as the harness's template (``QL3_TEST_PG_TEMPLATE``, read by
``tests/support/plugin.py``): every test database is a clone of it, so every test sees the mutant.
A mutant is killed when a test fails; it survives when they all pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
MIGRATIONS = ROOT / "src" / "ql3" / "storage" / "postgres" / "migrations"
RESULTS = ROOT / "mutants" / "sql-results.json"


@dataclasses.dataclass(frozen=True)
class Function:
    name: str
    migration: str
    # The tests that reach the function, fastest killers first: a mutant is tested by the first
    # group, then (if it survived) by the second, each with -x.
    tests: tuple[tuple[str, ...], ...]


FUNCTIONS = {
    "ql3_claim": Function(
        "ql3_claim",
        "0010_claim_function.sql",
        (
            (
                "tests/contract/test_lease_claim_edges.py",
                "tests/contract/test_claim_reacquire_slots.py",
                "tests/contract/test_claim_statements.py",
                "tests/contract/test_dispatch_claim_edges.py",
                # which rows the claim holds locked, and in which order (the FOR UPDATE mutants)
                "tests/contract/test_pg_round_trips.py::test_the_claim_locks_run_attempt_worker_then_lease_in_order_before_writing",
            ),
            (
                "tests/contract/test_lease_row_locks.py",
                "tests/contract/test_worker_slots_are_never_leaked.py",
                "tests/contract/test_dispatch_once.py",
                "tests/contract/test_dispatch_race.py",
                "tests/contract/test_time_authority.py",
            ),
        ),
    ),
    "ql3_claim_batch": Function(
        "ql3_claim_batch",
        "0013_claim_batch_function.sql",
        (
            (
                "tests/contract/test_dispatch_batch.py",
                "tests/contract/test_dispatch_claim_edges.py",
                # which rows a batch holds locked, in which order; and that a cycle costs one call
                "tests/contract/test_pg_round_trips.py::test_a_batch_locks_its_runs_then_its_attempts_then_the_worker",
                "tests/contract/test_pg_round_trips.py::test_a_batch_locks_its_earlier_lease_rows_by_attempt_id_before_any_claim",
                "tests/contract/test_pg_round_trips.py::test_a_cycle_of_several_offers_costs_the_round_trips_of_one",
            ),
            (
                "tests/contract/test_dispatch_once.py",
                "tests/contract/test_dispatch_multi_worker.py",
                "tests/contract/test_dispatch_fair_scan.py",
                "tests/contract/test_worker_slots_are_never_leaked.py",
                "tests/contract/test_lease_row_locks.py",
                "tests/contract/test_time_authority.py",
            ),
        ),
    ),
    "ql3_write_run": Function(
        "ql3_write_run",
        "0011_write_run_function.sql",
        (
            (
                "tests/contract/test_run_transitions.py",
                "tests/contract/test_ack_edges.py",
                "tests/contract/test_completion_edges.py",
            ),
            (
                "tests/contract/test_fence_edges.py",
                "tests/contract/test_lost_retry.py",
                "tests/contract/test_cancellation_results.py",
                "tests/contract/test_time_authority.py",
            ),
        ),
    ),
    "ql3_fence_rows": Function(
        "ql3_fence_rows",
        "0012_fence_rows_function.sql",
        (
            (
                # which rows a result holds locked, in which order, and that the worker is not
                "tests/contract/test_pg_round_trips.py::test_the_starting_ack_locks_run_attempt_then_lease_in_order",
                "tests/contract/test_pg_round_trips.py::test_a_result_reads_the_worker_row_without_waiting_for_its_lock",
                "tests/contract/test_fence_edges.py",
                "tests/contract/test_ack_edges.py",
                "tests/contract/test_completion_edges.py",
            ),
            (
                "tests/contract/test_lease_fences.py",
                "tests/contract/test_lease_row_locks.py",
                "tests/contract/test_time_authority.py",
                "tests/contract/test_worker_slots_are_never_leaked.py",
            ),
        ),
    ),
    "ql3_lease_result": Function(
        "ql3_lease_result",
        "0014_lease_result_function.sql",
        (
            (
                "tests/contract/test_lease_result_function.py",
                "tests/contract/test_ack_edges.py",
                "tests/contract/test_completion_edges.py",
                # which rows a result holds locked, in which order; and that it takes one round trip
                "tests/contract/test_pg_round_trips.py::test_the_starting_ack_locks_run_attempt_then_lease_in_order",
                "tests/contract/test_pg_round_trips.py::test_the_acks_and_the_completion_cost_a_bounded_number_of_round_trips",
            ),
            (
                "tests/contract/test_lease_fences.py",
                "tests/contract/test_lease_row_locks.py",
                "tests/contract/test_time_authority.py",
                "tests/contract/test_worker_slots_are_never_leaked.py",
                "tests/contract/test_cancellation_results.py",
                "tests/contract/test_notification_outbox.py",
                "tests/contract/test_notification_sources.py",
            ),
        ),
    ),
}


@dataclasses.dataclass(frozen=True)
class Mutant:
    function: str
    number: int
    kind: str
    line: int  # in the migration file
    before: str
    after: str
    body: str  # the whole mutated function body

    @property
    def name(self) -> str:
        return f"{self.function}#{self.number}"


# -- mutations ------------------------------------------------------------------------------------


def _code_mask(text: str) -> list[bool]:
    """True where a character is code: not inside a '...' literal or a -- comment."""
    mask = [True] * len(text)
    i = 0
    while i < len(text):
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            for j in range(i, end):
                mask[j] = False
            i = end
        elif text[i] == "'":
            end = i + 1
            while end < len(text):
                if text[end] == "'" and text[end + 1 : end + 2] == "'":
                    end += 2
                elif text[end] == "'":
                    break
                else:
                    end += 1
            for j in range(i, min(end + 1, len(text))):
                mask[j] = False
            i = end + 1
        else:
            i += 1
    return mask


_CLAUSE_END = re.compile(r"\b(WHERE|RETURNING|ORDER BY|LIMIT|FROM)\b|;")


def _set_spans(text: str, mask: list[bool]) -> list[tuple[int, int]]:
    """The assignment lists of UPDATE ... SET (their ``=`` is an assignment, not a comparison)."""
    spans = []
    for m in re.finditer(r"\bSET\b", text):
        if not mask[m.start()]:
            continue
        end = m.end()
        for e in _CLAUSE_END.finditer(text, m.end()):
            if mask[e.start()]:
                end = e.start()
                break
        spans.append((m.end(), end))
    return spans


_SWAPS = {"=": "<>", "<>": "=", "<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_COMPARISON = re.compile(r"(?<![<>:!=\-|])(<>|<=|>=|=|<|>)(?![=>])")


def _conditions(text: str, mask: list[bool]) -> Iterator[tuple[int, int, str]]:
    """The conditions of WHERE clauses and IF/ELSIF statements: (start, end, keyword)."""
    for m in re.finditer(r"\b(WHERE|ELSIF|IF)\b", text):
        if not mask[m.start()]:
            continue
        keyword = m.group(1)
        if keyword == "IF" and text[: m.start()].rstrip().endswith("END"):
            continue
        stop = (
            re.compile(r"\bTHEN\b")
            if keyword != "WHERE"
            else re.compile(r"\b(ORDER BY|LIMIT|RETURNING|FOR UPDATE|GROUP BY)\b|;")
        )
        depth = 0
        end = len(text)
        i = m.end()
        while i < len(text):
            c = text[i]
            if mask[i] and c == "(":
                depth += 1
            elif mask[i] and c == ")":
                if depth == 0:  # a subquery's WHERE ends with its parenthesis
                    end = i
                    break
                depth -= 1
            elif (
                mask[i]
                and depth == 0
                and (c == ";" or not (text[i - 1].isalnum() or text[i - 1] == "_"))
                and stop.match(text, i)
            ):
                end = i
                break
            i += 1
        yield m.end(), end, keyword


def _terms(text: str, start: int, end: int, mask: list[bool]) -> list[tuple[int, int]]:
    """Top-level AND/OR terms of a condition, as spans that include the connector before them."""
    cuts = [start]
    depth = 0
    for i in range(start, end):
        if not mask[i]:
            continue
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
        elif depth == 0:
            m = re.compile(r"\s(AND|OR)\s").match(text, i)
            if m:
                cuts.append(i)
    cuts.append(end)
    return [(cuts[k], cuts[k + 1]) for k in range(len(cuts) - 1)]


def mutations(body: str) -> Iterator[tuple[str, int, int, str]]:
    """(kind, start, end, replacement) for every mutant of one function body."""
    mask = _code_mask(body)
    in_set = _set_spans(body, mask)

    def code(i: int) -> bool:
        return mask[i]

    for m in _COMPARISON.finditer(body):
        if not code(m.start()) or any(a <= m.start() < b for a, b in in_set):
            continue
        yield "comparison", m.start(), m.end(), _SWAPS[m.group(1)]
    for m in re.finditer(r"\b(AND|OR)\b", body):
        if code(m.start()):
            yield "connective", m.start(), m.end(), "OR" if m.group(1) == "AND" else "AND"
    for m in re.finditer(r"\bIS (NOT )?(NULL|DISTINCT FROM)\b", body):
        if code(m.start()):
            yield "is", m.start(), m.end(), f"IS {'' if m.group(1) else 'NOT '}{m.group(2)}"
    for m in re.finditer(r"([+-]) 1\b", body):
        if code(m.start()):
            yield "plus_one", m.start(), m.end(), f"{m.group(1)} 0"
    for m in re.finditer(r" FOR UPDATE\b", body):
        if code(m.start()):
            yield "for_update", m.start(), m.end(), ""
    for start, end, keyword in _conditions(body, mask):
        if keyword != "WHERE":
            yield "if_false", start, end, " FALSE "
        terms = _terms(body, start, end, mask)
        if len(terms) < 2:
            continue
        for k, (a, b) in enumerate(terms):
            if k == 0:  # drop the first term and the connector after it
                nxt = re.compile(r"\s(AND|OR)\s").match(body, b)
                assert nxt is not None
                yield "drop_condition", a, nxt.end(), " "
            else:  # the connector before it goes with it; a space keeps the next token apart
                yield "drop_condition", a, b, " "


def function_parts(function: Function) -> tuple[str, int, int]:
    """The migration text and the span of the function body (between the $$ quotes)."""
    text = (MIGRATIONS / function.migration).read_text(encoding="utf-8")
    start = text.index("$$") + 2
    end = text.index("$$", start)
    return text, start, end


def mutants(function: Function) -> list[Mutant]:
    text, start, end = function_parts(function)
    body = text[start:end]
    out: list[Mutant] = []
    seen: set[str] = set()
    for kind, a, b, replacement in mutations(body):
        mutated = body[:a] + replacement + body[b:]
        if mutated in seen or mutated == body:
            continue
        seen.add(mutated)
        line = text.count("\n", 0, start + a) + 1
        before = " ".join(body[a:b].split())
        out.append(
            Mutant(function.name, len(out) + 1, kind, line, before, " ".join(replacement.split()), mutated)
        )
    return out


def install_sql(function: Function, body: str) -> str:
    text, start, end = function_parts(function)
    create = text[:start] + body + text[end:]
    create = create.replace(
        f"CREATE FUNCTION {function.name}(", f"CREATE OR REPLACE FUNCTION {function.name}(", 1
    )
    assert f"CREATE OR REPLACE FUNCTION {function.name}(" in create
    return create


# -- running ----------------------------------------------------------------------------------------


def _with_dbname(dsn: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items() if v is not None})


def install(dsn: str, function: Function, body: str) -> str | None:
    """Install a body; the error text when PostgreSQL refuses it (an invalid mutant)."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(install_sql(function, body).encode())
    except psycopg.Error as exc:
        return str(exc).splitlines()[0]
    return None


def run_tests(admin: str, template: str, paths: tuple[str, ...]) -> tuple[bool, str]:
    """(passed, the first failing test) for the PostgreSQL half of ``paths``."""
    env = dict(os.environ, CI="true", QL3_TEST_PG_DSN=admin, QL3_TEST_PG_TEMPLATE=template)
    cmd = [
        str(ROOT / ".venv" / "bin" / "python"),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-x",
        "-q",
        "--no-header",
        "-rf",
        "-k",
        "not sqlite",
        *paths,
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return True, ""
    if done.returncode not in (1,):
        raise SystemExit(
            f"pytest could not run ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    failed = [line.split(" ", 2)[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    return False, failed[0] if failed else "(failed)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("functions", nargs="*", help=f"of {', '.join(FUNCTIONS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="only list the mutants")
    parser.add_argument("--only", help="comma-separated mutant numbers (e.g. 3,17) of one function")
    parser.add_argument("--report", action="store_true", help="print the results of the last run")
    args = parser.parse_args()
    unknown = sorted(set(args.functions) - set(FUNCTIONS))
    if unknown:
        parser.error(f"unknown functions: {unknown}")
    selected = [FUNCTIONS[name] for name in args.functions or FUNCTIONS]
    if args.report:
        return report(json.loads(RESULTS.read_text()) if RESULTS.exists() else {})
    if args.list:
        for function in selected:
            for m in mutants(function):
                print(f"{m.name:18} line {m.line:4} {m.kind:15} {m.before!r} -> {m.after!r}")
        return 0
    admin = os.environ.get("QL3_TEST_PG_DSN")
    if not admin:
        raise SystemExit("QL3_TEST_PG_DSN is not set (a DSN whose user may CREATE DATABASE)")
    only = {int(n) for n in args.only.split(",")} if args.only else None
    template = f"ql3_mutsql_{os.getpid()}"
    sys.path.insert(0, str(ROOT / "src"))
    from ql3.storage.postgres.adapter import PostgresDatabase

    results: dict[str, dict[str, object]] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{template}"'.encode())
    try:
        db = PostgresDatabase(_with_dbname(admin, template), min_size=1, max_size=1)
        db.migrate()
        db.close()
        dsn = _with_dbname(admin, template)
        for function in selected:
            text, start, end = function_parts(function)
            original = text[start:end]
            every = mutants(function)
            todo = [m for m in every if only is None or m.number in only]
            print(f"{function.name}: {len(todo)} of {len(every)} mutants", flush=True)
            for group in function.tests:  # the unmutated function must pass every test first
                passed, first = run_tests(admin, template, group)
                if not passed:
                    raise SystemExit(f"{function.name}: {first} fails without any mutation")
            for m in todo:
                began = time.monotonic()
                error = install(dsn, function, m.body)
                if error is not None:
                    outcome, by = "invalid", error
                else:
                    outcome, by = "survived", ""
                    for group in function.tests:
                        passed, first = run_tests(admin, template, group)
                        if not passed:
                            outcome, by = "killed", first
                            break
                results[m.name] = {**dataclasses.asdict(m), "outcome": outcome, "by": by}
                results[m.name].pop("body")
                RESULTS.parent.mkdir(exist_ok=True)
                RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))
                took = time.monotonic() - began
                print(
                    f"{m.name:18} {outcome:8} {took:5.0f}s line {m.line} {m.kind} "
                    f"{m.before!r} -> {m.after!r} {by}",
                    flush=True,
                )
            failed = install(dsn, function, original)
            assert failed is None, failed
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)'.encode())
    return report(results, [f.name for f in selected])


def report(results: dict[str, dict[str, object]], names: list[str] | None = None) -> int:
    for name in names or sorted({str(r["function"]) for r in results.values()}):
        rows = [r for r in results.values() if r["function"] == name]
        killed = sum(1 for r in rows if r["outcome"] == "killed")
        valid = sum(1 for r in rows if r["outcome"] != "invalid")
        invalid = len(rows) - valid
        print(f"{name}: {killed}/{valid} killed ({invalid} invalid: PostgreSQL refused the mutant)")
        for r in sorted(rows, key=lambda r: int(str(r["number"]))):
            if r["outcome"] == "survived":
                print(
                    f"  survived {r['function']}#{r['number']} line {r['line']} {r['kind']}: "
                    f"{r['before']!r} -> {r['after']!r}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
