"""The named-query catalogue and the wake-up channels, read from the source (docs/design.md, "Storage").

- No query is dead: every name in the catalogue is a string the code can pass to the transaction,
  written out or built from constants (``f"{prefix}_first"`` with ``prefix`` one of two literals).
- A dialect file (``storage/{sqlite,postgres}/*.sql``) only overrides names the shared catalogue
  (``storage/sql/*.sql``) defines, unless its first line is ``-- dialect-only``: then it defines only
  names the shared catalogue does not (the locked reads, the JSON-array pages). That both dialects
  expose the same names is checked with the queries the code runs in tests/contract/test_database_port.py.
- Every query has a one-line description (``-- desc:`` right after its name line, at most 120
  characters, not the name repeated) that the loader keeps out of the SQL it sends.
- Wake-up channels are the constants of ``ql3/ports/channels.py``: no code names a channel by a
  string, and every channel has a listener (a wait on it) and a notifier (a commit or a process that
  posts it).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from ql3.ports import channels
from ql3.storage import queries
from ql3.storage.queries import catalogue, descriptions

SRC = Path(__file__).resolve().parents[2] / "src" / "ql3"
STORAGE = SRC / "storage"
DIALECTS = ("sqlite", "postgres")
DIALECT_ONLY = "-- dialect-only"


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), ast.parse(path.read_text(), filename=str(path))


# -- strings the code can name a query with -------------------------------------------------------


def _string_values(node: ast.expr | None, names: dict[str, set[str]]) -> set[str]:
    """The strings an expression can evaluate to when built from literals only (else empty)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _string_values(node.body, names) | _string_values(node.orelse, names)
    if isinstance(node, ast.Name):
        return names.get(node.id, set())
    if isinstance(node, ast.JoinedStr):
        parts: list[set[str]] = []
        for value in node.values:
            found = _string_values(value.value if isinstance(value, ast.FormattedValue) else value, names)
            if not found:
                return set()
            parts.append(found)
        return {"".join(combo) for combo in itertools.product(*parts)}
    return set()


def _strings_in(tree: ast.Module) -> set[str]:
    """Every literal of a module, and every f-string whose pieces are literals or names bound (in
    that module) to literals: ``prefix = "run_list_task" if task_id else "run_list"``."""
    names: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.setdefault(target.id, set()).update(_string_values(node.value, names))
    # A docstring names a query without running it.
    docstrings = {
        id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant | ast.JoinedStr) and id(node) not in docstrings:
            found |= _string_values(node, names)
    return found


def _strings_in_src() -> set[str]:
    found: set[str] = set()
    for _relative, tree in _modules():
        found |= _strings_in(tree)
    return found


def test_the_string_scan_sees_literals_and_names_built_from_them() -> None:
    tree = ast.parse(
        "def page(tx, task_id, cursor):\n"
        '    prefix = "run_list_task" if task_id else "run_list"\n'
        '    return tx.all(f"{prefix}_after" if cursor else f"{prefix}_first")\n'
        'QUERY = "event_list"\n'
    )
    assert _strings_in(tree) >= {
        "run_list_task_after",
        "run_list_task_first",
        "run_list_after",
        "run_list_first",
        "event_list",
    }
    assert "unknown_first" not in _strings_in(ast.parse('def f(tx, x):\n    return tx.all(f"{x}_first")\n'))
    assert "run_list_first" not in _strings_in(ast.parse('def f():\n    """run_list_first"""\n'))


def test_no_query_in_the_catalogue_is_dead() -> None:
    used = _strings_in_src()
    for dialect in DIALECTS:
        names = set(catalogue(dialect))
        assert len(names) > 100  # the catalogue was read
        dead = sorted(names - used)
        assert dead == [], f"{dialect}: queries no code in src/ names (delete them): {dead}"


# -- shared catalogue and dialect files -------------------------------------------------------------


def _names_in(text: str) -> list[str]:
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("--") and line[2:].lstrip().startswith("name:")
    ]


def _sql_files(package: str) -> dict[str, str]:
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in resources.files(package).iterdir()
        if p.name.endswith(".sql") and p.name != "schema.sql"
    }


def test_a_dialect_file_overrides_only_shared_names_unless_it_is_dialect_only() -> None:
    shared = {name for text in _sql_files("ql3.storage.sql").values() for name in _names_in(text)}
    assert len(shared) > 100
    for dialect in DIALECTS:
        files = _sql_files(f"ql3.storage.{dialect}")
        assert files, dialect
        for filename, text in files.items():
            names = _names_in(text)
            where = f"storage/{dialect}/{filename}"
            assert names, f"{where} defines no query"
            if text.startswith(DIALECT_ONLY):
                also_shared = sorted(set(names) & shared)
                assert also_shared == [], (
                    f"{where} is dialect-only but overrides shared queries: {also_shared}"
                )
            else:
                unknown = sorted(set(names) - shared)
                assert unknown == [], (
                    f"{where} overrides queries the shared catalogue does not define: {unknown} "
                    f"(a name only the dialects define goes in a file that starts with {DIALECT_ONLY!r})"
                )


# -- descriptions -----------------------------------------------------------------------------------

MAX_DESCRIPTION = 120


def test_every_query_has_a_one_line_description() -> None:
    for dialect in DIALECTS:
        found = descriptions(dialect)
        assert set(found) == set(catalogue(dialect)), dialect
        missing = sorted(name for name, text in found.items() if not text.strip())
        assert missing == [], f"{dialect}: queries without a '-- desc:' line after their name: {missing}"
        too_long = sorted(name for name, text in found.items() if len(text) > MAX_DESCRIPTION)
        assert too_long == [], f"{dialect}: descriptions over {MAX_DESCRIPTION} characters: {too_long}"
        multiline = sorted(name for name, text in found.items() if "\n" in text or "\r" in text)
        assert multiline == [], dialect
        echoes = sorted(
            name
            for name, text in found.items()
            if text.lower().strip(" .").replace(" ", "_") == name or len(text.split()) < 4
        )
        assert echoes == [], f"{dialect}: descriptions that only repeat the name: {echoes}"


def test_every_name_line_in_every_file_is_followed_by_its_description() -> None:
    """A dialect override carries its own description: the shared one may not fit its text."""
    for package in ("ql3.storage.sql", *(f"ql3.storage.{d}" for d in DIALECTS)):
        for filename, text in _sql_files(package).items():
            lines = text.splitlines()
            for i, line in enumerate(lines):
                if line.startswith("--") and line[2:].lstrip().startswith("name:"):
                    following = lines[i + 1] if i + 1 < len(lines) else ""
                    assert following.startswith("-- desc: "), f"{package}/{filename}:{i + 2}: {following!r}"


def test_a_description_is_kept_out_of_the_sql_sent_to_the_database() -> None:
    for dialect in DIALECTS:
        bodies = catalogue(dialect)
        texts = descriptions(dialect)
        leaked = sorted(
            name for name, body in bodies.items() if "desc:" in body or (texts[name] and texts[name] in body)
        )
        assert leaked == [], dialect
    parsed = queries._parse(
        "-- name: one\n-- desc: The first row.\nSELECT 1\n\n"
        "-- name: two\n-- a comment, not a description\nSELECT 2;\n"
        "-- name: three\n--desc:   Spaces around it.  \nSELECT 3\n"
    )
    assert parsed == {
        "one": ("The first row.", "SELECT 1"),
        "two": ("", "-- a comment, not a description\nSELECT 2"),
        "three": ("Spaces around it.", "SELECT 3"),
    }


# -- wake-up channels -------------------------------------------------------------------------------

NOTIFY_CALLS = {"notify", "_notify"}
# Calls that wait on the channels in their first argument (``counters`` takes the marks a
# ``wait_past`` then waits beyond).
WAIT_CALLS = {"wait_for", "wait_any", "counters", "_counters"}
CHANNEL_CALLS = NOTIFY_CALLS | WAIT_CALLS | {"start_listening"}
# The control-loop factory (application/control_loops.py): ``loop(name, cycle, channel, backstop_s)``
# without its own ``wait`` waits on ``channel``.
LOOP_FACTORY = "loop"
# Channels no commit notifies, each with the reason: only the loop's stop interrupts its wait.
INTERRUPT_ONLY = {channels.MAINTAIN: "the embedded worker's maintenance runs on its backstop timers"}


def _channel_aliases(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """Names bound to the channels module, and names imported from it (local name -> attribute)."""
    modules: set[str] = set()
    constants: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "ql3.ports":
            modules.update(a.asname or a.name for a in node.names if a.name == "channels")
        elif isinstance(node, ast.ImportFrom) and node.module == "ql3.ports.channels":
            constants.update({a.asname or a.name: a.name for a in node.names})
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name == "ql3.ports.channels" and a.asname)
    return modules, constants


def _channels_of(
    node: ast.expr, modules: set[str], constants: dict[str, str], tuples: dict[str, set[str]]
) -> set[str]:
    """The channels an expression names through the channels module (empty if none)."""
    attribute: str | None = None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
        attribute = node.attr
    elif isinstance(node, ast.Name) and node.id in constants:
        attribute = constants[node.id]
    elif isinstance(node, ast.Name) and node.id in tuples:
        return tuples[node.id]
    elif isinstance(node, ast.Tuple | ast.List):
        return {c for element in node.elts for c in _channels_of(element, modules, constants, tuples)}
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"list", "tuple"}:
        return {c for a in node.args for c in _channels_of(a, modules, constants, tuples)}
    if attribute is None:
        return set()
    value = getattr(channels, attribute)
    return {value} if isinstance(value, str) else set(value)


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _is_literal(node: ast.expr) -> bool:
    """A channel written as a string: ``"runs"``, ``("runs", ...)``, ``list(("runs",))``."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List):
        return any(_is_literal(e) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"list", "tuple"}:
        return any(_is_literal(a) for a in node.args)
    return False


def _channel_uses() -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """Listeners and notifiers (channel -> modules) and channel arguments written as strings."""
    listeners: dict[str, set[str]] = {}
    notifiers: dict[str, set[str]] = {}
    literals: list[str] = []
    for relative, tree in _modules():
        modules, constants = _channel_aliases(tree)
        tuples: dict[str, set[str]] = {}
        for node in tree.body:  # module-level tuples of channels: WAKE_CHANNELS = (channels.RUNS,)
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found = _channels_of(node.value, modules, constants, {})
                for target in targets:
                    if found and isinstance(target, ast.Name):
                        tuples[target.id] = found
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = _call_name(call)
            if name == LOOP_FACTORY and len(call.args) >= 3:
                argument: ast.expr | None = call.args[2]
                waits = len(call.args) < 5 and not any(k.arg == "wait" for k in call.keywords)
            elif name in CHANNEL_CALLS and call.args:
                argument, waits = call.args[0], name in WAIT_CALLS
            else:
                continue
            assert argument is not None
            if _is_literal(argument):
                literals.append(f"{relative}:{call.lineno}")
            if name in NOTIFY_CALLS or waits:
                into = notifiers if name in NOTIFY_CALLS else listeners
                for channel in _channels_of(argument, modules, constants, tuples):
                    into.setdefault(channel, set()).add(relative)
    return listeners, notifiers, literals


def test_every_channel_is_a_constant_of_the_channels_module() -> None:
    declared = {value for name, value in vars(channels).items() if name.isupper() and isinstance(value, str)}
    assert set(channels.ALL) == declared
    assert len(channels.ALL) == len(declared)
    assert set(channels.RELAYED) <= declared
    # PostgreSQL relays ``ql3_<name>``: an identifier within its 63-byte limit.
    assert all(c.isidentifier() and c.islower() and len(c) <= 59 for c in declared)
    _listeners, _notifiers, literals = _channel_uses()
    assert literals == [], f"a channel named by a string, not a constant of ql3/ports/channels.py: {literals}"


def test_every_channel_has_a_listener_and_a_notifier() -> None:
    listeners, notifiers, _literals = _channel_uses()
    assert len(listeners) > 3 and len(notifiers) > 3  # the scan sees the code
    without_listener = sorted(set(channels.ALL) - set(listeners))
    assert without_listener == [], f"channels nothing waits on: {without_listener}"
    without_notifier = sorted(set(channels.ALL) - set(notifiers) - set(INTERRUPT_ONLY))
    assert without_notifier == [], f"channels nothing notifies: {without_notifier}"
    stale = sorted(set(INTERRUPT_ONLY) & set(notifiers))
    assert stale == [], f"notified now: remove from INTERRUPT_ONLY: {stale} ({sorted(notifiers)})"


def test_the_channel_scan_sees_notifiers_waits_and_strings() -> None:
    tree = ast.parse(
        "from ql3.ports import channels as ch\n"
        "WAKE = (ch.RUNS,)\n"
        "def f(tx, db):\n"
        "    tx.notify(ch.RETRIES)\n"
        "    db.wait_for(ch.SCHEDULES, 1.0)\n"
        "    db.counters(WAKE)\n"
    )
    modules, constants = _channel_aliases(tree)
    assert modules == {"ch"}
    tuples = {"WAKE": _channels_of(ast.parse("(ch.RUNS,)", mode="eval").body, modules, constants, {})}
    calls = {_call_name(c): c for c in ast.walk(tree) if isinstance(c, ast.Call)}
    assert _channels_of(calls["notify"].args[0], modules, constants, tuples) == {"retries"}
    assert _channels_of(calls["wait_for"].args[0], modules, constants, tuples) == {"schedules"}
    assert _channels_of(calls["counters"].args[0], modules, constants, tuples) == {"runs"}
    literal = ast.parse('("runs",)', mode="eval").body
    assert _channels_of(literal, modules, constants, tuples) == set()
    assert _is_literal(literal) and _is_literal(ast.parse('list(["runs"])', mode="eval").body)
    assert not _is_literal(ast.parse('note.channel.removeprefix("ql3_")', mode="eval").body)
