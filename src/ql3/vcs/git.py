"""The ``git`` command as the subscription fetcher (``ports/vcs.py``).

git runs with no user or system configuration, no terminal prompt, only the file, http(s) and ssh
transports (never ``ext::``, which runs commands), and a timeout. A deploy key goes to a 0600 file in
a private temporary directory for ``GIT_SSH_COMMAND``; a token goes to git through the environment
(``GIT_CONFIG_*``), never the command line, and is masked in the log."""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

from ql3.ports.vcs import FetchResult, GitCredentials

ALLOWED_PROTOCOLS: Final = "file:http:https:ssh"
_USERINFO_RE: Final = re.compile(r"(://)[^/@\s]+@")
MASK: Final = "***"


def mask_url(url: str) -> str:
    """A URL without its user information (``https://user:pw@host`` -> ``https://***@host``)."""
    return _USERINFO_RE.sub(rf"\1{MASK}@", url)


class GitCli:
    def __init__(self, git: str | None = None) -> None:
        self._git = git or shutil.which("git") or "git"

    def fetch(
        self, *, url: str, branch: str | None, credentials: GitCredentials, dest: Path, timeout_s: float
    ) -> FetchResult:
        with tempfile.TemporaryDirectory(prefix="ql3-git-") as private:
            env = self._environment(Path(private), credentials)
            argv = [self._git, "clone", "--depth", "1", "--single-branch", "--no-tags"]
            if branch is not None:
                argv += ["--branch", branch]
            argv += ["--", url, str(dest)]
            shown = " ".join(shlex.quote(a) for a in [*argv[1:-2], "--", mask_url(url)])
            log = [f"$ git {shown}"]
            ok = self._run(argv, env, timeout_s, log)
            commit = None
            if ok:
                out: list[str] = []
                ok = self._run([self._git, "-C", str(dest), "rev-parse", "HEAD"], env, timeout_s, out)
                commit = out[-1].strip() if ok and out else None
                log.append(f"checked out {commit}")
        text = "\n".join(log) + "\n"
        if credentials.token:
            text = text.replace(credentials.token, MASK)
        return FetchResult(ok=ok and commit is not None, commit=commit, log=mask_url(text))

    def _run(self, argv: list[str], env: dict[str, str], timeout_s: float, log: list[str]) -> bool:
        try:
            done = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            log.append(f"git did not finish within {timeout_s:g} s")
            return False
        except OSError as exc:
            log.append(f"git could not be started: {exc.strerror}")
            return False
        output = (done.stdout + done.stderr).strip()
        if output:
            log.append(output)
        if done.returncode != 0:
            log.append(f"git exited with status {done.returncode}")
        return done.returncode == 0

    @staticmethod
    def _environment(private: Path, credentials: GitCredentials) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(private),
            "LANG": "C.UTF-8",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS,
            "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
        }
        if credentials.deploy_key is not None:
            key = private / "deploy_key"
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(credentials.deploy_key.rstrip("\n") + "\n")
            known = private / "known_hosts"
            env["GIT_SSH_COMMAND"] = (
                f"ssh -i {shlex.quote(str(key))} -o IdentitiesOnly=yes -o BatchMode=yes"
                f" -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={shlex.quote(str(known))}"
            )
        if credentials.token is not None:
            basic = base64.b64encode(f"x-access-token:{credentials.token}".encode()).decode()
            env["GIT_CONFIG_COUNT"] = "1"
            env["GIT_CONFIG_KEY_0"] = "http.extraHeader"
            env["GIT_CONFIG_VALUE_0"] = f"Authorization: Basic {basic}"
        return env
