"""Retention of the dead-letter streams: by age, never dropping a dead letter inside it; and
of the task index that `reach tasks` searches (prune_task_index).

`trim` removes the entries older than `dlq_retention_ms` (XTRIM MINID, exact, so the count is
exact and nothing newer goes). The cut is one second older than the retention, because an
entry's id and its `dead_at` are read a moment apart in the script that writes it.

`dlq_maxlen` (0: no limit) never cuts into the retention window: when a stream is still longer
than `dlq_maxlen` after the age trim, every entry left is younger than the retention, so none is
dropped; `trim` logs a warning instead (never a silent loss). Lower `dlq_retention_ms` to keep
less. Imported entries count their age from their import (their stream id), so an import never
loses anything to retention right away.
"""

from __future__ import annotations

import logging

from broker.ids import check_capability
from broker.infra.connection import SyncRedis
from broker.keys import CapabilityKeys, RegistryKeys
from broker.registry import clock_of
from broker.settings import Settings

log = logging.getLogger("reach.dlq")

CLOCK_MARGIN_MS = 1000


def cutoff_ms(now_ms: int, settings: Settings) -> int:
    """Entries with ids below `<cutoff>-0` are past the retention."""
    return max(0, now_ms - settings.dlq_retention_ms - CLOCK_MARGIN_MS)


def trim(client: SyncRedis, settings: Settings, capability: str) -> int:
    """Apply the retention to one capability's DLQ; returns how many entries were removed.

    `client` is a synchronous redis-py client (Redis or RedisCluster).
    """
    check_capability(capability)
    key = CapabilityKeys(settings.prefix, capability).dlq
    cut = cutoff_ms(clock_of(client, key), settings)
    removed = int(client.xtrim(key, minid=f"{cut}-0", approximate=False))
    if settings.dlq_maxlen:
        length = int(client.xlen(key))
        if length > settings.dlq_maxlen:
            log.warning(
                "DLQ of %s holds %d entries, over dlq_maxlen %d, all younger than the retention "
                "(%d ms): kept. Replay or purge them, or lower dlq_retention_ms.",
                capability, length, settings.dlq_maxlen, settings.dlq_retention_ms,
            )
    if removed:
        log.info("DLQ of %s: %d entries past the retention removed", capability, removed)
    return removed


def prune_task_index(client: SyncRedis, settings: Settings, capability: str) -> int:
    """Drop the task index entries (and canceled tasks) older than result_ttl: their records
    have expired or soon will (broker/ops/search.py skips those). Returns how many went."""
    check_capability(capability)
    keys = CapabilityKeys(settings.prefix, capability)
    cut = clock_of(client, keys.tasks) - settings.result_ttl_ms
    pipe = client.pipeline(transaction=False)
    pipe.zremrangebyscore(keys.tasks, "-inf", f"({cut}")
    pipe.zremrangebyscore(keys.canceled, "-inf", f"({cut}")
    return sum(int(n) for n in pipe.execute())


def trim_all(client: SyncRedis, settings: Settings) -> dict[str, int]:
    """`trim` for every capability of the registry; {capability: removed}."""
    names = sorted(client.smembers(RegistryKeys(settings.prefix).capabilities))
    out = {}
    for name in names:
        name = name.decode() if isinstance(name, bytes) else name
        try:
            check_capability(name)
        except ValueError:
            continue
        out[name] = trim(client, settings, name)
    return out
