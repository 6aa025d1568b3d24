"""``ql3 script``: put, list, show, edit, rm, log, run (docs/scripts.md)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ql3.cli import output, runs
from ql3.cli.client import ApiClient, seg
from ql3.cli.common import Parser, Subparsers, add_command, project_flag, quiet_flag, wants_json, wants_quiet
from ql3.cli.errors import EXIT_OK, UsageError
from ql3.domain.errors import ValidationFailed
from ql3.domain.scripts import MAX_SCRIPT_BYTES, task_name_for, validate_script_content, validate_script_path


def _base(args: argparse.Namespace) -> str:
    return f"/projects/{seg(args.project)}"


def _checked_path(path: str) -> str:
    try:
        return validate_script_path(path)
    except ValidationFailed as exc:
        raise UsageError(str(exc)) from None


def _read_file(name: str) -> str:
    """The file's text, refused before any request when it is too large or not UTF-8 text."""
    try:
        if name == "-":
            raw = sys.stdin.buffer.read(MAX_SCRIPT_BYTES + 1)
        else:
            with open(name, "rb") as src:
                raw = src.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror}") from None
    if len(raw) > MAX_SCRIPT_BYTES:
        raise UsageError(f"{name} is larger than {MAX_SCRIPT_BYTES} bytes, the script size limit")
    try:
        return validate_script_content(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValidationFailed):
        raise UsageError(f"{name} is not UTF-8 text without NUL bytes") from None


def _put(api: ApiClient, args: argparse.Namespace, path: str, content: str) -> dict[str, Any]:
    _, written = api.call("PUT", f"{_base(args)}/scripts/{seg(path)}", json={"content": content})
    result: dict[str, Any] = written
    return result


def cmd_put(args: argparse.Namespace) -> int:
    path = _checked_path(args.path or ("" if args.file == "-" else Path(args.file).name))
    content = _read_file(args.file)
    with ApiClient.from_environment() as api:
        written = _put(api, args, path, content)
    if wants_json(args):
        output.emit_json(written)
    elif written["changed"]:
        output.line(f"script {path} saved: revision {written['revision']}")
    else:
        output.line(f"script {path} unchanged: revision {written['revision']}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", f"{_base(args)}/scripts", params={"limit": 500})
    if wants_json(args):
        output.emit_json(page)
    elif wants_quiet(args):
        output.ids_only(str(s["path"]) for s in page["items"])
    else:
        output.table(
            ("PATH", "REV", "BYTES", "BY"),
            [(s["path"], s["revision"], s["size_bytes"], s["updated_by"]) for s in page["items"]],
        )
    return EXIT_OK


def _show(api: ApiClient, args: argparse.Namespace, path: str) -> dict[str, Any]:
    _, found = api.call("GET", f"{_base(args)}/scripts/{seg(path)}")
    result: dict[str, Any] = found
    return result


def cmd_show(args: argparse.Namespace) -> int:
    path = _checked_path(args.path)
    with ApiClient.from_environment() as api:
        found = _show(api, args, path)
    if wants_json(args):
        output.emit_json(found)
    else:
        sys.stdout.write(found["content"])
    return EXIT_OK


def cmd_edit(args: argparse.Namespace) -> int:
    """Open the script in $VISUAL/$EDITOR (vi by default); save to publish a new revision."""
    path = _checked_path(args.path)
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with ApiClient.from_environment() as api:
        found = _show(api, args, path)
        with tempfile.TemporaryDirectory(prefix="ql3-script-") as folder:
            local = Path(folder) / Path(path).name
            local.write_text(found["content"], encoding="utf-8")
            if subprocess.call([*shlex.split(editor), str(local)]) != 0:
                raise UsageError("the editor failed: nothing was saved", code="editor_failed")
            content = _read_file(str(local))
        if content == found["content"]:
            output.line(f"script {path} unchanged")
            return EXIT_OK
        written = _put(api, args, path, content)
    output.line(f"script {path} saved: revision {written['revision']}")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    path = _checked_path(args.path)
    with ApiClient.from_environment() as api:
        api.call("DELETE", f"{_base(args)}/scripts/{seg(path)}")
    output.line(f"script {path} removed (its history stays)")
    return EXIT_OK


def cmd_log(args: argparse.Namespace) -> int:
    """The revisions of a script, or one revision's diff."""
    path = _checked_path(args.path)
    params = {"revision": args.revision}
    with ApiClient.from_environment() as api:
        _, page = api.call("GET", f"{_base(args)}/script-history/{seg(path)}", params=params)
    if wants_json(args):
        output.emit_json(page)
    elif args.revision is not None:
        sys.stdout.write(page["items"][0]["diff"] or "")
    else:
        output.table(
            ("REV", "AUTHOR", "SOURCE", "CHANGE"),
            [
                (r["revision"], r["author"], r["source"], "deleted" if r["deleted"] else r["digest"][:12])
                for r in page["items"]
            ],
        )
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Run a script now and stream its log: through the task that names it, or a new task (no cron)."""
    path = _checked_path(args.path)
    with ApiClient.from_environment() as api:
        _show(api, args, path)  # a missing script is refused before any task is made
        _, page = api.call("GET", f"{_base(args)}/tasks", params={"limit": 200})
        task = next((t for t in page["items"] if t.get("script") == path), None)
        if task is None:
            body = {"name": task_name_for(path), "script": path}
            _, task = api.call("POST", f"{_base(args)}/tasks", json=body)
            output.note(f"task {task['name']} created for script {path}")
    run_args = argparse.Namespace(**vars(args))
    run_args.task = task["name"]
    run_args.priority = 0
    run_args.idempotency_key = None
    run_args.wait = False
    run_args.follow = not args.no_follow
    run_args.timeout_wait = None
    return runs.cmd_start(run_args)


def register(subparsers: Subparsers) -> None:
    group: Parser = subparsers.add_parser(
        "script", help="a project's scripts", description="A project's scripts, kept with their history."
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    proj = project_flag()
    put = add_command(actions, "put", cmd_put, "create or change a script from a file ('-': stdin)", proj)
    put.add_argument("file", metavar="FILE")
    put.add_argument(
        "path", metavar="PATH", nargs="?", help="where in the project (default: the file's name)"
    )
    quiet_flag(add_command(actions, "list", cmd_list, "the project's scripts", proj))
    show = add_command(actions, "show", cmd_show, "print a script's content", proj)
    show.add_argument("path", metavar="PATH")
    edit = add_command(actions, "edit", cmd_edit, "edit a script in $VISUAL or $EDITOR", proj)
    edit.add_argument("path", metavar="PATH")
    rm = add_command(actions, "rm", cmd_rm, "remove a script (its history stays)", proj)
    rm.add_argument("path", metavar="PATH")
    log = add_command(actions, "log", cmd_log, "a script's revisions, or one revision's diff", proj)
    log.add_argument("path", metavar="PATH")
    log.add_argument("--revision", "-r", type=int, metavar="N", help="show the diff that made revision N")
    run = add_command(
        actions,
        "run",
        cmd_run,
        "run a script now and stream its log (makes a task for it if none names it)",
        proj,
    )
    run.add_argument("path", metavar="PATH")
    run.add_argument("--no-follow", action="store_true", help="start the run and return")
