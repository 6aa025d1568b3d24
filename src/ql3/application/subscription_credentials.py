"""A subscription's deploy key or token, sealed at rest with the project secrets' key
(``$QL3_HOME/variables.key``, AES-256-GCM, ports/secrets.py), opened only to build the
``GitCredentials`` of a fetch (docs/scripts.md "Private repositories").

The stored text is the sealed form of ``ssh:KEY`` or ``token:TOKEN``, bound to the project and the
subscription's id (a sealed value copied to another row does not open). Rows written before sealing
existed hold that plaintext; ``seal_stored`` seals them (the subscriptions loop's first pass) and
``credentials_of`` still reads one meanwhile.
"""

from __future__ import annotations

import logging
from typing import Final

from ql3.domain.errors import SecretsUnavailable, SecretUnreadable, ValidationFailed
from ql3.domain.scripts import Subscription
from ql3.ports.secrets import SecretBox
from ql3.ports.storage import Database, Transaction
from ql3.repositories import scripts as store

SSH: Final = "ssh:"
TOKEN: Final = "token:"
PLAIN_PREFIXES: Final = (SSH, TOKEN)
MAX_STORED_CHARS: Final = 16384  # the column's CHECK (migrations 0024 / 0032)
SEAL_PAGE: Final = 100
MAX_SEAL_PAGES: Final = 10_000  # a bound far above any real count of subscriptions
_log = logging.getLogger(__name__)


def _context(project_id: str, subscription_id: str) -> str:
    return f"subscription:{project_id}:{subscription_id}"


def is_plaintext(stored: str | None) -> bool:
    return stored is not None and stored.startswith(PLAIN_PREFIXES)


def seal(box: SecretBox | None, project_id: str, subscription_id: str, secret: str) -> str:
    """``secret`` (``ssh:KEY`` or ``token:TOKEN``) as stored; a server without the key keeps none
    (503 ``secrets_unavailable``, as for a project secret)."""
    if box is None:
        raise SecretsUnavailable("this server has no key for secrets ($QL3_HOME/variables.key)")
    sealed = box.seal(secret, _context(project_id, subscription_id))
    if len(sealed) > MAX_STORED_CHARS:
        raise ValidationFailed("the credential is too long", field="deploy_key")
    return sealed


def plain_credential(sub: Subscription, box: SecretBox | None) -> str | None:
    """``ssh:KEY``, ``token:TOKEN`` or None. A credential this server cannot open (no key, another
    key) is a ``ValidationFailed`` naming no value: the sync fails with it and changes nothing."""
    stored = sub.deploy_key
    if stored is None or is_plaintext(stored):
        return stored
    if box is None:
        raise ValidationFailed("the subscription's credential is sealed and this server has no key")
    try:
        return box.open(stored, _context(sub.project_id, sub.id))
    except SecretUnreadable:
        raise ValidationFailed(
            "the subscription's credential does not open with this server's key ($QL3_HOME/variables.key)"
        ) from None


def seal_stored(db: Database, box: SecretBox | None) -> int:
    """Seal every credential still stored in plaintext (written by an older version), a page per
    transaction, each row compare-and-set on the text read; the number sealed. A credential too long
    to seal within the column's limit (a deploy key over ``MAX_DEPLOY_KEY_CHARS``, which no version
    accepts any more) is removed, with a warning naming the subscription: its syncs fail until it is
    given again. Bounded: each row leaves the plaintext set once."""
    if box is None:
        return 0
    sealed = 0
    for _ in range(MAX_SEAL_PAGES):
        done = db.transaction(lambda tx: _seal_page(tx, box))
        sealed += done
        if done < SEAL_PAGE:
            break
    return sealed


def _seal_page(tx: Transaction, box: SecretBox) -> int:
    rows = store.plaintext_credentials(tx, limit=SEAL_PAGE)
    for sub_id, project_id, name, plain in rows:
        value: str | None = box.seal(plain, _context(project_id, sub_id))
        if value is not None and len(value) > MAX_STORED_CHARS:
            _log.warning(
                "subscription %s of project %s: credential too long to seal, removed", name, project_id
            )
            value = None
        store.replace_credential(tx, sub_id, expected=plain, credential=value)
    return len(rows)
