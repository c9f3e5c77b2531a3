"""gateway_rate.lua: the gateway's per-API-key rate limit, a token bucket in Redis.

The bucket lives in Redis, not in the gateway process, so that the limit holds however many
gateways serve (they are stateless and scale out: a bucket each would multiply the limit by
their number). It costs one small script call per request, and only when gateway_rate_limit is
set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.keys import RegistryKeys
from broker.protocol.calls import ScriptCall
from broker.settings import Settings


@dataclass(frozen=True, slots=True)
class RateVerdict:
    allowed: bool
    retry_after_ms: int
    """When not allowed: how long until the bucket holds a token again."""


def burst_of(settings: Settings) -> int:
    """The bucket's size: gateway_rate_burst, else one second of the rate (at least 1)."""
    return settings.gateway_rate_burst or max(1, round(settings.gateway_rate_limit))


def gateway_rate_call(settings: Settings, identity: str) -> ScriptCall:
    """Take a request from `identity`'s bucket (`key:<id>` or `addr:<host>`)."""
    return ScriptCall("gateway_rate", [RegistryKeys(settings.prefix).gateway_rate(identity)],
                      [settings.gateway_rate_limit, burst_of(settings)])


def parse_gateway_rate(reply: list[Any]) -> RateVerdict:
    return RateVerdict(int(reply[0]) == 1, int(reply[1]))
