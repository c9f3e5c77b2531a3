"""Periodic schedules: a task of a capability at every due time of a cron expression (in a
timezone) or of a fixed interval.

Due times are deterministic (a cron's, or the schedule's creation time plus whole intervals),
so every dispatcher computes the same ones, and the task of a due time is submitted with the
idempotency key `schedule:<name>:<due ms>`: one task per due time however many dispatchers run.
A dispatcher fires the latest due time not fired yet, so after an outage a schedule makes one
catch-up task, not a burst; none while the schedule is paused.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from broker import codec
from broker.errors import BadInput
from broker.ids import check_capability

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
MIN_EVERY_MS = 1000
_MAX_STEPS = 100_000
"""Most cron due times walked in one look (an outage of years at a per-minute cron)."""


@dataclass(frozen=True)
class Schedule:
    name: str
    capability: str
    payload: Any
    cron: str | None = None
    every_ms: int | None = None
    timezone: str = "UTC"
    priority: int = 5
    paused: bool = False
    created_ms: int = 0

    def check(self) -> Schedule:
        """The schedule, or BadInput saying what is wrong with it."""
        if not NAME_RE.match(self.name):
            raise BadInput(f"invalid schedule name {self.name!r}: use 1-64 letters, digits, '_', '.', '-'")
        check_capability(self.capability)
        if (self.cron is None) == (self.every_ms is None):
            raise BadInput("give a cron expression or an interval (--cron or --every), one of them")
        if self.every_ms is not None and self.every_ms < MIN_EVERY_MS:
            raise BadInput(f"--every must be at least {MIN_EVERY_MS // 1000}s")
        priority = self.priority
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise BadInput(f"priority must be an int from 0 to 9, got {self.priority!r}")
        zone = self.zone()
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime.now(zone))
            except CronSimError as exc:
                raise BadInput(f"invalid cron expression {self.cron!r}: {exc}") from None
        codec.encode_payload(self.payload, 1_048_576)
        return self

    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise BadInput(f"unknown timezone {self.timezone!r} (an IANA name: Europe/Paris)") from None

    def latest_due(self, after_ms: int, now_ms: int) -> int | None:
        """The latest due time in (after_ms, now_ms], or None when none is."""
        if self.every_ms is not None:
            if now_ms < self.created_ms + self.every_ms:
                return None
            due = self.created_ms + (now_ms - self.created_ms) // self.every_ms * self.every_ms
            return due if due > after_ms else None
        latest = None
        start = datetime.fromtimestamp(max(after_ms, self.created_ms) / 1000, tz=self.zone())
        for step, moment in enumerate(CronSim(str(self.cron), start)):
            due = round(moment.timestamp() * 1000)
            if due > now_ms or step >= _MAX_STEPS:
                break
            latest = due
        return latest

    def next_due(self, after_ms: int) -> int:
        """The first due time after `after_ms`."""
        if self.every_ms is not None:
            base = max(after_ms, self.created_ms)
            return self.created_ms + ((base - self.created_ms) // self.every_ms + 1) * self.every_ms
        start = datetime.fromtimestamp(max(after_ms, self.created_ms) / 1000, tz=self.zone())
        return round(next(iter(CronSim(str(self.cron), start))).timestamp() * 1000)

    def encode(self) -> str:
        return codec.dumps(asdict(self))

    @classmethod
    def parse(cls, text: str) -> Schedule | None:
        """A stored schedule (None when it does not read as one)."""
        try:
            data = codec.loads(text)
            return cls(**data).check() if isinstance(data, dict) else None
        except (ValueError, TypeError, BadInput):
            return None

    def describe(self) -> str:
        if self.every_ms is not None:
            return f"every {self.every_ms / 1000:g}s"
        return f"cron {self.cron} ({self.timezone})"


def iso(ms: int | None) -> str | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat() if ms else None
