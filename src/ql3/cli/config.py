"""Where the CLI finds its state: ``$QL3_HOME``, the credentials file and the database URL."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ql3.bootstrap import default_database_url, ql3_home
from ql3.cli.errors import CliError, UsageError

DEFAULT_LISTEN: Final = "127.0.0.1:5700"
CREDENTIALS_FILE: Final = "credentials"


@dataclass(frozen=True, slots=True, kw_only=True)
class Credentials:
    url: str
    token: str


def home() -> Path:
    return ql3_home()


def credentials_path(base: Path | None = None) -> Path:
    return (base or home()) / CREDENTIALS_FILE


def database_url(explicit: str | None) -> str:
    return explicit or os.environ.get("QL3_DATABASE_URL") or default_database_url(home())


def read_credentials_file(path: Path) -> Credentials | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CliError("bad_credentials", f"cannot read {path}") from exc
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("url"), str)
        or not isinstance(data.get("token"), str)
    ):
        raise CliError("bad_credentials", f"{path} must hold a JSON object with url and token")
    return Credentials(url=data["url"], token=data["token"])


def write_credentials_file(path: Path, creds: Credentials) -> None:
    """Write atomically with mode 0600 from the first byte (never world-readable, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"url": creds.url, "token": creds.token}, fh)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def resolve_credentials() -> Credentials:
    """``QL3_URL`` and ``QL3_TOKEN`` each win over ``$QL3_HOME/credentials``."""
    env_url = os.environ.get("QL3_URL")
    env_token = os.environ.get("QL3_TOKEN")
    stored = None if env_url and env_token else read_credentials_file(credentials_path())
    url = env_url or (stored.url if stored else None)
    token = env_token or (stored.token if stored else None)
    if not url or not token:
        raise CliError(
            "not_configured",
            f"no credentials: run `ql3 init` or `ql3 serve`, or set QL3_URL and QL3_TOKEN"
            f" (looked in {credentials_path()})",
        )
    urls = [part.strip().rstrip("/") for part in url.split(",") if part.strip()]
    if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
        raise CliError(
            "bad_credentials",
            "the API URL must start with http:// or https:// (several replicas: comma-separated URLs)",
        )
    return Credentials(url=",".join(urls), token=token)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT``."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise UsageError("--listen must be HOST:PORT")
    port = int(port_text)
    if not 0 < port < 65536:
        raise UsageError("--listen port must be in 1..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def client_url(host: str, port: int) -> str:
    """The URL a local client uses to reach a server listening on ``host``."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
