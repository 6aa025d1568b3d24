"""``ql3 user add|passwd|list|rm|totp|sessions|revoke-session``: people who sign in to the console
with a name and a password (docs/security.md "Console sign-in").

A password is never an argument (it would land in the shell's history and the process list): it is
asked for twice on a terminal, or read as the first line of standard input otherwise.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from datetime import UTC, datetime

from ql3.cli import output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, project_flag, wants_json
from ql3.cli.errors import EXIT_OK, UsageError

MIN_PASSWORD = 8
MAX_PASSWORD = 1024
ROLES = ("viewer", "operator", "approver", "admin", "metrics")


def _when(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def read_password(name: str) -> str:
    """The new password: asked twice on a terminal, else the first line of stdin."""
    if sys.stdin.isatty():
        first = getpass.getpass(f"password for {name}: ")
        if getpass.getpass("again: ") != first:
            raise UsageError("password_mismatch", "the two passwords differ")
        password = first
    else:
        password = sys.stdin.readline(MAX_PASSWORD + 2).removesuffix("\n").removesuffix("\r")
    if not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise UsageError("invalid_password", f"a password has {MIN_PASSWORD}-{MAX_PASSWORD} characters")
    return password


def _users(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/users"


def cmd_add(args: argparse.Namespace) -> int:
    password = read_password(args.name)
    body = {"name": args.name, "password": password, "role": args.role, "attach_to_caller": args.me}
    with ApiClient.from_environment() as api:
        _, made = api.call("POST", _users(args), json=body)
    if wants_json(args):
        output.emit_json(made)
    else:
        whom = "you" if args.me else f"a new {args.role} in project {args.project}"
        output.line(f"user {made['name']} ({whom}) signs in to the console with this password")
    return EXIT_OK


def cmd_passwd(args: argparse.Namespace) -> int:
    password = read_password(args.name)
    with ApiClient.from_environment() as api:
        _, done = api.call("POST", f"{_users(args)}/{seg(args.name)}/password", json={"password": password})
    if wants_json(args):
        output.emit_json(done)
    else:
        output.line(f"password of {args.name} changed; {done['sessions_revoked']} session(s) signed out")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", _users(args), params={"cursor": args.cursor})
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    output.table(
        ("NAME", "PRINCIPAL", "TOTP", "LOCKED UNTIL", "CREATED"),
        [
            (
                u["name"],
                u["principal_id"],
                "yes" if u["totp"] else "no",
                _when(u["locked_until_ms"]),
                _when(u["created_at_ms"]),
            )
            for u in page["items"]
        ],
    )
    if page.get("next_cursor"):
        output.note(f"more: ql3 user list --cursor {page['next_cursor']}")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, done = api.call("DELETE", f"{_users(args)}/{seg(args.name)}")
    if wants_json(args):
        output.emit_json(done)
    else:
        output.line(
            f"user {args.name} can no longer sign in; {done['sessions_revoked']} session(s) signed out"
            " (its principal and token stay: ql3 token revoke)"
        )
    return EXIT_OK


def cmd_totp(args: argparse.Namespace) -> int:
    path = f"{_users(args)}/{seg(args.name)}/totp"
    with ApiClient.from_environment() as api:
        if args.state == "disable":
            api.call("DELETE", path)
            if wants_json(args):
                output.emit_json({"name": args.name, "totp": False})
            else:
                output.line(f"{args.name} signs in without a TOTP code")
            return EXIT_OK
        _, enabled = api.call("POST", path)
    if wants_json(args):
        output.emit_json(enabled)
    else:
        output.note(
            f"TOTP for {enabled['name']}: add this to an authenticator app (shown only this once);"
            " sign-in asks for its 6-digit code from now on"
        )
        output.line(enabled["uri"])
        output.line(f"secret: {enabled['secret']}")
    return EXIT_OK


def cmd_sessions(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", f"{_users(args)}/{seg(args.name)}/sessions")
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    output.table(
        ("ID", "CREATED", "LAST SEEN", "IDLE END", "END", "CLIENT", "BROWSER"),
        [
            (
                s["id"],
                _when(s["created_at_ms"]),
                _when(s["last_seen_at_ms"]),
                _when(s["idle_expires_at_ms"]),
                _when(s["expires_at_ms"]),
                s["client"],
                s["user_agent"][:40],
            )
            for s in page["items"]
        ],
    )
    return EXIT_OK


def cmd_revoke_session(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, item = api.call("POST", f"/projects/{seg(args.project)}/sessions/{seg(args.id)}/revoke")
    if wants_json(args):
        output.emit_json(item)
    else:
        output.line(f"session {item['id']} revoked at {_when(item['revoked_at_ms'])} UTC")
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "user",
        help="console users: names, passwords, TOTP, sessions",
        description="People who sign in to the console with a name and a password (docs/security.md).",
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = add_command(
        actions,
        "add",
        cmd_add,
        "add a user who signs in with NAME and a password (asked for, or the first line of stdin)",
        project_flag(),
    )
    add.add_argument("name", metavar="NAME", help="the sign-in name (unique on the server)")
    add.add_argument("--role", choices=ROLES, default="viewer", help="the new user's role in the project")
    add.add_argument(
        "--me", action="store_true", help="give this sign-in name to the caller itself (e.g. the owner)"
    )

    passwd = add_command(
        actions,
        "passwd",
        cmd_passwd,
        "set a user's password (its sessions are signed out, its lock-out cleared)",
        project_flag(),
    )
    passwd.add_argument("name", metavar="NAME")

    listing = add_command(actions, "list", cmd_list, "list the project's users", project_flag())
    listing.add_argument("--cursor", metavar="NAME", default=None, help="continue after this name")

    rm = add_command(
        actions, "rm", cmd_rm, "remove a user's sign-in name and sign out its sessions", project_flag()
    )
    rm.add_argument("name", metavar="NAME")

    totp = add_command(
        actions,
        "totp",
        cmd_totp,
        "enable (prints the otpauth:// URI and secret once) or disable a user's TOTP second factor",
        project_flag(),
    )
    totp.add_argument("state", choices=("enable", "disable"))
    totp.add_argument("name", metavar="NAME")

    sessions = add_command(
        actions, "sessions", cmd_sessions, "list a user's live console sessions", project_flag()
    )
    sessions.add_argument("name", metavar="NAME")

    revoke = add_command(
        actions,
        "revoke-session",
        cmd_revoke_session,
        "sign out one console session (its id: ql3 user sessions)",
        project_flag(),
    )
    revoke.add_argument("id", metavar="ID")
