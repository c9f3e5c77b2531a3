"""The policy a dispatcher follows (broker/policy.py), and the part it plays in keeping it.

At start a dispatcher seeds the fleet's policy in Redis from its own settings (environment,
reach.toml) and each `[capabilities.X]` table, for every field not set there yet, and logs
where its configuration differs from what Redis holds: so `REACH_MAX_ATTEMPTS=2` on the
dispatcher is the fleet's policy, whatever the producers' environments. Then each capability
loop, at most once a second (and at once when a wake-up says the policy changed), copies the
fleet's values into the capability's hash (which the scripts read) and reads the result.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from broker.policy import Policy, Source, configured, configured_for, encode, resolve
from broker.protocol.policy import (
    parse_seed,
    policy_keys,
    policy_seed_call,
    policy_sync_call,
)
from dispatcher.context import DispatcherContext

log = logging.getLogger("reach.dispatcher")

REFRESH_EVERY_S = 1.0


async def seed(ctx: DispatcherContext) -> None:
    """Publish this dispatcher's configured policy for every field Redis does not set yet."""
    now = round(time.time() * 1000)
    values = {name: encode(name, value) for name, value in configured(ctx.settings).items()}
    await _seed_one(ctx, None, values, Source("config", ctx.dispatcher_id, now, "fleet").encode())
    for capability, config in ctx.settings.capabilities.items():
        own = {name: encode(name, value) for name, value in configured_for(config).items()}
        if own and ctx.serves(capability):
            await _seed_one(ctx, capability, own,
                            Source("config", ctx.dispatcher_id, now, "capability").encode())


async def _seed_one(ctx: DispatcherContext, capability: str | None, values: dict[str, str],
                    source: str) -> None:
    differs = parse_seed(await ctx.scripts(policy_seed_call(
        ctx.settings, capability, values, source, ctx.dispatcher_id)))
    for name, held in sorted(differs.items()):
        log.warning("policy of %s: this dispatcher's configuration says %s=%s, Redis holds %s "
                    "(Redis applies; `reach policy show` says who set it)",
                    capability or "the fleet", name, values[name], held or "nothing")


class CapabilityPolicy:
    """The policy one capability's loop follows, as it last read it."""

    def __init__(self, ctx: DispatcherContext, capability: str) -> None:
        self.ctx = ctx
        self.capability = capability
        self.current: Policy = resolve(capability, {}, {})
        self._next = 0.0

    def stale(self) -> None:
        """A wake-up said it changed: read it at the next step."""
        self._next = 0.0

    async def refresh(self) -> Policy:
        """Copy the fleet's values into the capability's hash and read the effective policy
        (at most once a second unless stale)."""
        if time.monotonic() < self._next:
            return self.current
        self._next = time.monotonic() + REFRESH_EVERY_S
        fleet_key, _ = policy_keys(self.ctx.settings, None)
        fleet_fields: Any = await self.ctx.redis.hgetall(fleet_key)
        fleet = resolve(None, fleet_fields, {})
        values = {name: (encode(name, fleet[name]), fleet.sources[name].encode()) for name in fleet.values}
        await self.ctx.scripts(policy_sync_call(self.ctx.settings, self.capability, values))
        own: Any = await self.ctx.redis.hgetall(policy_keys(self.ctx.settings, self.capability)[0])
        before, self.current = self.current, resolve(self.capability, own, fleet_fields)
        if self.current.paused != before.paused:
            log.warning("%s is %s%s", self.capability, "paused" if self.current.paused else "resumed",
                        f" ({self.current['paused_reason']})" if self.current.paused else "")
        return self.current
