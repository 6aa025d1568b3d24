"""The launched command gets exactly the environment, stdio, cwd and process group it should."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import ql3.execution.identity as identity_module
import ql3.execution.launcher as launcher_module
from ql3.domain.notifications import notify_token
from ql3.execution.identity import read_stat
from ql3.execution.launcher import LocalLauncher
from ql3.execution.receipts import launch_identity_path, receipt_path
from ql3.ports.execution import ArgvCommand, LaunchFailed, LaunchRejected, ShellCommand
from tests.support.processes import ExecHarness

ID_VARS = {"QL3_RUN_ID", "QL3_ATTEMPT_ID", "QL_RUN_ID", "QL_ATTEMPT_ID"}


def _env_from_log(ex: ExecHarness, attempt_id: str) -> dict[str, str]:
    ex.wait_exit(attempt_id)
    lines = ex.log_path(attempt_id).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_isolated_environment_is_the_minimal_base_plus_task_env_plus_ids(ex: ExecHarness) -> None:
    ex.launch("att-iso", ArgvCommand(file="env"), environment={"TASK_VAR": "v 1", "LANG": "en_US.UTF-8"})

    env = _env_from_log(ex, "att-iso")

    # sh exports PWD, which only ever names the command's actual working directory
    assert env.pop("PWD", os.getcwd()) == os.getcwd()
    added = {"QL3_DEPS_DIR", "QL3_NOTIFY_TOKEN", "PYTHONPATH", "NODE_PATH"}
    assert set(env) == {"PATH", "HOME", "LANG", "TASK_VAR", *added, *ID_VARS}
    # The run's notify credential is its attempt's, derived one way from the callback token, which
    # itself never appears (no notify URL configured in this harness); the helpers scripts import
    # (notify.py, sendNotify.js) are found last.
    assert env["QL3_NOTIFY_TOKEN"] == notify_token("att-iso", ex.token)
    assert ex.token not in "".join(env.values())
    assert env["PYTHONPATH"] == env["NODE_PATH"] == launcher_module.HELPERS_DIR
    assert {"notify.py", "sendNotify.js"} <= set(os.listdir(launcher_module.HELPERS_DIR))
    # No dependency set is installed for this project: PATH is the minimal one, then the folder of
    # the worker's own `ql3` command (a script's `ql3 notify`), private to the worker's user.
    ql3_dir = os.path.join(os.path.dirname(os.path.abspath(ex.receipts)), "bin")
    assert env["PATH"] == f"/usr/local/bin:/usr/bin:/bin:{ql3_dir}"
    assert stat.S_IMODE(os.stat(os.path.join(ql3_dir, "ql3")).st_mode) == 0o700
    assert env["QL3_DEPS_DIR"] == os.path.join(env["HOME"], ".ql3-deps", "no-project")
    assert env["LANG"] == "en_US.UTF-8"  # the task may override the base
    assert env["TASK_VAR"] == "v 1"
    assert env["QL3_RUN_ID"] == env["QL_RUN_ID"] == ex.run_id
    assert env["QL3_ATTEMPT_ID"] == env["QL_ATTEMPT_ID"] == "att-iso"
    # the callback token stays with the shim: no variable of the task holds it
    assert not [key for key, value in env.items() if ex.token in value]


@pytest.mark.parametrize("policy", ["isolated", "inherit"])
def test_the_callback_token_never_reaches_the_task_even_when_the_caller_or_task_names_it(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    # Given a caller environment and a task environment that both carry a callback-token variable
    monkeypatch.setenv("QL3_CALLBACK_TOKEN", "from-caller")
    attempt_id = f"att-cb-{policy}"
    ex.launch(
        attempt_id,
        ArgvCommand(file="env"),
        environment_policy=policy,
        environment={"QL_CALLBACK_TOKEN": "from-task"},
    )
    env = _env_from_log(ex, attempt_id)

    # Then the task sees neither, nor the real token under any name
    assert "QL3_CALLBACK_TOKEN" not in env and "QL_CALLBACK_TOKEN" not in env
    assert not [key for key, value in env.items() if ex.token in value]
    # and the receipt (the shim's) still carries the token completion checks
    receipt = ex.receipt(attempt_id)
    assert receipt is not None and receipt.exit_code == 0 and receipt.token == ex.token


def test_inherit_environment_adds_the_callers_env_but_never_the_shim_inputs(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QL3_TEST_CALLER_VAR", "from-caller")
    monkeypatch.setenv("QL3_SHIM_HEAD", "spoofed")

    ex.launch("att-inherit", ArgvCommand(file="env"), environment_policy="inherit", environment={"A": "b"})
    env = _env_from_log(ex, "att-inherit")

    assert env["QL3_TEST_CALLER_VAR"] == "from-caller"
    assert env["A"] == "b"
    assert set(env) >= ID_VARS
    assert not [key for key in env if key.startswith("QL3_SHIM_")]


def test_task_env_cannot_override_the_attempt_ids(ex: ExecHarness) -> None:
    ex.launch("att-ids", ArgvCommand(file="env"), environment={"QL3_ATTEMPT_ID": "forged"})

    assert _env_from_log(ex, "att-ids")["QL3_ATTEMPT_ID"] == "att-ids"


def test_stdin_is_dev_null_and_stdout_and_stderr_append_to_the_log(ex: ExecHarness) -> None:
    ex.shell("att-stdio", "readlink /proc/self/fd/0; echo to-out; echo to-err >&2; cat")
    ex.wait_exit("att-stdio")

    log = ex.log_path("att-stdio")
    assert log.read_text().splitlines() == ["/dev/null", "to-out", "to-err"]
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_working_directory_is_applied_without_leaking_the_callers_cwd(
    ex: ExecHarness, tmp_path: Path
) -> None:
    workdir = tmp_path / "work dir"
    workdir.mkdir()

    ex.shell("att-cwd", 'pwd; echo "old=${OLDPWD-unset}"', working_directory=str(workdir))
    ex.wait_exit("att-cwd")

    assert ex.log_path("att-cwd").read_text().splitlines() == [str(workdir), "old=unset"]


def test_the_shim_leads_a_new_session_and_process_group(ex: ExecHarness) -> None:
    launched = ex.shell("att-group", "sleep 300")

    stat_now = read_stat(launched.pid)
    assert stat_now is not None
    assert launched.handle.pid == launched.handle.pgid == launched.pid == stat_now.pgrp
    session = Path(f"/proc/{launched.pid}/stat").read_text().rsplit(")", 1)[1].split()[3]
    assert int(session) == launched.pid
    assert launched.handle.attempt_id == "att-group"


def test_argv_commands_pass_arguments_verbatim(ex: ExecHarness) -> None:
    ex.launch("att-argv", ArgvCommand(file="printf", args=("[%s]", "a b", "$HOME", "", "*")))
    ex.wait_exit("att-argv")

    assert ex.log_path("att-argv").read_text() == "[a b][$HOME][][*]"


def test_a_missing_program_exits_127_without_naming_it_in_the_log(ex: ExecHarness) -> None:
    ex.launch("att-missing", ArgvCommand(file="ql3-no-such-program-xyz"))
    ex.wait_exit("att-missing")

    receipt = ex.receipt("att-missing")
    assert receipt is not None and receipt.exit_code == 127
    assert "ql3-no-such-program-xyz" not in ex.log_path("att-missing").read_text()


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"attempt_id": "../escape"}, "attempt_id"),
        ({"attempt_id": ".hidden"}, "attempt_id"),
        ({"run_id": ""}, "run_id"),
        ({"callback_token": "short"}, "callback_token"),
        ({"callback_sequence": -1}, "callback_sequence"),
        ({"log_cap_bytes": 0}, "log_cap_bytes"),
        ({"started_at_ms": -5}, "started_at_ms"),
        ({"environment_policy": "host"}, "environment_policy"),
        ({"environment": {"BAD=KEY": "x"}}, "environment"),
        ({"environment": {"QL3_SHIM_MODE": "argv"}}, "environment"),
        ({"environment": {"K": "nul\x00"}}, "environment"),
        ({"command": ShellCommand(command="")}, "command"),
        ({"command": ShellCommand(command="echo \x00")}, "command"),
        ({"command": ArgvCommand(file="-rf")}, "command"),
        ({"working_directory": "relative/dir"}, "working_directory"),
        ({"working_directory": "/nonexistent/ql3/dir"}, "working_directory"),
    ],
)
def test_invalid_requests_are_rejected_before_anything_starts(
    ex: ExecHarness, overrides: dict[str, Any], reason: str
) -> None:
    values: dict[str, Any] = {
        "attempt_id": "att-reject",
        "command": ShellCommand(command="echo secret-command"),
    }
    values.update(overrides)
    request = ex.request(
        values.pop("attempt_id"), values.pop("command"), log_path=ex.log_path("att-reject"), **values
    )

    with pytest.raises(LaunchRejected) as caught:
        ex.launcher.start(request)

    assert caught.value.reason == reason
    assert "secret-command" not in str(caught.value) and ex.token not in str(caught.value)
    assert not ex.log_path("att-reject").exists()


def test_an_existing_log_file_is_never_reused(ex: ExecHarness) -> None:
    ex.log_path("att-dup").parent.mkdir(parents=True, exist_ok=True)
    ex.log_path("att-dup").write_text("earlier output\n")

    with pytest.raises(LaunchFailed) as caught:
        ex.launcher.start(ex.request("att-dup", ShellCommand(command="true")))

    assert caught.value.reason == "log_or_receipt_dir_unavailable"
    assert ex.log_path("att-dup").read_text() == "earlier output\n"
    assert os.listdir(ex.receipts) == []


def test_an_argv_file_that_is_not_executable_exits_126_without_naming_it(ex: ExecHarness) -> None:
    script = ex.root / "not-executable.sh"
    script.write_text("echo hi\n")

    ex.launch("att-noexec", ArgvCommand(file=str(script)))
    ex.wait_exit("att-noexec")

    receipt = ex.receipt("att-noexec")
    assert receipt is not None and receipt.exit_code == 126
    assert ex.log_path("att-noexec").read_text() == ""


def test_only_stdio_reaches_the_command_even_if_the_caller_leaks_a_descriptor(ex: ExecHarness) -> None:
    # Given a descriptor the caller made inheritable by mistake
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    try:
        # When a command lists its open descriptors
        ex.launch("att-fds", ArgvCommand(file="ls", args=("/proc/self/fd",)))
        ex.wait_exit("att-fds")
    finally:
        os.close(read_end)
        os.close(write_end)

    # Then it has stdin, stdout, stderr and the descriptor ls itself opened, nothing else
    assert ex.log_path("att-fds").read_text().split() == ["0", "1", "2", "3"]


def test_a_working_directory_gone_before_the_shim_enters_it_exits_126_silently(
    ex: ExecHarness, tmp_path: Path
) -> None:
    # Given a working directory that passes the launcher's check and is removed before the shim's cd
    # (the shim waits for its ticks in between: the directory goes while the launcher captures it)
    workdir = tmp_path / "going"
    workdir.mkdir()
    real_capture = identity_module.capture

    def capture_then_remove(*args: Any, **kwargs: Any) -> Any:
        workdir.rmdir()
        return real_capture(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launcher_module, "capture", capture_then_remove)
        ex.shell("att-gonecwd", "echo ran", working_directory=str(workdir))
    ex.wait_exit("att-gonecwd")

    # Then the command never ran, the exit code says so, and the shim's own error is not in the log
    receipt = ex.receipt("att-gonecwd")
    assert receipt is not None and receipt.exit_code == 126
    assert ex.log_path("att-gonecwd").read_text() == ""


@pytest.mark.parametrize("mode", ["shell", "argv"])
def test_the_command_keeps_the_servers_umask_while_the_shims_own_files_stay_private(
    ex: ExecHarness, mode: str
) -> None:
    # Given a launcher made under a distinctive umask (it hands that one to every command)
    previous = os.umask(0o027)
    try:
        ex.launcher = LocalLauncher()
    finally:
        os.umask(previous)

    # When a command reports its umask
    attempt_id = f"att-umask-{mode}"
    if mode == "shell":
        ex.shell(attempt_id, "umask")
    else:
        ex.launch(attempt_id, ArgvCommand(file="sh", args=("-c", "umask")))
    ex.wait_exit(attempt_id)

    # Then it ran with the server's umask, and the shim's receipt and identity file are 0600 anyway
    assert ex.log_path(attempt_id).read_text() == "0027\n"
    for path in (receipt_path(ex.receipts, attempt_id), launch_identity_path(ex.receipts, attempt_id)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_receipt_that_cannot_be_reserved_starts_nothing(
    ex: ExecHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a disk without room for the receipt (fallocate refused with ENOSPC)
    marker = ex.root / "ran"

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)

    # When the attempt is launched
    with pytest.raises(LaunchFailed) as caught:
        ex.launcher.start(ex.request("att-nospace", ShellCommand(command=f"touch {marker}")))

    # Then nothing ran (a command whose exit code could be lost never starts) and no receipt file is left
    assert caught.value.reason == "receipt_space_unavailable"
    assert not marker.exists()
    assert os.listdir(ex.receipts) == []


def test_an_installed_dependency_set_goes_first_on_path_and_node_path(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "NODE_PATH": "/opt/node"}
    launcher_module.add_dependencies(env, str(tmp_path), "p1")
    root = tmp_path / ".ql3-deps" / "p1"
    assert env == {"PATH": "/usr/bin:/bin", "NODE_PATH": "/opt/node", "QL3_DEPS_DIR": str(root)}

    (root / "current").mkdir(parents=True)
    launcher_module.add_dependencies(env, str(tmp_path), "p1")

    current = root / "current"
    assert env["PATH"] == f"{current}/venv/bin:{current}/node_modules/.bin:/usr/bin:/bin"
    assert env["NODE_PATH"] == f"{current}/node_modules:/opt/node"
    # Another project's directory is its own.
    other: dict[str, str] = {}
    launcher_module.add_dependencies(other, str(tmp_path), "p2")
    assert other == {"QL3_DEPS_DIR": str(tmp_path / ".ql3-deps" / "p2")}


def test_a_task_finds_the_workers_own_ql3_command(ex: ExecHarness) -> None:
    # An isolated task's PATH has no ql3 of its own: the one the launcher appends runs this ql3.
    ex.launch("att-ql3", ShellCommand(command="ql3 --version"))

    ex.wait_exit("att-ql3")

    assert ex.log_path("att-ql3").read_text().startswith("ql3 ")
