"""The ExecutionSpec: what one attempt executes (docs/contracts.md §1.7), and the part of it the
worker journal keeps (``JournalSpec``).

An ``ExecutionSpec`` is built once per attempt from the pinned revision's ``TaskSpec`` (already the
validated type, so ``for_attempt`` validates nothing again) plus the attempt's identity. Its only
dictionary is the camelCase wire form: ``to_wire`` for the offer's JSON and digest, ``from_wire`` where
an offer crosses a trust boundary (parsed from JSON by ``Offer.from_json``). ``from_wire`` is the one
validation of a received spec and applies the same rule functions as ``build_spec``
(``domain/tasks.py``), under the wire field names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from ql3.domain.digests import canonical_json, sha256_hex
from ql3.domain.errors import ValidationFailed
from ql3.domain.scripts import script_digest, validate_script_content, validate_script_path
from ql3.domain.tasks import (
    DEFAULT_GRACE_MS,
    EnvironmentPolicy,
    TaskSpec,
    validate_command,
    validate_cwd,
    validate_env,
    validate_environment_policy,
    validate_grace_ms,
    validate_timeout_ms,
)

# 1-255 characters, no control character and no lone surrogate (it would not encode for the digest).
_IDENT_RE: Final = re.compile(r"[^\x00-\x1f\ud800-\udfff]{1,255}")
_REVISION_RE: Final = re.compile(r"[1-9][0-9]{0,17}")
# A spec received without ``environmentPolicy`` inherits, as every build before the typed spec did;
# ``to_wire`` always writes the policy, so only a foreign sender ever relies on this.
WIRE_DEFAULT_POLICY: Final = "inherit"


def _ident(value: object, what: str) -> str:
    if not isinstance(value, str) or _IDENT_RE.fullmatch(value) is None:
        raise ValidationFailed(f"invalid {what}", field=what)
    return value


def _revision(value: object) -> int:
    """The wire carries the revision as a canonical decimal string (``"7"``)."""
    if not isinstance(value, str) or _REVISION_RE.fullmatch(value) is None:
        raise ValidationFailed("invalid taskRevision", field="taskRevision")
    return int(value)


def _mapping(raw: object) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValidationFailed("invalid spec", field="spec")
    return raw


class _Identity(TypedDict):
    run_id: str
    attempt_id: str
    project_id: str
    task_id: str
    task_revision: int


class _StopPolicy(TypedDict):
    timeout_ms: int | None
    termination_grace_ms: int


def _identity_from_wire(src: Mapping[str, Any]) -> _Identity:
    return _Identity(
        run_id=_ident(src.get("runId"), "runId"),
        attempt_id=_ident(src.get("attemptId"), "attemptId"),
        project_id=_ident(src.get("projectId"), "projectId"),
        task_id=_ident(src.get("taskId"), "taskId"),
        task_revision=_revision(src.get("taskRevision")),
    )


def _stop_policy_from_wire(src: Mapping[str, Any]) -> _StopPolicy:
    timeout = src.get("timeoutMs")
    return _StopPolicy(
        timeout_ms=None if timeout is None else validate_timeout_ms(timeout, "timeoutMs"),
        termination_grace_ms=validate_grace_ms(
            src.get("terminationGraceMs", DEFAULT_GRACE_MS), "terminationGraceMs"
        ),
    )


def _identity_to_wire(spec: ExecutionSpec | JournalSpec) -> dict[str, Any]:
    return {
        "runId": spec.run_id,
        "attemptId": spec.attempt_id,
        "projectId": spec.project_id,
        "taskId": spec.task_id,
        "taskRevision": str(spec.task_revision),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptPayload:
    """The project script a run executes, as it was when the run was offered (docs/scripts.md): its
    path, the sha256 of its content and the content itself. ``content`` is None when the script was
    not found then; the worker refuses such a launch (``script_missing``)."""

    path: str
    digest: str
    content: str | None = field(repr=False)

    def to_wire(self) -> dict[str, Any]:
        if self.content is None:
            return {"path": self.path, "missing": True}
        return {"path": self.path, "digest": self.digest, "content": self.content}

    @staticmethod
    def from_wire(raw: object) -> ScriptPayload:
        """Validate a received script: its path, its size and that its content matches its digest."""
        if not isinstance(raw, Mapping):
            raise ValidationFailed("invalid script", field="script")
        path = validate_script_path(raw.get("path"), "script")
        if raw.get("missing") is True:
            return ScriptPayload(path=path, digest="", content=None)
        content = validate_script_content(raw.get("content"), "script")
        digest = raw.get("digest")
        if not isinstance(digest, str) or script_digest(content) != digest:
            raise ValidationFailed("the script's content does not match its digest", field="script")
        return ScriptPayload(path=path, digest=digest, content=content)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionSpec:
    """One attempt's identity and the execution fields of its pinned revision. Immutable: the
    environment is a sorted tuple of pairs. The command, working directory and environment are
    secrets and never appear in a ``repr``."""

    run_id: str
    attempt_id: str
    project_id: str
    task_id: str
    task_revision: int
    command: str = field(repr=False)
    working_directory: str | None = field(repr=False)
    environment_policy: EnvironmentPolicy
    environment: tuple[tuple[str, str], ...] = field(repr=False)
    timeout_ms: int | None
    termination_grace_ms: int
    script: ScriptPayload | None = None
    # The project's variables (docs/variables.md), under the task's own environment at launch. Not
    # part of the wire spec nor of its digest: an offer carries them beside the spec, so a rebuilt
    # offer keeps its digest whatever changed since; never journaled.
    shared_environment: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @staticmethod
    def for_attempt(
        task: TaskSpec,
        *,
        run_id: str,
        attempt_id: str,
        project_id: str,
        task_id: str,
        task_revision: int,
        shared_environment: tuple[tuple[str, str], ...] = (),
        script: ScriptPayload | None = None,
    ) -> ExecutionSpec:
        """The spec of one attempt of ``task`` (validated when it was built: nothing is checked again),
        with the project's variables ``shared_environment``; ``script`` is the task's script as read
        when the run is offered."""
        return ExecutionSpec(
            run_id=run_id,
            attempt_id=attempt_id,
            project_id=project_id,
            task_id=task_id,
            task_revision=task_revision,
            command=task.command,
            working_directory=task.cwd,
            environment_policy=task.environment_policy,
            environment=tuple(sorted(task.env.items())),
            timeout_ms=task.timeout_ms,
            termination_grace_ms=task.grace_ms,
            shared_environment=shared_environment,
            script=script,
        )

    def environment_map(self) -> dict[str, str]:
        """A fresh dictionary of the task's own environment."""
        return dict(self.environment)

    def launch_environment(self) -> dict[str, str]:
        """What the command receives: the project's variables, then the task's own values over them."""
        return dict(self.shared_environment) | dict(self.environment)

    def to_wire(self) -> dict[str, Any]:
        """The camelCase wire form in digest key order; optional fields are absent when unset."""
        out = _identity_to_wire(self)
        out["command"] = {"kind": "shell", "command": self.command}
        if self.working_directory is not None:
            out["workingDirectory"] = self.working_directory
        out["environmentPolicy"] = self.environment_policy
        out["environment"] = dict(self.environment)
        if self.timeout_ms is not None:
            out["timeoutMs"] = self.timeout_ms
        out["terminationGraceMs"] = self.termination_grace_ms
        if self.script is not None:
            out["script"] = self.script.to_wire()
        return out

    def digest(self) -> str:
        """``sha256`` of the canonical wire form (docs/contracts.md §8)."""
        return sha256_hex(canonical_json(self.to_wire()))

    def journaled(self) -> JournalSpec:
        """What the worker journal may keep: no command, working directory or environment."""
        return JournalSpec(
            run_id=self.run_id,
            attempt_id=self.attempt_id,
            project_id=self.project_id,
            task_id=self.task_id,
            task_revision=self.task_revision,
            timeout_ms=self.timeout_ms,
            termination_grace_ms=self.termination_grace_ms,
        )

    @staticmethod
    def from_wire(raw: object) -> ExecutionSpec:
        """Validate a received wire spec (the one validation); unknown fields, at the top and inside
        ``command``, are dropped. Raises ``ValidationFailed`` naming the wire field."""
        src = _mapping(raw)
        cmd = src.get("command")
        if not isinstance(cmd, Mapping) or cmd.get("kind") != "shell":
            raise ValidationFailed("invalid command", field="command")
        cwd = src.get("workingDirectory")
        script = src.get("script")
        return ExecutionSpec(
            script=None if script is None else ScriptPayload.from_wire(script),
            **_identity_from_wire(src),
            command=validate_command(cmd.get("command"), "command"),
            working_directory=None if cwd is None else validate_cwd(cwd, "workingDirectory"),
            environment_policy=validate_environment_policy(
                src.get("environmentPolicy", WIRE_DEFAULT_POLICY), "environmentPolicy"
            ),
            environment=tuple(validate_env(src.get("environment", {}), "environment").items()),
            **_stop_policy_from_wire(src),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalSpec:
    """The part of an ExecutionSpec the worker journal keeps: the identity and the stop policy."""

    run_id: str
    attempt_id: str
    project_id: str
    task_id: str
    task_revision: int
    timeout_ms: int | None
    termination_grace_ms: int

    def to_wire(self) -> dict[str, Any]:
        """The journal's ``spec`` object: the wire form's keys without the secrets, in its order."""
        out = _identity_to_wire(self)
        if self.timeout_ms is not None:
            out["timeoutMs"] = self.timeout_ms
        out["terminationGraceMs"] = self.termination_grace_ms
        return out

    @staticmethod
    def from_wire(raw: object) -> JournalSpec:
        """Read a journaled spec (this build's or the previous one's: the same keys). Any other key,
        a command or an environment included, is ignored and never reaches the result."""
        src = _mapping(raw)
        return JournalSpec(**_identity_from_wire(src), **_stop_policy_from_wire(src))
