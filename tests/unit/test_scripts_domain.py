"""Script headers (QingLong's ``cron:`` forms), task names for scripts, and the git adapter's handling
of credentials: a deploy key in a 0600 file for ssh, a token through the environment, masked in logs."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from ql3.domain.scripts import ScriptHeader, default_command, parse_header, task_name_for
from ql3.ports.vcs import GitCredentials
from ql3.vcs.git import GitCli, mask_url


@pytest.mark.parametrize(
    ("text", "header"),
    [
        ("# cron: 0 8 * * *\n# new Env('签到')\n", ScriptHeader(cron="0 8 * * *", title="签到")),
        (
            '/*\ncron "5 0 * * *" script-path=a.js, tag=Daily\n*/\n',
            ScriptHeader(cron="5 0 * * *", title="Daily"),
        ),
        (
            "// cron: '*/10 * * * *'\nconst $ = new Env(\"Box\");\n",
            ScriptHeader(cron="*/10 * * * *", title="Box"),
        ),
        ("print('no header')\n", ScriptHeader(cron=None, title=None)),
        ("x = 1\n" * 2000 + "# cron: 0 8 * * *\n", ScriptHeader(cron=None, title=None)),  # past 4 KiB
    ],
)
def test_headers_in_qinglong_forms(text: str, header: ScriptHeader) -> None:
    assert parse_header(text) == header


def test_task_names_and_default_commands() -> None:
    assert task_name_for("jd/签到 v2.js") == "jd_-v2.js"
    assert task_name_for("a/b.py") == "a_b.py"
    assert default_command("x.js") == 'node "$QL3_SCRIPT"'
    assert default_command("tool") == '"$QL3_SCRIPT"'


def test_a_deploy_key_goes_to_a_private_file_for_ssh(tmp_path: Path) -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----"
    env = GitCli._environment(tmp_path, GitCredentials(deploy_key=key))
    key_file = tmp_path / "deploy_key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert key_file.read_text() == key + "\n"
    assert f"-i {key_file}" in env["GIT_SSH_COMMAND"] and "IdentitiesOnly=yes" in env["GIT_SSH_COMMAND"]
    assert key not in " ".join(env.values())  # only the file holds it
    assert env["GIT_ALLOW_PROTOCOL"] == "file:http:https:ssh"


def test_a_token_reaches_git_through_the_environment_and_never_the_log(tmp_path: Path) -> None:
    token = "tok-123456789"
    env = GitCli._environment(tmp_path, GitCredentials(token=token))
    assert env["GIT_CONFIG_KEY_0"] == "http.extraHeader" and env["GIT_CONFIG_VALUE_0"].startswith(
        "Authorization: Basic "
    )
    # A clone that fails with the token in the URL: the log masks both the user info and the token.
    url = f"https://user:{token}@127.0.0.1:9/none.git"
    result = GitCli().fetch(
        url=url, branch=None, credentials=GitCredentials(token=token), dest=tmp_path / "d", timeout_s=10
    )
    assert not result.ok and token not in result.log and "https://***@127.0.0.1:9/none.git" in result.log
    assert mask_url("ssh://git@host/x") == "ssh://***@host/x"


def test_git_refuses_the_ext_transport(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = GitCli().fetch(
        url=f"ext::sh -c touch% {marker}",
        branch=None,
        credentials=GitCredentials(),
        dest=tmp_path / "d",
        timeout_s=10,
    )
    assert not result.ok and not marker.exists()
    assert subprocess.run(["git", "--version"], capture_output=True, check=False).returncode == 0
