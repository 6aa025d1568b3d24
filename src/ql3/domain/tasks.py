"""Task definitions: validation, normalisation and the revision content digest."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, Final, Literal

from cronsim import CronSim

from ql3.domain import cronexplain, timezones
from ql3.domain.digests import canonical_json, domain_digest
from ql3.domain.errors import RetrySafetyRequired, ValidationFailed
from ql3.domain.scripts import default_command, validate_script_path

NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Task names (docs/tasks.md "Names"): any script, as QingLong users name their scripts in Chinese.
MAX_TASK_NAME_CHARS: Final = 128
TASK_NAME_RULE: Final = (
    f"a task name is 1-{MAX_TASK_NAME_CHARS} printable characters in any script, without '/',"
    " control characters or leading/trailing spaces, not starting with '-', and not '.' or '..'"
)
# The same rule as JSON Schema can state it (isprintable's other refusals are checked in code).
TASK_NAME_RE: Final = re.compile(r"^(?![-\s])(?!\.{1,2}$)[^/\x00-\x1f\x7f]{1,128}(?<!\s)$")
ENV_KEY_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
LABEL_KEY_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
MAX_COMMAND_BYTES: Final = 128 * 1024
MAX_ENV_ENTRIES: Final = 256
MAX_ENV_VALUE_BYTES: Final = 64 * 1024
MAX_ENV_TOTAL_BYTES: Final = 256 * 1024
MAX_TIMEOUT_MS: Final = 7 * 24 * 3600 * 1000
MAX_GRACE_MS: Final = 5 * 60 * 1000
DEFAULT_GRACE_MS: Final = 5000
# Cron (docs/cron.md): how late an occurrence may still start, and the per-occurrence random delay.
DEFAULT_MISFIRE_GRACE_MS: Final = 5 * 60 * 1000
MAX_MISFIRE_GRACE_MS: Final = 60 * 60 * 1000
MAX_RANDOM_DELAY_MS: Final = 60 * 60 * 1000
MAX_CWD_BYTES: Final = 4096
MAX_PLACEMENT_ENTRIES: Final = 16
MAX_ATTEMPTS: Final = 16
TASK_DIGEST_DOMAIN: Final = "ql3.task-revision.v1"

EnvironmentPolicy = Literal["inherit", "isolated"]
Overlap = Literal["allow", "skip", "cancel_previous"]
OVERLAPS: Final = ("allow", "skip", "cancel_previous")


@dataclass(frozen=True, slots=True, kw_only=True)
class Preference:
    labels: dict[str, str]
    weight: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """The immutable content of one task revision."""

    command: str
    cron: str | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    environment_policy: EnvironmentPolicy = "isolated"
    timeout_ms: int | None = None
    grace_ms: int = DEFAULT_GRACE_MS
    require: dict[str, str] = field(default_factory=dict)
    prefer: tuple[Preference, ...] = ()
    overlap: Overlap = "allow"
    approval: Literal["none", "required"] = "none"
    max_attempts: int = 1
    retry_safe: bool = False
    executor: str = "local_process"
    misfire: Literal["skip", "fire_once"] = "skip"
    misfire_grace_ms: int = DEFAULT_MISFIRE_GRACE_MS
    random_delay_ms: int = 0
    on_start: bool = False
    # The project script the task runs (docs/scripts.md); absent from the dict when unset, so the
    # revisions written before scripts keep their digests.
    script: str | None = None

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        if body["script"] is None:
            del body["script"]
        body["prefer"] = [{"labels": dict(p.labels), "weight": p.weight} for p in self.prefer]
        return body

    def digest(self) -> str:
        return domain_digest(TASK_DIGEST_DOMAIN, canonical_json(self.to_dict()))


def validate_name(name: object, what: str = "name") -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValidationFailed(f"invalid {what}", field=what)
    return name


def validate_task_name(name: object) -> str:
    """A task's name (``TASK_NAME_RULE``); the error states the rule."""
    if (
        not isinstance(name, str)
        or not TASK_NAME_RE.fullmatch(name)
        or not name.isprintable()
        or len(name) > MAX_TASK_NAME_CHARS
    ):
        raise ValidationFailed(f"invalid name: {TASK_NAME_RULE}", field="name")
    return name


def validate_cron(expr: object) -> str:
    """Five fields, or six with seconds first, in UTC or behind a ``CRON_TZ=ZONE`` prefix; macros
    (``@daily``) are refused so the schedule is always explicit. Normalised to single spaces."""
    if not isinstance(expr, str) or len(expr) > 256:
        raise ValidationFailed("invalid cron expression", field="cron")
    reason = cronexplain.explain(expr)
    if reason is not None:
        raise ValidationFailed(f"invalid cron expression: {reason}", field="cron")
    zone_name, body = timezones.split_cron(expr)
    return timezones.join_cron(zone_name, body)


@lru_cache(maxsize=4096)
def next_fire_ms(expr: str, after_ms: int) -> int:
    """The first occurrence of ``expr`` strictly after ``after_ms``, evaluated as wall-clock time in
    the expression's zone (UTC without a ``CRON_TZ=`` prefix). Daylight saving (docs/tasks.md), as
    cronsim does it after Debian cron: a five-field schedule at fixed times (neither its minute nor its
    hour field starts with ``*``) follows the wall clock: a time skipped by a forward jump fires once
    at the first instant after the jump, a time repeated by a backward jump fires once (first pass).
    Other schedules (``*/30 * * * *``, six fields) follow elapsed time: nothing fires in a skipped
    hour, and a repeated hour fires in both passes. Remembered per expression and instant (a pure
    function of both): the tasks of a busy minute share a few expressions and one boundary."""
    zone_name, body = timezones.split_cron(expr)
    start = datetime.fromtimestamp(after_ms / 1000, tz=timezones.zone(zone_name or timezones.DEFAULT_ZONE))
    it = CronSim(body, start)
    nxt: datetime = next(it)
    return int(nxt.timestamp() * 1000)


def random_delay_ms(task_id: str, occurrence_ms: int, max_delay_ms: int) -> int:
    """The delay of one occurrence, uniform in ``[0, max_delay_ms]`` and seeded by the task and the
    occurrence: a restart, another replica or a second look computes the same delay."""
    if max_delay_ms <= 0:
        return 0
    seed = hashlib.sha256(f"ql3.cron.delay.v1:{task_id}:{occurrence_ms}".encode()).digest()
    return int.from_bytes(seed[:8], "big") % (max_delay_ms + 1)


def _text(value: object, what: str, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise ValidationFailed(f"invalid {what}", field=what)
    if "\x00" in value:
        raise ValidationFailed(f"{what} contains NUL", field=what)
    try:
        size = len(value.encode())
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800"): no process can take it
        raise ValidationFailed(f"{what} is not valid text", field=what) from None
    if size > max_bytes:
        raise ValidationFailed(f"{what} is too large", field=what)
    return value


def _labels(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValidationFailed(f"invalid {what}", field=what)
    if len(value) > MAX_PLACEMENT_ENTRIES:
        raise ValidationFailed(f"too many {what}", field=what)
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not LABEL_KEY_RE.fullmatch(key):
            raise ValidationFailed(f"invalid {what} key", field=what)
        out[key] = _text(val, what, 256)
        if any(ord(c) < 32 for c in out[key]):
            raise ValidationFailed(f"invalid {what} value", field=what)
    return dict(sorted(out.items()))


def _int(value: object, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValidationFailed(f"{what} must be an integer in [{lo}, {hi}]", field=what)
    return value


def _bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationFailed(f"{what} must be true or false", field=what)
    return value


# The execution fields' rules, shared by ``build_spec`` (a task revision) and
# ``ExecutionSpec.from_wire`` (an offer crossing a trust boundary, domain/execution.py): ``what`` is
# the field name reported, which differs between the two shapes (``cwd`` / ``workingDirectory``).


def validate_command(value: object, what: str = "command") -> str:
    command = _text(value, what, MAX_COMMAND_BYTES)
    if not command.strip():
        raise ValidationFailed(f"{what} must not be empty", field=what)
    return command


def validate_cwd(value: object, what: str = "cwd") -> str:
    cwd = _text(value, what, MAX_CWD_BYTES)
    if not cwd.startswith("/"):
        raise ValidationFailed(f"{what} must be an absolute path", field=what)
    return cwd


def validate_env(value: object, what: str = "env") -> dict[str, str]:
    """The environment, sorted by key; values are never echoed in an error."""
    if not isinstance(value, Mapping) or len(value) > MAX_ENV_ENTRIES:
        raise ValidationFailed(f"invalid {what}", field=what)
    env: dict[str, str] = {}
    total = 0
    for key, val in value.items():
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            raise ValidationFailed(f"invalid {what} key", field=what)
        env[key] = _text(val, what, MAX_ENV_VALUE_BYTES)
        total += len(key) + len(env[key].encode())
    if total > MAX_ENV_TOTAL_BYTES:
        raise ValidationFailed(f"{what} is too large", field=what)
    return dict(sorted(env.items()))


def validate_environment_policy(value: object, what: str = "environment_policy") -> EnvironmentPolicy:
    if value == "inherit":
        return "inherit"
    if value == "isolated":
        return "isolated"
    raise ValidationFailed(f"invalid {what}", field=what)


def validate_timeout_ms(value: object, what: str = "timeout_ms") -> int:
    return _int(value, what, 1, MAX_TIMEOUT_MS)


def validate_grace_ms(value: object, what: str = "grace_ms") -> int:
    return _int(value, what, 0, MAX_GRACE_MS)


def build_new_spec(raw: Mapping[str, Any]) -> TaskSpec:
    """``build_spec`` plus the rules a new revision must meet: retries (``max_attempts`` above 1)
    need the owner's explicit ``retry_safe`` declaration. Stored revisions are read with
    ``build_spec``, so a revision written before the rule still loads (and is never retried).
    A script task given no command gets its script's default one (``default_command``)."""
    script = raw.get("script")
    if raw.get("command") is None and isinstance(script, str):
        raw = {**raw, "command": default_command(validate_script_path(script, "script"))}
    spec = build_spec(raw)
    if spec.max_attempts > 1 and not spec.retry_safe:
        raise RetrySafetyRequired(field="retry_safe")
    return spec


def build_spec(raw: Mapping[str, Any]) -> TaskSpec:
    """Validate and normalise a task definition; unknown keys are refused."""
    allowed = set(TaskSpec.__dataclass_fields__)
    unknown = set(raw) - allowed
    if unknown:
        raise ValidationFailed("unknown fields", fields=sorted(unknown)[:16])
    command = validate_command(raw.get("command"))
    cron = raw.get("cron")
    cwd = raw.get("cwd")
    if cwd is not None:
        cwd = validate_cwd(cwd)
    env = validate_env(raw.get("env") or {})
    policy = validate_environment_policy(raw.get("environment_policy", "isolated"))
    timeout = raw.get("timeout_ms")
    if timeout is not None:
        timeout = validate_timeout_ms(timeout)
    prefer_raw = raw.get("prefer") or []
    if not isinstance(prefer_raw, list | tuple) or len(prefer_raw) > MAX_PLACEMENT_ENTRIES:
        raise ValidationFailed("invalid prefer", field="prefer")
    prefer: list[Preference] = []
    for entry in prefer_raw:
        if not isinstance(entry, Mapping) or set(entry) - {"labels", "weight"}:
            raise ValidationFailed("invalid prefer entry", field="prefer")
        prefer.append(
            Preference(
                labels=_labels(entry.get("labels", {}), "prefer"),
                weight=_int(entry.get("weight", 1), "weight", 1, 100),
            )
        )
    overlap = raw.get("overlap", "allow")
    if overlap not in OVERLAPS:
        raise ValidationFailed("invalid overlap", field="overlap")
    approval = raw.get("approval", "none")
    if approval not in ("none", "required"):
        raise ValidationFailed("invalid approval", field="approval")
    misfire = raw.get("misfire", "skip")
    if misfire not in ("skip", "fire_once"):
        raise ValidationFailed("invalid misfire policy", field="misfire")
    executor = raw.get("executor", "local_process")
    if executor != "local_process":
        raise ValidationFailed("unsupported executor", field="executor")
    script = raw.get("script")
    return TaskSpec(
        script=None if script is None else validate_script_path(script, "script"),
        command=command,
        cron=validate_cron(cron) if cron is not None else None,
        cwd=cwd,
        env=env,
        environment_policy=policy,
        timeout_ms=timeout,
        grace_ms=validate_grace_ms(raw.get("grace_ms", DEFAULT_GRACE_MS)),
        require=_labels(raw.get("require") or {}, "require"),
        prefer=tuple(prefer),
        overlap=overlap,
        approval=approval,
        max_attempts=_int(raw.get("max_attempts", 1), "max_attempts", 1, MAX_ATTEMPTS),
        retry_safe=_bool(raw.get("retry_safe", False), "retry_safe"),
        executor=executor,
        misfire=misfire,
        misfire_grace_ms=_int(
            raw.get("misfire_grace_ms", DEFAULT_MISFIRE_GRACE_MS), "misfire_grace_ms", 0, MAX_MISFIRE_GRACE_MS
        ),
        random_delay_ms=_int(raw.get("random_delay_ms", 0), "random_delay_ms", 0, MAX_RANDOM_DELAY_MS),
        on_start=_bool(raw.get("on_start", False), "on_start"),
    )


def spec_from_stored(data: Mapping[str, Any]) -> TaskSpec:
    return build_spec(data)


def public_spec(spec: TaskSpec) -> dict[str, Any]:
    """What management surfaces may show: never the command, cwd or env values."""
    return {
        "cron": spec.cron,
        "tz": timezones.zone_of(spec.cron),
        "env_keys": sorted(spec.env),
        "has_cwd": spec.cwd is not None,
        "environment_policy": spec.environment_policy,
        "timeout_ms": spec.timeout_ms,
        "grace_ms": spec.grace_ms,
        "require": dict(spec.require),
        "prefer": [{"labels": dict(p.labels), "weight": p.weight} for p in spec.prefer],
        "overlap": spec.overlap,
        "approval": spec.approval,
        "max_attempts": spec.max_attempts,
        "retry_safe": spec.retry_safe,
        "executor": spec.executor,
        "misfire": spec.misfire,
        "misfire_grace_ms": spec.misfire_grace_ms,
        "random_delay_ms": spec.random_delay_ms,
        "on_start": spec.on_start,
        "script": spec.script,
    }
