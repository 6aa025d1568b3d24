"""Project variables and secrets on both databases (docs/variables.md): set, replace, list without
secret values, remove, import all-or-none, the environment a run gets, secrets sealed at rest."""

from __future__ import annotations

import os

import pytest

from ql3.application import variables
from ql3.application.variables import SetVariable, SharedEnvironments
from ql3.domain.errors import NotFound, SecretsUnavailable, SecretUnreadable, ValidationFailed
from ql3.domain.variables import MAX_VARIABLES, parse_import
from ql3.storage.secret_box import AesGcmBox
from tests.support.builders import count, seed_project
from tests.support.databases import Harness

BOX = AesGcmBox(os.urandom(32))


def _set(harness: Harness, item: SetVariable, box: AesGcmBox | None = BOX) -> None:
    project = seed_project(harness.db)
    harness.db.transaction(lambda tx: variables.set_variable(tx, project, item, box))


def test_a_run_environment_holds_enabled_variables_and_opened_secrets(harness: Harness) -> None:
    project = seed_project(harness.db)
    _set(harness, SetVariable(name="JD_COOKIE", value="pt_key=abc;", secret=True, note="京东"))
    _set(harness, SetVariable(name="REGION", value="cn"))
    _set(harness, SetVariable(name="OFF", value="x", enabled=False))

    env = harness.db.transaction(lambda tx: variables.project_environment(tx, project.id, BOX))

    assert env == {"JD_COOKIE": "pt_key=abc;", "REGION": "cn"}


def test_a_secret_is_sealed_at_rest_and_never_listed(harness: Harness) -> None:
    project = seed_project(harness.db)
    _set(harness, SetVariable(name="TOKEN", value="s3cr3t-value", secret=True))
    _set(harness, SetVariable(name="PLAIN", value="visible"))

    stored = harness.db.raw("SELECT name, value FROM project_variables ORDER BY name")
    listed = harness.db.transaction(lambda tx: variables.list_variables(tx, project, reveal=True))
    hidden = harness.db.transaction(lambda tx: variables.list_variables(tx, project, reveal=False))

    assert stored[0]["value"] == "visible"
    assert "s3cr3t" not in stored[1]["value"] and stored[1]["value"].startswith("aesgcm1:")
    assert [(v.name, v.secret, v.value) for v in listed] == [
        ("PLAIN", False, "visible"),
        ("TOKEN", True, None),
    ]
    assert [v.value for v in hidden] == [None, None]
    # another key cannot open it
    with pytest.raises(SecretUnreadable):
        harness.db.transaction(
            lambda tx: variables.project_environment(tx, project.id, AesGcmBox(os.urandom(32)))
        )


def test_replacing_and_removing_a_variable(harness: Harness) -> None:
    project = seed_project(harness.db)
    _set(harness, SetVariable(name="A", value="1", secret=True))
    _set(harness, SetVariable(name="A", value="2", note="now plain"))

    env = harness.db.transaction(lambda tx: variables.project_environment(tx, project.id, BOX))
    harness.db.transaction(lambda tx: variables.remove_variable(tx, project, "A"))
    with pytest.raises(NotFound):
        harness.db.transaction(lambda tx: variables.remove_variable(tx, project, "A"))

    assert env == {"A": "2"}
    assert count(harness.db, "project_variables") == 0


def test_bad_input_writes_nothing(harness: Harness) -> None:
    project = seed_project(harness.db)
    bad = [
        SetVariable(name="1BAD", value="x"),
        SetVariable(name="OK", value="nul\x00inside"),
        SetVariable(name="OK", value="x" * (64 * 1024 + 1)),
        SetVariable(name="OK", value="x", note="line\nbreak"),
    ]
    for item in bad:
        with pytest.raises(ValidationFailed):
            harness.db.transaction(lambda tx, item=item: variables.set_variable(tx, project, item, BOX))
    with pytest.raises(SecretsUnavailable):
        harness.db.transaction(
            lambda tx: variables.set_variable(
                tx, project, SetVariable(name="S", value="x", secret=True), None
            )
        )
    too_many = [SetVariable(name=f"V{i}", value="x") for i in range(MAX_VARIABLES + 1)]
    with pytest.raises(ValidationFailed):
        harness.db.transaction(lambda tx: variables.import_variables(tx, project, too_many, BOX))

    assert count(harness.db, "project_variables") == 0


def test_a_qinglong_export_imports_all_or_none(harness: Harness) -> None:
    project = seed_project(harness.db)
    export = '[{"name": "JD_COOKIE", "value": "pt_key=1;", "remarks": "账号一", "status": 0},'
    export += ' {"name": "OLD", "value": "x", "remarks": "", "status": 1}]'
    items = [
        SetVariable(name=v.name, value=v.value, enabled=v.enabled, note=v.note) for v in parse_import(export)
    ]

    imported = harness.db.transaction(lambda tx: variables.import_variables(tx, project, items, BOX))
    listed = harness.db.transaction(lambda tx: variables.list_variables(tx, project, reveal=True))
    broken = [*items, SetVariable(name="bad-name", value="x")]
    with pytest.raises(ValidationFailed):
        harness.db.transaction(lambda tx: variables.import_variables(tx, project, broken, BOX))

    assert imported == 2
    assert [(v.name, v.enabled, v.note) for v in listed] == [
        ("JD_COOKIE", True, "账号一"),
        ("OLD", False, ""),
    ]
    assert count(harness.db, "project_variables") == 2


def test_the_shared_environment_cache_rereads_after_its_ttl(harness: Harness) -> None:
    project = seed_project(harness.db)
    now = [0.0]
    shared = SharedEnvironments(harness.db, BOX, ttl_s=1.0, clock=lambda: now[0])
    _set(harness, SetVariable(name="A", value="1"))

    first = shared(project.id)
    _set(harness, SetVariable(name="A", value="2"))
    cached = shared(project.id)
    now[0] = 1.5
    fresh = shared(project.id)

    assert (first, cached, fresh) == ((("A", "1"),), (("A", "1"),), (("A", "2"),))
