"""The policy as the scripts read it: every field of a capability's policy hash packed in one
string (lua/_policy.lua unpacks it with one match), and the callers' fallback in the same form.

    gated|max_attempts|timeout_ms|aging_ms|max_queue_depth|no_agent_timeout_ms|rate|burst|
    max_running|paused

`gated` is '1' when a start limit applies (paused, a rate, a max_running) and '0' when none does,
so that the hot paths skip the token bucket and the running count; the scripts write '?' there
when the hash lacks a field, which the caller's fallback then fills in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.protocol.cache import cached
from broker.settings import Settings

PACKED_FIELDS = ("max_attempts", "timeout_ms", "aging_ms", "max_queue_depth", "no_agent_timeout_ms",
                 "rate", "burst", "max_running", "paused")
"""The policy fields after `gated`, in their packed order."""


def pack(values: Mapping[str, Any]) -> str:
    """Every field of PACKED_FIELDS (numbers, `paused` a bool) as the scripts read them."""
    rate, running, paused = float(values["rate"]), int(values["max_running"]), bool(values["paused"])
    gated = "1" if paused or rate > 0 or running > 0 else "0"
    parts = [gated]
    for name in PACKED_FIELDS:
        value = values[name]
        if name == "paused":
            parts.append("1" if value else "0")
        elif name == "rate":
            parts.append(f"{float(value):g}")
        else:
            parts.append(str(int(value)))
    return "|".join(parts)


def unpack(packed: str) -> dict[str, str]:
    """The fields of a packed policy, as text (for tests and inspection)."""
    gated, *values = packed.split("|")
    if len(values) != len(PACKED_FIELDS):
        raise ValueError(f"a packed policy has {len(PACKED_FIELDS) + 1} fields, got {packed!r}")
    return {"gated": gated, **dict(zip(PACKED_FIELDS, values, strict=True))}


FleetItems = tuple[tuple[str, Any], ...]
"""The fields the fleet's policy hash sets, sorted by name (hashable, for the cache)."""


def fleet_items(fields: Mapping[str, Any]) -> FleetItems:
    return tuple(sorted(fields.items()))


def policy_defaults(settings: Settings, capability: str, fleet: FleetItems = ()) -> str:
    """The scripts' fallback for the fields a capability's policy hash does not hold yet (no
    dispatcher has copied the fleet's values into it), packed: the fleet's values (`fleet`, the
    fields its hash sets) where known, else the caller's settings. Cached: every script call of
    a hot path passes it."""
    return cached(settings, ("policy_defaults", capability, fleet),
                  lambda: _defaults(settings, capability, fleet))


def _defaults(settings: Settings, capability: str, fleet: FleetItems) -> str:
    own = settings.capability(capability)
    mine: dict[str, Any] = {
        "max_attempts": settings.max_attempts_for(capability),
        "timeout_ms": settings.timeout_ms_for(capability),
        "aging_ms": own.aging_ms or settings.aging_ms,
        "max_queue_depth": own.max_queue_depth or settings.max_queue_depth,
        "no_agent_timeout_ms": settings.no_agent_timeout_ms if own.no_agent_timeout_ms is None
        else own.no_agent_timeout_ms,
        "rate": settings.rate if own.rate is None else own.rate,
        "burst": settings.burst if own.burst is None else own.burst,
        "max_running": settings.max_running if own.max_running is None else own.max_running,
        "paused": False,
    }
    mine.update((name, value) for name, value in fleet if name in mine)
    return pack(mine)
