"""A project's dependencies: Python requirements and npm packages, validated, and the install script.

A dependency is a *kind* (``python`` or ``node``) and a *spec*: a PEP 508 requirement (``requests``,
``requests==2.32.*``, ``rich[jupyter]>=13``) checked with ``packaging``, the library pip itself uses, or
an npm package name with an optional version range (``axios``, ``axios@^1.7``, ``@scope/pkg@1.2.3``)
checked against npm's name rules. A direct URL, a path, a git reference or an option is refused: the
set is installed from the index the worker's pip and npm are configured for (docs/dependencies.md).

The install script is a POSIX shell script, one per version of the set: it builds a fresh virtualenv
and ``node_modules`` in a new directory under ``$QL3_DEPS_DIR`` and swaps the ``current`` link to it
only once everything installed, so a failed install changes nothing and a task never sees half a set.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Final, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ql3.domain.errors import ValidationFailed

DependencyKind = Literal["python", "node"]
KINDS: Final[tuple[DependencyKind, ...]] = ("python", "node")
MAX_SPEC_CHARS: Final = 200
MAX_PER_PROJECT: Final = 200
INSTALL_TASK: Final = "ql3-deps"  # the task whose runs install the set (a run with a live log)
INSTALL_TIMEOUT_MS: Final = 30 * 60 * 1000
# npm's rules for a package name (validate-npm-package-name): lower case, URL-safe, at most 214
# characters, not starting with a dot or an underscore, an optional @scope/.
_NPM_NAME_RE: Final = re.compile(r"^(?:@[a-z0-9~-][a-z0-9._~-]*/)?[a-z0-9~-][a-z0-9._~-]*$")
_NPM_NAME_MAX: Final = 214
# A semver range or a dist-tag: digits, letters, dots, wildcards, comparators, unions and spaces.
_NPM_RANGE_RE: Final = re.compile(r"^[0-9A-Za-z.*^~<>=|+ -]{1,64}$")
_PRINTABLE: Final = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Dependency:
    """One entry of a project's set: ``name`` is the key (one entry per kind and name)."""

    kind: DependencyKind
    name: str
    spec: str


def parse(kind: str, spec: str) -> Dependency:
    """Validate ``spec`` for ``kind``; raise ``ValidationFailed`` (422, exit 64) with the rule."""
    if kind not in KINDS:
        raise ValidationFailed("the kind is python or node", field="kind", allowed=list(KINDS))
    if not isinstance(spec, str) or not 1 <= len(spec) <= MAX_SPEC_CHARS or not _PRINTABLE.match(spec):
        raise ValidationFailed(
            f"a dependency is 1-{MAX_SPEC_CHARS} printable ASCII characters",
            field="spec",
            limit=MAX_SPEC_CHARS,
        )
    return _python(spec) if kind == "python" else _node(spec)


def _python(spec: str) -> Dependency:
    if spec.startswith("-"):
        raise ValidationFailed("a requirement, not a pip option", field="spec")
    try:
        req = Requirement(spec)
    except InvalidRequirement as exc:
        raise ValidationFailed(
            "not a valid Python requirement (PEP 508: name[extras] specifier, e.g. requests==2.32.*)",
            field="spec",
        ) from exc
    if req.url is not None:
        raise ValidationFailed("a direct URL is not accepted: name the package and a version", field="spec")
    return Dependency(kind="python", name=canonicalize_name(req.name), spec=str(req))


def _node(spec: str) -> Dependency:
    # ``@scope/name@range``: the version separator is the last ``@`` after the first character.
    at = spec.rfind("@")
    name, version = (spec[:at], spec[at + 1 :]) if at > 0 else (spec, "")
    if not _NPM_NAME_RE.match(name) or len(name) > _NPM_NAME_MAX or name.startswith((".", "_")):
        raise ValidationFailed(
            "not a valid npm package name (lower case letters, digits, - . _ ~, an optional @scope/, "
            f"at most {_NPM_NAME_MAX} characters, e.g. axios or @scope/pkg@^1.2)",
            field="spec",
        )
    if at > 0 and not _NPM_RANGE_RE.match(version):
        raise ValidationFailed("not a valid npm version range or tag after @", field="spec")
    return Dependency(kind="node", name=name, spec=spec)


def install_script(dependencies: list[Dependency]) -> str:
    """The install task's command for this set (validated entries only; each is shell-quoted).

    It runs with ``$QL3_DEPS_DIR`` set by the launcher; pip and npm read their index settings
    (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ``npm_config_registry``...) from the inherited environment.
    """
    python = sorted(d.spec for d in dependencies if d.kind == "python")
    node = sorted(d.spec for d in dependencies if d.kind == "node")
    lines = [
        "set -eu",
        "umask 077",
        ': "${QL3_DEPS_DIR:?the worker sets QL3_DEPS_DIR}"',
        'mkdir -p "$QL3_DEPS_DIR"',
        # The host's python3, pip and npm: not those of the set installed before (first on PATH).
        "PATH=$(printf '%s' \"$PATH\" | tr ':' '\\n' | grep -vF \"$QL3_DEPS_DIR/\" | paste -sd: -)",
        "export PATH",
        'build="$QL3_DEPS_DIR/build-$QL3_RUN_ID"',
        'rm -rf "$build"',
        'mkdir "$build"',
        "trap 'rm -rf \"$build\"' EXIT",
    ]
    if python:
        lines += [
            'echo "ql3 deps: python: creating a virtualenv"',
            # The host's pip installs into the new environment (pip >= 22.3): no copy of pip per set.
            'python3 -m venv --without-pip "$build/venv"',
            'python3 -m pip --python "$build/venv/bin/python" install --disable-pip-version-check --no-input '
            + " ".join(shlex.quote(s) for s in python),
        ]
    if node:
        lines += [
            'echo "ql3 deps: node: installing into node_modules"',
            'printf \'{"private":true}\\n\' > "$build/package.json"',
            'cd "$build"',
            "npm install --no-audit --no-fund --no-save --no-package-lock "
            + " ".join(shlex.quote(s) for s in node),
            'cd "$QL3_DEPS_DIR"',
        ]
    everything = " ".join(shlex.quote(s) for s in python + node)
    lines += [
        "trap - EXIT",
        'old=$(readlink "$QL3_DEPS_DIR/current" 2>/dev/null || true)',
        # Atomic swap: a task resolves current either to the old set or to the new one.
        'ln -sfn "build-$QL3_RUN_ID" "$QL3_DEPS_DIR/current.next"',
        'mv -T "$QL3_DEPS_DIR/current.next" "$QL3_DEPS_DIR/current"',
        # Keep the new set and the one before it (a task started on it may still run); drop the rest.
        'for dir in "$QL3_DEPS_DIR"/build-*; do',
        "  name=${dir##*/}",
        '  if [ -d "$dir" ] && [ "$name" != "build-$QL3_RUN_ID" ] && [ "$name" != "$old" ]; then',
        '    rm -rf "$dir"',
        "  fi",
        "done",
        "printf 'ql3 deps: installed:'",
        f"printf ' %s' {everything}" if everything else "printf ' (nothing)'",
        "echo",
    ]
    return "\n".join(lines) + "\n"
