"""The fleet's join secret: what `reach agents secret set` stores, and what a worker presents.

Only a verifier is stored, never the secret: a random per-fleet salt, an iteration count, and
`sha1(proof)` where `proof = PBKDF2-HMAC-SHA256(secret, salt, iterations)`. A worker derives
the proof from its secret and the stored salt and sends it with its registration; register.lua
hashes it and compares with the verifier in constant time. So whoever reads the stored hash
(a read-only console user, a backup) cannot register with it, and the secret itself never
crosses the wire. Setting a new secret replaces salt and verifier at once: agents already
registered keep their tokens; only new registrations need the new secret.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from broker.errors import BadInput
from broker.keys import RegistryKeys
from broker.settings import Settings

ITERATIONS = 100_000
"""PBKDF2 rounds: a leaked proof (it crosses the wire) is slow to turn back into the secret."""
MIN_SECRET_CHARS = 16
MAX_SECRET_CHARS = 1024


@dataclass(frozen=True, slots=True)
class JoinParams:
    """What a worker needs from the stored record to derive its proof."""

    salt: str
    iterations: int


def check_secret(secret: str) -> str:
    """The secret as given, or BadInput saying why it will not do."""
    if len(secret) < MIN_SECRET_CHARS:
        raise BadInput(f"a join secret needs at least {MIN_SECRET_CHARS} characters "
                       "(e.g. `openssl rand -hex 24`)")
    if len(secret) > MAX_SECRET_CHARS:
        raise BadInput(f"a join secret may have at most {MAX_SECRET_CHARS} characters")
    if secret != secret.strip() or any(ord(ch) < 32 for ch in secret):
        raise BadInput("a join secret may not hold control characters or surrounding spaces")
    return secret


def join_proof(secret: str, params: JoinParams) -> str:
    """What a worker presents (hex): the secret stretched with the fleet's salt."""
    return hashlib.pbkdf2_hmac("sha256", secret.encode(), bytes.fromhex(params.salt),
                               params.iterations).hex()


def verifier(proof: str) -> str:
    """What the registry keeps of a proof (register.lua computes the same with sha1hex)."""
    return hashlib.sha1(proof.encode()).hexdigest()


def parse_params(fields: dict[str, Any]) -> JoinParams | None:
    """The stored record's salt and iterations; None when no secret is set (or the record is
    not one we can use: registration then fails with a clear refusal, never a crash)."""
    try:
        salt, iterations = str(fields["salt"]), int(fields["iterations"])
        bytes.fromhex(salt)
    except (KeyError, ValueError, TypeError):
        return None
    return JoinParams(salt, iterations) if 0 < iterations <= 10_000_000 else None


def set_secret(client: Any, settings: Settings, secret: str, now_ms: int) -> None:
    """Store the verifier of a new secret (replacing any earlier one, salt and all)."""
    params = JoinParams(secrets.token_hex(16), ITERATIONS)
    record = {"salt": params.salt, "iterations": str(params.iterations),
              "verifier": verifier(join_proof(check_secret(secret), params)), "set_at": str(now_ms)}
    key = RegistryKeys(settings.prefix).join_secret
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    pipe.hset(key, mapping=record)
    pipe.execute()


def clear_secret(client: Any, settings: Settings) -> bool:
    """Let agents register without a secret again; whether one was set."""
    return bool(client.delete(RegistryKeys(settings.prefix).join_secret))


def secret_set_at(client: Any, settings: Settings) -> int | None:
    """When the current secret was set (ms), or None when there is none."""
    value = client.hget(RegistryKeys(settings.prefix).join_secret, "set_at")
    return int(value) if value else None
