"""A QingLong user's repository migrated into ql3 end to end (issue 30, README "Coming from QingLong"),
through the CLI against a real ``ql3 serve`` on PostgreSQL, whose database clock the test shifts.

The test builds what such a user has: a git repository (a local bare one) of Python, Node and shell
scripts with QingLong ``cron:`` headers and titles, QingLong's JSON env export, a cookie kept as a
secret, a Python package (a wheel the test builds: no registry) and a webhook (an HTTP listener the
test runs). It then moves them in: project time zone Asia/Shanghai, ``env import``, ``env set
--secret``, ``deps add``, ``notify channel add``, ``subscription add --sync``; checks the tasks' zone
and next fires; moves the database clock to just before 08:00 in Shanghai and sees the cron runs
happen, each seeing the variables, the secret (masked in the log) and the dependency, and each
notifying the webhook. Bad input on the way (an invalid zone, a traversal path, an oversized script, an
unreachable repository) is refused and changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

import psycopg
import pytest

from ql3.domain.scripts import MAX_SCRIPT_BYTES
from ql3.storage.postgres.adapter import PostgresDatabase
from tests.acceptance.test_cli_dependencies import build_wheel
from tests.acceptance.test_script_notify import Receiver
from tests.acceptance.test_scripts_and_subscriptions import _git
from tests.support.databases import pg_admin_dsn
from tests.support.server import Server, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow

SHANGHAI = ZoneInfo("Asia/Shanghai")
COOKIE = "pt_key=AAJ-secret-cookie-value;pt_pin=jd_user;"
HOOK_SECRET = "migration-webhook-secret-0123456789"

SIGN_PY = '''# -*- coding: utf-8 -*-
"""
cron: 0 8 * * *
new Env('每日签到');
"""
import os

import ql3demo
from notify import send

print("region", os.environ["REGION"], "wheel", ql3demo.VALUE)
print("cookie", os.environ["JD_COOKIE"])
print("disabled", os.environ.get("OLD_PIN", "absent"))
send("签到完成", "python " + os.environ["REGION"])
'''

FRUIT_JS = """/*
东东农场
cron: 30 8 * * *
*/
function Env(name) { this.name = name; }
const $ = new Env('东东农场');
const { sendNotify } = require('sendNotify');
console.log('fruit', process.env.REGION, $.name);
console.log('cookie', process.env.JD_COOKIE);
sendNotify('农场', 'node ' + process.env.REGION).catch((e) => { console.error(e); process.exit(1); });
"""

# Six fields, seconds first (QingLong's format): 08:00:00 every day.
CHECKIN_SH = """#!/usr/bin/env bash
# cron: 0 0 8 * * *
# new Env('签到shell')
set -e
echo "shell $REGION"
echo "cookie $JD_COOKIE"
ql3 notify "shell done" "from bash $REGION"
"""

# A header whose zone does not exist: logged by the sync, no task made.
BADZONE_PY = "# cron: CRON_TZ=Mars/Olympus 0 8 * * *\nprint('never')\n"

QINGLONG_EXPORT = [
    {"name": "REGION", "value": "cn-east", "remarks": "where to sign in", "status": 0},
    {"name": "OLD_PIN", "value": "retired-pin", "remarks": "disabled in the panel", "status": 1},
]


@pytest.fixture
def pg_url() -> Iterator[str]:
    admin = pg_admin_dsn()  # skips on a laptop without PostgreSQL; fails under CI=true
    if admin is None:
        pytest.skip("PostgreSQL not configured (QL3_TEST_PG_DSN)")
    name = f"ql3_qlmig_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    info = psycopg.conninfo.conninfo_to_dict(admin)
    user = info.get("user") or "postgres"
    host = info.get("host") or "127.0.0.1"
    port = info.get("port") or "5432"
    url = f"postgresql://{quote(str(user))}@{quote(str(host), safe='')}:{port}/{name}"
    try:
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def _set_clock_offset(pg_url: str, offset_ms: int) -> None:
    db = PostgresDatabase(pg_url, min_size=1, max_size=1)
    try:
        db.raw("UPDATE ql3_clock SET offset_ms = ?", (offset_ms,))
    finally:
        db.close()


def _repository(root: Path) -> str:
    work = root / "work"
    (work / "jd").mkdir(parents=True)
    _git("init", "-q", "-b", "main", cwd=work)
    (work / "jd" / "sign.py").write_text(SIGN_PY)
    (work / "jd" / "fruit.js").write_text(FRUIT_JS)
    (work / "checkin.sh").write_text(CHECKIN_SH)
    (work / "badzone.py").write_text(BADZONE_PY)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "scripts", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
    return f"file://{root / 'repo.git'}"


def _ok(done: Any) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    out: str = done.stdout
    return out


def _next_shanghai_ms(hour: int, minute: int, after: datetime) -> int:
    local = after.astimezone(SHANGHAI)
    due = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if due <= local:
        due += timedelta(days=1)
    return int(due.timestamp() * 1000)


def _cron_runs(server: Server, task: str) -> list[dict[str, Any]]:
    listed = server.cli_json("run", "list", "--task", task)
    return [r for r in listed["items"] if r.get("trigger_type") == "cron"]


def _cron_run_succeeded(server: Server, task: str) -> bool:
    return any(r["status"] == "succeeded" for r in _cron_runs(server, task))


def _received(receiver: Receiver, title: str) -> bool:
    return any(p.get("title") == title for p in receiver.payloads())


def _runs_seen(server: Server, task: str) -> str:
    runs = server.cli_json("run", "list", "--task", task)["items"]
    logs = [server.cli("run", "logs", r["id"]).stdout[-2000:] for r in runs]
    return f"runs {runs}, logs {logs}"


def test_a_qinglong_repository_moves_in_and_runs_on_shanghai_time(tmp_path: Path, pg_url: str) -> None:
    if shutil.which("node") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is needed under CI to run the repository's Node script")
        pytest.skip("node is not installed")
    url = _repository(tmp_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "ql3demo", "1.0", 'VALUE = "from-the-wheel"\n')
    user_home = tmp_path / "user"
    user_home.mkdir()
    receiver = Receiver()
    env = {
        "HOME": str(user_home),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
    }
    home = tmp_path / "home"
    server = start_server(home, "--database-url", pg_url, "--notify-allow", "127.0.0.1", env=env)
    try:
        # -- the panel's settings: time zone, variables, the secret, the dependency, the webhook --------
        bad_zone = server.cli("project", "set", "--tz", "Mars/Olympus")
        assert bad_zone.returncode == 64 and "unknown time zone 'Mars/Olympus'" in bad_zone.stderr
        _ok(server.cli("project", "set", "--tz", "Asia/Shanghai"))

        export = tmp_path / "qinglong-envs.json"
        export.write_text(json.dumps(QINGLONG_EXPORT, ensure_ascii=False))
        _ok(server.cli("env", "import", str(export)))
        _ok(server.cli("env", "set", "JD_COOKIE", COOKIE, "--secret", "--note", "京东 cookie"))
        listed_env = server.cli("env", "list")
        assert COOKIE not in listed_env.stdout and "(secret)" in listed_env.stdout

        added = server.cli("deps", "add", "python", "ql3demo==1.*", "--follow")
        assert "succeeded" in _ok(added)

        _ok(
            server.cli(
                "notify", "channel", "add", "hook", "--webhook", receiver.url, "--secret-env", "HOOK_SECRET",
                env={"HOOK_SECRET": HOOK_SECRET},
            )
        )  # fmt: skip
        _ok(server.cli("notify", "rule", "add", "--channel", "hook"))

        # -- bad script input and an unreachable repository change nothing --------------------------
        small = tmp_path / "ok.sh"
        small.write_text("echo ok\n")
        big = tmp_path / "big.sh"
        big.write_text("#" * (MAX_SCRIPT_BYTES + 1))
        assert server.cli("script", "put", str(small), "../jd/sign.py").returncode == 64
        assert server.cli("script", "put", str(big), "big.sh").returncode == 64
        server.cli_json("subscription", "add", "gone", "--repo", f"file://{tmp_path / 'missing.git'}")
        failed = server.cli("subscription", "sync", "gone")
        assert failed.returncode == 1 and "sync failed" in failed.stderr
        assert server.cli_json("script", "list")["items"] == []
        # (the failed sync was a run of its own task, which failed)
        assert sorted(t["name"] for t in server.cli_json("task", "list")["items"]) == [
            "ql3-deps",
            "ql3-sync-gone",
        ]
        assert [r["status"] for r in server.cli_json("run", "list", "--task", "ql3-sync-gone")["items"]] == [
            "failed"
        ]

        # -- the subscription: its scripts become tasks in the project's zone --------------------------
        synced_at = datetime.now(UTC)
        sync = _ok(server.cli("subscription", "add", "jd", "--repo", url, "--branch", "main", "--sync"))
        assert "created task jd_sign.py (每日签到): cron 0 8 * * *" in sync
        assert "created task jd_fruit.js (东东农场): cron 30 8 * * *" in sync
        assert "created task checkin.sh (签到shell): cron 0 0 8 * * *" in sync
        assert "badzone.py: cron 'CRON_TZ=Mars/Olympus 0 8 * * *' not accepted" in sync
        paths = sorted(s["path"] for s in server.cli_json("script", "list")["items"])
        assert paths == ["badzone.py", "checkin.sh", "jd/fruit.js", "jd/sign.py"]

        eight = _next_shanghai_ms(8, 0, synced_at)
        half_past = _next_shanghai_ms(8, 30, synced_at)
        expected = {"jd_sign.py": eight, "checkin.sh": eight, "jd_fruit.js": half_past}
        for name, first in expected.items():
            task = server.cli_json("task", "show", name)
            assert task["tz"] == "Asia/Shanghai", task
            assert task["next_fires_at_ms"][0] == first, (name, task["next_fires_at_ms"])
            assert task["next_fires_at_ms"][1] == first + 86_400_000
            assert task["next_fires_local"][0].startswith(
                datetime.fromtimestamp(first / 1000, SHANGHAI).strftime("%Y-%m-%dT%H:%M")
            )
        assert "badzone.py" not in [t["name"] for t in server.cli_json("task", "list")["items"]]

        # -- the Node script, run now: variables, the secret masked, sendNotify -------------------------
        fruit = server.cli("run", "start", "jd_fruit.js", "--follow")
        assert "fruit cn-east 东东农场" in _ok(fruit)
        assert "cookie ***" in fruit.stdout and COOKIE not in fruit.stdout
        wait_for(partial(_received, receiver, "农场"), 30, what="node's notify")

        # -- the clock moved to 08:00 in Shanghai: the cron runs happen -------------------------------
        stop(server.process)
        # The database clock is set 20 s before the boundary (a restart takes a few seconds).
        _set_clock_offset(pg_url, eight - 20_000 - int(time.time() * 1000))
        server = start_server(home, "--database-url", pg_url, "--notify-allow", "127.0.0.1", env=env)
        for name in ("jd_sign.py", "checkin.sh"):
            wait_for(
                partial(_cron_run_succeeded, server, name),
                90,
                what=f"the 08:00 Shanghai run of {name}",
                detail=partial(_runs_seen, server, name),
            )
            (run,) = _cron_runs(server, name)
            assert run["scheduled_for_ms"] == eight, run
        assert _cron_runs(server, "jd_fruit.js") == []  # 08:30 has not come

        sign_log = server.cli("run", "logs", _cron_runs(server, "jd_sign.py")[0]["id"]).stdout
        assert "region cn-east wheel from-the-wheel" in sign_log
        assert "cookie ***" in sign_log and "disabled absent" in sign_log and COOKIE not in sign_log
        shell_log = server.cli("run", "logs", _cron_runs(server, "checkin.sh")[0]["id"]).stdout
        assert "shell cn-east" in shell_log and "cookie ***" in shell_log and COOKIE not in shell_log

        for title, message in (("签到完成", "python cn-east"), ("shell done", "from bash cn-east")):
            wait_for(partial(_received, receiver, title), 30, what=f"the notification {title!r}")
            (payload,) = [p for p in receiver.payloads() if p.get("title") == title]
            assert payload["message"] == message and payload["event"] == "script"
        assert all(COOKIE not in json.dumps(p, ensure_ascii=False) for p in receiver.payloads())
    finally:
        stop(server.process)
        receiver.close()
