"""The launcher writes a script task's script once, named by its digest, and refuses one whose content
does not match its digest or that was missing when the run was offered (docs/scripts.md)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ql3.domain.execution import ScriptPayload
from ql3.domain.scripts import script_digest
from ql3.execution.launcher import LocalLauncher
from ql3.execution.run_as import TaskUser
from ql3.ports.execution import LaunchRejected

CONTENT = "echo from a script\n"


def test_the_script_is_written_under_its_digest_and_named_in_the_environment(tmp_path: Path) -> None:
    digest = script_digest(CONTENT)
    env = LocalLauncher()._write_script(
        ScriptPayload(path="jobs/run.sh", digest=digest, content=CONTENT), str(tmp_path), None
    )
    target = tmp_path / "scripts" / digest / "run.sh"
    assert env == {"QL3_SCRIPT": str(target), "QL3_SCRIPT_PATH": "jobs/run.sh"}
    assert target.read_text() == CONTENT and stat.S_IMODE(os.stat(target).st_mode) == 0o600


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (ScriptPayload(path="a.sh", digest=script_digest("other"), content=CONTENT), "script_digest"),
        (ScriptPayload(path="a.sh", digest="", content=None), "script_missing"),
    ],
)
def test_a_mismatched_or_missing_script_is_refused(
    tmp_path: Path, payload: ScriptPayload, reason: str
) -> None:
    with pytest.raises(LaunchRejected) as refused:
        LocalLauncher()._write_script(payload, str(tmp_path), None)
    assert refused.value.reason == reason
    assert not (tmp_path / "scripts").exists()


def test_a_script_is_refused_where_commands_run_as_a_task_user(tmp_path: Path) -> None:
    user = TaskUser(name="nobody", uid=65534, gid=65534, home="/nonexistent", setpriv="/usr/bin/setpriv")
    payload = ScriptPayload(path="a.sh", digest=script_digest(CONTENT), content=CONTENT)
    with pytest.raises(LaunchRejected) as refused:
        LocalLauncher()._write_script(payload, str(tmp_path), user)
    assert refused.value.reason == "script_needs_server_user"
