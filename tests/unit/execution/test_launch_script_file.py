"""The launcher writes a script task's script once, named by its digest, and refuses one whose content
does not match its digest or that was missing when the run was offered; for a task user (``--run-as``)
it goes where that user may read and execute it but not change it (docs/scripts.md)."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql3.domain.execution import ScriptPayload
from ql3.domain.scripts import script_digest
from ql3.execution.launcher import LocalLauncher, task_scripts_root
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


NOBODY = TaskUser(name="nobody", uid=65534, gid=65534, home="/nonexistent", setpriv="/usr/bin/setpriv")


@pytest.fixture(autouse=True)
def _remove_task_script_roots(tmp_path: Path) -> Iterator[None]:
    """The task-user roots live in the host's temporary directory, named after the home used."""
    yield
    for home in (tmp_path, tmp_path / "home"):
        shutil.rmtree(task_scripts_root(str(home)), ignore_errors=True)


def _needs_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the task-user script tests need root under CI (they chown)")
        pytest.skip("the task-user script tests need root (they chown)")


def test_a_task_users_script_is_ours_readable_by_its_group_and_outside_the_home(tmp_path: Path) -> None:
    _needs_root()
    launcher = LocalLauncher()
    payload = ScriptPayload(path="jobs/a.sh", digest=script_digest(CONTENT), content=CONTENT)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)

    env = launcher._write_script(payload, str(home), NOBODY)

    target = Path(env["QL3_SCRIPT"])
    assert env["QL3_SCRIPT_PATH"] == "jobs/a.sh" and target.name == "a.sh"
    assert not target.is_relative_to(home) and target.read_text() == CONTENT
    root = target.parent.parent.parent
    modes = {
        root: (os.geteuid(), None, 0o711),
        target.parent.parent: (os.geteuid(), NOBODY.gid, 0o710),
        target.parent: (os.geteuid(), NOBODY.gid, 0o710),
        target: (os.geteuid(), NOBODY.gid, 0o750),
    }
    for path, (uid, gid, mode) in modes.items():
        st = os.lstat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, mode), path
        assert gid is None or st.st_gid == gid, path
    assert target.parent.name == payload.digest and target.parent.parent.name == str(NOBODY.uid)


def test_a_task_users_script_that_changed_on_disk_is_written_again_before_the_launch(tmp_path: Path) -> None:
    _needs_root()
    launcher = LocalLauncher()
    payload = ScriptPayload(path="a.sh", digest=script_digest(CONTENT), content=CONTENT)
    target = Path(launcher._write_script(payload, str(tmp_path), NOBODY)["QL3_SCRIPT"])
    # another content under the same digest's name (as if written by someone who could), then a
    # looser mode on an otherwise intact file
    target.write_text("echo tampered\n")
    assert Path(launcher._write_script(payload, str(tmp_path), NOBODY)["QL3_SCRIPT"]).read_text() == CONTENT
    os.chmod(target, 0o777)
    launcher._write_script(payload, str(tmp_path), NOBODY)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o750 and target.read_text() == CONTENT


def test_a_task_users_mismatched_script_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    launcher = LocalLauncher()
    payload = ScriptPayload(path="a.sh", digest=script_digest("other"), content=CONTENT)
    with pytest.raises(LaunchRejected) as refused:
        launcher._write_script(payload, str(tmp_path), NOBODY)
    assert refused.value.reason == "script_digest"
    assert not os.path.exists(os.path.join(task_scripts_root(str(tmp_path)), str(NOBODY.uid)))
