"""Dependency specs: PEP 508 through ``packaging``, npm's name rules, and the install script's quoting."""

from __future__ import annotations

import pytest

from ql3.domain.dependencies import Dependency, install_script, parse
from ql3.domain.errors import ValidationFailed


@pytest.mark.parametrize(
    ("kind", "spec", "name"),
    [
        ("python", "requests==2.32.*", "requests"),
        ("python", "Rich[jupyter]>=13,<14", "rich"),
        ("python", "my_pkg.sub", "my-pkg-sub"),
        ("node", "axios", "axios"),
        ("node", "axios@^1.7", "axios"),
        ("node", "@scope/pkg@1.2.3", "@scope/pkg"),
        ("node", "lodash@>=4 <5", "lodash"),
    ],
)
def test_valid_specs_are_keyed_by_their_normalised_name(kind: str, spec: str, name: str) -> None:
    assert parse(kind, spec).name == name


@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("python", ""),
        ("python", "-r requirements.txt"),
        ("python", "pkg @ file:///etc/passwd"),
        ("python", "requests==2.32.*\nrm -rf /"),
        ("python", "x" * 201),
        ("node", "_private"),
        ("node", ".hidden"),
        ("node", "UPPER"),
        ("node", "git+https://example.invalid/x.git"),
        ("node", "axios@`id`"),
        ("node", "a" * 215),
        ("go", "x"),
    ],
)
def test_invalid_specs_are_refused_with_the_rule(kind: str, spec: str) -> None:
    with pytest.raises(ValidationFailed):
        parse(kind, spec)


def test_the_install_script_quotes_every_spec_and_swaps_the_set_in_at_the_end() -> None:
    script = install_script(
        [
            Dependency(kind="python", name="tomli", spec='tomli; python_version < "3.11"'),
            Dependency(kind="node", name="axios", spec="axios@>=1 <2"),
        ]
    )
    assert "install --disable-pip-version-check --no-input 'tomli; python_version < \"3.11\"'" in script
    assert "npm install --no-audit --no-fund --no-save --no-package-lock 'axios@>=1 <2'" in script
    lines = script.splitlines()
    assert lines.index('mv -T "$QL3_DEPS_DIR/current.next" "$QL3_DEPS_DIR/current"') > max(
        i for i, line in enumerate(lines) if "install" in line and line.startswith(("python3 -m pip", "npm"))
    )
    assert "python3 -m venv" not in install_script([Dependency(kind="node", name="a", spec="a")])
