"""Keeping periodic schedules (broker/schedule.py) in Redis: `reach schedule add|list|pause|
resume|remove` and the clients' schedule methods. The dispatchers fire them
(dispatcher/scheduler.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from broker.errors import BadInput, ReachError
from broker.infra.connection import SyncRedis
from broker.keys import RegistryKeys
from broker.schedule import Schedule
from broker.settings import Settings


class UnknownSchedule(ReachError, LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")


def add(client: SyncRedis, settings: Settings, schedule: Schedule, *,
        replace_existing: bool = False) -> Schedule:
    """Store a new schedule (BadInput if one of that name exists, unless `replace_existing`)."""
    schedule = replace(schedule, created_ms=schedule.created_ms or round(time.time() * 1000)).check()
    rk = RegistryKeys(settings.prefix)
    stored = client.hset(rk.schedules, schedule.name, schedule.encode()) if replace_existing \
        else client.hsetnx(rk.schedules, schedule.name, schedule.encode())
    if not stored and not replace_existing:
        raise BadInput(f"a schedule named {schedule.name!r} exists: remove it first")
    # (it fires from its next due time on, not for the past)
    client.hset(rk.schedule_fires, schedule.name, str(schedule.created_ms))
    return schedule


def get(client: SyncRedis, settings: Settings, name: str) -> Schedule:
    text: Any = client.hget(RegistryKeys(settings.prefix).schedules, name)
    schedule = Schedule.parse(text) if text else None
    if schedule is None:
        raise UnknownSchedule(name)
    return schedule


def list_all(client: SyncRedis, settings: Settings) -> list[tuple[Schedule, int]]:
    """Every readable schedule with the time it last fired (ms), by name."""
    rk = RegistryKeys(settings.prefix)
    stored: Any = client.hgetall(rk.schedules)
    fires: Any = client.hgetall(rk.schedule_fires)
    out = []
    for name in sorted(stored):
        schedule = Schedule.parse(stored[name])
        if schedule is not None:
            last = fires.get(name, "0")
            out.append((schedule, int(last) if last.isdigit() else 0))
    return out


def set_paused(client: SyncRedis, settings: Settings, name: str, paused: bool) -> Schedule:
    """Pause or resume; a resumed schedule fires from its next due time (none for the pause)."""
    schedule = replace(get(client, settings, name), paused=paused)
    rk = RegistryKeys(settings.prefix)
    client.hset(rk.schedules, name, schedule.encode())
    if not paused:
        client.hset(rk.schedule_fires, name, str(round(time.time() * 1000)))
    return schedule


def remove(client: SyncRedis, settings: Settings, name: str) -> None:
    rk = RegistryKeys(settings.prefix)
    if not client.hdel(rk.schedules, name):
        raise UnknownSchedule(name)
    client.hdel(rk.schedule_fires, name)
