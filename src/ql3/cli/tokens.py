"""``ql3 token create|list|revoke|rotate``.

``rotate`` of the token that ``$QL3_HOME/credentials`` holds (the owner's, on the server host) also
rewrites that file, atomically and 0600, so the CLI keeps working; see docs/security.md ("Tokens").
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from ql3.cli import output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, project_flag, quiet_flag, wants_json, wants_quiet
from ql3.cli.config import (
    Credentials,
    credentials_path,
    read_credentials_file,
    resolve_credentials,
    write_credentials_file,
)
from ql3.cli.errors import EXIT_OK, CliError

MIN_EXPIRES_IN_S = 60
MAX_EXPIRES_IN_S = 10 * 366 * 86400


def _when(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _expires_in(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a whole number of seconds") from None
    if not MIN_EXPIRES_IN_S <= value <= MAX_EXPIRES_IN_S:
        raise argparse.ArgumentTypeError(f"must be {MIN_EXPIRES_IN_S}-{MAX_EXPIRES_IN_S} seconds")
    return value


def cmd_create(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"role": args.role, "name": args.name}
    if args.expires_in is not None:
        body["expires_in_s"] = args.expires_in
    with ApiClient.from_environment() as api:
        _, issued = api.call("POST", f"/projects/{seg(args.project)}/tokens", json=body)
    if wants_json(args):
        output.emit_json(issued)
    else:
        expiry = f"; expires {_when(issued['expires_at_ms'])} UTC" if issued.get("expires_at_ms") else ""
        output.note(
            f"token for {issued['name']} ({issued['role']} in project {issued['project']}{expiry});"
            " it is shown only this once"
        )
        output.line(issued["token"])
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", f"/projects/{seg(args.project)}/tokens", params={"cursor": args.cursor})
    if wants_json(args):
        output.emit_json(page)
        return EXIT_OK
    if wants_quiet(args):
        output.ids_only(str(t["id"]) for t in page["items"])
        if page.get("next_cursor"):
            output.note(f"more: ql3 token list --cursor {page['next_cursor']} -q")
        return EXIT_OK
    output.table(
        ("ID", "NAME", "ROLE", "CREATED", "EXPIRES", "REVOKED", "LAST USED"),
        [
            (
                t["id"],
                t["name"],
                t["role"],
                _when(t["created_at_ms"]),
                _when(t["expires_at_ms"]),
                _when(t["revoked_at_ms"]),
                _when(t["last_used_at_ms"]),
            )
            for t in page["items"]
        ],
    )
    if page.get("next_cursor"):
        output.note(f"more: ql3 token list --cursor {page['next_cursor']}")
    return EXIT_OK


def cmd_revoke(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, item = api.call("POST", f"/projects/{seg(args.project)}/tokens/{seg(args.id)}/revoke")
    if wants_json(args):
        output.emit_json(item)
    else:
        output.line(f"token {item['id']} ({item['name']}) revoked at {_when(item['revoked_at_ms'])} UTC")
    return EXIT_OK


def _stored_credentials_of(api: ApiClient, acting: Credentials, principal_id: str) -> Credentials | None:
    """The credentials file, when it holds a token of ``principal_id`` on the server we talk to.

    The file's token is only ever sent to the file's own URL, and only when that is this server.
    """
    stored = read_credentials_file(credentials_path())
    if stored is None or stored.url.rstrip("/") != acting.url:
        return None
    if stored.token == acting.token:
        _, me = api.call("GET", "/whoami")
    else:
        try:
            with ApiClient(Credentials(url=acting.url, token=stored.token)) as probe:
                _, me = probe.call("GET", "/whoami")
        except CliError:  # the file's token is stale or revoked: it is not the one being rotated
            return None
    return stored if isinstance(me, dict) and me.get("principal_id") == principal_id else None


def cmd_rotate(args: argparse.Namespace) -> int:
    acting = resolve_credentials()
    body = {"expires_in_s": args.expires_in} if args.expires_in is not None else None
    with ApiClient(acting) as api:
        if args.id == "me":
            _, me = api.call("GET", "/whoami")
            args.id = str(me["principal_id"])
        stored = _stored_credentials_of(api, acting, args.id)
        _, rotated = api.call(
            "POST", f"/projects/{seg(args.project)}/tokens/{seg(args.id)}/rotate", json=body
        )
    updated = False
    if stored is not None:
        try:
            write_credentials_file(credentials_path(), Credentials(url=stored.url, token=rotated["token"]))
            updated = True
        except OSError as exc:
            # The old token is dead already: never lose the new one.
            output.line(rotated["token"])
            raise CliError(
                "credentials_not_written",
                f"rotated, but {credentials_path()} could not be rewritten; the new token is printed above",
            ) from exc
    if wants_json(args):
        output.emit_json({**rotated, "credentials_updated": updated})
        return EXIT_OK
    where = f"; {credentials_path()} now holds it" if updated else ""
    output.note(
        f"new token for {rotated['name']} ({rotated['role']}); the old one is refused from now on{where};"
        " it is shown only this once"
    )
    output.line(rotated["token"])
    return EXIT_OK


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser("token", help="API tokens", description="API tokens.")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = add_command(
        actions, "create", cmd_create, "create a principal and print its token once", project_flag()
    )
    create.add_argument(
        "--role",
        required=True,
        choices=("viewer", "operator", "approver", "admin", "metrics"),
        help="metrics: a Prometheus scrape token (reads /metrics with this project's task names only)",
    )
    create.add_argument("--name", default="token", metavar="N", help="a label for the principal")
    create.add_argument(
        "--expires-in",
        type=_expires_in,
        metavar="SECONDS",
        default=None,
        help="the token is refused after this many seconds (60 to 10 years; default: never)",
    )

    listing = add_command(
        actions,
        "list",
        cmd_list,
        "list the project's tokens: role, expiry, revocation, last use",
        project_flag(),
    )
    listing.add_argument("--cursor", metavar="ID", default=None, help="continue after this id")
    quiet_flag(listing)

    revoke = add_command(
        actions, "revoke", cmd_revoke, "revoke a token: refused from the next request on", project_flag()
    )
    revoke.add_argument(
        "id", metavar="ID", help="the token's id, a unique prefix of it, or its name (ql3 token list)"
    )
    revoke.set_defaults(refs={"id": "token"})

    rotate = add_command(
        actions,
        "rotate",
        cmd_rotate,
        "replace a token (the old one is refused at once) and print the new one once; rotating the"
        " token of $QL3_HOME/credentials rewrites that file",
        project_flag(),
    )
    rotate.add_argument(
        "id",
        metavar="ID",
        help="the token's id, a unique prefix of it or its name (ql3 token list), or `me` for the token"
        " in use",
    )
    rotate.set_defaults(refs={"id": "token"})
    rotate.add_argument(
        "--expires-in",
        type=_expires_in,
        metavar="SECONDS",
        default=None,
        help="lifetime of the new token (default: the old token's lifetime, or never)",
    )
