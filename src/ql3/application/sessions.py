"""Sign-in with a name and a password (and an optional TOTP code) into a console session
(docs/security.md "Console sign-in").

- Passwords are hashed with argon2id (argon2-cffi; OWASP's parameters: 19 MiB, 2 passes).
- A session is a random secret in an HttpOnly cookie; the database holds its digest only. Its CSRF
  token is derived from the secret (a domain-separated digest), so it needs no storage and only a page
  that can read the session's own answers (same origin) learns it.
- A session ends at the earlier of its idle end (``idle_ms`` after its last recorded use) and its
  absolute end (``max_ms`` after sign-in), when it is revoked, or when its principal is.
- Failed attempts lock the name (in the database, ``max_failures`` in a row -> ``lockout_ms``) and the
  client address (in memory, a bounded map per process).
- TOTP is RFC 6238 (HMAC-SHA1, 6 digits, 30 s steps, one step of drift either way), with a replay
  guard: a step at or before the last one used is refused. The secret is sealed like project secrets.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import quote

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from ql3.application import auth
from ql3.domain.digests import digest_equals, domain_digest, new_token
from ql3.domain.errors import Conflict, NotFound, PermissionDenied, SecretsUnavailable, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Principal, Project
from ql3.domain.tasks import validate_name
from ql3.ports.secrets import SecretBox
from ql3.ports.storage import Transaction
from ql3.repositories import sessions as store
from ql3.repositories.sessions import Login as Login
from ql3.repositories.sessions import Session as Session

SESSION_DOMAIN: Final = "ql3.console-session.v1"
CSRF_DOMAIN: Final = "ql3.console-csrf.v1"
SESSION_PREFIX: Final = "ql3s_"
MAX_SECRET_LENGTH: Final = 128
MIN_PASSWORD: Final = 8
MAX_PASSWORD: Final = 1024
TOTP_STEP_S: Final = 30
TOTP_DIGITS: Final = 6
TOTP_DRIFT_STEPS: Final = 1
MAX_SESSION_PAGE: Final = 100
MAX_USER_PAGE: Final = 500
# A session's last use is written at most this often (and at most a tenth of its idle time).
TOUCH_GRANULARITY_MS: Final = 60_000
# Ended sessions are deleted at the principal's next sign-in once they ended this long ago.
PRUNE_AFTER_MS: Final = 86_400_000

_hasher = PasswordHasher(time_cost=2, memory_cost=19_456, parallelism=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPolicy:
    """How long sessions last and when sign-in locks (``ql3 serve``'s QL3_SESSION_* / QL3_SIGNIN_*)."""

    idle_ms: int = 12 * 3_600_000
    max_ms: int = 30 * 86_400_000
    max_failures: int = 5
    lockout_ms: int = 15 * 60_000
    address_max_failures: int = 20


# -- passwords ----------------------------------------------------------------------------------


def hash_password(password: object) -> str:
    """The argon2id hash of a valid password (8-1024 characters); slow on purpose: call it outside
    any transaction."""
    if not isinstance(password, str) or not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise ValidationFailed(f"a password has {MIN_PASSWORD}-{MAX_PASSWORD} characters", field="password")
    if "\x00" in password:
        raise ValidationFailed("a password has no NUL character", field="password")
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


_dummy_lock = threading.Lock()
_dummy: list[str] = []


def burn_verification(password: str) -> None:
    """As much work as verifying a real hash, for a name that does not exist (no timing oracle)."""
    with _dummy_lock:
        if not _dummy:
            _dummy.append(_hasher.hash(secrets.token_urlsafe(16)))
        dummy = _dummy[0]
    verify_password(dummy, password)


# -- TOTP (RFC 6238) ----------------------------------------------------------------------------


def totp_code(secret_b32: str, step: int) -> str:
    key = base64.b32decode(secret_b32.upper() + "=" * (-len(secret_b32) % 8))
    mac = hmac.new(key, struct.pack(">Q", step), hashlib.sha1).digest()
    offset = mac[-1] & 0x0F
    number = struct.unpack(">I", mac[offset : offset + 4])[0] & 0x7FFFFFFF
    return str(number % 10**TOTP_DIGITS).zfill(TOTP_DIGITS)


def totp_match(secret_b32: str, code: str, now_ms: int) -> int | None:
    """The step ``code`` is valid for at ``now_ms`` (one step of drift either way), or None."""
    if len(code) != TOTP_DIGITS or not code.isdigit():
        return None
    current = now_ms // 1000 // TOTP_STEP_S
    for step in range(current - TOTP_DRIFT_STEPS, current + TOTP_DRIFT_STEPS + 1):
        if hmac.compare_digest(totp_code(secret_b32, step), code):
            return step
    return None


def _totp_context(principal_id: str) -> str:
    return f"ql3.totp.v1\0{principal_id}"


def totp_uri(login: str, secret_b32: str) -> str:
    return (
        f"otpauth://totp/ql3:{quote(login, safe='')}?secret={secret_b32}&issuer=ql3"
        f"&algorithm=SHA1&digits={TOTP_DIGITS}&period={TOTP_STEP_S}"
    )


# -- the per-address limit ----------------------------------------------------------------------


class AddressLimiter:
    """Failed sign-ins per client address, in memory: at most ``capacity`` addresses (the oldest
    forgotten first); ``max_failures`` within ``lockout_ms`` of the first locks the address until
    ``lockout_ms`` after the last failure."""

    def __init__(self, *, max_failures: int, lockout_ms: int, capacity: int = 10_000) -> None:
        self.max_failures = max_failures
        self.lockout_ms = lockout_ms
        self.capacity = capacity
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, tuple[int, int]] = OrderedDict()  # address -> (failures, last ms)

    def locked_until(self, address: str, now_ms: int) -> int | None:
        with self._lock:
            entry = self._seen.get(address)
            if entry is None:
                return None
            count, last = entry
            if last + self.lockout_ms <= now_ms:
                del self._seen[address]
                return None
            return last + self.lockout_ms if count >= self.max_failures else None

    def failed(self, address: str, now_ms: int) -> None:
        with self._lock:
            count, last = self._seen.pop(address, (0, now_ms))
            if last + self.lockout_ms <= now_ms:
                count = 0
            self._seen[address] = (count + 1, now_ms)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._seen.pop(address, None)

    def __len__(self) -> int:
        return len(self._seen)


# -- sign-in ------------------------------------------------------------------------------------


SignInOutcome = Literal["ok", "failed", "locked", "totp_required"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NewSession:
    session: Session
    principal: Principal
    secret: str
    csrf_token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SignInResult:
    """What a sign-in attempt came to; the caller commits it before answering (a failure is
    recorded, so it must not be rolled back by raising inside the transaction)."""

    outcome: SignInOutcome
    retry_after_ms: int = 0
    created: NewSession | None = None


def csrf_token(secret: str) -> str:
    return domain_digest(CSRF_DOMAIN, secret)


def csrf_matches(secret: str, presented: str | None) -> bool:
    return bool(presented) and digest_equals(csrf_token(secret), str(presented))


def read_login(tx: Transaction, login: str) -> Login | None:
    if not isinstance(login, str) or not 0 < len(login) <= 128:
        return None
    return store.get_login(tx, login)


def complete_sign_in(
    tx: Transaction,
    policy: SessionPolicy,
    box: SecretBox | None,
    *,
    seen: Login | None,
    password_ok: bool,
    totp: str | None,
    client: str,
    user_agent: str,
) -> SignInResult:
    """The write half of a sign-in, after the password was checked outside the transaction against
    ``seen`` (the login as read before): lock-out, failure counting, TOTP and the new session."""
    if seen is None:
        return SignInResult(outcome="failed")
    login = store.get_login_of(tx, seen.principal.id)
    now = tx.now_ms()
    if login is None or login.login != seen.login or login.disabled_at_ms is not None:
        return SignInResult(outcome="failed")
    if login.locked_until_ms is not None and login.locked_until_ms > now:
        return SignInResult(outcome="locked", retry_after_ms=login.locked_until_ms - now)
    if not password_ok or login.password_hash != seen.password_hash:
        return _failed(tx, policy, login)
    step: int | None = None
    if login.totp_sealed is not None:
        if not totp:
            return SignInResult(outcome="totp_required")
        if box is None:
            raise SecretsUnavailable()
        secret_b32 = box.open(login.totp_sealed, _totp_context(login.principal.id))
        step = totp_match(secret_b32, totp.strip(), now)
        if step is None or (login.totp_last_step is not None and step <= login.totp_last_step):
            return _failed(tx, policy, login)
    store.record_success(tx, login.principal.id, totp_step=step if step is not None else login.totp_last_step)
    store.prune_sessions_of(tx, login.principal.id, before_ms=now - PRUNE_AFTER_MS)
    secret = new_token(SESSION_PREFIX)
    session_id = new_id()
    store.insert_session(
        tx,
        session_id=session_id,
        principal_id=login.principal.id,
        secret_digest=domain_digest(SESSION_DOMAIN, secret),
        idle_timeout_ms=policy.idle_ms,
        expires_at_ms=now + policy.max_ms,
        client=client[:64],
        user_agent=user_agent[:256],
    )
    created = store.get_session(tx, session_id)
    assert created is not None
    return SignInResult(
        outcome="ok",
        created=NewSession(
            session=created, principal=login.principal, secret=secret, csrf_token=csrf_token(secret)
        ),
    )


def _failed(tx: Transaction, policy: SessionPolicy, login: Login) -> SignInResult:
    store.record_failure(
        tx, login.principal.id, max_failures=policy.max_failures, lockout_ms=policy.lockout_ms
    )
    again = store.get_login_of(tx, login.principal.id)
    now = tx.now_ms()
    if again is not None and again.locked_until_ms is not None and again.locked_until_ms > now:
        return SignInResult(outcome="locked", retry_after_ms=again.locked_until_ms - now)
    return SignInResult(outcome="failed")


# -- the session on each request -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUse:
    session: Session
    principal: Principal
    needs_touch: bool


def authenticate_session(tx: Transaction, secret: str | None) -> SessionUse | None:
    """The live session with this secret, or None (unknown, revoked, idle or past its end, or its
    principal revoked)."""
    if not secret or len(secret) > MAX_SECRET_LENGTH or not secret.isascii():
        return None
    digest = domain_digest(SESSION_DOMAIN, secret)
    found = store.get_session_by_digest(tx, digest)
    if found is None or not digest_equals(found.session.secret_digest, digest):
        return None
    now = tx.now_ms()
    session = found.session
    if session.revoked_at_ms is not None or found.disabled_at_ms is not None or session.ends_at_ms() <= now:
        return None
    if found.principal.kind == "worker":
        return None
    granularity = min(TOUCH_GRANULARITY_MS, session.idle_timeout_ms // 10)
    return SessionUse(
        session=session, principal=found.principal, needs_touch=session.last_seen_at_ms < now - granularity
    )


def touch(tx: Transaction, session: Session) -> None:
    granularity = min(TOUCH_GRANULARITY_MS, session.idle_timeout_ms // 10)
    store.touch_session(tx, session.id, stale_before_ms=tx.now_ms() - granularity)


def sign_out(tx: Transaction, session_id: str) -> None:
    store.revoke_session(tx, session_id)


def list_own_sessions(tx: Transaction, principal: Principal) -> list[Session]:
    return store.list_sessions_of(tx, principal.id, limit=MAX_SESSION_PAGE)


def revoke_own_session(tx: Transaction, principal: Principal, session_id: str) -> Session:
    found = store.get_session(tx, session_id) if _valid_ref(session_id) else None
    if found is None or found.principal_id != principal.id:
        raise NotFound("session not found")
    store.revoke_session(tx, session_id)
    again = store.get_session(tx, session_id)
    assert again is not None
    return again


# -- managing users (admins of a project) ---------------------------------------------------------


def _valid_ref(ref: object) -> bool:
    return isinstance(ref, str) and 0 < len(ref) <= 128


def _user(tx: Transaction, caller: Principal, project: Project, login: str) -> Login:
    found = store.get_login(tx, login) if _valid_ref(login) else None
    if found is None:
        raise NotFound("user not found")
    try:
        auth.managed_principal(tx, caller, project, found.principal.id)
    except NotFound:
        raise NotFound("user not found") from None
    return found


def create_user(
    tx: Transaction,
    caller: Principal,
    project: Project,
    *,
    login: str,
    role: str,
    password_hash: str,
    attach_to_caller: bool = False,
) -> Login:
    """A sign-in name with a password: for a new principal with ``role`` in ``project``, or for the
    caller itself (``attach_to_caller``; its roles stay as they are)."""
    validate_name(login, "user name")
    if store.get_login(tx, login) is not None:
        raise Conflict("a user with that name exists", code_hint="name_taken")
    if attach_to_caller:
        principal_id = caller.id
    else:
        principal_id = auth.issue_token(
            tx, name=login, role=role, project=project, kind="user", issued_by=caller
        ).principal.id  # its token is never shown: this principal signs in with its password
    if not store.insert_login(tx, principal_id=principal_id, login=login, password_hash=password_hash):
        raise Conflict("the principal already has a user name", code_hint="user_exists")
    created = store.get_login(tx, login)
    assert created is not None
    return created


def set_user_password(
    tx: Transaction, caller: Principal, project: Project, login: str, password_hash: str
) -> int:
    """Replace the password, clear the lock-out, revoke every session; the number revoked."""
    found = _user(tx, caller, project, login)
    store.set_password(tx, found.principal.id, password_hash)
    return store.revoke_sessions_of(tx, found.principal.id)


def remove_user(tx: Transaction, caller: Principal, project: Project, login: str) -> int:
    """Remove the sign-in name (the principal and its token stay) and revoke its sessions."""
    found = _user(tx, caller, project, login)
    store.delete_login(tx, found.principal.id)
    return store.revoke_sessions_of(tx, found.principal.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class TotpEnabled:
    login: str
    secret: str
    uri: str


def enable_totp(
    tx: Transaction, caller: Principal, project: Project, login: str, box: SecretBox | None
) -> TotpEnabled:
    """A new TOTP secret for the user (replacing any), sealed at rest; returned once."""
    if box is None:
        raise SecretsUnavailable()
    found = _user(tx, caller, project, login)
    secret_b32 = base64.b32encode(secrets.token_bytes(20)).decode().rstrip("=")
    store.set_totp(tx, found.principal.id, box.seal(secret_b32, _totp_context(found.principal.id)))
    return TotpEnabled(login=found.login, secret=secret_b32, uri=totp_uri(found.login, secret_b32))


def disable_totp(tx: Transaction, caller: Principal, project: Project, login: str) -> None:
    found = _user(tx, caller, project, login)
    store.set_totp(tx, found.principal.id, None)


def list_users(tx: Transaction, project: Project, *, after: str = "", limit: int = 100) -> list[Login]:
    page = max(1, min(limit, MAX_USER_PAGE))
    return store.list_project_logins(tx, project_id=project.id, after=after, limit=page)


def list_user_sessions(tx: Transaction, caller: Principal, project: Project, login: str) -> list[Session]:
    found = _user(tx, caller, project, login)
    return store.list_sessions_of(tx, found.principal.id, limit=MAX_SESSION_PAGE)


def revoke_session(tx: Transaction, caller: Principal, project: Project, session_id: str) -> Session:
    """Revoke a session: the caller's own, or one of a principal the caller manages in ``project``."""
    found = store.get_session(tx, session_id) if _valid_ref(session_id) else None
    if found is None:
        raise NotFound("session not found")
    if found.principal_id != caller.id:
        try:
            auth.managed_principal(tx, caller, project, found.principal_id)
        except (NotFound, PermissionDenied):
            raise NotFound("session not found") from None
    store.revoke_session(tx, session_id)
    again = store.get_session(tx, session_id)
    assert again is not None
    return again
