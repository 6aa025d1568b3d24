"""``ql3 notify channel add|list|remove``, ``ql3 notify rule add|list|remove``, ``ql3 notify test``.

A channel's URL and secret are write-only: the server never shows them again, so pass them through
environment variables (``--url-env``, ``--secret-env``) to keep them out of shell history and ``ps``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import httpx

from ql3.cli import output
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import (
    Parser,
    Subparsers,
    add_command,
    duration_s,
    print_quiet_id,
    project_flag,
    quiet_flag,
    wants_json,
    wants_quiet,
)
from ql3.cli.errors import EXIT_ERROR, EXIT_OK, CliError, UsageError

EPILOG = """\
events: failed timed_out lost cancellation_blocked approval_requested script (the default set) and succeeded

inside a run (a task's script), with the run's own credential ($QL3_NOTIFY_TOKEN):
  ql3 notify "backup done" "3 files, 12 MB"      # or: from notify import send; require('sendNotify')

examples:
  export HOOK_SECRET=$(openssl rand -hex 32)
  ql3 notify channel add ops --webhook https://hooks.example.com/ql3 --secret-env HOOK_SECRET
  TG='tgram://BOT_TOKEN/CHAT_ID' ql3 notify channel add phone --apprise-env TG
  ql3 notify rule add --channel phone --task backup --events failed,timed_out,succeeded
  ql3 notify test phone
"""


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}/notifications"


def _from_env(name: str | None, what: str) -> str | None:
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise UsageError(f"{what}: the environment variable {name} is not set")
    return value


def cmd_channel_add(args: argparse.Namespace) -> int:
    given = [
        ("webhook", args.webhook),
        ("webhook", _from_env(args.webhook_env, "--webhook-env")),
        ("apprise", args.apprise),
        ("apprise", _from_env(args.apprise_env, "--apprise-env")),
    ]
    chosen = [(kind, url) for kind, url in given if url is not None]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --webhook, --webhook-env, --apprise, --apprise-env")
    kind, url = chosen[0]
    secret = _from_env(args.secret_env, "--secret-env")
    body = {"name": args.name, "kind": kind, "url": url, "secret": secret}
    with ApiClient.from_environment() as api:
        _, channel = api.call("POST", f"{_base(args)}/channels", json=body)
    if wants_json(args):
        output.emit_json(channel)
        return EXIT_OK
    output.line(f"channel {channel['name']} added ({channel['kind']}, {channel['scheme']}://...)")
    if channel.get("secret"):
        output.note("the webhook signing secret (X-Ql3-Signature: sha256=HMAC of the body); shown only once:")
        output.line(channel["secret"])
    return EXIT_OK


def cmd_channel_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", f"{_base(args)}/channels")
    if wants_json(args):
        output.emit_json(page)
    else:
        output.table(("NAME", "KIND", "SCHEME"), [(c["name"], c["kind"], c["scheme"]) for c in page["items"]])
    return EXIT_OK


def cmd_channel_remove(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        api.call("DELETE", f"{_base(args)}/channels/{seg(args.name)}")
    if not wants_json(args):
        output.line(f"channel {args.name} removed with its rules and undelivered messages")
    return EXIT_OK


def cmd_rule_add(args: argparse.Namespace) -> int:
    events = [e for e in args.events.split(",") if e] if args.events else None
    body = {"channel": args.channel, "task": args.task, "events": events}
    with ApiClient.from_environment() as api:
        _, rule = api.call("POST", f"{_base(args)}/rules", json=body)
    if wants_json(args):
        output.emit_json(rule)
    elif not print_quiet_id(args, rule["id"]):
        scope = f"task {rule['task']}" if rule["task"] else "every task"
        output.line(f"rule {rule['id']}: {','.join(rule['events'])} of {scope} -> {rule['channel']}")
    return EXIT_OK


def cmd_rule_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", f"{_base(args)}/rules")
    if wants_json(args):
        output.emit_json(page)
    elif wants_quiet(args):
        output.ids_only(str(r["id"]) for r in page["items"])
    else:
        output.table(
            ("ID", "CHANNEL", "TASK", "EVENTS"),
            [(r["id"], r["channel"], r["task"] or "*", ",".join(r["events"])) for r in page["items"]],
        )
    return EXIT_OK


def cmd_rule_remove(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        api.call("DELETE", f"{_base(args)}/rules/{seg(args.id)}")
    if not wants_json(args):
        output.line(f"rule {args.id} removed")
    return EXIT_OK


def cmd_test(args: argparse.Namespace) -> int:
    """Queue a test message and wait (bounded) for the server's delivery loop to settle it."""
    if not 0 < args.timeout <= 600:
        raise UsageError("--timeout must be between 0 and 600 seconds")
    with ApiClient.from_environment() as api:
        _, delivery = api.call("POST", f"{_base(args)}/channels/{seg(args.channel)}/test")
        deadline = time.monotonic() + args.timeout
        while delivery["status"] != "delivered" and time.monotonic() < deadline:
            if delivery["status"] == "dead":
                break
            time.sleep(0.25)
            _, delivery = api.call("GET", f"{_base(args)}/deliveries/{seg(delivery['id'])}")
    if wants_json(args):
        output.emit_json(delivery)
    if delivery["status"] == "delivered":
        if not wants_json(args):
            output.line(f"test message delivered to {args.channel}")
        return EXIT_OK
    reason = delivery.get("last_error") or "not settled yet"
    raise CliError(
        "notification_not_delivered",
        f"the test message to {args.channel} is {delivery['status']} after {delivery['attempts']}"
        f" attempt(s): {reason}",
        EXIT_ERROR,
    )


SUBCOMMANDS = frozenset({"channel", "rule", "test", "send"})


def rewrite_argv(argv: list[str]) -> list[str]:
    """``ql3 notify TITLE [BODY]`` (QingLong's habit) is ``ql3 notify send TITLE [BODY]``."""
    for i, arg in enumerate(argv):
        if arg == "notify":
            rest = argv[i + 1 :]
            if rest and rest[0] not in SUBCOMMANDS and rest[0] not in ("-h", "--help"):
                return [*argv[: i + 1], "send", *rest]
            return argv
        if not arg.startswith("-"):
            return argv
    return argv


NOTIFY_RETRY_S = 15.0  # a run starts before its credential is accepted: 409 attempt_not_running


def cmd_send(args: argparse.Namespace) -> int:
    """Inside a run: queue a message for the project's channels with the run's own credential
    ($QL3_NOTIFY_TOKEN, valid while the run runs) at $QL3_NOTIFY_URL; the same call as notify.py."""
    url, token = os.environ.get("QL3_NOTIFY_URL"), os.environ.get("QL3_NOTIFY_TOKEN")
    if not url or not token:
        raise UsageError(
            "QL3_NOTIFY_URL and QL3_NOTIFY_TOKEN are set only inside a ql3 run", code="not_in_a_run"
        )
    body = sys.stdin.read() if args.body == "-" else args.body
    deadline = time.monotonic() + NOTIFY_RETRY_S
    delay = 0.1
    with httpx.Client(timeout=10.0) as client:
        while True:
            try:
                answer = client.post(
                    url.rstrip("/") + "/api/v1/notify",
                    json={"title": args.title, "body": body, "log_lines": args.log},
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.HTTPError as exc:
                if time.monotonic() >= deadline:
                    raise CliError("unreachable", f"{url}: {type(exc).__name__}", EXIT_ERROR) from None
            else:
                if answer.is_success:
                    break
                error = _error_of(answer)
                if error[0] != "attempt_not_running" or time.monotonic() >= deadline:
                    if answer.status_code == 422:
                        raise UsageError(error[1], code=error[0])
                    raise CliError(error[0], error[1], EXIT_ERROR)
            time.sleep(delay)
            delay = min(1.0, delay * 2)
    sent = answer.json()
    if wants_json(args):
        output.emit_json(sent)
    elif sent.get("deliveries"):
        output.line(f"queued for {sent['deliveries']} channel(s)")
    else:
        output.note("no channel takes script messages (ql3 notify rule add --channel NAME --events script)")
    return EXIT_OK


def _error_of(answer: httpx.Response) -> tuple[str, str]:
    try:
        error = answer.json()["error"]
        return str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"http_{answer.status_code}", answer.reason_phrase


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "notify",
        help="notifications on outcomes",
        description="Notification channels (webhook, apprise), rules, and test messages.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()

    channel: Parser = actions.add_parser("channel", help="channels", description="Notification channels.")
    channel_actions = channel.add_subparsers(dest="channel_action", metavar="ACTION", required=True)
    add = add_command(channel_actions, "add", cmd_channel_add, "add a channel (admin)", proj)
    add.add_argument("name", metavar="NAME")
    add.add_argument("--webhook", metavar="URL", help="an http(s) URL that receives signed JSON")
    add.add_argument("--webhook-env", metavar="VAR", help="read the webhook URL from $VAR")
    add.add_argument("--apprise", metavar="URL", help="an apprise URL (tgram://, mailto://, dingtalk://...)")
    add.add_argument("--apprise-env", metavar="VAR", help="read the apprise URL from $VAR (it holds tokens)")
    add.add_argument(
        "--secret-env",
        metavar="VAR",
        help="webhook signing secret from $VAR (default: generated, shown once)",
    )
    add_command(channel_actions, "list", cmd_channel_list, "list channels (never their URLs)", proj)
    remove = add_command(channel_actions, "remove", cmd_channel_remove, "remove a channel", proj)
    remove.add_argument("name", metavar="NAME", help="channel name or a unique prefix of its id")
    remove.set_defaults(refs={"name": "channel"})

    rule: Parser = actions.add_parser("rule", help="rules", description="Which events go to which channel.")
    rule_actions = rule.add_subparsers(dest="rule_action", metavar="ACTION", required=True)
    radd = add_command(
        rule_actions, "add", cmd_rule_add, "send events of a task (or all tasks) to a channel", proj
    )
    radd.add_argument(
        "--channel", required=True, metavar="NAME", help="channel name or a unique prefix of its id"
    )
    radd.add_argument("--task", metavar="TASK", help="one task (default: every task of the project)")
    radd.add_argument("--events", metavar="E,E", help="comma-separated events (default: all but succeeded)")
    radd.set_defaults(refs={"channel": "channel", "task": "task"})
    quiet_flag(radd)
    quiet_flag(add_command(rule_actions, "list", cmd_rule_list, "list rules", proj))
    rremove = add_command(rule_actions, "remove", cmd_rule_remove, "remove a rule", proj)
    rremove.add_argument("id", metavar="ID", help="rule id or a unique prefix of one")
    rremove.set_defaults(refs={"id": "rule"})

    send = add_command(
        actions,
        "send",
        cmd_send,
        "inside a run: send TITLE and BODY to the project's channels (also: ql3 notify TITLE BODY)",
    )
    send.add_argument("title", metavar="TITLE")
    send.add_argument("body", metavar="BODY", nargs="?", default="", help="the text; - reads it from stdin")
    send.add_argument(
        "--log",
        type=int,
        default=0,
        choices=range(51),
        metavar="N",
        help="add the run's last N log lines (0-50)",
    )

    test = add_command(actions, "test", cmd_test, "send a test message and wait for its delivery", proj)
    test.add_argument("channel", metavar="CHANNEL", help="channel name or a unique prefix of its id")
    test.set_defaults(refs={"channel": "channel"})
    test.add_argument(
        "--timeout", type=duration_s, default=30.0, metavar="DURATION", help="time to wait (default 30s)"
    )
