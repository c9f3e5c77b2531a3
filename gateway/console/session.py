"""The console's sessions and CSRF tokens: signed, stateless, shared by every gateway.

A session is a cookie (HttpOnly, SameSite=Strict) holding `<key id>.<nonce>.<expires s>.<mac>`:
the API key it logged in with (by id, never the key), a random nonce, and an HMAC-SHA256 over
those and the key's stored hash, made with a secret every gateway reads from Redis (made once
by the first). So a revoked key ends its sessions at once, any gateway accepts a session
another began, and nothing on the server side needs storing. A visitor who has not logged in
(or a console that needs no key) gets a session with key id `-`, so that the login form, and
every form of an open console, carries a CSRF token too.

The CSRF token of a session is an HMAC of its nonce: a form's hidden `csrf` field must carry it
on every POST. A new session (a login) gets a new nonce, and so a new token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from broker.infra.connection import AsyncRedis
from broker.keys import RegistryKeys
from broker.settings import Settings

COOKIE = "reach_console"
SESSION_TTL_S = 12 * 3600
ANONYMOUS = "-"


@dataclass(frozen=True, slots=True)
class Session:
    key_id: str
    """The API key's id, or ANONYMOUS."""
    nonce: str
    expires_s: int

    @property
    def anonymous(self) -> bool:
        return self.key_id == ANONYMOUS


def new_session(key_id: str = ANONYMOUS, now_s: float | None = None) -> Session:
    return Session(key_id, secrets.token_hex(12), int((now_s or time.time()) + SESSION_TTL_S))


def _mac(secret: bytes, session: Session, key_sha: str) -> str:
    text = f"{session.key_id}.{session.nonce}.{session.expires_s}.{key_sha}"
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def encode(secret: bytes, session: Session, key_sha: str = "") -> str:
    """The cookie's value; `key_sha` is the stored hash of the session's key ('' if anonymous)."""
    return f"{session.key_id}.{session.nonce}.{session.expires_s}.{_mac(secret, session, key_sha)}"


def decode(value: str | None, now_s: float | None = None) -> tuple[Session, str] | None:
    """(session, mac) of a cookie that is well formed and not expired; check() verifies the mac."""
    parts = (value or "").split(".")
    if len(parts) != 4 or len(value or "") > 200:
        return None
    key_id, nonce, expires, mac = parts
    if not (key_id and nonce.isalnum() and expires.isascii() and expires.isdigit() and mac.isalnum()):
        return None
    session = Session(key_id, nonce, int(expires))
    if session.expires_s < (now_s or time.time()):
        return None
    return session, mac


def check(secret: bytes, session: Session, mac: str, key_sha: str = "") -> bool:
    return hmac.compare_digest(mac.encode(), _mac(secret, session, key_sha).encode())


def csrf_token(secret: bytes, session: Session) -> str:
    return hmac.new(secret, f"csrf.{session.nonce}".encode(), hashlib.sha256).hexdigest()[:40]


def csrf_ok(secret: bytes, session: Session, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest((token or "").encode(), csrf_token(secret, session).encode())


class Secret:
    """The signing secret, read from Redis once (made there by the first gateway to need it)."""

    def __init__(self, settings: Settings, client: AsyncRedis) -> None:
        self.key = RegistryKeys(settings.prefix).console_secret
        self.client = client
        self._value: bytes | None = None

    async def get(self) -> bytes:
        if self._value is None:
            # (Read first: a gateway whose Redis user may only read, a read-only console, uses
            # the secret another gateway made.)
            value = await self.client.get(self.key)
            if value is None:
                await self.client.set(self.key, secrets.token_hex(32), nx=True)
                value = await self.client.get(self.key)
            self._value = str(value).encode()
        return self._value
