"""A durable process handle encodes to one exact, bounded text and rejects every malformed variant."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from ql3.execution.identity import HANDLE_PREFIX, MAX_HANDLE_BYTES, InvalidHandle, ProcessHandle

BOOT = "402a5320-97c6-405f-b9a7-87de3a7b0088"


def _handle(**overrides: Any) -> ProcessHandle:
    values: dict[str, Any] = {
        "attempt_id": "0190c1a2-7b3c-7d4e-8f00-112233445566",
        "boot_id": BOOT,
        "pid": 4242,
        "pgid": 4242,
        "start_ticks": "987654",
    }
    values.update(overrides)
    return ProcessHandle(**values)


def _wrap(payload: bytes) -> str:
    return HANDLE_PREFIX + base64.urlsafe_b64encode(payload).rstrip(b"=").decode()


def _json(**overrides: Any) -> bytes:
    obj: dict[str, Any] = {"v": 1, "h": "att", "b": BOOT, "p": 10, "g": 10, "s": "123"}
    obj.update(overrides)
    return json.dumps({k: v for k, v in obj.items() if v is not ...}, separators=(",", ":")).encode()


def test_encode_is_prefixed_unpadded_base64url_of_compact_json_in_fixed_order() -> None:
    text = _handle().encode()

    assert text.startswith("ql3lp1.")
    assert "=" not in text and len(text) <= 512
    body = text[len(HANDLE_PREFIX) :]
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    assert raw == (
        b'{"v":1,"h":"0190c1a2-7b3c-7d4e-8f00-112233445566","b":"' + BOOT.encode() + b'",'
        b'"p":4242,"g":4242,"s":"987654"}'
    )


def test_decode_round_trips_encode() -> None:
    handle = _handle(pgid=17, start_ticks="1" * 32)

    assert ProcessHandle.decode(handle.encode()) == handle


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ql3lp2." + _wrap(_json())[len(HANDLE_PREFIX) :],
        _wrap(_json()) + "=",
        _wrap(_json()) + "!",
        _wrap(_json())[:-1] + "\n",
        HANDLE_PREFIX + "A",
        _wrap(b"not json"),
        _wrap(b"[1,2]"),
        _wrap(b'{"v":1,"v":1,"h":"a","b":"b","p":1,"g":1,"s":"1"}'),
        _wrap(_json(x=1)),
        _wrap(_json(s=...)),
        _wrap(_json(v=2)),
        _wrap(_json(v=True)),
        _wrap(_json(v=1.0)),
        _wrap(_json(h="")),
        _wrap(_json(h="a" * 256)),
        _wrap(_json(h=5)),
        _wrap(_json(b="not/a-boot-id")),
        _wrap(_json(b="a" * 65)),
        _wrap(_json(b="")),
        _wrap(_json(p=0)),
        _wrap(_json(p=-3)),
        _wrap(_json(p="10")),
        _wrap(_json(p=True)),
        _wrap(_json(p=2**31)),
        _wrap(_json(g=0)),
        _wrap(_json(s="")),
        _wrap(_json(s="1" * 33)),
        _wrap(_json(s="12a")),
        _wrap(_json(s=123)),
        _wrap(_json(s="١٢٣")),
        _wrap(b'{"v":1,"h":"a","b":"b","p":NaN,"g":1,"s":"1"}'),
        HANDLE_PREFIX + "A" * 600,
    ],
)
def test_decode_rejects_malformed_text_with_a_fixed_message(text: str) -> None:
    with pytest.raises(InvalidHandle) as caught:
        ProcessHandle.decode(text)

    assert str(caught.value) == "The process handle is malformed."
    assert isinstance(caught.value, ValueError)


def test_decode_rejects_non_canonical_base64_spellings() -> None:
    # Given a valid handle whose last base64 character carries unused bits
    text = _handle().encode()
    body = text[len(HANDLE_PREFIX) :]
    assert len(body) % 4 in (2, 3)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    # When the unused low bits are set
    tweaked = body[:-1] + alphabet[alphabet.index(body[-1]) | 1]

    # Then the alternative spelling is rejected, not silently accepted
    with pytest.raises(InvalidHandle):
        ProcessHandle.decode(HANDLE_PREFIX + tweaked)


def test_decode_rejects_non_string_input() -> None:
    with pytest.raises(InvalidHandle):
        ProcessHandle.decode(b"ql3lp1.AAAA")


def test_construction_validates_fields_and_the_512_byte_bound() -> None:
    with pytest.raises(InvalidHandle):
        _handle(boot_id="bad boot id")
    with pytest.raises(InvalidHandle):
        _handle(pid=0)
    with pytest.raises(InvalidHandle):
        _handle(start_ticks="-1")
    with pytest.raises(InvalidHandle):
        _handle(attempt_id="x" * 255, boot_id="b" * 64, start_ticks="9" * 32)


@pytest.mark.parametrize(
    "fields",
    [
        {"attempt_id": "a"},
        {"attempt_id": "a" * 255, "boot_id": "b", "start_ticks": "1"},
        {"pid": 1, "pgid": 1},
        {"pid": 2**31 - 1, "pgid": 2**31 - 1},
    ],
    ids=["one-char-attempt", "255-char-attempt", "pid-1", "max-pid"],
)
def test_the_bounds_of_every_field_are_accepted_and_round_trip(fields: dict[str, Any]) -> None:
    handle = _handle(**fields)

    assert ProcessHandle.decode(handle.encode()) == handle


@pytest.mark.parametrize(
    "payload",
    [
        b'{"v": 1, "h": "att", "b": "b", "p": 10, "g": 10, "s": "123"}',  # not compact
        b'{"v":1,"h":"att","b":"b","p":10,"g":10,"s":"123"} ',  # trailing whitespace
        b'{"h":"att","v":1,"b":"b","p":10,"g":10,"s":"123"}',  # another key order
        b'{"v":1,"h":"\\u0061tt","b":"b","p":10,"g":10,"s":"123"}',  # an escaped character
    ],
    ids=["spaces", "trailing-space", "key-order", "escape"],
)
def test_decode_rejects_every_other_json_spelling_of_a_valid_handle(payload: bytes) -> None:
    # Given the same fields as a valid handle, spelt another way
    canonical = ProcessHandle(attempt_id="att", boot_id="b", pid=10, pgid=10, start_ticks="123")
    assert json.loads(payload) == json.loads(base64.urlsafe_b64decode(canonical.encode()[7:] + "=="))

    # Then only the one compact spelling decodes
    with pytest.raises(InvalidHandle):
        ProcessHandle.decode(_wrap(payload))
    assert ProcessHandle.decode(canonical.encode()) == canonical


def test_an_oversized_text_is_refused_before_any_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a text one body of base64 (a multiple of 4 characters) past the 512-byte bound
    text = HANDLE_PREFIX + "A" * 508
    assert len(text) > MAX_HANDLE_BYTES
    real = base64.urlsafe_b64decode
    decoded: list[str | bytes] = []

    def recording(s: str | bytes) -> bytes:
        decoded.append(s)
        return real(s)

    monkeypatch.setattr(base64, "urlsafe_b64decode", recording)

    # When it is decoded, Then it is refused on its size alone: nothing was base64-decoded
    with pytest.raises(InvalidHandle):
        ProcessHandle.decode(text)
    assert decoded == []
    # (the same text within the bound is decoded, and refused only then)
    with pytest.raises(InvalidHandle):
        ProcessHandle.decode(HANDLE_PREFIX + "A" * 500)
    assert len(decoded) == 1
