"""Reading an agent's inbox from outside the agent: what is unread, what has lapsed.

Used by the dispatcher (offline agents, lapsed leases) and by a draining worker (it hands its
unread tasks back before it exits). Every move itself is one script (release.lua,
reclaim.lua); this module only finds the candidates.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from broker.acl import is_permission_error
from broker.infra.connection import AsyncRedis
from broker.keys import AGENT_GROUP, CapabilityKeys
from broker.protocol.delivery import parse_lease, parse_reclaim, reclaim_call, release_call
from broker.protocol.lifecycle import dead_letter_raw_call
from broker.scripts import AsyncScripts
from broker.settings import Settings

log = logging.getLogger("reach.inbox")

BATCH = 200


def agent_group(groups: Any) -> tuple[int, str] | None:
    """(pending, last-delivered id) of the agents' group in an XINFO GROUPS reply; None when
    the reply holds no such group (or is an error)."""
    if not isinstance(groups, list):
        return None
    for group in groups:
        if isinstance(group, dict) and group.get("name") == AGENT_GROUP:
            return int(group.get("pending") or 0), str(group.get("last-delivered-id"))
    return None


async def last_delivered(client: AsyncRedis, inbox: str) -> str | None:
    """The consumer group's last-delivered id, or None when the inbox or group does not exist."""
    try:
        groups = await client.xinfo_groups(inbox)
    except redis.exceptions.ResponseError as exc:
        if is_permission_error(exc):
            raise
        return None
    group = agent_group(groups)
    return group[1] if group is not None else None


async def release_unread(client: AsyncRedis, scripts: AsyncScripts, settings: Settings, capability: str,
                         agent_id: str, reason: str) -> int:
    """Put every task still unread in the agent's inbox back into the ready queue."""
    inbox = CapabilityKeys(settings.prefix, capability).inbox(agent_id)
    released = 0
    while True:
        start = await last_delivered(client, inbox)
        if start is None:
            return released
        entries: Any = await client.xrange(inbox, min=f"({start}", max="+", count=BATCH)
        leases = [lease for entry_id, fields in entries
                  if (lease := parse_lease(entry_id, fields)) is not None]
        if leases:
            released += int(await scripts(release_call(settings, capability, agent_id, reason, leases)))
        if len(entries) < BATCH:
            return released
        if not leases:
            return released  # only entries we cannot parse; the agent dead-letters them when read


async def reclaim_lapsed(client: AsyncRedis, scripts: AsyncScripts, settings: Settings, capability: str,
                         agent_id: str, consumer: str, min_idle_ms: int, reason: str) -> int:
    """Claim inbox entries idle for `min_idle_ms` (their lease lapsed) and requeue their tasks.

    Returns the number of tasks requeued or failed.
    """
    inbox = CapabilityKeys(settings.prefix, capability).inbox(agent_id)
    cursor = "0-0"
    moved = 0
    while True:
        try:
            reply = await client.xautoclaim(inbox, AGENT_GROUP, consumer, min_idle_ms,
                                            start_id=cursor, count=BATCH)
        except redis.exceptions.ResponseError as exc:
            if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
                return moved
            raise
        # Redis 7 answers [cursor, entries, deleted ids]; 6.2 only [cursor, entries], where an
        # entry deleted from the stream comes back with no fields.
        cursor, entries = reply[0], reply[1]
        leases = []
        for entry_id, fields in entries:
            lease = parse_lease(entry_id, fields)
            if lease is not None:
                leases.append(lease)
            elif fields:  # not a valid delivery: keep it, in the dead-letter stream
                await scripts(dead_letter_raw_call(
                    settings, capability, inbox, AGENT_GROUP, entry_id, "malformed",
                    "inbox entry without a valid task id and fence", fields))
            else:  # finished and deleted while still pending: just clear it
                await client.xack(inbox, AGENT_GROUP, entry_id)
        if leases:
            done = parse_reclaim(await scripts(reclaim_call(
                settings, capability, agent_id, consumer, reason, leases)))
            moved += done.requeued + done.failed
        if cursor in ("0-0", b"0-0"):
            return moved
