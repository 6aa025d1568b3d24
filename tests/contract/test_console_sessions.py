"""Console sign-in on both databases: passwords, sessions (digest only, idle and absolute end,
revocation), the name's lock-out and TOTP with its replay guard (docs/security.md "Console sign-in")."""

from __future__ import annotations

import os

import pytest

from ql3.application import auth, sessions
from ql3.domain.errors import Conflict, NotFound, ValidationFailed
from ql3.repositories import sessions as store
from ql3.storage.secret_box import AesGcmBox
from tests.support.databases import Harness

BOX = AesGcmBox(os.urandom(32))
POLICY = sessions.SessionPolicy(idle_ms=60_000, max_ms=600_000, max_failures=3, lockout_ms=120_000)
PASSWORD = "correct horse battery"


def _owner(harness: Harness) -> auth.IssuedToken:
    issued: auth.IssuedToken | None = harness.db.transaction(auth.bootstrap_owner)
    assert issued is not None
    return issued


def _user(
    harness: Harness, owner: auth.IssuedToken, name: str = "alice", role: str = "operator"
) -> sessions.Login:
    digest = sessions.hash_password(PASSWORD)
    created: sessions.Login = harness.db.transaction(
        lambda tx: sessions.create_user(
            tx, owner.principal, owner.project, login=name, role=role, password_hash=digest
        )
    )
    return created


def _sign_in(
    harness: Harness, name: str, password: str = PASSWORD, totp: str | None = None
) -> sessions.SignInResult:
    seen = harness.db.transaction(lambda tx: sessions.read_login(tx, name), write=False)
    ok = seen is not None and sessions.verify_password(seen.password_hash, password)
    result: sessions.SignInResult = harness.db.transaction(
        lambda tx: sessions.complete_sign_in(
            tx, POLICY, BOX, seen=seen, password_ok=ok, totp=totp, client="127.0.0.1", user_agent="test"
        )
    )
    return result


def _use(harness: Harness, secret: str) -> sessions.SessionUse | None:
    found: sessions.SessionUse | None = harness.db.transaction(
        lambda tx: sessions.authenticate_session(tx, secret), write=False
    )
    return found


def test_a_user_signs_in_and_only_the_digest_of_the_session_is_stored(harness: Harness) -> None:
    owner = _owner(harness)
    user = _user(harness, owner)
    assert user.password_hash.startswith("$argon2id$") and PASSWORD not in user.password_hash

    result = _sign_in(harness, "alice")

    assert result.outcome == "ok" and result.created is not None
    created = result.created
    use = _use(harness, created.secret)
    assert use is not None and use.principal.id == user.principal.id and use.principal.name == "alice"
    stored = harness.db.transaction(lambda tx: store.get_session(tx, created.session.id), write=False)
    assert (
        stored is not None and created.secret not in stored.secret_digest and len(stored.secret_digest) == 64
    )
    assert stored.expires_at_ms == stored.created_at_ms + POLICY.max_ms
    assert created.csrf_token == sessions.csrf_token(created.secret) != created.secret
    assert sessions.csrf_matches(created.secret, created.csrf_token)
    assert not sessions.csrf_matches(created.secret, None)
    assert not sessions.csrf_matches(created.secret, sessions.csrf_token("ql3s_other"))
    assert _use(harness, created.secret + "x") is None
    # the user's role is the one it was created with
    roles = harness.db.transaction(lambda tx: auth.roles_of(tx, use.principal), write=False)
    assert roles == {"default": "operator"}


def test_a_wrong_password_or_an_unknown_name_fails(harness: Harness) -> None:
    owner = _owner(harness)
    _user(harness, owner)
    assert _sign_in(harness, "alice", "wrong password").outcome == "failed"
    assert _sign_in(harness, "nobody").outcome == "failed"
    assert _sign_in(harness, "ALICE").outcome == "failed"


def test_the_idle_end_and_the_absolute_end_sign_out(harness: Harness) -> None:
    owner = _owner(harness)
    _user(harness, owner)
    result = _sign_in(harness, "alice")
    assert result.created is not None
    secret = result.created.secret

    harness.advance_clock(POLICY.idle_ms - 1000)
    use = _use(harness, secret)
    assert use is not None and use.needs_touch
    harness.db.transaction(lambda tx: sessions.touch(tx, use.session))  # used: the idle end moves on
    harness.advance_clock(POLICY.idle_ms - 1000)
    assert _use(harness, secret) is not None
    harness.advance_clock(1000)
    assert _use(harness, secret) is None  # idle past its end

    again = _sign_in(harness, "alice")
    assert again.created is not None
    for _ in range(POLICY.max_ms // (POLICY.idle_ms // 2)):  # used every half idle period
        use = _use(harness, again.created.secret)
        assert use is not None
        harness.db.transaction(lambda tx, u=use: sessions.touch(tx, u.session))
        harness.advance_clock(POLICY.idle_ms // 2)
    assert _use(harness, again.created.secret) is None  # the absolute end, however much it is used


def test_sessions_are_listed_revoked_and_signing_out_revokes(harness: Harness) -> None:
    owner = _owner(harness)
    user = _user(harness, owner)
    first, second = _sign_in(harness, "alice").created, _sign_in(harness, "alice").created
    assert first is not None and second is not None
    listed = harness.db.transaction(lambda tx: sessions.list_own_sessions(tx, user.principal), write=False)
    assert {s.id for s in listed} == {first.session.id, second.session.id}

    harness.db.transaction(lambda tx: sessions.sign_out(tx, first.session.id))
    assert _use(harness, first.secret) is None and _use(harness, second.secret) is not None

    revoked = harness.db.transaction(
        lambda tx: sessions.revoke_session(tx, owner.principal, owner.project, second.session.id)
    )
    assert revoked.revoked_at_ms is not None
    assert _use(harness, second.secret) is None
    assert (
        harness.db.transaction(lambda tx: sessions.list_own_sessions(tx, user.principal), write=False) == []
    )
    # another user cannot see or revoke alice's session
    bob = _user(harness, owner, "bob", role="viewer")
    third = _sign_in(harness, "alice").created
    assert third is not None
    with pytest.raises(NotFound):
        harness.db.transaction(lambda tx: sessions.revoke_own_session(tx, bob.principal, third.session.id))
    assert _use(harness, third.secret) is not None


def test_a_new_password_and_a_revoked_principal_end_every_session(harness: Harness) -> None:
    owner = _owner(harness)
    user = _user(harness, owner)
    created = _sign_in(harness, "alice").created
    assert created is not None
    new_hash = sessions.hash_password("another long password")
    revoked = harness.db.transaction(
        lambda tx: sessions.set_user_password(tx, owner.principal, owner.project, "alice", new_hash)
    )
    assert revoked == 1 and _use(harness, created.secret) is None
    assert _sign_in(harness, "alice").outcome == "failed"
    later = _sign_in(harness, "alice", "another long password").created
    assert later is not None and _use(harness, later.secret) is not None

    harness.db.transaction(
        lambda tx: auth.revoke_token(tx, owner.principal, owner.project, user.principal.id)
    )
    assert _use(harness, later.secret) is None
    assert _sign_in(harness, "alice", "another long password").outcome == "failed"


def test_failed_attempts_lock_the_name_until_the_lockout_ends(harness: Harness) -> None:
    owner = _owner(harness)
    _user(harness, owner)
    assert [_sign_in(harness, "alice", "wrong password").outcome for _ in range(POLICY.max_failures)] == [
        "failed",
        "failed",
        "locked",
    ]
    locked = _sign_in(harness, "alice")  # the right password is refused while locked
    assert locked.outcome == "locked" and 0 < locked.retry_after_ms <= POLICY.lockout_ms
    stored = harness.db.transaction(lambda tx: store.get_login(tx, "alice"), write=False)
    assert stored is not None and stored.failed_count == POLICY.max_failures

    harness.advance_clock(POLICY.lockout_ms)
    assert _sign_in(harness, "alice").outcome == "ok"
    cleared = harness.db.transaction(lambda tx: store.get_login(tx, "alice"), write=False)
    assert cleared is not None and cleared.failed_count == 0 and cleared.locked_until_ms is None


def test_a_success_clears_the_failure_count(harness: Harness) -> None:
    owner = _owner(harness)
    _user(harness, owner)
    for _ in range(POLICY.max_failures - 1):
        assert _sign_in(harness, "alice", "wrong password").outcome == "failed"
    assert _sign_in(harness, "alice").outcome == "ok"
    for _ in range(POLICY.max_failures - 1):
        assert _sign_in(harness, "alice", "wrong password").outcome == "failed"


def test_totp_is_required_checked_and_not_replayed(harness: Harness) -> None:
    owner = _owner(harness)
    user = _user(harness, owner)
    enabled = harness.db.transaction(
        lambda tx: sessions.enable_totp(tx, owner.principal, owner.project, "alice", BOX)
    )
    assert enabled.uri.startswith("otpauth://totp/ql3:alice?secret=" + enabled.secret)
    stored = harness.db.transaction(lambda tx: store.get_login(tx, "alice"), write=False)
    assert stored is not None and stored.totp_sealed is not None and enabled.secret not in stored.totp_sealed

    assert _sign_in(harness, "alice").outcome == "totp_required"
    step = harness.now_ms() // 1000 // sessions.TOTP_STEP_S
    wrong = str((int(sessions.totp_code(enabled.secret, step)) + 1) % 10**6).zfill(6)
    assert _sign_in(harness, "alice", totp=wrong).outcome == "failed"
    code = sessions.totp_code(enabled.secret, step)
    ok = _sign_in(harness, "alice", totp=code)
    assert ok.outcome == "ok" and ok.created is not None and ok.created.principal.id == user.principal.id
    assert _sign_in(harness, "alice", totp=code).outcome == "failed"  # the same code again: a replay
    harness.advance_clock(sessions.TOTP_STEP_S * 1000)
    assert _sign_in(harness, "alice", totp=sessions.totp_code(enabled.secret, step + 1)).outcome == "ok"

    harness.db.transaction(lambda tx: sessions.disable_totp(tx, owner.principal, owner.project, "alice"))
    assert _sign_in(harness, "alice").outcome == "ok"


def test_the_rfc_6238_test_vector() -> None:
    # RFC 6238 appendix B, SHA-1: T = 59 s -> 94287082 (8 digits); the last 6 are the 6-digit code.
    secret = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ"  # base32 of "12345678901234567890"
    assert sessions.totp_code(secret, 59 // 30) == "287082"
    assert sessions.totp_code(secret, 1111111109 // 30) == "081804"


def test_names_are_unique_and_passwords_validated(harness: Harness) -> None:
    owner = _owner(harness)
    _user(harness, owner)
    with pytest.raises(Conflict):
        _user(harness, owner)
    with pytest.raises(ValidationFailed):
        sessions.hash_password("short")
    with pytest.raises(ValidationFailed):
        sessions.hash_password(123)
    # the owner gives itself a sign-in name; a second one for the same principal is refused
    digest = sessions.hash_password(PASSWORD)
    harness.db.transaction(
        lambda tx: sessions.create_user(
            tx,
            owner.principal,
            owner.project,
            login="root",
            role="admin",
            password_hash=digest,
            attach_to_caller=True,
        )
    )
    with pytest.raises(Conflict):
        harness.db.transaction(
            lambda tx: sessions.create_user(
                tx,
                owner.principal,
                owner.project,
                login="root2",
                role="admin",
                password_hash=digest,
                attach_to_caller=True,
            )
        )
    created = _sign_in(harness, "root").created
    assert created is not None and created.principal.id == owner.principal.id and created.principal.is_owner
    users = harness.db.transaction(lambda tx: sessions.list_users(tx, owner.project), write=False)
    assert [u.login for u in users] == ["alice", "root"]
    assert (
        harness.db.transaction(lambda tx: sessions.remove_user(tx, owner.principal, owner.project, "root"))
        == 1
    )
    assert _use(harness, created.secret) is None
    assert _sign_in(harness, "root").outcome == "failed"


def test_ended_sessions_are_pruned_at_the_next_sign_in(harness: Harness) -> None:
    owner = _owner(harness)
    user = _user(harness, owner)
    old = _sign_in(harness, "alice").created
    assert old is not None
    harness.advance_clock(POLICY.max_ms + sessions.PRUNE_AFTER_MS + 1)
    assert _sign_in(harness, "alice").outcome == "ok"
    assert harness.db.transaction(lambda tx: store.get_session(tx, old.session.id), write=False) is None
    assert (
        len(harness.db.transaction(lambda tx: sessions.list_own_sessions(tx, user.principal), write=False))
        == 1
    )


def test_the_address_limiter_locks_and_stays_bounded() -> None:
    limiter = sessions.AddressLimiter(max_failures=2, lockout_ms=1000, capacity=3)
    limiter.failed("a", 0)
    assert limiter.locked_until("a", 10) is None
    limiter.failed("a", 10)
    assert limiter.locked_until("a", 20) == 1010
    assert limiter.locked_until("a", 1010) is None  # the lock lapsed
    for i in range(10):
        limiter.failed(f"addr-{i}", 0)
    assert len(limiter) == 3
    limiter.failed("b", 0)
    limiter.failed("b", 0)
    limiter.succeeded("b")
    assert limiter.locked_until("b", 1) is None
