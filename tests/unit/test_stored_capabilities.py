"""The dispatcher's per-cycle worker snapshot parses a stored capabilities text once, and still refuses a
bad one every time."""

from __future__ import annotations

import json

import pytest

from ql3.domain.errors import ValidationFailed
from ql3.domain.workers import parse_capabilities, stored_capabilities


def test_a_stored_text_parses_to_what_parse_capabilities_gives_and_is_parsed_once() -> None:
    raw = {"executors": ["local_process"], "operatingSystem": "linux", "labels": {"zone": "a", "gpu": "no"}}
    text = json.dumps(raw)
    stored_capabilities.cache_clear()

    first = stored_capabilities(text)
    again = stored_capabilities(text)

    assert first == parse_capabilities(raw)
    assert again is first
    info = stored_capabilities.cache_info()
    assert (info.hits, info.misses) == (1, 1)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"executors": []}),
        json.dumps({"executors": ["local_process"], "unknown": 1}),
        json.dumps({"executors": ["local_process"], "labels": {"k": "bad\u0001"}}),
        "not json",
    ],
)
def test_an_invalid_stored_text_is_refused_on_every_read(text: str) -> None:
    for _ in range(2):
        with pytest.raises((ValidationFailed, ValueError)):
            stored_capabilities(text)
