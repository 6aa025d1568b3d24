"""Properties of the typed ExecutionSpec over generated task specs and identities: the wire form
round-trips exactly with a stable digest, every invalid field is refused under its wire name, and
unknown fields are dropped (domain/execution.py)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ql3.domain.digests import canonical_json
from ql3.domain.errors import ValidationFailed
from ql3.domain.execution import ExecutionSpec
from ql3.domain.offers import LeaseFence, Offer
from ql3.domain.tasks import (
    ENV_KEY_RE,
    MAX_COMMAND_BYTES,
    MAX_CWD_BYTES,
    MAX_GRACE_MS,
    MAX_TIMEOUT_MS,
    build_spec,
)

settings.register_profile("ql3", max_examples=200, deadline=None, derandomize=True)
settings.load_profile("ql3")

_no_nul = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=40)
_commands = _no_nul.filter(lambda s: s.strip() != "")
_cwds = st.none() | _no_nul.map(lambda s: "/" + s)
_env = st.dictionaries(st.from_regex(ENV_KEY_RE, fullmatch=True), _no_nul, max_size=6)
_ids = st.text(st.characters(exclude_categories=["Cs"], min_codepoint=0x20), min_size=1, max_size=40)

task_specs = st.builds(
    lambda command, cwd, env, policy, timeout, grace: build_spec(
        {
            "command": command,
            "cwd": cwd,
            "env": env,
            "environment_policy": policy,
            "timeout_ms": timeout,
            "grace_ms": grace,
        }
    ),
    _commands,
    _cwds,
    _env,
    st.sampled_from(["inherit", "isolated"]),
    st.none() | st.integers(1, MAX_TIMEOUT_MS),
    st.integers(0, MAX_GRACE_MS),
)
specs = st.builds(
    lambda task, run_id, attempt_id, project_id, task_id, revision: ExecutionSpec.for_attempt(
        task,
        run_id=run_id,
        attempt_id=attempt_id,
        project_id=project_id,
        task_id=task_id,
        task_revision=revision,
    ),
    task_specs,
    _ids,
    _ids,
    _ids,
    _ids,
    st.integers(1, 10**18 - 1),
)

# Per wire field, values its rule refuses (each alone, the rest of the spec valid).
_not_text = st.none() | st.integers() | st.booleans() | st.lists(st.text(), max_size=2)
_surrogate = "\ud800"
_bad_ids = _not_text | st.sampled_from(["", "x" * 256, _surrogate]) | _no_nul.map(lambda s: s + "\n")
INVALID: dict[str, st.SearchStrategy[Any]] = {
    "runId": _bad_ids,
    "attemptId": _bad_ids,
    "projectId": _bad_ids,
    "taskId": _bad_ids,
    "taskRevision": st.none()
    | st.integers()
    | st.just("0")
    | st.integers(1, 10**6).map(lambda n: f"0{n}")
    | st.just("1" * 19)
    | st.text(st.characters(exclude_categories=["Nd"]), min_size=1),
    "command": _not_text
    | st.builds(lambda c: {"kind": "exec", "command": c}, _commands)
    | st.builds(lambda c: {"kind": "shell", "command": c}, st.text(" \t\n", max_size=5))
    | st.builds(lambda c: {"kind": "shell", "command": c + "\x00"}, _no_nul)
    | st.just({"kind": "shell", "command": "x" * (MAX_COMMAND_BYTES + 1)})
    | st.just({"kind": "shell", "command": "echo " + _surrogate}),
    "workingDirectory": st.integers()
    | _no_nul.filter(lambda s: not s.startswith("/"))
    | _no_nul.map(lambda s: "/" + s + "\x00")
    | st.sampled_from(["/" + "d" * MAX_CWD_BYTES, "/" + _surrogate]),
    "environmentPolicy": _not_text | st.text().filter(lambda s: s not in ("inherit", "isolated")),
    "environment": st.none()
    | st.integers()
    | st.lists(st.text(), max_size=2)
    | st.dictionaries(st.from_regex(ENV_KEY_RE, fullmatch=True), st.integers(), min_size=1, max_size=2)
    | st.just({"A": _surrogate})
    | st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: ENV_KEY_RE.match(k) is None),
        _no_nul,
        min_size=1,
        max_size=2,
    ),
    "timeoutMs": st.booleans()
    | st.integers(max_value=0)
    | st.integers(min_value=MAX_TIMEOUT_MS + 1)
    | st.floats(allow_nan=False)
    | st.text(),
    "terminationGraceMs": st.none()
    | st.booleans()
    | st.integers(max_value=-1)
    | st.integers(min_value=MAX_GRACE_MS + 1)
    | st.floats(allow_nan=False)
    | st.text(),
    "script": st.integers()
    | st.text()
    | st.just({"path": "../x.sh", "missing": True})
    | st.just({"path": "a.sh", "content": "echo a", "digest": "0" * 64}),
}
WIRE_KEYS = frozenset(INVALID)
_json_scalars = st.none() | st.booleans() | st.integers() | st.text(st.characters(), max_size=8)


@given(specs)
def test_the_wire_form_round_trips_exactly_and_the_digest_is_stable(spec: ExecutionSpec) -> None:
    wire = spec.to_wire()
    text = canonical_json(wire)

    received = ExecutionSpec.from_wire(json.loads(text))

    assert received == spec
    assert canonical_json(received.to_wire()) == text
    assert received.digest() == spec.digest() == ExecutionSpec.from_wire(wire).digest()


@given(specs)
def test_an_offer_round_trips_through_its_json_with_the_same_digest(spec: ExecutionSpec) -> None:
    fence = LeaseFence(
        run_id=spec.run_id,
        attempt_id=spec.attempt_id,
        worker_id="w",
        session_id="s",
        worker_generation=1,
        lease_generation=1,
        lease_token="t",
        lease_version=1,
    )
    offer = Offer(
        offer_id="o",
        delivery_kind="new_claim",
        fence=fence,
        lease_expires_at_ms=1,
        spec=spec,
        spec_digest=spec.digest(),
        placement_score=None,
    )

    parsed = Offer.from_json(json.loads(offer.to_json()))

    assert parsed == offer and parsed.to_json() == offer.to_json()
    assert parsed.spec.digest() == offer.spec_digest


@given(specs, st.data())
def test_each_invalid_field_is_refused_under_its_wire_name(spec: ExecutionSpec, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(INVALID)))
    bad = data.draw(INVALID[key])
    wire = spec.to_wire() | {key: bad}

    try:
        ExecutionSpec.from_wire(wire)
    except ValidationFailed as err:
        assert err.details["field"] == key
    else:
        raise AssertionError(f"{key}={bad!r} was accepted")


@given(
    specs,
    st.dictionaries(st.text(max_size=12).filter(lambda k: k not in WIRE_KEYS), _json_scalars, max_size=4),
    st.dictionaries(
        st.text(max_size=12).filter(lambda k: k not in ("kind", "command")), _json_scalars, max_size=3
    ),
)
def test_unknown_wire_fields_are_dropped_at_every_level(
    spec: ExecutionSpec, extra: dict[str, Any], command_extra: dict[str, Any]
) -> None:
    wire = extra | spec.to_wire()
    wire["command"] = wire["command"] | command_extra

    received = ExecutionSpec.from_wire(wire)

    assert received == spec and received.digest() == spec.digest()


@given(
    st.dictionaries(
        st.sampled_from(sorted(WIRE_KEYS)),
        _json_scalars | st.dictionaries(st.text(max_size=4), _json_scalars, max_size=3),
    )
)
def test_any_received_object_is_either_refused_cleanly_or_canonical(raw: dict[str, Any]) -> None:
    try:
        spec = ExecutionSpec.from_wire(raw)
    except ValidationFailed as err:
        assert err.details["field"] in WIRE_KEYS
    else:
        assert ExecutionSpec.from_wire(spec.to_wire()) == spec
