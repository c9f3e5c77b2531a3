"""API keys of the gateway: made and revoked with `reach keys`, checked on every request.

A key is shown once, when it is made (`rk_` and 43 random characters); Redis holds only its
SHA-256 (the hash `apikeys` of broker/keys.py maps each key's hash to its record), so a copy of
the database gives no usable key. Each key has a role:

    reader     reads tasks, events, agents, queues
    producer   a reader that also submits and cancels tasks
    operator   a producer that may also do what operators do (the console's actions)
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from broker.errors import BadInput
from broker.infra.connection import AsyncRedis, SyncRedis
from broker.keys import RegistryKeys
from broker.settings import Settings

KEY_PREFIX = "rk_"
MAX_NAME_LEN = 100


class AuthMode(StrEnum):
    """When a gateway asks for a key (see gateway/auth.py)."""

    AUTO = "auto"
    """Loopback addresses: no key needed while none exists."""
    REQUIRED = "required"
    OFF = "off"
    """`--insecure-no-auth`."""


class Role(StrEnum):
    READER = "reader"
    PRODUCER = "producer"
    OPERATOR = "operator"

    def allows(self, needed: Role) -> bool:
        """Whether a key of this role may do what `needed` may (each role includes the ones before)."""
        return _RANK[self] >= _RANK[needed]


_RANK = {Role.READER: 0, Role.PRODUCER: 1, Role.OPERATOR: 2}


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    name: str
    role: Role
    created_at: str

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "role": self.role.value}

    @classmethod
    def from_json(cls, text: str) -> KeyRecord | None:
        try:
            data = json.loads(text)
            return cls(id=str(data["id"]), name=str(data.get("name") or ""), role=Role(data["role"]),
                       created_at=str(data.get("created_at") or ""))
        except (ValueError, KeyError, TypeError):
            return None


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_role(text: str) -> Role:
    try:
        return Role(text)
    except ValueError:
        raise BadInput(f"unknown role {text!r}: use {', '.join(r.value for r in Role)}") from None


def create_key(client: SyncRedis, settings: Settings, role: Role, name: str = "") -> tuple[str, KeyRecord]:
    """Make a key; returns its text (shown once, never stored) and its record."""
    if len(name) > MAX_NAME_LEN or any(ord(c) < 32 for c in name):
        raise BadInput(f"--name must be at most {MAX_NAME_LEN} printable characters")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    record = KeyRecord(id=secrets.token_hex(4), name=name, role=role,
                       created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    client.hset(RegistryKeys(settings.prefix).api_keys, key_sha256(key), json.dumps(record.as_dict()))
    return key, record


def list_keys(client: SyncRedis, settings: Settings) -> list[KeyRecord]:
    raw: Any = client.hgetall(RegistryKeys(settings.prefix).api_keys)
    records = [r for text in raw.values() if (r := KeyRecord.from_json(text)) is not None]
    return sorted(records, key=lambda r: (r.created_at, r.id))


def revoke_key(client: SyncRedis, settings: Settings, key_id: str) -> bool:
    """Remove the key with this id (as `keys list` shows it); False when there is none."""
    where = RegistryKeys(settings.prefix).api_keys
    raw: Any = client.hgetall(where)
    hashes = [sha for sha, text in raw.items()
              if (r := KeyRecord.from_json(text)) is not None and r.id == key_id]
    if hashes:
        client.hdel(where, *hashes)
    return bool(hashes)


async def load_keys(client: AsyncRedis, settings: Settings) -> dict[str, KeyRecord]:
    """Every key's hash and record (the gateway's cache of them)."""
    raw: Any = await client.hgetall(RegistryKeys(settings.prefix).api_keys)
    return {sha: r for sha, text in raw.items() if (r := KeyRecord.from_json(text)) is not None}
