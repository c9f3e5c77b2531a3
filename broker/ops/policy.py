"""Reading and changing policies (broker/policy.py), for `reach policy ...`, `reach pause` and the
clients' `policy()` / `set_policy()`: every change goes through policy_set.lua, which records it
in the policy's history and tells the dispatchers."""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any

from broker.errors import BadInput
from broker.ids import check_capability
from broker.infra.connection import SyncRedis
from broker.policy import FIELDS, Policy, Source, built_in, encode, resolve
from broker.protocol.policy import (
    Change,
    parse_changes,
    policy_keys,
    policy_reset_call,
    policy_set_call,
)
from broker.scripts import Scripts
from broker.settings import Settings


def operator() -> str:
    """Who makes a change, as its history records it (user@host)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def read(client: SyncRedis, settings: Settings, capability: str | None) -> Policy:
    """The effective policy of a capability (None: the fleet's defaults), with sources."""
    if capability is not None:
        check_capability(capability)
    fleet_key, _ = policy_keys(settings, None)
    fleet: Any = client.hgetall(fleet_key)
    if capability is None:
        return resolve(None, fleet, {})
    own: Any = client.hgetall(policy_keys(settings, capability)[0])
    return resolve(capability, own, fleet)


def _checked(values: Mapping[str, Any]) -> dict[str, str]:
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise BadInput(f"unknown policy field(s): {', '.join(unknown)}")
    if not values:
        raise BadInput("nothing to set: give at least one field")
    return {name: encode(name, value) for name, value in values.items()}


def set_fields(client: SyncRedis, scripts: Scripts, settings: Settings, capability: str | None,
               values: Mapping[str, Any], who: str | None = None) -> list[Change]:
    """Set fields (validated first: BadInput and nothing written); returns what changed."""
    if capability is not None:
        check_capability(capability)
    encoded = _checked(values)
    who = who or operator()
    source = Source("set", who, round(time.time() * 1000),
                    "capability" if capability else "fleet").encode()
    return parse_changes(scripts(policy_set_call(settings, capability, encoded, who, source)))


def reset_fields(client: SyncRedis, scripts: Scripts, settings: Settings, capability: str | None,
                 fields: Iterable[str] = (), who: str | None = None) -> list[Change]:
    """Reset fields (all of them when none are named) to what they inherit: a capability's to
    the fleet's, the fleet's to the built-in defaults."""
    names = list(fields) or list(FIELDS)
    unknown = sorted(set(names) - set(FIELDS))
    if unknown:
        raise BadInput(f"unknown policy field(s): {', '.join(unknown)}")
    if capability is None:
        fallbacks = dict.fromkeys(names, "")
    else:
        check_capability(capability)
        fleet = read(client, settings, None)
        fallbacks = {name: f"{encode(name, fleet[name])}|{fleet.sources[name].encode()}" for name in names}
    return parse_changes(scripts(policy_reset_call(settings, capability, fallbacks, who or operator())))


def history(client: SyncRedis, settings: Settings, capability: str | None,
            count: int = 100) -> list[dict[str, Any]]:
    """The latest changes, newest first: field, old, new, who, at (ms), change."""
    if capability is not None:
        check_capability(capability)
    _, stream = policy_keys(settings, capability)
    entries: Any = client.xrevrange(stream, count=count)
    out = []
    for _, fields in entries:
        at = fields.get("at", "0")
        out.append({"field": fields.get("field"), "old": fields.get("old") or None,
                    "new": fields.get("new") or None, "who": fields.get("who"),
                    "at": int(at) if at.isdigit() else 0, "change": fields.get("change")})
    return out


def describe(policy: Policy) -> list[dict[str, Any]]:
    """Each field with its value, whether it differs from the built-in default, and its source."""
    defaults = built_in()
    return [{"field": name, "value": policy[name], "default": defaults[name],
             "source": policy.sources[name].describe(), "set_at": policy.sources[name].at_ms or None}
            for name in FIELDS]
