"""The typed ExecutionSpec (domain/execution.py): built from a TaskSpec without a second validation,
its wire form pinned byte for byte (workers of the previous build hold offers, recovery compares
stored digests), ``from_wire`` the one validation of a received spec, and the journal's trimmed form
readable across an upgrade."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from ql3.domain.errors import ValidationFailed
from ql3.domain.execution import ExecutionSpec, JournalSpec
from ql3.domain.journal import JournalRecord
from ql3.domain.offers import JournaledOffer, LeaseFence, Offer
from ql3.domain.tasks import MAX_COMMAND_BYTES, MAX_GRACE_MS, MAX_TIMEOUT_MS, build_spec
from ql3.worker.attempts import journal_offer, journal_offer_json, termination_grace_ms

# Golden values computed with the code before the typed spec (main at f678ce1: plan_from_spec,
# normalize_spec, spec_digest and Offer.to_json over the camelCase dictionary). A drift here breaks
# every stored execution_spec_digest and every offer a worker of the previous build holds.
FULL_DIGEST = "56395aacd2977c34feae642aaed0219e8d213e11ba145353fd85554e9f62ce36"
MINIMAL_DIGEST = "e2cb4260b59fff8b0997b901407cd6b49090d63fa6a79da4953d5a1813975399"
FULL_SPEC_JSON = (
    '{"runId":"run-1","attemptId":"att-1","projectId":"proj-1","taskId":"task-1","taskRevision":"7",'
    '"command":{"kind":"shell","command":"echo \'héllo\' && env"},"workingDirectory":"/srv/job",'
    '"environmentPolicy":"isolated","environment":{"A_KEY":"sécret","ZED":"z"},"timeoutMs":60000,'
    '"terminationGraceMs":1500}'
)
MINIMAL_SPEC_JSON = (
    '{"runId":"run-2","attemptId":"att-2","projectId":"proj-2","taskId":"task-2","taskRevision":"1",'
    '"command":{"kind":"shell","command":"true"},"environmentPolicy":"inherit","environment":{},'
    '"terminationGraceMs":5000}'
)
_FENCE_JSON = (
    '"fence":{"runId":"run-1","attemptId":"att-1","workerId":"w-1","sessionId":"s-1",'
    '"workerGeneration":2,"leaseGeneration":3,"leaseToken":"%s","leaseVersion":4}'
)
FULL_OFFER_JSON = (
    '{"offerId":"' + "o" * 64 + '","deliveryKind":"new_claim",' + _FENCE_JSON % "tok" + ","
    '"leaseExpiresAtMs":1700000000000,"spec":' + FULL_SPEC_JSON + ',"specDigest":"' + FULL_DIGEST + '",'
    '"placementScore":5}'
)
# The journal's offer_json as the build before the typed spec wrote it (journal_offer_json then).
STORED_JOURNAL_JSON = (
    '{"offerId":"' + "o" * 64 + '","deliveryKind":"new_claim",' + _FENCE_JSON % "" + ","
    '"leaseExpiresAtMs":1700000000000,"spec":{"runId":"run-1","attemptId":"att-1","projectId":"proj-1",'
    '"taskId":"task-1","taskRevision":"7","timeoutMs":60000,"terminationGraceMs":1500},'
    '"specDigest":"' + FULL_DIGEST + '","placementScore":5}'
)

FENCE = LeaseFence(
    run_id="run-1",
    attempt_id="att-1",
    worker_id="w-1",
    session_id="s-1",
    worker_generation=2,
    lease_generation=3,
    lease_token="tok",
    lease_version=4,
)


def _full() -> ExecutionSpec:
    task = build_spec(
        {
            "command": "echo 'héllo' && env",
            "cwd": "/srv/job",
            "env": {"ZED": "z", "A_KEY": "sécret"},
            "environment_policy": "isolated",
            "timeout_ms": 60000,
            "grace_ms": 1500,
        }
    )
    return ExecutionSpec.for_attempt(
        task, run_id="run-1", attempt_id="att-1", project_id="proj-1", task_id="task-1", task_revision=7
    )


def _minimal() -> ExecutionSpec:
    task = build_spec({"command": "true", "environment_policy": "inherit"})
    return ExecutionSpec.for_attempt(
        task, run_id="run-2", attempt_id="att-2", project_id="proj-2", task_id="task-2", task_revision=1
    )


def _offer(spec: ExecutionSpec) -> Offer:
    return Offer(
        offer_id="o" * 64,
        delivery_kind="new_claim",
        fence=FENCE,
        lease_expires_at_ms=1_700_000_000_000,
        spec=spec,
        spec_digest=spec.digest(),
        placement_score=5,
    )


def _record(offer_json: str) -> JournalRecord:
    return JournalRecord(
        offer_id="o" * 64,
        run_id="run-1",
        attempt_id="att-1",
        lease_generation=3,
        execution_spec_digest=FULL_DIGEST,
        delivery_kind="new_claim",
        state="running_acknowledged",
        revision=4,
        offer_json=offer_json,
        accepted_at_ms=1,
        updated_at_ms=1,
        lease_token="sealed-and-unsealed",
    )


def _wire(**change: Any) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(FULL_SPEC_JSON)
    raw.update(change)
    return raw


# -- the wire form, pinned ---------------------------------------------------------------------------


def test_the_wire_bytes_and_digests_are_those_of_the_previous_build() -> None:
    from ql3.domain.digests import canonical_json

    assert canonical_json(_full().to_wire()) == FULL_SPEC_JSON
    assert canonical_json(_minimal().to_wire()) == MINIMAL_SPEC_JSON
    assert (_full().digest(), _minimal().digest()) == (FULL_DIGEST, MINIMAL_DIGEST)
    assert _offer(_full()).to_json() == FULL_OFFER_JSON


def test_an_offer_of_the_previous_build_parses_to_the_same_spec_and_serialises_identically() -> None:
    parsed = Offer.from_json(json.loads(FULL_OFFER_JSON))

    assert parsed == _offer(_full())
    assert parsed.to_json() == FULL_OFFER_JSON
    assert parsed.spec.digest() == parsed.spec_digest == FULL_DIGEST
    minimal = ExecutionSpec.from_wire(json.loads(MINIMAL_SPEC_JSON))
    assert minimal == _minimal() and (minimal.working_directory, minimal.timeout_ms) == (None, None)


def test_for_attempt_carries_every_execution_field_and_the_identity_verbatim() -> None:
    spec = _full()

    assert (spec.run_id, spec.attempt_id, spec.project_id, spec.task_id, spec.task_revision) == (
        "run-1",
        "att-1",
        "proj-1",
        "task-1",
        7,
    )
    assert (spec.command, spec.working_directory, spec.environment_policy) == (
        "echo 'héllo' && env",
        "/srv/job",
        "isolated",
    )
    assert spec.environment == (("A_KEY", "sécret"), ("ZED", "z"))
    assert (spec.timeout_ms, spec.termination_grace_ms) == (60000, 1500)


def test_the_spec_is_immutable_and_shares_nothing_with_its_task_spec() -> None:
    task = build_spec({"command": "echo hi", "env": {"A": "1"}})
    spec = ExecutionSpec.for_attempt(
        task, run_id="r", attempt_id="a", project_id="p", task_id="t", task_revision=1
    )

    task.env["A"] = "changed"
    spec.environment_map()["A"] = "changed too"
    assert spec.environment == (("A", "1"),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.command = "rm -rf /"  # type: ignore[misc]


def test_the_repr_never_shows_the_command_the_working_directory_or_the_environment() -> None:
    shown = repr(_full()) + repr(_offer(_full())) + repr(_offer(_full()).journaled())

    assert "run-1" in repr(_full())
    assert not [s for s in ("héllo", "/srv/job", "sécret", "A_KEY", "tok") if s in shown]


# -- from_wire: the one validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"command": {"kind": "exec", "command": "echo hi"}}, "command"),
        ({"command": {"kind": "shell", "command": "echo \x00 hi"}}, "command"),
        ({"command": {"kind": "shell", "command": "x" * (MAX_COMMAND_BYTES + 1)}}, "command"),
        ({"command": {"kind": "shell", "command": "   "}}, "command"),
        ({"command": {"kind": "shell"}}, "command"),
        ({"command": "echo hi"}, "command"),
        ({"runId": ""}, "runId"),
        ({"attemptId": "a\nb"}, "attemptId"),
        ({"projectId": None}, "projectId"),
        ({"taskId": "t" * 256}, "taskId"),
        ({"taskRevision": 7}, "taskRevision"),
        ({"taskRevision": "07"}, "taskRevision"),
        ({"taskRevision": "seven"}, "taskRevision"),
        ({"workingDirectory": "relative/dir"}, "workingDirectory"),
        ({"workingDirectory": "/srv\x00"}, "workingDirectory"),
        ({"workingDirectory": "/" + "d" * 4096}, "workingDirectory"),
        ({"environmentPolicy": "host"}, "environmentPolicy"),
        ({"environment": {"A": 1}}, "environment"),
        ({"environment": ["A=1"]}, "environment"),
        ({"environment": None}, "environment"),
        ({"environment": {"NOT-A-NAME": "1"}}, "environment"),
        ({"environment": {"A": "\x00"}}, "environment"),
        ({"timeoutMs": 0}, "timeoutMs"),
        ({"timeoutMs": MAX_TIMEOUT_MS + 1}, "timeoutMs"),
        ({"timeoutMs": True}, "timeoutMs"),
        ({"terminationGraceMs": -1}, "terminationGraceMs"),
        ({"terminationGraceMs": MAX_GRACE_MS + 1}, "terminationGraceMs"),
        ({"terminationGraceMs": 1.5}, "terminationGraceMs"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else v,
)
def test_every_wire_field_is_validated_and_named(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        ExecutionSpec.from_wire(_wire(**change))
    assert caught.value.details["field"] == field


def test_a_spec_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValidationFailed) as caught:
        ExecutionSpec.from_wire(["runId"])
    assert caught.value.details["field"] == "spec"


def test_unknown_fields_are_stripped_at_every_level() -> None:
    raw = _wire(
        argv=["sh", "-c", "evil"],
        secretToken="t",
        command={"kind": "shell", "command": "echo 'héllo' && env", "argv": ["x"], "env": {"K": "v"}},
    )

    spec = ExecutionSpec.from_wire(raw)

    assert spec == _full() and spec.digest() == FULL_DIGEST


def test_the_bounds_themselves_are_accepted_and_absent_fields_take_the_wire_defaults() -> None:
    spec = ExecutionSpec.from_wire(
        _wire(
            command={"kind": "shell", "command": "x" * MAX_COMMAND_BYTES},
            timeoutMs=MAX_TIMEOUT_MS,
            terminationGraceMs=0,
        )
    )
    assert (spec.timeout_ms, spec.termination_grace_ms) == (MAX_TIMEOUT_MS, 0)
    assert ExecutionSpec.from_wire(_wire(timeoutMs=1, terminationGraceMs=MAX_GRACE_MS)).timeout_ms == 1

    bare = {k: v for k, v in _wire().items() if k in {"runId", "attemptId", "projectId", "taskId"}}
    spec = ExecutionSpec.from_wire(bare | {"taskRevision": "1", "command": {"kind": "shell", "command": "x"}})
    assert (spec.environment_policy, spec.environment, spec.termination_grace_ms) == ("inherit", (), 5000)


# -- the journal's trimmed spec ----------------------------------------------------------------------


def test_the_journal_form_is_that_of_the_previous_build_and_holds_no_secret() -> None:
    written = journal_offer_json(_offer(_full()))

    assert written == STORED_JOURNAL_JSON
    assert not [s for s in ("héllo", "/srv/job", "sécret", "A_KEY", '"tok"') if s in written]


def test_a_journal_row_written_by_the_previous_build_still_loads() -> None:
    record = _record(STORED_JOURNAL_JSON)

    loaded = journal_offer(record)

    assert loaded.fence == dataclasses.replace(FENCE, lease_token="sealed-and-unsealed")
    assert loaded.spec == JournalSpec(
        run_id="run-1",
        attempt_id="att-1",
        project_id="proj-1",
        task_id="task-1",
        task_revision=7,
        timeout_ms=60000,
        termination_grace_ms=1500,
    )
    assert loaded.spec == _full().journaled() and loaded.spec_digest == FULL_DIGEST
    assert termination_grace_ms(record) == 1500
    assert JournaledOffer.from_json(json.loads(STORED_JOURNAL_JSON)).to_json() == STORED_JOURNAL_JSON


def test_a_journaled_spec_never_keeps_a_secret_it_is_handed() -> None:
    raw = json.loads(STORED_JOURNAL_JSON)
    raw["spec"] |= {"command": {"kind": "shell", "command": "secret"}, "environment": {"K": "v"}}

    loaded = JournaledOffer.from_json(raw)

    assert "secret" not in loaded.to_json() and '"K"' not in loaded.to_json()


@pytest.mark.parametrize(
    "offer_json", ["not json", "[]", '{"spec": {}}', STORED_JOURNAL_JSON.replace("1500", "-1")]
)
def test_an_unreadable_journal_row_stops_with_the_default_grace(offer_json: str) -> None:
    assert termination_grace_ms(_record(offer_json)) == 5000
