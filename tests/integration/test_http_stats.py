"""``GET /projects/P/stats/runs``: buckets of a fixed range, a bad range refused with 422, a token and
a role with run.read required."""

from __future__ import annotations

from typing import Any

STATS = "/api/v1/projects/default/stats/runs"


def test_the_stats_route_answers_each_range_in_whole_buckets(client: Any, owner: Any) -> None:
    day = client.get(STATS, headers=owner)
    week = client.get(STATS, params={"range": "7d"}, headers=owner)

    assert day.status_code == 200, day.text
    body = day.json()
    assert body["range"] == "24h" and body["bucket_ms"] == 3_600_000 and len(body["buckets"]) == 24
    assert body["end_ms"] - body["start_ms"] == 24 * 3_600_000 and body["start_ms"] % 3_600_000 == 0
    assert body["start_ms"] + 23 * 3_600_000 <= body["now_ms"] < body["end_ms"]
    assert week.status_code == 200 and len(week.json()["buckets"]) == 28
    assert week.json()["bucket_ms"] == 6 * 3_600_000


def test_a_bad_range_or_caller_is_refused(client: Any, owner: Any, make_token: Any) -> None:
    outsider = make_token("viewer", project="elsewhere", name="outsider-stats")

    bad = client.get(STATS, params={"range": "1y"}, headers=owner)

    assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_failed"
    assert client.get(STATS).status_code == 401
    assert client.get(STATS, headers=outsider).status_code == 404
