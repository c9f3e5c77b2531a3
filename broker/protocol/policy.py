"""The policy scripts: set and reset fields (with their history), seed from a dispatcher's
configuration, copy the fleet's defaults into a capability, and count what is handed out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.keys import CapabilityKeys, RegistryKeys
from broker.protocol.calls import ScriptCall, wake_channel
from broker.settings import Settings

FLEET = "*"
"""The name of the fleet's defaults where a capability name goes (wake-ups, the CLI)."""


def policy_keys(settings: Settings, capability: str | None) -> tuple[str, str]:
    """(policy hash, history stream) of a capability, or of the fleet's defaults (None)."""
    if capability is None:
        rk = RegistryKeys(settings.prefix)
        return rk.policy, rk.policy_history
    ck = CapabilityKeys(settings.prefix, capability)
    return ck.policy, ck.policy_history


@dataclass(frozen=True, slots=True)
class Change:
    field: str
    old: str
    new: str


def policy_set_call(settings: Settings, capability: str | None, values: Mapping[str, str],
                    who: str, source: str) -> ScriptCall:
    """Set fields (encoded values, see broker/policy.py) of a capability's policy or the fleet's."""
    return _set_call(settings, capability, "set", values, who, source)


def policy_reset_call(settings: Settings, capability: str | None, fallbacks: Mapping[str, str],
                      who: str) -> ScriptCall:
    """Reset fields: a capability's to the fleet's (`value|source` each), the fleet's to the
    built-in defaults ('' each)."""
    return _set_call(settings, capability, "reset", fallbacks, who, "")


def _set_call(settings: Settings, capability: str | None, mode: str, values: Mapping[str, str],
              who: str, source: str) -> ScriptCall:
    key, history = policy_keys(settings, capability)
    args: list[str | int | float] = [mode, who, source, wake_channel(settings), capability or FLEET,
                                     "1" if capability else ""]
    for name, value in values.items():
        args += [name, value]
    return ScriptCall("policy_set", [key, history], args)


def parse_changes(reply: list[Any]) -> list[Change]:
    return [Change(str(reply[i]), str(reply[i + 1]), str(reply[i + 2])) for i in range(0, len(reply), 3)]


def policy_seed_call(settings: Settings, capability: str | None, values: Mapping[str, str],
                     source: str, who: str) -> ScriptCall:
    key, history = policy_keys(settings, capability)
    args: list[str | int | float] = [source, "1" if capability else "", who]
    for name, value in values.items():
        args += [name, value]
    return ScriptCall("policy_seed", [key, history], args)


def parse_seed(reply: list[Any]) -> dict[str, str]:
    """The fields Redis held otherwise already: field -> the value it holds."""
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply), 2)}


def policy_sync_call(settings: Settings, capability: str,
                     fleet: Mapping[str, tuple[str, str]]) -> ScriptCall:
    """Copy the fleet's values (field -> (value, source)) into the capability's hash."""
    args: list[str | int | float] = []
    for name, (value, source) in fleet.items():
        args += [name, value, source]
    return ScriptCall("policy_sync", [CapabilityKeys(settings.prefix, capability).policy], args)


def active_sync_call(settings: Settings, capability: str) -> ScriptCall:
    """Set the count of tasks handed out to what the inboxes hold (the reply: the count)."""
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("active_sync", [ck.inboxes, ck.stats], [ck.inbox_prefix])


def schedule_fired_call(settings: Settings, name: str, due_ms: int) -> ScriptCall:
    """Record a schedule's fire (the reply: 1, or 0 when a later one was recorded)."""
    return ScriptCall("schedule_fired", [RegistryKeys(settings.prefix).schedule_fires], [name, due_ms])
